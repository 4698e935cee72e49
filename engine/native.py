"""The optional compiled build: which modules it compiles, and which are compiled here.

``PDSIM_COMPILE=1 pip install .`` compiles the modules of :data:`COMPILED` with mypyc into
C extensions (``setup.py``; see ``docs/native-build.md``); every other module, and every
module of a plain install, runs as Python. The compiled modules are the same source, so a
run gives the same events, summaries and trace hash either way (``tests/test_native_build.py``
checks it on several scenarios).

A module belongs here when it is on the simulator's per-request or per-transfer path and
compiles without changing behaviour: no class of it is subclassed by a module that is not
compiled unless the class is declared open (``@mypyc_attr(allow_interpreted_subclasses=True)``,
or ``native_class=False`` for a base whose subclasses are decorated: the placement
policies), and none is monkeypatched; no class of it is built on a built-in type other than
``object``, ``Exception``, ``ValueError`` and the few others mypyc supports
(``RuntimeError`` subclasses live in :mod:`engine.errors`); and its annotations are exact
(mypyc checks ``int``/``float`` arguments at run time, so a NumPy scalar where ``int`` is
declared is an error there). A class built on a Python class of another library (SimPy's
environment and events in :mod:`sim.simenv`) compiles as a regular Python class whose
methods are compiled.

This module imports nothing beyond the standard library: ``setup.py`` loads it by path in a
build environment that has neither NumPy nor pdsim.
"""

from __future__ import annotations

import importlib
import importlib.machinery

#: the modules the compiled build compiles (dotted names, each a ``.py`` file of the tree)
COMPILED: tuple[str, ...] = (
    "engine.cache",
    "engine.kv.admission",
    "engine.kv.allocator",
    "engine.kv.blocks",
    "engine.prefetch",
    "engine.sched.batch",
    "engine.sched.decode",
    "engine.sched.scheduler",
    "engine.tiers.chain",
    "sim.simenv",
    "sim.serving.arrivals",
    "sim.serving.fetchpath",
    "sim.serving.iterprice",
    "sim.serving.link",
    "sim.serving.maxmin",
    "sim.serving.metrics",
    "sim.serving.network",
    "sim.serving.paramstore",
    "sim.serving.placement",
    "sim.serving.replica",
    "sim.serving.segcut",
    "sim.serving.streams",
    "sim.serving.turn",
)


def compiled_here() -> list[str]:
    """The modules of :data:`COMPILED` that this interpreter loads as C extensions (imports
    them); empty for a plain install."""
    suffixes = tuple(importlib.machinery.EXTENSION_SUFFIXES)
    out = []
    for name in COMPILED:
        path = getattr(importlib.import_module(name), "__file__", None) or ""
        if path.endswith(suffixes):
            out.append(name)
    return out


def build_label() -> str:
    """``"python"`` for a plain install, ``"mypyc (k of n modules)"`` for the compiled one."""
    k = len(compiled_here())
    return "python" if k == 0 else f"mypyc ({k} of {len(COMPILED)} modules)"
