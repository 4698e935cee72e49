"""A trace-driven iteration cost: the i-th iteration of a replica costs what a recording says.

:class:`RecordedCost` implements :class:`sim.serving.itercost.IterationCost` from a list of
:class:`RecordedIteration` (each iteration's shape and seconds, e.g. one real engine run's
iterations in order). The i-th call of :meth:`RecordedCost.work` returns the i-th recorded
seconds, after checking that the batch the simulator formed has the recorded shape: a
replay whose batches part from the recording stops at once with :class:`ReplayMismatch`
(the step, the recorded and the simulated shape), since every later time would then belong
to another batch. Running out of records is a mismatch too.

It is sequential, not a price: a replica whose model is priced by it runs one iteration per
scheduler step, never a multi-step decode segment, and its prices are not memoised
(:class:`sim.serving.context.ModelRt` ``step_by_step``). With it the simulator's own model
of how long a batch takes drops out, and what is left -- which batches form, who waits,
when tokens come out -- is the scheduling model alone (``docs/design/validation.md``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

from sim.serving.itercost import IterationCost

__all__ = ["RecordedCost", "RecordedIteration", "ReplayMismatch"]


class RecordedIteration(NamedTuple):
    """One recorded iteration: its seconds and the shape of its batch (the arguments of
    :meth:`sim.serving.itercost.IterationCost.work`)."""

    seconds: float
    prefill_tokens: int
    prefill_sq: float
    n_prompts: int
    n_decode: int
    decode_ctx: float


class ReplayMismatch(RuntimeError):
    """The simulator formed a batch the recording does not have at that step."""

    def __init__(self, step: int, recorded: RecordedIteration | None, got: tuple[float, ...]):
        self.step = step
        self.recorded = recorded
        self.got = got
        shape = "(prefill_tokens, prefill_sq, n_prompts, n_decode, decode_ctx)"
        want = "no more iterations" if recorded is None else str(tuple(recorded[1:]))
        super().__init__(
            f"replay step {step}: the simulator's batch {shape} = {got}, the recording's "
            f"{want}: the scheduler formed another batch than the engine did"
        )


class RecordedCost:
    """:class:`~sim.serving.itercost.IterationCost` from ``records`` (see the module
    docstring). ``counts``: an iteration cost whose FLOPs and bytes are reported with the
    recorded seconds (MFU, MBU); without it both are 0. ``tp``/``pp``: the replica's."""

    def __init__(
        self,
        records: Sequence[RecordedIteration],
        counts: IterationCost | None = None,
        tp: int = 1,
        pp: int = 1,
    ) -> None:
        self.records = list(records)
        self.counts = counts
        self.tp = tp
        self.pp = pp
        #: the next record to hand out (iterations priced so far)
        self.cursor = 0

    @property
    def exhausted(self) -> bool:
        """Every record was handed out (a replay that ran the whole recording)."""
        return self.cursor == len(self.records)

    def work(
        self,
        prefill_tokens: int,
        prefill_sq: float,
        n_prompts: int,
        n_decode: int,
        decode_ctx: float,
    ) -> tuple[float, float, float, float]:
        """``(recorded seconds, 0, flops, bytes)`` of the next recorded iteration; raises
        :class:`ReplayMismatch` when the shape differs from it (prefill squares and context
        to 1e-6 relative) or none is left."""
        got = (prefill_tokens, prefill_sq, n_prompts, n_decode, decode_ctx)
        i = self.cursor
        if i >= len(self.records):
            raise ReplayMismatch(i, None, got)
        rec = self.records[i]
        same = (
            rec.prefill_tokens == prefill_tokens
            and rec.n_prompts == n_prompts
            and rec.n_decode == n_decode
            and abs(rec.prefill_sq - prefill_sq) <= 1e-6 * max(abs(prefill_sq), 1.0)
            and abs(rec.decode_ctx - decode_ctx) <= 1e-6 * max(abs(decode_ctx), 1.0)
        )
        if not same:
            raise ReplayMismatch(i, rec, got)
        self.cursor = i + 1
        flops = nbytes = 0.0
        if self.counts is not None:
            _, _, flops, nbytes = self.counts.work(*got)
        return rec.seconds, 0.0, flops, nbytes

    def breakdown(
        self,
        prefill_tokens: int,
        prefill_sq: float,
        n_prompts: int,
        n_decode: int,
        decode_ctx: float,
    ) -> list[tuple[str, float, str]]:
        """One row: the seconds the next record holds (``recorded``), without consuming it
        (0 and ``not run`` when none is left)."""
        i = self.cursor
        if i >= len(self.records):
            return [("recorded", 0.0, "not run")]
        return [("recorded", self.records[i].seconds, "recording")]
