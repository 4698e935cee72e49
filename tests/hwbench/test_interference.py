"""Copy/compute interference: the fit inverts the simulator, and the hook only slows streaming."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hwbench.interference import (
    H_KEYS,
    H_MAX,
    KEY,
    KEY_PREFILL,
    KEY_WAKE,
    S_GRID,
    S_MAX,
    Interference,
    KindBusy,
    fit_terms,
    interference_of,
    layer_time,
    overhead_of,
)
from hwbench.validate import run_simulator
from hwbench.workloads import ValidationWorkload
from sim.costmodel import Profile, load_profile

Triple = tuple[float, float, float]


def _linear(
    base: Triple, overlap: Triple, count: Triple, cross: float = 0.0
) -> Callable[[Interference, Interference], KindBusy]:
    """Reference simulator of one run: each kind's busy seconds are its base plus ``s`` times
    its overlap plus ``h`` times its iteration count, and ``cross`` times the other kinds'
    extra (timing moves batches a little)."""

    def sim(s: Interference, h: Interference) -> KindBusy:
        extra = [s[k] * overlap[k] + h[k] * count[k] for k in range(3)]
        busy = [base[k] + extra[k] + cross * (sum(extra) - extra[k]) for k in range(3)]
        return KindBusy(busy, list(overlap), list(count))

    return sim


def _triples(lo: float, hi: float) -> st.SearchStrategy[Triple]:
    return st.tuples(st.floats(lo, hi), st.floats(lo, hi), st.floats(lo, hi))


@settings(deadline=None)
@given(
    s_true=st.sampled_from(list(S_GRID)),
    h_true=_triples(0.0, H_MAX),
    base=_triples(0.1, 10.0),
    overlap=_triples(0.05, 2.0),
    count=_triples(10.0, 500.0),
    spread=st.floats(1.5, 3.0),
)
def test_fit_terms_recovers_the_factor_and_every_overhead(
    s_true: float, h_true: Triple, base: Triple, overlap: Triple, count: Triple, spread: float
) -> None:
    """Two runs whose prompt-admitting iterations overlap more copy in one (as LRU-K's 30 MB
    per iteration against LRU's 20) tell the factor from the overheads; the fit gives all
    back (the factor on its 0.01 grid)."""
    more = (overlap[0], overlap[1] * spread, overlap[2] * spread)
    runs = [_linear(base, overlap, count), _linear(base, more, count)]
    s0, h0 = Interference(s_true, s_true, s_true), Interference(*h_true)
    targets = [r(s0, h0).kinds() for r in runs]
    s, h = fit_terms(targets, runs, rounds=1)
    assert s == s0
    for k in range(3):
        assert h[k] == pytest.approx(h_true[k], abs=1e-9)


def test_fit_terms_clamps_keeps_kinds_without_iterations_and_checks_its_input() -> None:
    run = _linear((1.0, 1.0, 1.0), (1.0, 1.0, 1.0), (10.0, 10.0, 0.0))
    # decodes faster than with no interference at all, prefills far slower than the range
    s, h = fit_terms([(0.5, 1e3, 1.0)], [run])
    assert s == (0.0, 0.0, 0.0)
    assert h.decode == 0.0 and h.prefill == H_MAX
    assert h.wake == 0.0  # no streamed iteration of that kind
    with pytest.raises(ValueError):
        fit_terms([(-1.0, 1.0, 1.0)], [run])
    with pytest.raises(ValueError):
        fit_terms([(1.0, 1.0, 1.0)], [run, run])
    with pytest.raises(ValueError):
        fit_terms([(1.0, 1.0, 1.0)], [run], rounds=-1)


def test_fit_terms_returns_the_best_terms_it_evaluated() -> None:
    """A reference that triples its busy seconds in every second call (noise): the fit
    still returns terms it evaluated, those of smallest error."""
    calls: list[tuple[Interference, Interference]] = []
    good = _linear((1.0, 1.0, 1.0), (1.0, 2.0, 3.0), (10.0, 10.0, 10.0))

    def noisy(s: Interference, h: Interference) -> KindBusy:
        calls.append((s, h))
        out = good(s, h)
        if len(calls) % 2 == 0:
            out.busy = [b * 3.0 for b in out.busy]
        return out

    def err(c: tuple[Interference, Interference]) -> float:
        return sum((b / 2.0 - 1.0) ** 2 for b in good(*c).busy)

    s, h = fit_terms([(2.0, 2.0, 2.0)], [noisy], rounds=3)
    assert (s, h) in calls[::2]
    assert err((s, h)) == pytest.approx(min(err(c) for c in calls[::2]))


@given(
    c=st.floats(0.0, 1.0),
    x=st.floats(0.0, 1.0),
    s=st.floats(0.0, S_MAX),
)
def test_layer_time_runs_from_parallel_to_serial(c: float, x: float, s: float) -> None:
    """s = 0: copy and compute overlap fully; s = 1: they take turns (C + X), whichever is
    longer; the time grows with s and never undercuts the longer of the two."""
    assert layer_time(c, x, 0.0) == max(c, x)
    assert layer_time(c, x, 1.0) == pytest.approx(c + x)
    assert layer_time(c, x, s) >= max(c, x)
    assert layer_time(c, x, s) == pytest.approx(layer_time(x, c, s))  # symmetric
    assert layer_time(c, x, s) <= layer_time(c, x, s + 0.5)


def _profile(
    s: float | None,
    s_prefill: float | None = None,
    s_wake: float | None = None,
    h: Triple | None = None,
) -> Profile:
    prof = load_profile("a100-80gb")
    fitted = dict(prof.fitted)
    fit: dict[str, float] = {"attn_per_token_s": 4e-7}
    if s is not None:
        fit[KEY] = s
    if s_prefill is not None:
        fit[KEY_PREFILL] = s_prefill
    if s_wake is not None:
        fit[KEY_WAKE] = s_wake
    if h is not None:
        fit.update(zip(H_KEYS, h, strict=True))
    fitted["engine_fit"] = [fit]
    gpu = prof.gpu.model_copy(update={"per_layer_overhead_s": 3e-4})
    # a slow copy path, so a layer's copy and compute are of the same order
    links = prof.links.model_copy(
        update={"pcie": prof.links.pcie.model_copy(update={"bandwidth": 5e9})}
    )
    return prof.model_copy(update={"fitted": fitted, "gpu": gpu, "links": links})


def test_datasheet_profiles_have_no_interference() -> None:
    assert interference_of(load_profile("h200-sxm")) == (0.0, 0.0, 0.0)
    assert interference_of(_profile(None)) == (0.0, 0.0, 0.0)
    # one factor serves every kind unless the prefill one is given; wake defaults to prefill
    assert interference_of(_profile(0.7)) == Interference(0.7, 0.7, 0.7)
    assert interference_of(_profile(0.7, 1.4)) == Interference(0.7, 1.4, 1.4)
    assert interference_of(_profile(0.7, 1.4, 2.1)) == Interference(0.7, 1.4, 2.1)
    assert overhead_of(_profile(0.7)) == (0.0, 0.0, 0.0)
    assert overhead_of(_profile(0.7, h=(1e-3, 2e-3, 3e-3))) == (1e-3, 2e-3, 3e-3)
    assert Interference.of(0.5) == (0.5, 0.5, 0.5)
    assert Interference.of((0.5, 1.0)) == (0.5, 1.0, 1.0)
    with pytest.raises(ValueError):
        Interference.of((0.5, 1.0, 1.5, 2.0))


def _latency(
    w: ValidationWorkload, prof: Profile, tmp: Path, s: float | None
) -> tuple[np.ndarray, np.ndarray]:
    df, hits, _, _, _ = run_simulator(w, prof, tmp, interference=s)
    return (df["end"] - df["arrival"]).to_numpy(dtype=float), hits


def test_interference_slows_streaming_only_and_keeps_cache_decisions(tmp_path: Path) -> None:
    stream = ValidationWorkload("s", "stream", requests=6, rate=20.0, hbm_fraction=0.6, seed=3)
    resident = ValidationWorkload("r", "resident", requests=6, rate=20.0, seed=3)
    prof = _profile(None)
    base, hits0 = _latency(stream, prof, tmp_path, 0.0)
    lat = [base]
    for s in (0.5, 1.5):
        x, hits = _latency(stream, prof, tmp_path, s)
        # same cache decisions (hit rates); slower iterations batch differently, so counts move
        np.testing.assert_allclose(hits / hits.sum(), hits0 / hits0.sum(), atol=0.01)
        lat.append(x)
    assert lat[0].mean() < lat[1].mean() < lat[2].mean()
    # the profile's own factor is used by default
    x, _ = _latency(stream, _profile(0.5), tmp_path, None)
    np.testing.assert_allclose(x, lat[1])
    # nothing streams: the factor changes nothing
    r0, _ = _latency(resident, prof, tmp_path, 0.0)
    r1, _ = _latency(resident, prof, tmp_path, 1.5)
    np.testing.assert_array_equal(r0, r1)


def _kinds(
    w: ValidationWorkload, prof: Profile, tmp: Path, s: Triple, h: Triple = (0.0, 0.0, 0.0)
) -> Triple:
    kb = KindBusy()
    cl = run_simulator(w, prof, tmp, interference=s, overhead=h, busy=kb)[4]
    # every iteration streams, so the three kinds make up the whole busy time
    assert sum(kb.kinds()) == pytest.approx(cl.ctx.metrics.busy, rel=1e-9)
    # one prefill after idle, one back to back, the decode steps of both requests
    assert kb.count[1:] == [1.0, 1.0] and kb.count[0] >= 8
    return kb.kinds()


def test_each_term_slows_only_its_own_kind_of_iteration(tmp_path: Path) -> None:
    """Two requests 0.1 ms apart: the first wakes the idle node (an iteration after idle),
    the second arrives during it and is admitted back to back with the first's decode, then
    both decode; the batches are the same whatever the terms, so each kind's busy time
    moves with its own factor and overhead only, the overhead by exactly its seconds per
    iteration."""
    w = ValidationWorkload(
        "two", "two requests", requests=2, rate=1e4, hbm_fraction=0.6, output_low=8, seed=4
    )
    prof = _profile(None)
    base = _kinds(w, prof, tmp_path, (0.0, 0.0, 0.0))
    assert min(base) > 0
    kb = KindBusy()
    run_simulator(w, prof, tmp_path, interference=0.0, busy=kb)
    decodes = kb.count[0]
    for kind in range(3):
        s = [0.0, 0.0, 0.0]
        s[kind] = 1.5
        got = _kinds(w, prof, tmp_path, (s[0], s[1], s[2]))
        h = [0.0, 0.0, 0.0]
        h[kind] = 2e-3
        with_h = _kinds(w, prof, tmp_path, (0.0, 0.0, 0.0), (h[0], h[1], h[2]))
        count = decodes if kind == 0 else 1.0
        for other in range(3):
            if other == kind:
                assert got[other] > base[other] * 1.01
                assert with_h[other] == pytest.approx(base[other] + count * 2e-3, rel=1e-9)
            else:
                assert got[other] == pytest.approx(base[other], rel=1e-9)
                assert with_h[other] == pytest.approx(base[other], rel=1e-9)
