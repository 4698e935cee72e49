"""The scheduler's batch formation and KV-growth bookkeeping against what they promise, on
random batches: the prefill chunks of :meth:`engine.sched.scheduler.Scheduler.schedule` (the
greedy prefix of prompts within the token budget), a decoding request's block-due bucket (the
steps at which its context crosses a block boundary), :meth:`Scheduler.fit_steps` (its
shortcut never grants a step whose blocks are not free, and it grants every step that fits)
and :meth:`Scheduler.advance_decode` (one block per boundary crossing, nothing else)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from engine.kv.admission import KvAdmission, LogEntry
from engine.sched.scheduler import Prefill, Scheduler

KVB = 8
_PROMPTS = st.lists(st.tuples(st.integers(1, 600), st.integers(0, 2000)), max_size=8)


def _sched(budget: int, chunked: bool, dense: bool = False, bt: int = 16) -> Scheduler:
    kv = KvAdmission(1 << 40, bt)
    return Scheduler(
        kv,
        max_num_seqs=64,
        max_num_batched_tokens=budget,
        chunked_prefill=chunked,
        kv_bytes_per_token=[0 if dense else KVB],
        dense=[dense],
    )


def _budgets(prompts: list[tuple[int, int]]) -> st.SearchStrategy[int]:
    """Any budget, or one at (or one token off) the end of a prefix of the prompts."""
    ends = [sum(left for left, _ in prompts[:j]) for j in range(1, len(prompts) + 1)]
    edges = sorted({e + d for e in ends for d in (-1, 0, 1)})
    return st.one_of(st.integers(-5, 2048), st.sampled_from(edges)) if edges else st.integers(-5, 9)


def _chunks(s: Scheduler, prompts: list[tuple[int, int]]) -> tuple[list[Prefill], object]:
    pf = [Prefill(rid, left, done) for rid, (left, done) in enumerate(prompts)]
    s.prefilling[0].extend(pf)
    return pf, s.schedule(0)


@settings(max_examples=400, deadline=None)
@given(_PROMPTS, st.data(), st.booleans())
def test_prefill_chunks_are_a_greedy_prefix_within_the_budget(
    prompts: list[tuple[int, int]], data: st.DataObject, chunked: bool
) -> None:
    budget = data.draw(_budgets(prompts), label="budget")
    s = _sched(budget, chunked)
    pf, b = _chunks(s, prompts)
    chunks = b.chunks  # type: ignore[attr-defined]
    assert [p.request_id for p, _ in chunks] == list(range(len(chunks)))  # a prefix, in order
    assert all(p is pf[i] for i, (p, _) in enumerate(chunks))
    assert b.prefill_tokens == sum(c for _, c in chunks)  # type: ignore[attr-defined]
    assert b.prefill_sq == sum(c * c + 2.0 * c * p.num_computed_tokens for p, c in chunks)  # type: ignore[attr-defined]
    assert b.ends == [p for p, c in chunks if c == p.num_tokens_left]  # type: ignore[attr-defined]
    # scheduling reads only: the chunks are applied by complete()
    assert [(p.num_tokens_left, p.num_computed_tokens) for p in pf] == prompts
    sizes = [c for _, c in chunks]
    if budget <= 0 or not prompts:
        assert chunks == []
        return
    assert chunks, "a positive budget always runs the first prompt (or a chunk of it)"
    rest = prompts[len(chunks) :]
    if chunked:
        assert all(c >= 1 for c in sizes)
        assert sum(sizes) <= budget
        assert all(c == p.num_tokens_left for p, c in chunks[:-1])  # only the last is cut
        if rest or chunks[-1][1] < chunks[-1][0].num_tokens_left:
            assert sum(sizes) == budget  # prompts wait only when the budget is used up
    else:
        assert all(c == p.num_tokens_left for p, c in chunks)  # whole prompts
        assert sum(sizes[1:]) <= budget - sizes[0] or len(sizes) == 1
        if rest:  # the next prompt waits only when it does not fit in what is left
            assert rest[0][0] > budget - sum(sizes)


@settings(max_examples=200, deadline=None)
@given(_PROMPTS.filter(bool), st.data(), st.booleans())
def test_a_dense_model_runs_whole_inputs(
    prompts: list[tuple[int, int]], data: st.DataObject, chunked: bool
) -> None:
    budget = data.draw(_budgets(prompts).filter(lambda b: b > 0), label="budget")
    s = _sched(budget, chunked, dense=True)
    pf, b = _chunks(s, prompts)
    chunks = b.chunks  # type: ignore[attr-defined]
    assert all(c == p.num_tokens_left for p, c in chunks)
    assert b.ends == [p for p, _ in chunks]  # type: ignore[attr-defined]
    sizes = [c for _, c in chunks]
    assert sum(sizes[:-1]) < budget  # an input starts only while budget is left
    if len(chunks) < len(pf) and chunked:
        assert sum(sizes) >= budget


def _decoding(held: list[int], bt: int, off: int) -> tuple[Scheduler, list[LogEntry]]:
    """A scheduler whose requests (holding ``held`` KV tokens each) decode from step ``off``."""
    n = len(held)
    s = _sched(1 << 30, chunked=False, bt=bt)
    log: list[LogEntry] = []
    s.set_requests(list(held), [1000] * n, [0] * n)
    for rid in range(n):
        s.add_request(rid)
    s.steps[0] = off - 1
    b = s.schedule(0)  # every prompt in one batch: they decode from step off
    s.complete(b)
    assert s.decoding(0) == list(range(n)) and s.steps[0] == off
    s.kv.log = log
    return s, log


def _blocks_for(s: Scheduler, lo: int, hi: int) -> int:
    bt = s.kv.block_tokens
    return sum(len(s.block_due[0][t % bt]) for t in range(lo, hi))


_SEQS = st.lists(st.integers(1, 300), min_size=1, max_size=12)  # KV tokens held per request


@settings(max_examples=200, deadline=None)
@given(_SEQS, st.integers(1, 20), st.integers(1, 50))
def test_a_decoding_request_is_due_a_block_exactly_when_its_context_crosses_one(
    held: list[int], bt: int, off: int
) -> None:
    s, _ = _decoding(held, bt, off)
    assert s.num_decoding[0] == len(held)
    for rid, kv_tok in enumerate(held):
        due = {t for t in range(off, off + 3 * bt) if rid in s.block_due[0][t % bt]}
        # step t writes token kv_tok + 1 + (t - off); a new block when the held ones are full
        need = {t for t in range(off, off + 3 * bt) if (kv_tok + t - off) % bt == 0}
        assert due == need
        assert sum(rid in bucket for bucket in s.block_due[0]) == 1
        assert s.num_computed_tokens(0, rid) == kv_tok


@settings(max_examples=300, deadline=None)
@given(_SEQS, st.integers(1, 20), st.integers(1, 40), st.integers(0, 80), st.integers(0, 40))
def test_fit_steps_grants_the_longest_run_of_steps_whose_blocks_are_free(
    held: list[int], bt: int, off: int, k: int, free: int
) -> None:
    s, log = _decoding(held, bt, off)
    s.kv.capacity = s.kv.reserved + free * bt * KVB
    j = s.fit_steps(0, k)
    if k <= 1:
        assert j == k
        return
    assert 1 <= j <= k
    assert _blocks_for(s, off + 1, off + j) <= free  # the steps granted fit
    if j < k:
        assert _blocks_for(s, off + 1, off + j + 1) > free  # one more would not
    assert log == []  # reads only


@settings(max_examples=200, deadline=None)
@given(_SEQS, st.integers(1, 20), st.integers(1, 40), st.integers(1, 70))
def test_advance_decode_takes_one_block_per_boundary_crossing(
    held: list[int], bt: int, off: int, steps: int
) -> None:
    s, log = _decoding(held, bt, off)
    lo, hi = off + 1, off + steps
    want = sorted(
        (t, "block", rid, s.base_of[rid] + t)
        for t in range(lo, hi)
        for rid in s.block_due[0][t % bt]
    )
    s.advance_decode(0, steps)
    assert sorted(log) == want
    for t, _, rid, ctx_tok in log:  # the crossing: the held blocks are full before step t
        assert (held[rid] + t - off) % bt == 0 and ctx_tok == held[rid] + 1 + t - off
    assert s.steps[0] == off + steps
    assert all(s.num_computed_tokens(0, r) == held[r] + steps for r in range(len(held)))
