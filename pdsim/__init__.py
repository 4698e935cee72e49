"""pdsim's command line, on top of the simulator (:mod:`sim`), the hardware benchmarks and
calibration (:mod:`hwbench`) and the engine (:mod:`engine`); nothing below imports it."""
