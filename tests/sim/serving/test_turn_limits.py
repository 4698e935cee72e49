"""Two limits of a replica's turn, end to end (a KV-pressured llama-2-7b replica), checked at
every call rather than from the totals: an iteration runs at most ``max_num_batched_tokens``
tokens (its prefill chunks plus one per decoding sequence), and a swap-out never takes more
host swap space than ``kv.swap_space`` (a preemption that does not fit recomputes instead),
keeps exactly the KV written and gives the space back on swap-in. Mutation harness: these
kill ``serving:budget-ignores-decodes``, ``serving:swap-ignores-capacity``,
``serving:preempt-kv-off-by-one`` and ``serving:swap-in-keeps-space``
(tests/mutation/serving_mutants.py)."""

from __future__ import annotations

import pytest

from engine.sched.batch import Batch
from engine.sched.scheduler import Scheduler
from sim.runner import run_scenario

from .test_serving import _scenario

PRESSURE = {
    "cluster__gpu": {"hbm": "16GiB", "memory_utilization": 1.0, "workspace": "1GiB"},
    "workload__rate": 50.0,
    "workload__input_tokens": {"dist": "fixed", "mean": 256},
    "workload__output_tokens": {"dist": "fixed", "mean": 600},
}


def test_an_iteration_never_exceeds_the_token_budget(monkeypatch: pytest.MonkeyPatch) -> None:
    schedule = Scheduler.schedule
    seen: list[tuple[int, int, int]] = []

    def checked(self: Scheduler, m: int) -> Batch:
        batch = schedule(self, m)
        seen.append((batch.prefill_tokens, batch.num_decodes, self.max_num_batched_tokens))
        return batch

    monkeypatch.setattr(Scheduler, "schedule", checked)
    sc = _scenario(
        **{**PRESSURE, "workload__input_tokens": {"dist": "fixed", "mean": 1500}},
        cluster__replica={"max_num_batched_tokens": 512, "chunked_prefill": True},
        workload__requests=12,
    )
    res = run_scenario(sc, seed=1)
    assert res.summary["requests"]["completed"] == 12
    mixed = [(p, n, cap) for p, n, cap in seen if p and n]
    assert mixed, "no iteration mixed prefill chunks with decodes"
    assert all(p + n <= cap for p, n, cap in seen), max(p + n for p, n, _ in seen)
    assert any(p + n == cap for p, n, cap in mixed)  # a chunk fills what the decodes leave


def test_swap_keeps_the_written_kv_within_the_swap_space_and_frees_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """After each preemption: swap use within ``kv.swap_space``, and every swapped-out
    sequence keeps the KV it wrote -- its prompt and every generated token but the newest
    (whose KV the next step writes). After the run every swap-in freed its space."""
    preempt = Scheduler._preempt
    seen: list[tuple[int, int]] = []
    scheds: list[Scheduler] = []

    def checked(self: Scheduler, m: int, off: int, batch: Batch) -> None:
        preempt(self, m, off, batch)
        seen.append((self.swap_used, self.swap_capacity))
        for rid, (kv_tok, gen) in self.swapped.items():
            assert kv_tok == self.prompt_lens[rid] + gen - 1, (rid, kv_tok, gen)
        scheds[:] = [self]

    monkeypatch.setattr(Scheduler, "_preempt", checked)
    sc = _scenario(
        **PRESSURE,
        kv={"preemption": "swap", "block_tokens": 16, "swap_space": "1GiB"},
        workload__requests=40,
    )
    res = run_scenario(sc, seed=2)
    assert res.summary["requests"]["completed"] == 40
    assert len(seen) >= 2
    assert all(used <= cap for used, cap in seen), max(seen)
    # a 1 GiB swap space holds two of these sequences at most: later ones recompute
    assert any(used + 300 * 2**19 > cap for used, cap in seen)
    (sched,) = scheds
    assert sched.swap_moved > 0 and sched.swapped == {} and sched.swap_used == 0
