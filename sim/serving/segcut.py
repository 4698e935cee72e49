"""Cutting a replica's decode segment short when a request arrives that could join it.

A decode segment (:func:`sim.serving.turn._segment`) waits on one timeout for ``k`` steps. An
arrival that could join must wake it at once, as an interrupt would, but without SimPy's
interrupt machinery (an exception built, copied and thrown through the process's generator
stack at every arrival): :class:`SegmentCut` is an event that, when processed, resumes the
process waiting on the segment's timeout with the value :data:`CUT` instead.

Contract: ``SegmentCut(proc, seg)`` is scheduled like :class:`simpy.events.Interruption` (one
``URGENT`` event at the current time, so it is processed before any regular event due now);
when processed, if ``proc`` still waits on ``seg`` it stops waiting on it and receives
:data:`CUT` from its ``yield seg``, else (the segment ended, or a kill ended the process first)
nothing happens. ``seg`` itself still fires later, with no one waiting on it, as an
interrupted timeout does.

It reads :attr:`simpy.Process.target` (the event the process waits on) and resumes the
process through :meth:`sim.simenv.SimProcess.resume_with` (as SimPy's own ``Interruption``
does with the process's ``_resume``, SimPy 4.1 on);
``tests/sim/serving/test_segcut.py`` pins the behaviour against SimPy's interrupt.
"""

from __future__ import annotations

from typing import Any

import simpy
from simpy.events import URGENT, Event

from sim.simenv import SimProcess

__all__ = ["CUT", "SegmentCut"]


class _Cut:
    """The type of :data:`CUT`."""

    def __repr__(self) -> str:
        return "CUT"


#: what a cut segment's ``yield`` returns
CUT: Any = _Cut()


class SegmentCut(Event):
    """Resume ``proc`` from its wait on segment timeout ``seg`` now (see the module doc)."""

    def __init__(self, proc: simpy.Process, seg: Event) -> None:
        self.env = proc.env
        self.callbacks = [self._cut]
        self._ok = True
        self._value = CUT
        self.proc = proc
        self.seg = seg
        self.env.schedule(self, URGENT)

    def _cut(self, _event: Event) -> None:
        proc, seg = self.proc, self.seg
        if proc.target is not seg:  # the segment ended, or the process did
            return
        if not isinstance(proc, SimProcess):  # env.process of a CountingEnvironment makes one
            raise TypeError(f"SegmentCut needs a sim.simenv.SimProcess, got {type(proc).__name__}")
        proc.resume_with(self)
