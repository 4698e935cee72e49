"""Hardware probes, calibration profiles and simulator-vs-engine validation."""

__all__: list[str] = []
