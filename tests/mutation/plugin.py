"""Pytest plugin of the mutation harness: runs the session with one mutant patched in.

``PDSIM_MUTANT=<package>:<name> pytest -p tests.mutation.plugin TESTS`` patches mutant
``name`` of catalogue ``package`` (:data:`tests.mutation.catalogue.PACKAGES`) in before the
first test is collected and restores the original after the last one. Without the variable
the plugin does nothing.
"""

from __future__ import annotations

import os
from contextlib import ExitStack

import pytest

from tests.mutation.catalogue import find

_stack = ExitStack()


def pytest_configure(config: pytest.Config) -> None:
    spec = os.environ.get("PDSIM_MUTANT")
    if spec:
        m = find(spec)
        _stack.enter_context(m.applied())
        config.stash[_KEY] = spec


def pytest_report_header(config: pytest.Config) -> str | None:
    spec = config.stash.get(_KEY, None)
    return None if spec is None else f"mutant: {spec}"


def pytest_unconfigure(config: pytest.Config) -> None:
    _stack.close()


_KEY = pytest.StashKey[str]()
