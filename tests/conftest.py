"""Test-suite configuration: Hypothesis profiles and the `gpu` marker's skip rule.

Profiles: ``dev`` (default; quick) and ``ci`` (more examples, derandomised so CI is
reproducible). Choose with ``HYPOTHESIS_PROFILE=ci``; ``.ci/run`` does.
"""

from __future__ import annotations

import os

import pytest
from hypothesis import HealthCheck, settings

settings.register_profile(
    "dev", max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
settings.register_profile(
    "ci",
    max_examples=150,
    deadline=None,
    derandomize=True,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "dev"))


def _gpu_available() -> bool:
    try:
        import cupy

        return cupy.cuda.runtime.getDeviceCount() > 0
    except Exception:  # any import or driver failure means: no usable GPU here
        return False


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if any("gpu" in item.keywords for item in items) and not _gpu_available():
        skip = pytest.mark.skip(reason="needs a CUDA GPU with CuPy; none found")
        for item in items:
            if "gpu" in item.keywords:
                item.add_marker(skip)
