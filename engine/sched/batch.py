"""What the replica scheduler hands its caller: the batch, a prefilling request, the hooks.

:class:`Batch` is one iteration of one model as :meth:`engine.sched.scheduler.Scheduler.schedule`
formed it; :class:`Prefill` a request still prefilling, with its ``num_computed_tokens``;
:class:`SchedulerHooks` what the scheduler tells its caller (the simulator's replica, the
engine) when the state changes.
"""

from __future__ import annotations

from typing import Protocol

__all__ = ["Batch", "BatchRecord", "Prefill", "SchedulerHooks"]

#: one batch as logged (:attr:`engine.sched.scheduler.Scheduler.batch_log`): (step, admitted
#: ids, preempted ids, ``(id, prefill tokens)`` chunks, decodes)
BatchRecord = tuple[int, tuple[int, ...], tuple[int, ...], tuple[tuple[int, int], ...], int]


class SchedulerHooks(Protocol):
    """What a :class:`~engine.sched.scheduler.Scheduler` tells its caller, at the moment the state changes."""

    def on_admit(self, m: int, rid: int) -> None:
        """``rid`` (model ``m``) was admitted (it now holds its blocks)."""

    def on_preempt(self, m: int, rid: int) -> None:
        """``rid`` was preempted (queued again at the head of its class)."""

    def on_first_token(self, rid: int) -> None:
        """``rid``'s prompt (or recomputed prefill) ran: it sampled a token."""

    def on_finish(self, m: int, rid: int) -> None:
        """``rid`` finished; its blocks are released."""

    def hands_off(self) -> bool:
        """Whether prefilled requests leave this replica (a disaggregated prefill replica)."""

    def on_handoff(self, m: int, rid: int, kv_tokens: int, generated: int) -> None:
        """``rid`` left after its prefill (blocks released) with ``kv_tokens`` of KV and
        ``generated`` tokens sampled."""


class Prefill:
    """A running request still prefilling: ``num_tokens_left`` prompt (and recomputed) tokens
    to go, ``num_computed_tokens`` whose KV is written (a cached prefix counts as computed)."""

    __slots__ = ("num_computed_tokens", "num_tokens_left", "request_id")

    def __init__(self, request_id: int, num_tokens_left: int, num_computed_tokens: int) -> None:
        self.request_id = request_id
        self.num_tokens_left = num_tokens_left
        self.num_computed_tokens = num_computed_tokens

    def __repr__(self) -> str:
        return f"Prefill({self.request_id}, {self.num_tokens_left}, {self.num_computed_tokens})"


class Batch:
    """One iteration of model ``model`` at step ``step``: ``num_decodes`` decoding requests
    (one token each) and the prefill ``chunks`` (``(request, tokens)`` in admission order;
    ``prefill_tokens`` in all, ``prefill_sq`` the sum of each chunk's length squared plus twice
    length x prior context, ``ends`` the requests whose last chunk this is). ``admitted``:
    requests admitted by this schedule (in order), ``preempted`` those preempted by it,
    ``swap_bytes`` the KV bytes its swap-outs and swap-ins copy over PCIe (in order)."""

    __slots__ = (
        "admitted",
        "chunks",
        "ends",
        "model",
        "num_decodes",
        "preempted",
        "prefill_sq",
        "prefill_tokens",
        "step",
        "swap_bytes",
    )

    def __init__(self, model: int, step: int) -> None:
        self.model = model
        self.step = step
        self.num_decodes = 0
        self.chunks: list[tuple[Prefill, int]] = []
        self.prefill_tokens = 0
        self.prefill_sq = 0.0
        self.ends: list[Prefill] = []
        self.admitted: list[int] = []
        self.preempted: list[int] = []
        self.swap_bytes: list[int] = []

    def record(self) -> BatchRecord:
        """The batch as logged: (step, admitted, preempted, ``(id, tokens)`` chunks, decodes)."""
        return (
            self.step,
            tuple(self.admitted),
            tuple(self.preempted),
            tuple((p.request_id, c) for p, c in self.chunks),
            self.num_decodes,
        )
