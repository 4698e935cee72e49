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


@pytest.fixture(autouse=True, scope="session")
def _patient_dask() -> None:
    """Dask LocalClusters started by tests get generous connect/heartbeat timeouts: CI's
    2 shared cores can stall a worker start for many seconds, which is not a test failure."""
    try:
        import dask
    except ImportError:  # the dist extra is not installed; Dask tests skip themselves
        return
    dask.config.set(
        {
            "distributed.comm.timeouts.connect": "120s",
            "distributed.comm.timeouts.tcp": "120s",
            "distributed.scheduler.worker-ttl": "600s",
            "distributed.deploy.lost-worker-timeout": "120s",
        }
    )
