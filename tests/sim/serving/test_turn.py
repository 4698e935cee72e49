"""The replica's batch formation and KV-growth bookkeeping against what they promise, on random
batches: :func:`sim.serving.turn.form_batch` (the greedy prefix of prompts within the token
budget), :func:`sim.serving.replicakv.start_decoding` (a decoding sequence sits in the residue bucket
of exactly the steps at which its context crosses a block boundary),
:func:`sim.serving.replicakv.fit_steps` (its shortcut never grants a step whose blocks are not free,
and it grants every step that fits) and :func:`sim.serving.replicakv.grow_steps` (one block per
boundary crossing, nothing else)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from sim.serving.replicakv import fit_steps, grow_steps, start_decoding
from sim.serving.turn import form_batch

_PROMPTS = st.lists(st.tuples(st.integers(1, 600), st.integers(0, 2000)), max_size=8)


def _node(chunked: bool) -> Any:
    return SimpleNamespace(chunked=chunked)


def _budgets(prompts: list[tuple[int, int]]) -> st.SearchStrategy[int]:
    """Any budget, or one at (or one token off) the end of a prefix of the prompts."""
    ends = [sum(left for left, _ in prompts[:j]) for j in range(1, len(prompts) + 1)]
    edges = sorted({e + d for e in ends for d in (-1, 0, 1)})
    return st.one_of(st.integers(-5, 2048), st.sampled_from(edges)) if edges else st.integers(-5, 9)


@settings(max_examples=400, deadline=None)
@given(_PROMPTS, st.data(), st.booleans())
def test_form_batch_takes_a_greedy_prefix_within_the_budget(
    prompts: list[tuple[int, int]], data: st.DataObject, chunked: bool
) -> None:
    budget = data.draw(_budgets(prompts), label="budget")
    pf = [[rid, left, done] for rid, (left, done) in enumerate(prompts)]
    ptok, sq, ends, chunks = form_batch(_node(chunked), SimpleNamespace(is_cnn=False), pf, budget)
    assert [e[0] for e, _ in chunks] == list(range(len(chunks)))  # a prefix, in order
    assert all(e is pf[i] for i, (e, _) in enumerate(chunks))
    assert ptok == sum(c for _, c in chunks)
    assert sq == sum(c * c + 2.0 * c * e[2] for e, c in chunks)
    assert ends == [e for e, c in chunks if c == e[1]]
    assert pf == [[rid, left, done] for rid, (left, done) in enumerate(prompts)]  # reads only
    sizes = [c for _, c in chunks]
    if budget <= 0:
        assert chunks == []
        return
    if not prompts:
        assert chunks == []
        return
    assert chunks, "a positive budget always runs the first prompt (or a chunk of it)"
    rest = prompts[len(chunks) :]
    if chunked:
        assert all(c >= 1 for c in sizes)
        assert sum(sizes) <= budget
        assert all(c == e[1] for e, c in chunks[:-1])  # only the last one may be cut
        if rest or (chunks and chunks[-1][1] < chunks[-1][0][1]):
            assert sum(sizes) == budget  # prompts wait only when the budget is used up
    else:
        assert all(c == e[1] for e, c in chunks)  # whole prompts
        assert sum(sizes[1:]) <= budget - sizes[0] or len(sizes) == 1
        if rest:  # the next prompt waits only when it does not fit in what is left
            assert rest[0][0] > budget - sum(sizes)


@settings(max_examples=200, deadline=None)
@given(_PROMPTS.filter(bool), st.data(), st.booleans())
def test_form_batch_runs_whole_samples_for_a_cnn(
    prompts: list[tuple[int, int]], data: st.DataObject, chunked: bool
) -> None:
    budget = data.draw(_budgets(prompts).filter(lambda b: b > 0), label="budget")
    pf = [[rid, left, done] for rid, (left, done) in enumerate(prompts)]
    _, _, ends, chunks = form_batch(_node(chunked), SimpleNamespace(is_cnn=True), pf, budget)
    assert all(c == e[1] for e, c in chunks) and ends == [e for e, _ in chunks]
    sizes = [c for _, c in chunks]
    assert sum(sizes[:-1]) < budget  # a sample starts only while budget is left
    if len(chunks) < len(pf) and chunked:
        assert sum(sizes) >= budget


def _kv_node(bt: int, bpt: int, free: int = 0) -> Any:
    grown: list[tuple[int, list[tuple[int, int, int]], int]] = []
    kv = SimpleNamespace(
        block_tokens=bt,
        free_blocks=lambda _bpt: free,
        grow=lambda m, items, b: grown.append((m, list(items), b)),
        grow_at=lambda m, rids, base, s, b: grown.append(
            (m, [(r, base[r] + s, s) for r in rids], b)
        ),
    )
    return SimpleNamespace(
        kv=kv,
        grown=grown,
        ctx=SimpleNamespace(models=[SimpleNamespace(kv_bytes_per_token=bpt)]),
        b_n=[0],
        b_base=[0.0],
        b_heap=[[]],
        _res=[[{} for _ in range(bt)]],
        _lag=[[]],
        _base_of={},
        _life={},
        _out=[],
    )


_SEQS = st.lists(st.integers(1, 300), min_size=1, max_size=12)  # KV tokens held per sequence


@settings(max_examples=200, deadline=None)
@given(_SEQS, st.integers(1, 20), st.integers(0, 50))
def test_a_decoding_sequence_is_due_a_block_exactly_when_its_context_crosses_one(
    held: list[int], bt: int, off: int
) -> None:
    node = _kv_node(bt, bpt=8)
    for rid, kv_tok in enumerate(held):
        node._life[rid] = rid + 1
        node._out.append(1000)
        start_decoding(node, 0, rid, off, kv_tok, gen=1)
    assert node.b_n[0] == len(held)
    for rid, kv_tok in enumerate(held):
        due = {s for s in range(off, off + 3 * bt) if rid in node._res[0][s % bt]}
        # step s writes token kv_tok + 1 + (s - off); a new block when the held ones are full
        need = {s for s in range(off, off + 3 * bt) if (kv_tok + s - off) % bt == 0}
        assert due == need
        assert sum(rid in bucket for bucket in node._res[0]) == 1


def _decoding(node: Any, held: list[int], off: int) -> None:
    for rid, kv_tok in enumerate(held):
        node._life[rid] = rid + 1
        node._out.append(1000)
        start_decoding(node, 0, rid, off, kv_tok, gen=1)


def _blocks_for(node: Any, lo: int, hi: int) -> int:
    bt = node.kv.block_tokens
    return sum(len(node._res[0][s % bt]) for s in range(lo, hi))


@settings(max_examples=300, deadline=None)
@given(_SEQS, st.integers(1, 20), st.integers(0, 40), st.integers(0, 80), st.integers(0, 40))
def test_fit_steps_grants_the_longest_run_of_steps_whose_blocks_are_free(
    held: list[int], bt: int, off: int, k: int, free: int
) -> None:
    node = _kv_node(bt, bpt=8, free=free)
    _decoding(node, held, off)
    j = fit_steps(node, 0, off, k)
    if k <= 1:
        assert j == k
        return
    assert 1 <= j <= k
    assert _blocks_for(node, off + 1, off + j) <= free  # the steps granted fit
    if j < k:
        assert _blocks_for(node, off + 1, off + j + 1) > free  # one more would not
    assert node.grown == []  # reads only


@settings(max_examples=200, deadline=None)
@given(_SEQS, st.integers(1, 20), st.integers(0, 40), st.integers(-3, 70))
def test_grow_steps_takes_one_block_per_boundary_crossing(
    held: list[int], bt: int, off: int, span: int
) -> None:
    node = _kv_node(bt, bpt=8)
    _decoding(node, held, off)
    lo, hi = off + 1, off + 1 + span
    grow_steps(node, 0, lo, hi)
    want = sorted(
        (rid, node._base_of[rid] + s, s) for s in range(lo, hi) for rid in node._res[0][s % bt]
    )
    got = sorted(item for _, items, _ in node.grown for item in items)
    assert got == want
    assert len(node.grown) <= 1  # one bulk call
    for rid, ctx_tok, s in got:  # the crossing: the held blocks are full before step s
        assert (held[rid] + s - off) % bt == 0 and ctx_tok == held[rid] + 1 + s - off


def test_grow_steps_takes_nothing_for_a_model_without_kv() -> None:
    node = _kv_node(4, bpt=0)
    node._res[0][1][7] = None
    node._base_of[7] = 0
    grow_steps(node, 0, 0, 10)
    assert node.grown == []
