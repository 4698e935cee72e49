"""The findings of a new user's run of every command (issue 41, item 7)."""

from __future__ import annotations

import importlib
import os
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from pdsim.cli import app
from pdsim.cli.plan import _with_options
from sim.study.planspec import plan_from_file

runner = CliRunner()
ROOT = Path(__file__).resolve().parents[2]
SCEN = ROOT / "scenarios"


def test_p99_option_replaces_the_files_e2e_p99_limit_in_either_spelling() -> None:
    path = SCEN / "plan-llama70b-h200.yaml"  # its limit is written slo.e2e.p99
    spec, _ = plan_from_file(path)
    assert spec.slo.limits() == [("e2e", "p99", "all", 5.0)]
    new = _with_options(spec, path, None, None, None, None, ["all=10s"])
    assert new.slo.limits() == [("e2e", "p99", "all", 10.0)]
    path = SCEN / "plan-quickstart.yaml"  # its limit is written slo.p99
    spec, _ = plan_from_file(path)
    new = _with_options(spec, path, None, None, None, None, ["all=7s"])
    assert new.slo.limits() == [("e2e", "p99", "all", 7.0)]


def _one_line_error(args: list[str]) -> str:
    r = runner.invoke(app, args)
    assert r.exit_code == 2, r.output
    assert r.output.startswith("error: ") and r.output.count("\n") == 1, r.output
    return r.output


AB = str(SCEN / "ab-demo.yaml")


def test_ab_blames_the_side_whose_override_is_bad(tmp_path: Path) -> None:
    out = ["--seeds", "2", "--out", str(tmp_path / "ab")]
    both = ["--a", "cluster.servers=2"]
    msg = _one_line_error(["ab", AB, *both, "--b", "cluster.servers=x", *out])
    assert msg.startswith("error: --b cluster.servers=x: cluster.servers: ")
    msg = _one_line_error(["ab", AB, "--a", "cluster.servers=x", "--b", "cluster.servers=3", *out])
    assert msg.startswith("error: --a cluster.servers=x: ")
    msg = _one_line_error(["ab", AB, *both, "--b", "cluster.servers", *out])
    assert msg.startswith("error: --b 'cluster.servers': expected KEY=VALUE")
    assert not (tmp_path / "ab").exists()


def test_bad_options_fail_before_any_work(tmp_path: Path) -> None:
    a_file = tmp_path / "f"
    a_file.write_text("x")
    msg = _one_line_error(
        ["ab", AB, "--a", "cluster.servers=2", "--b", "cluster.servers=3", "--boot-seed", "-1",
         "--seeds", "2", "--out", str(tmp_path / "ab")]
    )  # fmt: skip
    assert "--boot-seed" in msg and "allowed: an integer >= 0" in msg
    msg = _one_line_error(["calibrate", "--tiny", "--workdir", str(a_file),
                           "--out", str(tmp_path / "p.json")])  # fmt: skip
    assert msg == f"error: --workdir {a_file}: is a file; give a folder\n"
    msg = _one_line_error(["profile", "import", "aiconfigurator", "--out", str(tmp_path)])
    assert msg.startswith(f"error: --out {tmp_path}: is a folder")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["f"]


def test_plan_size_and_qps_are_checked_before_any_run(tmp_path: Path) -> None:
    out = tmp_path / "plan"
    msg = _one_line_error(["plan", "plan-quickstart", "--size", "0", "--out", str(out)])
    assert "'--size': 0 is out of range; allowed: an integer >= 1" in msg
    msg = _one_line_error(["plan", "plan-quickstart", "--qps", "-1", "--out", str(out)])
    assert "'--qps': '-1' is out of range; allowed: a finite number > 0" in msg
    assert not out.exists()


@pytest.mark.parametrize("marker", ["plan.json", "ab.json", "chaos.json", "sweep-0a1b2c3d.json"])
def test_a_folder_of_another_kind_of_result_is_refused(tmp_path: Path, marker: str) -> None:
    out = tmp_path / "o"
    out.mkdir()
    (out / marker).write_text("{}")
    commands = {
        "plan.json": ["plan", "plan-quickstart"],
        "ab.json": ["ab", AB, "--a", "cluster.servers=2", "--b", "cluster.servers=3"],
        "chaos.json": ["chaos", "chaos-partition", "--seeds", "1"],
        "sweep-0a1b2c3d.json": ["sweep", "--scenario", "quickstart", "--grid", "cluster.servers=1,2"],
        "run": ["run", "quickstart"],
    }  # fmt: skip
    for kind, cmd in commands.items():
        if kind == marker:
            continue
        msg = _one_line_error([*cmd, "--out", str(out)])
        assert f"holds {_KIND[marker]} results ({marker}); results of different kinds" in msg
    assert [p.name for p in out.iterdir()] == [marker]


_KIND = {
    "plan.json": "plan",
    "ab.json": "A/B",
    "chaos.json": "chaos",
    "sweep-0a1b2c3d.json": "sweep",
}


def test_no_plotting_code_selects_a_backend_or_leaves_a_figure_open(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A notebook keeps its inline backend: plots are Figure objects, never pyplot's."""
    import matplotlib
    import matplotlib.pyplot as plt
    import pandas as pd

    import sim.study.plots as p

    chosen: list[object] = []
    monkeypatch.setattr(matplotlib, "use", lambda *a, **k: chosen.append(a))
    importlib.reload(p)  # importing selects no backend
    open_before = plt.get_fignums()
    df = pd.DataFrame(
        {"status": ["ok"] * 2, "x": [1, 2], p.THROUGHPUT: [1.0, 2.0], p.P99: [0.5, 0.7]}
    )
    out = p.sweep_plot(df, ["x"], tmp_path / "s.png", "t")
    assert out is not None and out.stat().st_size > 0
    assert chosen == [] and plt.get_fignums() == open_before


def test_ctrl_c_ends_a_command_with_one_line_and_status_130(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    import signal

    import pdsim.cli.run as run_mod
    from pdsim.cli import main

    def interrupted(*_a: object, **_k: object) -> None:
        os.kill(os.getpid(), signal.SIGINT)  # as the terminal does on Ctrl-C

    monkeypatch.setattr(run_mod, "load_scenario_arg", interrupted)
    monkeypatch.setattr(sys, "argv", ["pdsim", "run", "quickstart", "--out", str(tmp_path)])
    old = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with pytest.raises(SystemExit) as stop:
            main()
    finally:
        signal.signal(signal.SIGINT, old)
    assert stop.value.code == 130
    assert capsys.readouterr().err == "interrupted (Ctrl-C)\n"


@pytest.mark.parametrize(
    ("args", "start"),
    [
        (["--tp", "1"], "error: --tp 1: llama-3.1-70b (bf16) at tp=1 pp=1 needs 141.1 GB of weights"),
        (["--tp", "8", "--context", "200000"],
         "error: --context 200000: above llama-3.1-70b's context window of 131,072 tokens"),
        (["--tp", "8", "--batch", "60000"], "error: --batch 60000: the KV of 60,000 x 2,048 tokens"),
    ],
)  # fmt: skip
def test_cost_refuses_a_step_no_replica_can_run(args: list[str], start: str) -> None:
    msg = _one_line_error(["cost", "--model", "llama-3.1-70b", "--profile", "h200-sxm-vllm", *args])
    assert msg.startswith(start), msg
    r = runner.invoke(app, ["cost", "--model", "llama-3.1-70b", "--tp", "2", "--json"])
    assert r.exit_code == 0, r.output  # 70B fits two H200s


def test_calibrate_prints_a_line_per_probe_when_stderr_is_not_a_terminal(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    import numpy as np

    import hwbench.probes as probes
    from pdsim.cli import calibrate as cal

    ran: list[str] = []
    steps = [probes.Step(n, lambda n=n: ran.append(n) or []) for n in ("copy a", "matmul b")]
    monkeypatch.setattr(probes, "plan", lambda cfg, xp, workdir: steps)
    assert not cal.err_console.is_terminal
    assert cal._run_probes("tiny", np, tmp_path) == [] and ran == ["copy a", "matmul b"]
    lines = capsys.readouterr().err.splitlines()
    assert [line.split(" ", 1)[1] for line in lines] == ["probe 1/2: copy a", "probe 2/2: matmul b"]


def test_validate_says_why_the_shipped_cpu_profile_cannot_be_validated(tmp_path: Path) -> None:
    msg = _one_line_error(
        [
            "validate",
            "--profile",
            str(ROOT / "profiles" / "cpu-vm.json"),
            "--out",
            str(tmp_path / "v"),
        ]
    )
    assert "has no ops.engine" in msg and "measured 2026-11-30" in msg
    assert "allowed: a profile the current `pdsim calibrate` wrote on this machine" in msg
    assert not (tmp_path / "v").exists()


def test_rejections_are_counted_by_reason_and_named_in_the_warning() -> None:
    import numpy as np

    from pdsim.cli.run import _warnings
    from sim.cluster import build
    from sim.scenario import load_scenario
    from sim.serving.costmodel import CostModel, load_profile
    from sim.serving.models import load_catalogue

    sc = load_scenario(SCEN / "quickstart.yaml")  # one of its 2,000 requests is too long
    cl = build(sc, 0, load_catalogue(sc.catalogue), load_profile(sc.profile), CostModel, None)
    why = cl.rejected_reasons()
    window = np.array([m.max_context for m in cl.ctx.models])[cl.wl.model]
    assert why["too_long"] == int(((cl.wl.inp + cl.wl.out) > window).sum()) > 0
    assert why["too_long"] + why["kv_too_large"] == int(cl.rejected_mask().sum())
    s = {"requests": {"rejected": 2}, "rejected_reasons": {"too_long": 2, "kv_too_large": 0}}
    assert _warnings(s) == [
        "2 requests rejected (they can never run): 2 longer (prompt + output) than the "
        "model's context window"
    ]


def test_busy_share_is_at_most_one() -> None:
    from types import SimpleNamespace

    from sim.runner import utilisation

    snaps = {k: 0.0 for k in ("t", "busy", "tok_s", "flops", "hbm_read")}
    for kind in ("pcie", "nic", "nvme", "ps_nic", "ps_ssd"):
        snaps |= {f"{kind}_bw": 0.0, f"{kind}_bytes": 0.0}
    w1 = {**snaps, "t": 10.0, "busy": 20.5}  # 2 replicas; an iteration crossing the end
    model = SimpleNamespace(cost=SimpleNamespace(
        profile=SimpleNamespace(gpu=SimpleNamespace(flops_fp16=1.0, hbm_bandwidth=1.0)),
        model=SimpleNamespace(dtype_bytes=2)))  # fmt: skip
    cluster = SimpleNamespace(gpus_per_replica=1, replica=SimpleNamespace(max_num_batched_tokens=1))
    ctx = SimpleNamespace(sc=SimpleNamespace(cluster=cluster), disagg=None, models=[model],
                          nodes=[SimpleNamespace(kv=SimpleNamespace(capacity=1))] * 2,
                          metrics=SimpleNamespace(samples=[]))  # fmt: skip
    cl = SimpleNamespace(snaps={"w0": snaps, "w1": w1}, ctx=ctx)
    assert utilisation(cl)["busy"] == 1.0  # type: ignore[arg-type]


def test_the_override_examples_in_the_help_are_valid_overrides() -> None:
    import re

    from pdsim.cli.common import load_scenario_arg

    seen = []
    for cmd in (["run"], ["sweep"], ["ab"], ["plan"], ["chaos"]):
        r = runner.invoke(app, [*cmd, "--help"], env={"COLUMNS": "200"})
        seen += re.findall(r"e\.g\. ([a-z_]+\.[a-z_.]+=[\w.]+)", r.output)
        for example in re.findall(r"e\.g\. ([a-z_]+\.[a-z_.]+=[\w.]+)", r.output):
            load_scenario_arg("quickstart", [example])  # raises InputError if it is not
    assert "cluster.servers=8" in seen


def test_plan_progress_counts_runs_over_every_probe(monkeypatch: pytest.MonkeyPatch) -> None:
    """A plan's probes arrive one batch after another: the count goes on, not 3/3 then 1/1."""
    import pdsim.cli.sweep as sweep_mod

    shown: list[tuple[object, object]] = []

    class Bar:
        def __init__(self, *columns: object, **kw: object) -> None:
            pass

        def __enter__(self) -> Bar:
            return self

        def __exit__(self, *exc: object) -> None:
            return None

        def add_task(self, label: str, total: object = None) -> int:
            return 0

        def update(self, task: int, completed: object = None, total: object = None) -> None:
            shown.append((completed, total))

    monkeypatch.setattr(sweep_mod, "Progress", Bar)
    from rich.console import Console

    monkeypatch.setattr(sweep_mod, "err_console", Console(force_terminal=True))
    with sweep_mod.run_progress("plan x", batches=True) as prog:
        for done, total in [(0, 3), (1, 3), (3, 3), (0, 1), (1, 1), (0, 3), (2, 3)]:
            prog(done, total)
    assert [c for c, _ in shown] == [0, 1, 3, 3, 4, 4, 6] and {t for _, t in shown} == {None}


def test_the_plan_frontier_table_fits_80_columns_without_the_reasons(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The finding: a 22-column table 164 columns wide with one word per line of ``reason``.
    The printed frontier has the answer, GPUs, cost (per hour with a GPU-hour price), the
    busiest resource and the boundary's pass share (whole numbers as integers); every other
    column stays in frontier.csv."""
    import io
    from types import SimpleNamespace

    import pandas as pd
    from rich.console import Console

    import pdsim.cli.plan as plan_mod

    buf = io.StringIO()
    monkeypatch.setattr(plan_mod, "console", Console(file=buf, width=80, highlight=False))
    reason = "p99 e2e 6.2 s above the limit of 5 s at seeds 1, 2 and 3 " * 3
    row = {"question": "min-size", "qps": 30.0, "size": 62.0, "gpus": 496.0, "cost": 1736.0,
           "saturates_first": "mbu", "util_mbu": 0.27, "util_flops": 0.1, "reason": reason,
           "boundary_size": 61, "boundary_qps": 30.0, "boundary_pass_fraction": 2 / 3}  # fmt: skip
    spec = SimpleNamespace(alternatives={}, gpu_hour_cost=3.5)
    plan_mod._print_frontier(pd.DataFrame([row]), spec)  # type: ignore[arg-type]
    text = buf.getvalue()
    assert max(len(line) for line in text.splitlines()) <= 80, text
    assert "above the limit" not in text and "62.0" not in text
    assert "│   62 │  496 │  1,736 │ mbu 27% │" in text and "61 @ 30 QPS: 67%" in text, text
    assert "cost/h" in text  # the unit: GPUs x gpu_hour_cost per hour
