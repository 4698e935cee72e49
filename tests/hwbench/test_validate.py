"""``pdsim validate`` and its parts: the simulator side is an ordinary scenario that ``pdsim
run`` reproduces, the table's arithmetic is right, the suite is held out from calibration,
the CLI exits 1 on a figure over its limit and 2 on bad input."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from typer.testing import CliRunner

import hwbench.quiet as _quiet
from engine.backend import cupy_status
from engine.runtime.engine import IterationRecord
from engine.runtime.weights import TIER_NAMES
from hwbench.engine_probe import PassPoint, _collect
from hwbench.validate import (
    Comparison,
    compare,
    decoder_config,
    median_requests,
    model_config,
    run_cv,
    run_simulator,
    scenario_dict,
    sim_catalogue,
    sizes,
    validate_suite,
    validate_workload,
)
from hwbench.workloads import SUITE, ValidationWorkload, arrivals, get_workload
from pdsim.cli import app
from sim.scenario import validate as validate_scenario
from sim.serving.costmodel import Profile, load_profile
from sim.serving.gpumemory import plan_memory
from sim.serving.opcost import EngineTerms, OpsProfile

_REAL_REFERENCE = _quiet.reference_seconds


def engine_profile() -> Profile:
    """A datasheet profile with engine terms (roofline ops): enough for the simulator side."""
    prof = load_profile("a100-80gb")
    terms = EngineTerms(fused_iterations=False, layer_overhead_s=3e-4, iter_gap_s=2e-5)
    return prof.model_copy(update={"ops": OpsProfile(engine=terms)})


def test_suite_is_held_out_from_calibration() -> None:
    """No suite workload is a calibration workload: other seeds, cache fractions the fetch
    probe never used (0.6 and 1.5 are its), and one model that spills a 32 MiB cache."""
    assert {w.seed for w in SUITE}.isdisjoint({1, 7, *range(100, 400), *range(500, 510), 1000})
    assert any(w.hbm_fraction not in (0.6, 1.5) for w in SUITE)
    large = [w for w in SUITE if w.model == "decoder-large"]
    assert large and sum(model_config(large[0]).layer_bytes()) > 32 * 1024**2


def test_suite_covers_load_pressure_policy_and_context() -> None:
    assert len(SUITE) >= 6
    assert len({w.name for w in SUITE}) == len(SUITE)
    assert {w.policy for w in SUITE} >= {"lru", "lru-k"}
    assert any(w.hbm_fraction >= 1 for w in SUITE) and any(w.hbm_fraction < 1 for w in SUITE)
    rates = sorted(w.rate for w in SUITE)
    assert rates[-1] >= 3 * rates[0]  # low load and near saturation
    assert max(w.input_high for w in SUITE) >= 4 * min(w.input_high for w in SUITE)


def test_arrivals_are_seeded_and_start_at_zero() -> None:
    w = SUITE[0]
    a, b = arrivals(w), arrivals(w)
    for x, y in zip(a, b, strict=True):
        np.testing.assert_array_equal(x, y)
    assert a[0][0] == 0 and np.all(np.diff(a[0]) >= 0) and len(a[0]) == w.requests
    assert a[1].min() >= w.input_low and a[1].max() <= w.input_high


def test_engine_model_is_the_catalogue_shape_scaled_down() -> None:
    cfg = decoder_config()
    assert (cfg.hidden, cfg.heads, cfg.ffn, cfg.vocab) == (4096 // 16, 32 // 8, 11008 // 16, 2000)
    spec = sim_catalogue(cfg)[cfg.name]
    assert spec.layer_bytes() == cfg.layer_bytes()
    assert spec.kv_bytes_per_token == cfg.kv_bytes_per_token


def test_simulator_scenario_matches_engine_sizes(tmp_path: Path) -> None:
    w = get_workload("stream-045")
    cfg = decoder_config()
    sz = sizes(w, cfg)
    trace = tmp_path / "t.csv"
    trace.write_text("time,input_tokens,output_tokens\n0,1,1\n", encoding="utf-8")
    sc = validate_scenario(scenario_dict(w, sz, cfg.name, trace))
    assert sc.cluster.servers == 1 and sc.cluster.replicas == 1
    mem = plan_memory(sc, [sim_catalogue(cfg)[cfg.name]], sc.cluster.gpu.hbm, "validation")
    assert mem.weight_cache == sz.hbm_weights  # exact weight cache
    assert mem.kv == sz.kv
    assert (sc.cluster.server.host, sc.cluster.server.nvme) == (sz.host, sz.ssd)
    assert not sc.cluster.replica.chunked_prefill  # the engine prefills whole prompts
    assert sc.cache.hbm_policy == w.policy and sc.warmup.node_hbm
    assert sc.prefetch.window_batches == w.window


def test_compare_relative_errors_and_hit_rate_differences() -> None:
    def frame(lat: list[float]) -> pd.DataFrame:
        n = len(lat)
        return pd.DataFrame(
            {
                "arrival": np.zeros(n),
                "start": np.zeros(n),
                "first_token": np.array(lat) / 2,
                "end": np.array(lat),
                "status": ["done"] * n,
            }
        )

    eng, sim = frame([1.0, 2.0, 3.0]), frame([1.1, 2.2, 3.3])
    c = compare(
        "w",
        eng,
        np.array([90.0, 10, 0, 0, 0]),
        np.array([0, 5e6, 0, 0, 0]),
        sim,
        np.array([89.0, 11, 0, 0, 0]),
        np.array([0, 6e6, 0, 0, 0]),
    )
    rows = {r[0]: r for r in c.rows}
    assert rows["latency_p50"][3] == pytest.approx(0.1)
    assert rows["latency_mean"][3] == pytest.approx(0.1)
    assert rows["throughput_rps"][3] == pytest.approx(1 / 1.1 - 1)
    assert rows["hit_rate_hbm"][3] == pytest.approx(-0.01)
    assert rows["bytes_per_access_host"][3] == pytest.approx(0.2)
    d = c.as_dict()
    assert d["latency_p50"]["rel_error"] == pytest.approx(0.1)
    assert d["hit_rate_host"]["abs_error"] == pytest.approx(0.01)
    assert all("error" in k for k in c.errors())


def test_probe_groups_iterations_by_prompt_count_and_keeps_squared_lengths() -> None:
    """One 128-token prompt and four 32-token prompts have the same token count but not the
    same attention work: they land in different groups, each with its mean squared sum."""
    log = [
        IterationRecord(0.0, 0.010, 1, 128, 128**2, 0, 0, 0.0),
        IterationRecord(0.0, 0.012, 1, 130, 130**2, 0, 0, 0.0),
        IterationRecord(0.0, 0.006, 4, 128, 4 * 32**2, 0, 0, 0.0),
        IterationRecord(0.0, 0.002, 0, 0, 0, 3, 300, 0.0),
    ]
    rows: dict = {}
    _collect(rows, log)
    assert sorted(rows) == [(0, 0, 3, 288), (144, 1, 0, 0), (144, 4, 0, 0)]
    assert [r[:2] for r in rows[(144, 1, 0, 0)]] == [(0.010, 128.0**2), (0.012, 130.0**2)]
    assert [r[:2] for r in rows[(144, 4, 0, 0)]] == [(0.006, 4.0 * 32**2)]
    assert all(r[2] != r[2] for v in rows.values() for r in v)  # no overheads given: NaN
    assert PassPoint(144, 0, 0, 0.01, 2).sq == 144.0**2  # one prompt by default
    assert PassPoint(144, 0, 0, 0.01, 2, prompts=4, sq_tokens=4096.0).sq == 4096.0


def test_validate_workload_end_to_end_is_small_and_consistent() -> None:
    """A tiny streaming workload through both sides: the same cache code on the same
    accesses gives the same hit rates and bytes per tier (up to the iteration or two that
    timing adds or removes), and every error key is there."""
    w = ValidationWorkload("t", "tiny", requests=4, rate=20.0, hbm_fraction=0.6, seed=3)
    c = validate_workload(w, engine_profile())
    rows = {r[0]: r for r in c.rows}
    assert abs(rows["hit_rate_hbm"][3]) < 0.01 and abs(rows["hit_rate_host"][3]) < 0.01
    assert all(abs(r[3]) < 0.02 for r in c.rows if r[0].startswith("bytes_per_access_"))
    assert c.engine_latency.size == c.sim_latency.size == 4
    assert all(math.isfinite(r[1]) and r[1] > 0 for r in c.rows if r[0].startswith("latency"))


def test_run_cv_is_each_runs_own_figure_over_the_runs() -> None:
    """Two runs whose latencies are 1 and 2 s, and 1 and 4 s: each run's own P50 (1.5 and
    2.5 s) has a coefficient of variation of 0.25 over the runs (standard deviation 0.5
    over mean 2); the comparison carries it and its JSON shows it; one run: none."""

    def run(lat: list[float]) -> pd.DataFrame:
        n = len(lat)
        return pd.DataFrame(
            {
                "status": ["done"] * n,
                "arrival": np.zeros(n),
                "start": np.zeros(n),
                "first_token": np.array(lat) / 2,
                "end": np.array(lat),
            }
        )

    runs = [run([1.0, 2.0]), run([1.0, 4.0])]
    cv = run_cv(runs)
    assert cv["latency_p50"] == pytest.approx(0.25)
    assert cv["ttft_p50"] == pytest.approx(0.25)
    assert cv["latency_mean"] == pytest.approx(0.25)
    med = median_requests(runs)
    t = np.ones(len(TIER_NAMES))
    c = compare("w", med, t, t, runs[0], t, t, runs=runs)
    assert c.run_cv == cv and c.as_dict()["latency_p50"]["engine_run_cv"] == 0.25
    alone = compare("w", med, t, t, runs[0], t, t)
    assert alone.run_cv == {} and "engine_run_cv" not in alone.as_dict()["latency_p50"]


def test_validate_suite_interleaves_the_engine_runs(tmp_path: Path) -> None:
    """Two workloads, two runs each: every workload runs once before any runs again; the
    comparisons come back in the workloads' order, the named scenario folder is kept and
    each workload's figures come from its own runs."""
    a = ValidationWorkload("a", "tiny", requests=3, rate=20.0, seed=3)
    b = ValidationWorkload("b", "tiny", requests=5, rate=20.0, hbm_fraction=0.6, seed=4)
    order: list[tuple[str, int]] = []
    comps = validate_suite(
        [a, b],
        engine_profile(),
        repeats=2,
        scenario_dirs={"b": tmp_path / "kept"},
        on_run=lambda w, k: order.append((w.name, k)),
    )
    assert order == [("a", 0), ("b", 0), ("a", 1), ("b", 1)]
    assert [c.workload for c in comps] == ["a", "b"]
    assert comps[0].engine_latency.size == 3 and comps[1].engine_latency.size == 5
    assert (tmp_path / "kept" / "scenario.yaml").is_file()
    with pytest.raises(ValueError, match="names must differ"):
        validate_suite([a, a], engine_profile())
    with pytest.raises(ValueError, match="repeats"):
        validate_suite([a], engine_profile(), repeats=0)


def test_pdsim_run_of_the_written_scenario_gives_the_validation_figures(tmp_path: Path) -> None:
    """The simulator side of a validation workload is the scenario folder it writes:
    ``pdsim run`` of it gives every request the very times the validation simulated."""
    w = ValidationWorkload("t", "tiny", requests=12, rate=8.0, hbm_fraction=0.45, seed=41)
    df, _, _, _, _ = run_simulator(w, engine_profile(), tmp_path / "scn")
    res = CliRunner().invoke(
        app, ["run", str(tmp_path / "scn" / "scenario.yaml"), "--out", str(tmp_path / "runs")]
    )
    assert res.exit_code == 0, res.output
    (folder,) = [p for p in (tmp_path / "runs").iterdir() if p.is_dir()]
    run = pd.read_parquet(folder / "requests.parquet").sort_values("request_id")
    ours = df.sort_values("request_id")
    assert len(run) == len(ours) == 12
    for col in ("arrival", "first_token", "end"):
        np.testing.assert_array_equal(run[col].to_numpy(), ours[col].to_numpy())


def _comparison(p99_err: float, hit_diff: float) -> Comparison:
    rows = [
        ("latency_p50", 1.0, 1.05, 0.05, "rel"),
        ("latency_p99", 2.0, 2.0 * (1 + p99_err), p99_err, "rel"),
        ("throughput_rps", 3.0, 2.0, -1 / 3, "rel"),
        ("hit_rate_hbm", 0.5, 0.5 + hit_diff, hit_diff, "abs"),
    ]
    return Comparison("w", rows, np.ones(3), np.ones(3))


@pytest.mark.parametrize(
    ("p99_err", "hit_diff", "code"), [(0.14, 0.0, 0), (0.16, 0.0, 1), (0.0, 0.02, 1)]
)
def test_cli_validate_exits_1_when_a_figure_is_over_or_a_check_differs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, p99_err: float, hit_diff: float, code: int
) -> None:
    """P99 within 15% and equal hit rates pass (throughput is reported, never a limit);
    P99 over 15% or hit rates that differ exit 1."""
    import hwbench.validate
    from hwbench.validate import SuiteRun

    suite = SuiteRun([_comparison(p99_err, hit_diff)], [], [], [0.2, 0.2])
    monkeypatch.setattr(hwbench.validate, "run_suite", lambda *a, **k: suite)
    prof = tmp_path / "p.json"
    prof.write_text(engine_profile().model_dump_json(), encoding="utf-8")
    res = CliRunner().invoke(
        app,
        ["validate", "-p", str(prof), "-w", "low-resident", "-o", str(tmp_path / "v"), "--json"],
    )
    assert res.exit_code == code, res.output
    doc = json.loads(res.stdout.strip().splitlines()[-1])
    assert doc["passed"] is (code == 0) and len(doc["failed"]) == (0 if code == 0 else 1)
    assert doc["verdict"] == ("pass" if code == 0 else "fail")


class TickClock:
    """A clock that advances ``tick`` seconds per reading: every timed run of the reference
    workload reads exactly ``tick``, however fast the machine really is."""

    def __init__(self, tick: float) -> None:
        self.tick = tick
        self.t = 0.0

    def __call__(self) -> float:
        self.t += self.tick
        return self.t


def test_cli_validate_is_inconclusive_when_the_machine_slowed_after_calibration(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The calibration records the reference workload timed on a clock reading 100 ms a run
    (what ``pdsim calibrate`` writes: the mean of its start and end); ``pdsim validate`` then
    times it on one reading 120 ms (the machine 20% slower): the verdict is "inconclusive:
    the machine's speed moved 20.0%", exit 3, whatever the errors. On an unchanged clock the
    same validation is judged (pass or fail, never 3). The engine serves on a virtual clock
    and the scheduling check is stubbed to pass (its own tests: test_schedcheck.py), so
    nothing here depends on the machine's real speed."""
    import engine.runtime.engine as rt
    import hwbench.quiet
    import hwbench.validate
    import hwbench.workloads
    from engine.runtime.clock import VirtualClock
    from hwbench.schedcheck import SchedCheck

    # the real reference workload, shortened; its clock is the test's
    monkeypatch.setattr(
        hwbench.quiet,
        "reference_seconds",
        lambda repeats=5, steps=900: _REAL_REFERENCE(repeats, 20),
    )
    monkeypatch.setattr(hwbench.quiet, "reference_clock", TickClock(0.100))
    start, end = hwbench.quiet.reference_seconds(), hwbench.quiet.reference_seconds()
    row = {"others": 0.0, "steal": 0.0, "reference_s": (start + end) / 2}
    calibrated = engine_profile()
    calibrated = calibrated.model_copy(update={"fitted": {hwbench.quiet.KEY: [row]}})
    prof = tmp_path / "p.json"
    prof.write_text(calibrated.model_dump_json(), encoding="utf-8")
    assert row["reference_s"] == pytest.approx(0.1)

    tiny = ValidationWorkload("tiny", "tiny", requests=3, rate=30.0, window=0, seed=3)
    monkeypatch.setattr(hwbench.workloads, "SUITE", (tiny,))
    monkeypatch.setattr(rt, "RunClock", lambda *a, **k: VirtualClock(1e-4))
    monkeypatch.setattr(hwbench.validate, "check_workload", lambda w, *a: SchedCheck(w.name))
    args = ["validate", "-p", str(prof), "-w", "tiny", "-r", "1", "--json"]
    for tick, code in ((0.120, 3), (0.100, None)):
        monkeypatch.setattr(hwbench.quiet, "reference_clock", TickClock(tick))
        res = CliRunner().invoke(app, [*args, "-o", str(tmp_path / f"v{tick}")])
        doc = json.loads(res.stdout.strip().splitlines()[-1])
        assert doc["machine_speed"]["samples_s"] == pytest.approx([tick, tick])
        if code == 3:
            assert res.exit_code == 3, res.output
            assert doc["verdict"] == "inconclusive" and doc["passed"] is False
            assert "inconclusive: the machine's speed moved 20.0%" in doc["inconclusive"]
            assert "inconclusive: the machine's speed moved 20.0%" in res.output
        else:
            assert res.exit_code in (0, 1), res.output
            assert doc["verdict"] in ("pass", "fail") and doc["inconclusive"] is None
            assert doc["machine_speed"]["moved"] == pytest.approx(0.0, abs=1e-9)


def test_cli_validate_needs_engine_terms_and_writes_nothing(tmp_path: Path) -> None:
    res = CliRunner().invoke(app, ["validate", "-p", "a100-80gb", "-o", str(tmp_path / "v")])
    assert res.exit_code == 2 and "ops.engine" in res.output
    assert not (tmp_path / "v").exists()


def test_cli_unknown_workload_and_bad_profile_exit_2(tmp_path: Path) -> None:
    runner = CliRunner()
    r = runner.invoke(app, ["validate", "--profile", str(tmp_path / "nope.json")])
    assert r.exit_code == 2 and "nope.json" in r.output
    bad = tmp_path / "p.json"
    bad.write_text(json.dumps({"name": "x"}), encoding="utf-8")
    r = runner.invoke(app, ["validate", "--profile", str(bad)])
    assert r.exit_code == 2
    good = tmp_path / "good.json"
    good.write_text(engine_profile().model_dump_json(), encoding="utf-8")
    r = runner.invoke(
        app, ["validate", "--profile", str(good), "--workload", "nope", "--out", str(tmp_path)]
    )
    assert r.exit_code == 2 and "low-resident" in r.output


def test_cli_validate_bad_backend_exits_2(tmp_path: Path) -> None:
    res = CliRunner().invoke(
        app, ["validate", "-p", "a100-80gb", "--backend", "tpu", "-o", str(tmp_path / "v")]
    )
    assert res.exit_code == 2
    assert "allowed: cpu, gpu" in res.output
    assert not (tmp_path / "v").exists()


@pytest.mark.skipif(cupy_status()[0] is not None, reason="a GPU is present here")
def test_cli_validate_gpu_without_gpu_exits_2(tmp_path: Path) -> None:
    res = CliRunner().invoke(
        app, ["validate", "-p", "a100-80gb", "--backend", "gpu", "-o", str(tmp_path / "v")]
    )
    assert res.exit_code == 2 and "cupy" in res.output


@pytest.mark.gpu
def test_engine_parts_on_cupy_keep_weights_and_kv_on_the_gpu(tmp_path: Path) -> None:
    """``--backend gpu``: the tier stack's device level, the weights the model reads and the
    KV store are CuPy arrays, and a tiny streaming workload gives the NumPy engine's first
    tokens (later ones may part on a near-tie of float32 logits) and token counts."""
    from engine.backend import get_backend, is_gpu
    from hwbench.validate import engine_for, engine_parts, run_engine, workload_for

    cp = get_backend("cupy")
    w = ValidationWorkload("t", "tiny", requests=3, rate=50.0, hbm_fraction=0.6, seed=3)
    parts = engine_parts(w, tmp_path / "gpu", cp)
    eng = engine_for(w, parts)
    assert is_gpu(eng.model.xp) and parts[1].xp is cp
    assert isinstance(parts[1].layer(1, 0.0), cp.ndarray)
    parts[1].release(1)
    got = eng.run(workload_for(w)).tokens
    want = run_engine(w, tmp_path / "cpu")[0].tokens
    assert [len(t) for t in got] == [len(t) for t in want]
    assert [t[0] for t in got] == [t[0] for t in want]


def _frame(lat: list[float], status: list[str] | None = None) -> pd.DataFrame:
    n = len(lat)
    arrival = np.arange(n, dtype=float)
    return pd.DataFrame(
        {
            "arrival": arrival,
            "start": arrival,
            "first_token": arrival + 0.1 * np.asarray(lat),
            "end": arrival + np.asarray(lat),
            "status": pd.Categorical(status or ["done"] * n),
        }
    )


def test_median_requests_takes_each_requests_median_delay() -> None:
    """A slow spell hitting a different request in each run leaves every request's median
    alone; a request slow in most runs stays slow; one not done everywhere keeps run 0."""
    runs = [
        _frame([1.0, 9.0, 1.0, 5.0], ["done", "done", "done", "done"]),
        _frame([1.0, 1.0, 9.0, 5.0], ["done", "done", "done", "rejected"]),
        _frame([9.0, 1.0, 1.0, 5.0], ["done", "done", "done", "done"]),
    ]
    m = median_requests(runs)
    lat = (m["end"] - m["arrival"]).to_numpy()
    np.testing.assert_allclose(lat, [1.0, 1.0, 1.0, 5.0])
    np.testing.assert_allclose((m["first_token"] - m["arrival"]).to_numpy()[:3], [0.1] * 3)
    assert np.percentile(lat[:3], 99) == pytest.approx(1.0)  # no run's spell is the tail
    slow = [_frame([1.0, 7.0, 1.0]), _frame([1.0, 8.0, 1.0]), _frame([1.0, 1.0, 1.0])]
    assert (median_requests(slow)["end"] - median_requests(slow)["arrival"])[1] == 7.0
    assert median_requests(runs[:1]).equals(runs[0])
    with pytest.raises(ValueError):
        median_requests([])


def test_gpu_check_script_validates_suite_workloads() -> None:
    """hwbench/gpu_check.sh (run where a GPU is lent) names workloads that exist."""
    text = (Path(__file__).parents[2] / "hwbench" / "gpu_check.sh").read_text(encoding="utf-8")
    names = re.findall(r"-w ([\w-]+)", text)
    assert names and all(get_workload(n).name == n for n in names)
    assert "pdsim calibrate --backend gpu --quick" in text


def test_gpu_check_dry_run_fits_the_budget_and_runs_all_three_checks(tmp_path: Path) -> None:
    """``gpu_check.sh --dry-run`` runs nothing: it lists the three steps, their limits add up
    to at most the 8-minute budget, and validation is the three-check ``pdsim validate``
    of two engine runs per workload."""
    import os
    import subprocess
    import sys

    script = Path(__file__).parents[2] / "hwbench" / "gpu_check.sh"
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    out = tmp_path / "gpu"
    res = subprocess.run(
        ["bash", str(script), "--dry-run", str(out)],
        capture_output=True, text=True, env=env, check=False, timeout=120,
    )  # fmt: skip
    assert res.returncode == 0, res.stdout + res.stderr
    limits = [int(x) for x in re.findall(r"limit=(\d+)s", res.stdout)]
    steps = re.findall(r"^step (\S+)", res.stdout, flags=re.M)
    assert steps == ["pytest_gpu", "calibrate", "validate"]
    assert sum(limits) <= 8 * 60
    assert "--repeats 2" in res.stdout and "--backend gpu" in res.stdout
    assert not (out / "profile-gpu.json").exists()  # nothing ran
