"""pdsim's cluster simulator (SimPy) and the studies built on it (sweeps, A/B tests, plans,
chaos runs, claims); the command line is :mod:`pdsim.cli`."""

__all__: list[str] = []
