"""pdsim's cluster simulator (SimPy) and its command-line interface."""

__all__: list[str] = []
