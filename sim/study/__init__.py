"""Studies built on runs: sweeps, A/B tests, claims, capacity plans, chaos runs, recordings, plots."""
