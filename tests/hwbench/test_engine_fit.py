"""The engine's own terms: priced by the op cost model, fitted with the op tables fixed,
impossible fits rejected; measured op tables against simple references."""

from __future__ import annotations

import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.runtime.engine import IterationRecord
from hwbench.engine_fit import (
    ENGINE_SHAPE,
    MAX_FIT_ERROR,
    ImpossibleFit,
    fit_engine_terms,
    op_ratios,
    with_engine,
)
from hwbench.engine_probe import PassPoint, ProbeRun, StreamProbe
from hwbench.opprobe import OpGrid, gemm_table, origin, weight_pool
from hwbench.probes import Measurement
from hwbench.profile import CEILINGS, check_profile
from hwbench.validate import decoder_config, sim_catalogue
from sim.serving.costmodel import CostModel, Profile, load_profile
from sim.serving.opcost import EngineTerms, GemmTable, Grid3, OpCostModel, OpsProfile, TableOrigin

SPEC = sim_catalogue(decoder_config())[decoder_config().name]
ORIGIN = TableOrigin(device="cpu", framework="numpy", measured_at="2026-12-01", source="test")


def base_profile() -> Profile:
    """A datasheet profile with an (empty) ops section: every op priced by the roofline."""
    return load_profile("a100-80gb").model_copy(update={"ops": OpsProfile()})


def shapes() -> list[tuple[int, int, int, int, int]]:
    """(prefill tokens, prompts, sq, decode batch, context) of calibration-like iterations."""
    out = []
    for tokens, prompts in ((0, 0), (64, 1), (256, 1), (256, 4), (512, 2)):
        for batch, ctx in ((0, 0), (1, 100), (4, 900), (16, 3000)):
            if tokens or batch:
                sq = tokens * tokens // max(prompts, 1)
                out.append((tokens, prompts, sq, batch, ctx))
    return out


def points(
    a: float, b: float = 0.0, noise: float = 0.0, ops_scale: float = 1.0, per_tok: float = 0.0
) -> list[PassPoint]:
    """Iterations whose times are the op model's for the engine's shape, its ops taking
    ``ops_scale`` times the tables' seconds, with overhead ``a`` per iteration, ``b`` per
    layer and part and ``per_tok`` per prompt token (and a multiplicative ``noise``
    alternating in sign), each with the overhead an in-place measurement sees."""
    zero = OpCostModel(with_engine(base_profile(), EngineTerms(**ENGINE_SHAPE), 0.0), SPEC)
    out = []
    for i, (tok, pr, sq, batch, ctx) in enumerate(shapes()):
        ovh = a + b * SPEC.n_layers * ((tok > 0) + (batch > 0)) + per_tok * tok
        t = ops_scale * zero.iteration_time(tok, sq, pr, batch, float(ctx)) + ovh
        t *= 1.0 + noise * (-1) ** i
        out.append(
            PassPoint(
                tok, batch, ctx, t, 3, prompts=max(pr, 1), sq_tokens=float(sq),
                overhead_s=ovh, overhead_count=3,
            )
        )  # fmt: skip
    return out


def probe(rate: float) -> StreamProbe:
    return StreamProbe(rate, ())


def test_split_iteration_is_a_prefill_part_plus_a_decode_part() -> None:
    """``fused_iterations: false``: a mixed iteration costs its prefill-only iteration plus
    its decode-only one, the iteration overhead once; each part pays the per-layer overhead
    on every layer (embedding and lm_head included)."""
    terms = EngineTerms(fused_iterations=False, layer_overhead_s=1e-4)
    cost = OpCostModel(with_engine(base_profile(), terms, 5e-4), SPEC)
    pre = cost.iteration_time(128, 128 * 128, 1, 0, 0.0)
    dec = cost.iteration_time(0, 0, 0, 4, 600.0)
    assert cost.iteration_time(128, 128 * 128, 1, 4, 600.0) == pytest.approx(pre + dec - 5e-4)
    ops = cost.iteration_ops(128, 128 * 128, 1, 4, 600.0)
    assert ops["layer_overhead"] == pytest.approx(2 * SPEC.n_layers * 1e-4)
    assert ops["iteration_overhead"] == pytest.approx(5e-4)
    assert sum(ops.values()) == pytest.approx(cost.iteration_time(128, 128 * 128, 1, 4, 600.0))
    fused = OpCostModel(with_engine(base_profile(), EngineTerms(), 5e-4), SPEC)
    assert fused.iteration_time(128, 128 * 128, 1, 4, 600.0) < pre + dec


@settings(max_examples=40, deadline=None)
@given(
    st.integers(0, 600), st.integers(0, 32), st.floats(0, 4000), st.floats(0, 1e-3),
    st.floats(0, 1e-2), st.floats(0, 1e-5),
)  # fmt: skip
def test_engine_overheads_add_linearly(
    tokens: int, batch: int, ctx: float, layer_s: float, iter_s: float, tok_s: float
) -> None:
    """Against a reference: the op sum without overheads, plus ``iter_s`` once, ``layer_s``
    per layer call of each part that runs and ``tok_s`` per prompt token; the breakdown
    sums to the same."""
    if tokens == 0 and batch == 0:
        return
    zero = OpCostModel(with_engine(base_profile(), EngineTerms(fused_iterations=False), 0.0), SPEC)
    terms = EngineTerms(
        fused_iterations=False, layer_overhead_s=layer_s, prompt_overhead_s_per_token=tok_s
    )
    cost = OpCostModel(with_engine(base_profile(), terms, iter_s), SPEC)
    parts = (tokens > 0) + (batch > 0)
    ctx = ctx if batch else 0.0
    args = (tokens, tokens * tokens, 1 if tokens else 0, batch, ctx)
    want = zero.iteration_time(*args)
    want += iter_s + layer_s * SPEC.n_layers * parts + tok_s * tokens
    assert cost.iteration_time(*args) == pytest.approx(want, rel=1e-9, abs=1e-15)
    assert sum(cost.iteration_ops(*args).values()) == pytest.approx(want, rel=1e-9, abs=1e-15)
    assert cost.iteration_ops(*args)["prompt_overhead"] == pytest.approx(tok_s * tokens)


def test_the_overhead_is_the_measured_one() -> None:
    """Iterations that are the tables' ops plus 0.4 ms: the measured overhead is the term,
    least squares agrees and the error is nil."""
    prof, report = fit_engine_terms(base_profile(), SPEC, points(4e-4), probe(1e9))
    assert prof.ops is not None and prof.ops.engine is not None
    assert prof.ops.roofline.iteration_overhead_s == pytest.approx(4e-4, rel=1e-9)
    assert report["raw_iteration_overhead_s"] == pytest.approx(4e-4, rel=1e-6)
    # the decode iterations' mean (3 iterations of each decode-only shape)
    assert report["overhead_iterations"] == 3 * sum(1 for sh in shapes() if sh[0] == 0)
    # no prompt cost beyond the tables: a slope of rounding residue (1e-23 s/token)
    assert prof.ops.engine.prompt_overhead_s_per_token == pytest.approx(0.0, abs=1e-15)
    assert prof.ops.engine.layer_overhead_s == 0.0  # not identifiable: same layers throughout
    assert not prof.ops.engine.fused_iterations and prof.ops.engine.split_projections
    assert report["rms_rel_error"] < 1e-9
    assert report["raw_part_overhead_s"] == pytest.approx(0.0, abs=1e-9)
    assert report["ops_share"] < 1.0
    # measured hardware terms are inputs: the fit leaves them as they were
    assert prof.gpu == base_profile().gpu and prof.links.nvme == base_profile().links.nvme


def test_op_tables_that_miss_time_do_not_move_the_overhead() -> None:
    """Ops 10% slower in the engine than the tables say: the measured overhead stays the
    engine's 0.4 ms (least squares would have absorbed the tables' miss into it), and the
    report's error shows the miss."""
    prof, report = fit_engine_terms(base_profile(), SPEC, points(4e-4, ops_scale=1.1), probe(1e9))
    assert prof.ops is not None
    assert prof.ops.roofline.iteration_overhead_s == pytest.approx(4e-4, rel=1e-9)
    assert report["raw_iteration_overhead_s"] > 4.2e-4
    assert 0.01 < report["rms_rel_error"] < 0.1


def test_overhead_per_prompt_token_is_the_slope_over_the_decode_mean() -> None:
    """Overheads of 0.4 ms plus 2 us per prompt token: the term is the decode iterations'
    0.4 ms, the per-token term 2 us, the error nil; the simulator's price of a 256-token
    prefill then carries 0.4 ms + 256 x 2 us of overhead."""
    pts = points(4e-4, per_tok=2e-6)
    prof, report = fit_engine_terms(base_profile(), SPEC, pts, probe(1e9))
    assert prof.ops is not None and prof.ops.engine is not None
    assert prof.ops.roofline.iteration_overhead_s == pytest.approx(4e-4, rel=1e-9)
    assert prof.ops.engine.prompt_overhead_s_per_token == pytest.approx(2e-6, rel=1e-9)
    assert report["prompt_overhead_s_per_token"] == pytest.approx(2e-6, rel=1e-9)
    assert report["prompt_overhead_iterations"] == 3 * sum(1 for sh in shapes() if sh[0] > 0)
    assert report["rms_rel_error"] < 1e-9
    ops = OpCostModel(prof, SPEC).iteration_ops(256, 256 * 256, 1, 0, 0.0)
    assert ops["prompt_overhead"] == pytest.approx(256 * 2e-6, rel=1e-9)
    assert ops["iteration_overhead"] == pytest.approx(4e-4, rel=1e-9)
    # without the per-token term the same points' prefills are priced short
    no_tok = prof.ops.engine.model_copy(update={"prompt_overhead_s_per_token": 0.0})
    flat = with_engine(prof, no_tok, 4e-4)
    p = next(p for p in pts if p.tokens == 512 and p.batch == 0)
    assert OpCostModel(flat, SPEC).iteration_time(512, round(p.sq), 2, 0, 0.0) < p.mean_s - 1e-3


def test_a_prompt_overhead_below_the_decode_mean_is_floored_at_zero() -> None:
    """Prompt-carrying iterations shorter than their ops plus the decodes' overhead: no
    negative per-token term."""
    pts = [replace(p, mean_s=p.mean_s - 1e-4) if p.tokens else p for p in points(4e-4)]
    prof, _ = fit_engine_terms(base_profile(), SPEC, pts, probe(1e9))
    assert prof.ops is not None and prof.ops.engine is not None
    assert prof.ops.engine.prompt_overhead_s_per_token == 0.0


def test_prompt_ops_slower_than_their_tables_go_to_the_per_token_term() -> None:
    """Iterations whose prompt tokens each cost 3 us more than the tables price, none of it
    outside the timed ops (the in-place overheads are the decodes' 0.4 ms): the per-token
    term is those 3 us, the iteration overhead stays the measured 0.4 ms, the error nil."""
    pts = points(4e-4)
    slow = [replace(p, mean_s=p.mean_s + 3e-6 * p.tokens) for p in pts]
    prof, report = fit_engine_terms(base_profile(), SPEC, slow, probe(1e9))
    assert prof.ops is not None and prof.ops.engine is not None
    assert prof.ops.roofline.iteration_overhead_s == pytest.approx(4e-4, rel=1e-9)
    assert prof.ops.engine.prompt_overhead_s_per_token == pytest.approx(3e-6, rel=1e-6)
    assert report["rms_rel_error"] < 1e-6


def test_points_without_a_measured_overhead_are_rejected() -> None:
    bare = [replace(p, overhead_s=None, overhead_count=0) for p in points(4e-4)]
    with pytest.raises(ImpossibleFit, match="no iteration overhead"):
        fit_engine_terms(base_profile(), SPEC, bare, probe(1e9))


def test_fit_rejects_a_negative_overhead() -> None:
    """A negative measured overhead (the timer's own cost not taken out): impossible."""
    with pytest.raises(ImpossibleFit, match=r"iteration_overhead_s .* negative or near zero"):
        fit_engine_terms(base_profile(), SPEC, points(-2e-4), probe(1e9))


def test_a_per_part_overhead_shows_in_the_report_not_in_the_terms() -> None:
    """Iterations that did pay an overhead per layer and part: the term is its measured
    mean per iteration, and the two-term solution in the report recovers the share."""
    prof, report = fit_engine_terms(base_profile(), SPEC, points(4e-4, 5e-5), probe(1e9))
    assert report["raw_part_overhead_s"] == pytest.approx(5e-5, rel=1e-6)
    assert prof.ops is not None
    lo, hi = 4e-4 + 5e-5 * SPEC.n_layers, 4e-4 + 2 * 5e-5 * SPEC.n_layers
    assert lo <= prof.ops.roofline.iteration_overhead_s <= hi


def test_fit_rejects_a_fit_error_over_the_threshold() -> None:
    noisy = points(4e-3, noise=2 * MAX_FIT_ERROR)
    with pytest.raises(ImpossibleFit, match=r"iteration error .* over") as err:
        fit_engine_terms(base_profile(), SPEC, noisy, probe(1e9))
    # the message names the worst iteration shape, one of the probe's
    shapes = {f"at {p.tokens} prompt tokens and {p.batch} decodes of" for p in noisy}
    assert any(s in str(err.value) for s in shapes) and "op tables cover" in str(err.value)


def test_copy_contention_and_a_copy_rate_above_the_link() -> None:
    link = base_profile().links.pcie.bandwidth
    prof, _ = fit_engine_terms(base_profile(), SPEC, points(4e-4), probe(link / 2.5))
    assert prof.ops is not None and prof.ops.engine is not None
    assert prof.ops.engine.copy_contention == pytest.approx(1.5)
    with pytest.raises(ImpossibleFit, match="above the host->device link"):
        fit_engine_terms(base_profile(), SPEC, points(4e-4), probe(link * 1.5))
    # chunk copies the link probe itself timed at 2x the link (cache-resident): the engine's
    # copies at 1.5x are possible (no contention), at 2.5x not
    fast = {"bytes": 4.0 * 2**20, "min_s": 4.0 * 2**20 / (2 * link), "median_s": 1.0}
    small = {"bytes": 4096.0, "min_s": 4096.0 / (100 * link), "median_s": 1.0}  # not a chunk
    cached = base_profile().model_copy(update={"fitted": {"copy_host_to_device": [fast, small]}})
    prof, _ = fit_engine_terms(cached, SPEC, points(4e-4), probe(link * 1.5))
    assert prof.ops is not None and prof.ops.engine is not None
    assert prof.ops.engine.copy_contention == 0.0
    with pytest.raises(ImpossibleFit, match="fastest probe copy"):
        fit_engine_terms(cached, SPEC, points(4e-4), probe(link * 2.5))


def test_simulator_runs_weight_copies_slower_by_the_contention(tmp_path: Path) -> None:
    """The cluster's host->device link of a profile with ``copy_contention`` c carries
    1 / (1 + c) of the link's bandwidth; without engine terms, all of it."""
    from sim.cluster import build
    from sim.scenario import validate as validate_scenario

    sc = validate_scenario({"name": "t", "deployments": [{"model": "llama-2-7b"}]})
    from sim.serving.models import load_catalogue

    cat = load_catalogue()
    prof = load_profile(sc.profile)
    plain = build(sc, 0, cat, prof, CostModel)
    slow = with_engine(
        prof.model_copy(update={"ops": OpsProfile()}), EngineTerms(copy_contention=1.5), 0.0
    )
    cl = build(sc, 0, cat, slow, CostModel)
    bw0 = plain.ctx.nodes[0].ws.links["pcie"].bandwidth
    assert cl.ctx.nodes[0].ws.links["pcie"].bandwidth == pytest.approx(bw0 / 2.5)


def _records(cost: OpCostModel, scale: float, wait: float) -> tuple[IterationRecord, ...]:
    """Back-to-back iterations of :func:`shapes` taking ``scale`` times the model's price
    plus ``wait`` seconds of parameter wait."""
    out, t = [], 0.0
    for tok, pr, sq, batch, ctx in shapes():
        secs = scale * cost.iteration_time(tok, sq, pr, batch, float(ctx)) + wait
        out.append(IterationRecord(t, secs, pr, tok, sq, batch, ctx, wait))
        t += secs
    return tuple(out)


def test_prefetch_terms_are_the_streamed_compute_per_byte_and_the_job_lag() -> None:
    """Resident twins at 1.1x the model's price; streamed iterations at the same 1.1x plus
    parameter wait plus 2 ms each of compute lost, one 1 MB prefetch job per iteration (and
    0.5 MB of demand reads, which do not dilute it): 2 ns per prefetched byte. Prefetch jobs
    taking 0.4 ms (+-10 us) more than their bytes at the copy thread's rate: their mean lag
    is the hand-off. Streamed iterations no slower than their twins: both 0 (floored)."""
    base = points(4e-4)
    prof, _ = fit_engine_terms(base_profile(), SPEC, base, probe(1e9))
    cost = OpCostModel(prof, SPEC)
    resident = _records(cost, 1.1, 0.0)
    n = len(resident)
    rate = 5e9
    jobs = tuple((1e6 / rate + 4e-4 + 1e-5 * (-1) ** i, 1_000_000) for i in range(n))
    streamed = tuple(
        r._replace(seconds=r.seconds + 3e-3 + 2e-3, param_wait=3e-3)
        for r in _records(cost, 1.1, 0.0)
    )
    run = ProbeRun(None, streamed, None, resident, n * 1_500_000, rate, jobs)
    assert run.prefetched_bytes == n * 1_000_000
    fitted, _ = fit_engine_terms(base_profile(), SPEC, base, StreamProbe(1e9, (run,)))
    assert fitted.ops is not None and fitted.ops.engine is not None
    assert fitted.ops.engine.prefetch_compute_s_per_byte == pytest.approx(2e-9, rel=1e-6)
    lag = 4e-4 + 1e-5 * sum((-1) ** i for i in range(n)) / n
    assert fitted.ops.engine.prefetch_handoff_s == pytest.approx(lag, rel=1e-9)
    fast = tuple((1e6 / rate * 0.5, 1_000_000) for _ in range(3))
    twin = ProbeRun(None, _records(cost, 0.9, 1e-3), None, resident, n * 1_000_000, rate, fast)
    fitted, _ = fit_engine_terms(base_profile(), SPEC, base, StreamProbe(1e9, (twin,)))
    assert fitted.ops is not None and fitted.ops.engine is not None
    assert fitted.ops.engine.prefetch_compute_s_per_byte == 0.0
    assert fitted.ops.engine.prefetch_handoff_s == 0.0


def test_prefetch_compute_is_measured_per_weight_cache_size() -> None:
    """Runs at two weight caches losing 1 and 3 ns of compute per prefetched byte: knots
    (cache bytes, s/B) at both, the single figure their byte-weighted mean; one cache size
    gives no knots."""
    base = points(4e-4)
    prof, _ = fit_engine_terms(base_profile(), SPEC, base, probe(1e9))
    cost = OpCostModel(prof, SPEC)
    resident = _records(cost, 1.0, 0.0)
    n = len(resident)

    def run(pool: int, ns: float) -> ProbeRun:
        lost = ns * 1e-9 * 1_000_000  # per iteration, 1 MB prefetched each
        streamed = tuple(
            r._replace(seconds=r.seconds + 1e-3 + lost, param_wait=1e-3) for r in resident
        )
        jobs = tuple((1e-3, 1_000_000) for _ in range(n))
        return ProbeRun(None, streamed, None, resident, n * 1_000_000, 5e9, jobs, pool)

    runs = (run(4_000_000, 1.0), run(12_000_000, 3.0), run(4_000_000, 1.0))
    fitted, _ = fit_engine_terms(base_profile(), SPEC, base, StreamProbe(1e9, runs))
    assert fitted.ops is not None and fitted.ops.engine is not None
    eng = fitted.ops.engine
    assert [x for x, _ in eng.prefetch_compute_knots] == [4e6, 12e6]
    assert [y for _, y in eng.prefetch_compute_knots] == pytest.approx([1e-9, 3e-9], rel=1e-6)
    assert eng.prefetch_compute_s_per_byte == pytest.approx(5e-9 / 3, rel=1e-6)
    # interpolated between the knots, clamped beyond them
    assert eng.prefetch_per_byte(8e6) == pytest.approx(2e-9, rel=1e-6)
    assert eng.prefetch_per_byte(1e6) == pytest.approx(1e-9, rel=1e-6)
    assert eng.prefetch_per_byte(1e9) == pytest.approx(3e-9, rel=1e-6)
    one = StreamProbe(1e9, runs[:1])
    fitted, _ = fit_engine_terms(base_profile(), SPEC, base, one)
    assert fitted.ops is not None and fitted.ops.engine is not None
    assert fitted.ops.engine.prefetch_compute_knots == []
    assert fitted.ops.engine.prefetch_per_byte(8e6) == fitted.ops.engine.prefetch_compute_s_per_byte


@pytest.mark.parametrize(
    "field, knots, why",
    [("prefetch_compute_knots", [(8.0, 1e-9), (4.0, 2e-9)], "ascending"),
     ("prefetch_compute_knots", [(0.0, 1e-9)], "ascending"),
     ("prefetch_compute_knots", [(4.0, -1e-9)], ">= 0"),
     ("copy_contention_knots", [(4.0, 5.0)], r"in \[0, 4\]"),
     ("copy_contention_knots", [(4.0, 1.0), (4.0, 2.0)], "ascending")],
)  # fmt: skip
def test_engine_knots_must_ascend_and_stay_in_range(
    field: str, knots: list[tuple[float, float]], why: str
) -> None:
    with pytest.raises(ValueError, match=why):
        EngineTerms(**{field: knots})


def test_copy_contention_is_measured_per_weight_cache_size(tmp_path: Path) -> None:
    """Copies at the link's rate with a small weight cache and at half of it with a large
    one: contention knots 0 and 1; the cluster's host->device links follow the replica's
    weight cache."""
    link = base_profile().links.pcie.bandwidth
    base = points(4e-4)

    def run(pool: int, rate: float) -> ProbeRun:
        return ProbeRun(None, (), None, (), 10_000_000, rate, (), pool)

    runs = (run(4_000_000, link), run(12_000_000, link / 2), run(12_000_000, link / 2))
    fitted, _ = fit_engine_terms(base_profile(), SPEC, base, StreamProbe(link / 1.6, runs))
    assert fitted.ops is not None and fitted.ops.engine is not None
    eng = fitted.ops.engine
    assert eng.copy_contention_knots == [(4e6, 0.0), (12e6, pytest.approx(1.0))]
    assert eng.copy_contention_at(8e6) == pytest.approx(0.5)
    assert eng.copy_contention == pytest.approx(0.6)  # the probe's aggregate rate

    from sim.cluster import build
    from sim.scenario import validate as validate_scenario
    from sim.serving.models import load_catalogue

    cat = load_catalogue()
    sc = validate_scenario({"name": "t", "deployments": [{"model": "llama-2-7b"}]})
    plain = build(sc, 0, cat, with_engine(base_profile(), EngineTerms(), 0.0), CostModel)
    cap = plain.ctx.nodes[0].ws.hbm.capacity
    bw0 = plain.ctx.nodes[0].ws.links["pcie"].bandwidth
    for lo, hi, want in ((cap / 2, cap * 2, 1.0 + 2.0 / 3.0), (cap * 2, cap * 4, 1.0)):
        knots = EngineTerms(copy_contention_knots=[(lo, 1.0), (hi, 3.0)])
        cl = build(sc, 0, cat, with_engine(base_profile(), knots, 0.0), CostModel)
        # interpolated a third of the way from cap / 2 to 2 cap; clamped below cap * 2
        assert cl.ctx.nodes[0].ws.links["pcie"].bandwidth == pytest.approx(bw0 / (1 + want))


def test_simulator_charges_the_prefetch_terms_only_where_weights_stream(
    tmp_path: Path,
) -> None:
    """Prefetch compute per byte and a hand-off make a workload whose weights stream
    slower, and leave a resident one exactly as it was."""
    from hwbench.validate import run_simulator
    from hwbench.workloads import get_workload

    stream = replace(get_workload("stream-045"), requests=8)
    prof = with_engine(base_profile(), EngineTerms(**ENGINE_SHAPE), 4e-4)
    terms = {"prefetch_compute_s_per_byte": 1e-9, "prefetch_handoff_s": 0.0}
    slow_compute = with_engine(base_profile(), EngineTerms(**ENGINE_SHAPE, **terms), 4e-4)
    terms = {"prefetch_compute_s_per_byte": 0.0, "prefetch_handoff_s": 2e-3}
    slow_handoff = with_engine(base_profile(), EngineTerms(**ENGINE_SHAPE, **terms), 4e-4)
    for w in (stream, replace(stream, hbm_fraction=1.5)):
        lat = [
            run_simulator(w, p, tmp_path / f"{w.hbm_fraction}-{i}")[0]
            .eval("end - arrival")
            .to_numpy()
            for i, p in enumerate((prof, slow_compute, slow_handoff))
        ]
        if w.hbm_fraction < 1:
            assert lat[1].mean() > lat[0].mean() * 1.05
            assert lat[2].mean() > lat[0].mean() * 1.05
        else:
            np.testing.assert_array_equal(lat[0], lat[1])
            np.testing.assert_array_equal(lat[0], lat[2])
    # knots by weight cache: the replica's cache picks the figure (here below the first
    # knot, so 1 ns/B, the slow_compute figure, whatever the single figure says)
    knots = {"prefetch_compute_s_per_byte": 0.0, "prefetch_compute_knots": [(1e12, 1e-9)]}
    by_cache = with_engine(base_profile(), EngineTerms(**ENGINE_SHAPE, **knots), 4e-4)
    lat_k = run_simulator(stream, by_cache, tmp_path / "knots")[0].eval("end - arrival")
    lat_1 = run_simulator(stream, slow_compute, tmp_path / "one")[0].eval("end - arrival")
    np.testing.assert_array_equal(lat_k.to_numpy(), lat_1.to_numpy())


def _meas(label: str, nbytes: float, secs: float) -> Measurement:
    return Measurement("copy", label, {"bytes": nbytes}, nbytes, secs, secs, secs, secs, secs, 3)


def test_check_profile_rejects_bandwidths_above_ceiling_or_probe_peak() -> None:
    prof = base_profile()
    names = {"object->ssd": "object_store", "ssd->host": "nvme", "host->host": "rdma"}
    names |= {"host->device": "pcie", "device->device": "nvlink"}

    def at(link: str, nbytes: float, factor: float = 1.0) -> Measurement:
        lp = getattr(prof.links, names[link])
        return _meas(link, nbytes, factor * (lp.latency + nbytes / lp.bandwidth))

    # every probe copy took what the profile's link says: nothing above the peak (copies
    # below a chunk do not count: 1 kB in 1 ns would be a peak of 1e12 B/s)
    ok = [at(lk, 1e8) for lk in names] + [_meas(lk, 1e3, 1e-9) for lk in names]
    assert check_profile(prof, ok, gpu=True) == []
    # every host->device copy ran at half the fitted rate; NVMe above any SSD
    ms = [m for m in ok if m.label != "host->device" or m.params["bytes"] < 1e8]
    ms.append(at("host->device", 1e8, 2.0))
    nvme = prof.links.model_copy(
        update={"nvme": prof.links.nvme.model_copy(update={"bandwidth": 1e12})}
    )
    reasons = check_profile(prof.model_copy(update={"links": nvme}), ms, gpu=True)
    assert len(reasons) == 2
    assert any("links.pcie" in r and "fastest host->device copy" in r for r in reasons)
    assert any("links.nvme" in r and "physical ceiling" in r for r in reasons)
    # within the allowance: accepted
    ms[-1] = at("host->device", 1e8, 1.4)
    assert check_profile(prof, ms, gpu=True) == []
    assert CEILINGS["cpu"]["host->device"] >= CEILINGS["gpu"]["host->device"]


def test_gemm_table_picks_cache_resident_timings_only_for_models_that_fit() -> None:
    """A model whose weights fit in a table's cache is priced from that table, a larger one
    from the cold table (NumPy model: fp32)."""

    def table(secs: float, resident: int) -> GemmTable:
        grid = Grid3(m=[1, 64], n=[256, 4096], k=[256, 4096], latency_s=[[[secs] * 2] * 2] * 2)
        return GemmTable(origin=ORIGIN, dtype="fp32", resident_bytes=resident, grid=grid)

    weights = SPEC.param_bytes
    for cache, want in ((2 * weights, 1e-5), (weights // 2, 3e-5)):
        ops = OpsProfile(gemm=[table(3e-5, 0), table(1e-5, cache)])
        cost = OpCostModel(base_profile().model_copy(update={"ops": ops}), SPEC)
        assert cost.gemm_time(8, 512, 512) == (pytest.approx(want), "table")


def test_gemm_table_times_every_knot_and_states_its_cache() -> None:
    """Tiny grid on NumPy (the same code runs on CuPy): one positive time per knot, and the
    table says how it was timed (no claim about the times: that would read the clock)."""
    import datetime as dt

    grid = OpGrid.tiny()
    org = origin(np, dt.datetime(2026, 12, 1, tzinfo=dt.UTC), "test")
    cold = gemm_table(np, grid, org)
    warm = gemm_table(np, grid, org, resident_bytes=1 << 25)
    for t in (cold, warm):
        arr = np.array(t.grid.latency_s)
        assert arr.shape == (len(grid.m), len(grid.n), len(grid.k)) and (arr > 0).all()
    assert cold.resident_bytes == 0 and "cold" in cold.kernel
    assert warm.resident_bytes == 1 << 25 and "resident" in warm.kernel
    assert org.framework.startswith("numpy") and org.measured_at == "2026-12-01"


@pytest.mark.parametrize(("k", "n"), [(8, 16), (4, 16), (8, 4), (4, 4)])
def test_weight_pool_copies_are_distinct_buffers(k: int, n: int) -> None:
    """Every copy of the pool is its own C-contiguous buffer with the slice's values, also
    where the slice is already contiguous (the full width, or the whole array): a pool of
    one buffer would time hot weights as cold ones."""
    w_all = np.arange(8 * 16, dtype=np.float32).reshape(8, 16)
    pool = weight_pool(np, w_all, k, n, 3)
    assert len(pool) == 3
    for i, a in enumerate(pool):
        assert a.flags["C_CONTIGUOUS"] and a.shape == (k, n)
        np.testing.assert_array_equal(a, w_all[:k, :n])
        assert not np.shares_memory(a, w_all)
        assert not any(np.shares_memory(a, b) for b in pool[i + 1 :])


def fake_cupy(calls: list[str]) -> Any:
    """NumPy dressed as CuPy (module name ``cupy``, a ``cuda.runtime`` that records its
    synchronisations and reports a device): the GPU branches of hwbench.opprobe run on it."""
    import types

    mod = types.ModuleType("cupy")
    for key in ("float32", "ones", "array", "asarray", "ascontiguousarray", "matmul", "empty_like"):
        setattr(mod, key, getattr(np, key))
    mod.__version__ = "0.0-standin"
    runtime = types.SimpleNamespace(
        deviceSynchronize=lambda: calls.append("sync"),
        getDeviceProperties=lambda dev: {"name": b"Stand-in GPU", "l2CacheSize": 1 << 20},
    )
    mod.cuda = types.SimpleNamespace(runtime=runtime)  # type: ignore[attr-defined]
    return mod


def test_gpu_branch_of_the_op_probe_with_numpy_standing_in_for_cupy() -> None:
    """On the CuPy backend every timed call ends with a device synchronisation, the table's
    origin names the GPU and CuPy, and the cold pool is sized from the GPU's L2 cache."""
    import datetime as dt

    from hwbench.opprobe import cache_bytes, op_floor

    calls: list[str] = []
    xp = fake_cupy(calls)
    grid = OpGrid.tiny()
    assert cache_bytes(xp) == 1 << 20
    org = origin(xp, dt.datetime(2026, 12, 1, tzinfo=dt.UTC), "stand-in")
    assert org.device == "Stand-in GPU" and org.framework == "cupy 0.0-standin"
    table = gemm_table(xp, grid, org)
    knots = len(grid.m) * len(grid.n) * len(grid.k)
    # each timed or warm-up call is followed by a sync (time_op syncs before timing, too)
    assert len(calls) >= knots * (grid.warmup + grid.repeats)
    assert table.resident_bytes == 0 and "cupy matmul" in table.kernel
    calls.clear()
    assert op_floor(xp, grid) > 0 and len(calls) >= grid.warmup + grid.repeats
    # kernels on a device: wall time around a synchronisation, and the engine on wall time
    from hwbench.opprobe import op_clock
    from hwbench.validate import excludes_cpu_wait

    assert op_clock(xp) is time.perf_counter and op_clock(np) is time.thread_time
    assert not excludes_cpu_wait(xp) and excludes_cpu_wait(np)


def test_a_fitted_profile_with_unmeasured_points_round_trips_through_json() -> None:
    """Shapes seen only after idle spells carry no overhead: the evidence table leaves the
    field out (JSON has no NaN), and the profile reads back equal."""
    pts = points(4e-4)
    pts[0] = replace(pts[0], overhead_s=None, overhead_count=0)
    prof, _ = fit_engine_terms(base_profile(), SPEC, pts, probe(1e9))
    back = Profile.model_validate_json(prof.model_dump_json())
    assert back == prof
    rows = back.fitted["engine_pass"]
    assert "overhead_s" not in rows[0] and rows[1]["overhead_s"] == pytest.approx(4e-4)


def test_op_ratios_compare_each_table_with_the_op_timed_in_place() -> None:
    """Points whose in-place ops are the tables' seconds, gate/up GEMMs 1.5x slower and the
    norms split into norm and residual-add calls: gate_up_gemm's table is 1/1.5 of it, the
    others 1, the norms compared as one; a rejected fit names gate_up_gemm first."""
    zero = OpCostModel(with_engine(base_profile(), EngineTerms(**ENGINE_SHAPE), 0.0), SPEC)

    def timed(p: PassPoint, noise: float = 0.0) -> PassPoint:
        ops = zero.iteration_ops(p.tokens, round(p.sq), p.prompts if p.tokens else 0, p.batch,
                                 float(p.context))  # fmt: skip
        ops["gate_up_gemm"] *= 1.5
        norm = ops.pop("input_norm") + ops.pop("post_attn_norm")
        ops["input_norm"], ops["residual_add"] = 0.25 * norm, 0.75 * norm
        return replace(p, op_s=tuple(sorted((k, v) for k, v in ops.items() if v > 0)))

    pts = [timed(p) for p in points(4e-4)]
    ratios = op_ratios(base_profile(), SPEC, pts)
    assert ratios["gate_up_gemm"] == pytest.approx(1 / 1.5)
    assert ratios["norms"] == pytest.approx(1.0)
    assert all(r == pytest.approx(1.0) for k, r in ratios.items() if k != "gate_up_gemm")
    assert "residual_add" not in ratios and "iteration_overhead" not in ratios
    _, report = fit_engine_terms(base_profile(), SPEC, pts, probe(1e9))
    assert report["op_ratio.gate_up_gemm"] == pytest.approx(1 / 1.5)
    noisy = [timed(p) for p in points(4e-3, noise=2 * MAX_FIT_ERROR)]
    with pytest.raises(ImpossibleFit, match=r"timed in place: gate_up_gemm 0\.67x"):
        fit_engine_terms(base_profile(), SPEC, noisy, probe(1e9))
