"""Single-point mutants of ``sim/serving``: the token budget and chunked prefill of an
iteration, KV growth of decoding sequences, preemption and swap, the metrics' steady window
(see :mod:`tests.mutation.mutant`; module-level functions are patched wherever imported).

``tests`` are the test files that target the mutated code; ``python -m tests.mutation
--package serving`` runs each mutant through them.
"""

from __future__ import annotations

from engine.sched.decode import DecodeBatches
from engine.sched.scheduler import Scheduler
from sim.serving import metrics
from tests.mutation.mutant import Mutant

TURN_T = (
    "tests/engine/sched/test_batch_state.py",
    "tests/engine/sched/test_scheduler.py",
    "tests/sim/serving/test_turn_limits.py",
    "tests/sim/serving/test_serving.py",
)
KV_T = (
    "tests/sim/serving/test_same_batches.py",
    "tests/engine/sched/test_batch_state.py",
    "tests/engine/sched/test_scheduler.py",
    "tests/sim/serving/test_turn_limits.py",
    "tests/sim/serving/test_serving.py",
)
MET_T = (
    "tests/sim/serving/test_metrics.py",
    "tests/sim/serving/test_metrics_summary.py",
    "tests/sim/serving/test_metrics_window.py",
)

MUTANTS: list[Mutant] = [
    Mutant(
        "chunk-ignores-budget",
        "chunked prefill takes the whole remaining prompt, not what the budget leaves",
        Scheduler,
        "_chunks",
        "c = todo if whole else min(todo, left)",
        "c = todo",
        "budget",
        TURN_T,
    ),
    Mutant(
        "unchunked-exact-fit-waits",
        "unchunked, a later prompt that exactly fills the budget left waits",
        Scheduler,
        "_chunks",
        "if unchunked and chunks and c > left:",
        "if unchunked and chunks and c >= left:",
        "budget",
        TURN_T,
    ),
    Mutant(
        "budget-ignores-decodes",
        "an iteration's prefill budget does not count the decoding sequences' tokens",
        Scheduler,
        "schedule",
        "self._chunks(m, pf, self.max_num_batched_tokens - n, batch)",
        "self._chunks(m, pf, self.max_num_batched_tokens, batch)",
        "budget",
        TURN_T,
    ),
    Mutant(
        "grow-forgets-lagging",
        "the KV growth check does not count the sequences owing a block",
        DecodeBatches,
        "_grow_step",
        "if not kv.can_grow(len(bucket) + len(owed), bpt):",
        "if not kv.can_grow(len(bucket), bpt):",
        "kv-growth",
        KV_T,
    ),
    Mutant(
        "fit-steps-floor",
        "the no-walk bound of fit_steps rounds the blocks per sequence down",
        DecodeBatches,
        "fit_steps",
        "if self.num_decoding[m] * (-(-(k - 1) // bt)) <= room:",
        "if self.num_decoding[m] * ((k - 1) // bt) <= room:",
        "kv-growth",
        KV_T,
    ),
    Mutant(
        "swap-ignores-capacity",
        "a preempted sequence swaps out even when it overflows the swap space",
        Scheduler,
        "_preempt",
        "self.swap_used + nbytes <= self.swap_capacity",
        "self.swap_used <= self.swap_capacity",
        "preemption",
        KV_T,
    ),
    Mutant(
        "preempt-kv-off-by-one",
        "a preempted sequence's KV counts the token of the step not yet run",
        Scheduler,
        "_preempt",
        "kv_tok = base + off - 1",
        "kv_tok = base + off",
        "preemption",
        KV_T,
    ),
    Mutant(
        "swap-in-keeps-space",
        "swapping a sequence back in does not free its swap space",
        Scheduler,
        "_swap_in",
        "self.swap_used -= kv_tok * bpt",
        "pass",
        "preemption",
        KV_T,
    ),
    Mutant(
        "window-open-end",
        "the steady window excludes arrivals exactly at its end",
        metrics,
        "summarize",
        "in_w = (arr >= w0) & (arr <= w1)",
        "in_w = (arr >= w0) & (arr < w1)",
        "metrics",
        MET_T,
    ),
    Mutant(
        "achieved-no-lag",
        "achieved throughput counts finishes in the window without the median-latency shift",
        metrics,
        "summarize",
        "((ends >= w0 + lag) & (ends <= w1 + lag))",
        "((ends >= w0) & (ends <= w1))",
        "metrics",
        MET_T,
    ),
]
