"""``pdsim cost``: one iteration's ops as a table or one JSON object."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from pdsim.cli import app
from sim.serving.costmodel import load_profile as load_op_profile
from sim.serving.itercost import iteration_cost, iteration_seconds
from sim.serving.models import load_catalogue
from sim.serving.opcost import OP_NAMES, OpCostModel

runner = CliRunner()


def cost_json(*args: str) -> dict[str, object]:
    res = runner.invoke(app, ["cost", *args, "--json"])
    assert res.exit_code == 0, res.output
    return json.loads(res.output.strip().splitlines()[-1])


def test_json_is_the_cost_model_iteration() -> None:
    out = cost_json("--model", "llama-2-70b", "--tp", "8", "--phase", "decode", "--batch", "64",
                    "--context", "4096")  # fmt: skip
    ops = out["ops"]
    assert isinstance(ops, dict) and list(ops) == [*OP_NAMES, "pp_handoff"]
    assert out["seconds"] == pytest.approx(sum(ops.values()))
    cm = OpCostModel(load_op_profile("h200-sxm-vllm"), load_catalogue()["llama-2-70b"], tp=8)
    assert out["seconds"] == pytest.approx(cm.iteration_time(0, 0, 0, 64, 64 * 4096.0))
    # the simulator's price of the same iteration (one implementation)
    sim = iteration_cost(load_op_profile("h200-sxm-vllm"), load_catalogue()["llama-2-70b"], tp=8)
    assert out["seconds"] == pytest.approx(iteration_seconds(sim, 0, 0.0, 0, 64, 64 * 4096.0))
    assert ops["allreduce_attn"] > 0 and out["sources"]["qkv_gemm"] == "table"  # type: ignore[index]


def test_prefill_is_batch_prompts_of_context_tokens() -> None:
    one = cost_json(
        "--model", "llama-2-7b", "--phase", "prefill", "--batch", "1", "--context", "1024"
    )
    four = cost_json(
        "--model", "llama-2-7b", "--phase", "prefill", "--batch", "4", "--context", "1024"
    )
    cm = OpCostModel(load_op_profile("h200-sxm-vllm"), load_catalogue()["llama-2-7b"])
    assert four["seconds"] == pytest.approx(cm.iteration_time(4096, 4 * 1024**2, 4, 0, 0.0))
    assert one["seconds"] < four["seconds"]  # type: ignore[operator]
    ops = four["ops"]
    assert isinstance(ops, dict) and ops["attention_decode"] == 0.0


def test_table_lists_every_op_with_its_source() -> None:
    res = runner.invoke(app, ["cost", "--model", "llama-2-7b"])
    assert res.exit_code == 0, res.output
    for name in ("qkv_gemm", "attention_decode", "lm_head", "total", "table"):
        assert name in res.output
    # a datasheet profile has no op tables: the simulator's roofline, by layer kind
    res = runner.invoke(app, ["cost", "--model", "llama-2-7b", "--profile", "h200-sxm"])
    assert res.exit_code == 0, res.output
    for name in ("transformer_layers", "lm_head", "allreduce", "total", "roofline"):
        assert name in res.output


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--model", "nope"], "llama-2-7b"),
        (["--model", "llama-2-7b", "--phase", "both"], "allowed: prefill, decode"),
        (["--model", "llama-2-7b", "--batch", "0"], ">= 1"),
        (["--model", "llama-2-7b", "--tp", "3"], "tp=3"),
        (["--model", "resnet-50"], "prices decoders"),
        (["--model", "llama-2-7b", "--profile", "missing.json"], "missing.json"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(args: list[str], needle: str) -> None:
    res = runner.invoke(app, ["cost", *args])
    assert res.exit_code == 2 and needle in res.output, res.output


def test_framework_overheads_are_ops_with_their_provenance(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """The vLLM profile's framework overheads are ops of the iteration, by hand: a prefill of
    3 prompts pays 3 admissions and 3 sampled tokens, a decode of 64 sequences 64 sampled
    tokens, each iteration one iteration overhead; with the terms removed from the profile
    the iteration costs exactly that much less, and the ops say the profile states none."""
    prof = load_op_profile("h200-sxm-vllm")
    fw = prof.ops.framework  # type: ignore[union-attr]
    assert fw is not None and "vLLM" in fw.origin
    over = prof.ops.roofline.iteration_overhead_s  # type: ignore[union-attr]
    assert (over, fw.admission_s, fw.token_output_s) == (1.53e-4, 1.76e-4, 1.27e-5)
    pre = cost_json("--model", "llama-3.1-8b", "--phase", "prefill", "--batch", "3",
                    "--context", "512")  # fmt: skip
    ops, src = pre["ops"], pre["sources"]
    assert isinstance(ops, dict) and isinstance(src, dict)
    assert ops["admission"] == pytest.approx(3 * 1.76e-4, rel=1e-12)
    assert ops["token_output"] == pytest.approx(3 * 1.27e-5, rel=1e-12)
    assert ops["iteration_overhead"] == 1.53e-4
    assert src["admission"] == src["token_output"] == src["iteration_overhead"] == "framework"
    assert "simllm" in str(pre["framework_origin"])
    dec = cost_json("--model", "llama-3.1-8b", "--batch", "64", "--context", "600")
    dops = dec["ops"]
    assert isinstance(dops, dict) and dops["admission"] == 0.0
    assert dops["token_output"] == pytest.approx(64 * 1.27e-5, rel=1e-12)
    # the same profile without the terms: the iteration is cheaper by exactly them
    data = json.loads(prof.model_dump_json())
    data["ops"]["framework"] = None
    data["ops"]["roofline"]["iteration_overhead_s"] = 0.0
    bare = tmp_path / "bare.json"
    bare.write_text(json.dumps(data))
    off = cost_json("--model", "llama-3.1-8b", "--batch", "64", "--context", "600",
                    "--profile", str(bare))  # fmt: skip
    added = 1.53e-4 + 64 * 1.27e-5
    assert dec["seconds"] - off["seconds"] == pytest.approx(added, rel=1e-9)  # type: ignore[operator]
    osrc = off["sources"]
    assert isinstance(osrc, dict) and off["framework_origin"] is None
    assert osrc["token_output"] == osrc["iteration_overhead"] == "none in profile"
    table = runner.invoke(app, ["cost", "--model", "llama-3.1-8b", "--profile", str(bare)])
    assert "states no framework overheads" in table.output


def _run_and_cost(tmp_path: object, tp: int, batch: int, tokens: int) -> tuple[str, str]:
    """The last line of ``pdsim run llama70b-h200`` and of ``pdsim cost`` for one replica
    shape: ``tp``, and a token budget of ``tokens`` over ``batch`` sequences (a decode step
    of ``batch`` sequences is ``tokens == batch``)."""
    sets = [f"cluster.tp={tp}", f"cluster.replica.max_num_batched_tokens={tokens}",
            f"cluster.replica.max_num_seqs={batch}", "workload.duration=0.01s"]  # fmt: skip
    args = ["run", "llama70b-h200", "--out", str(tmp_path), "--seed", "1"]
    for s in sets:
        args += ["--set", s]
    run = runner.invoke(app, args).output.strip().splitlines()
    cost = runner.invoke(
        app, ["cost", "-m", "llama-3.1-70b", "-p", "h200-sxm-vllm", "--tp", str(tp),
              "--batch", str(batch), "--context", "2048"],
    ).output.strip().splitlines()  # fmt: skip
    return run[-1], cost[-1]


def test_cost_and_run_refuse_the_same_replica_with_the_same_message(tmp_path: object) -> None:
    # 70B bf16 is 141.1 GB of weights: one H200 (149.3 GB x 0.9 = 134.3 GB) cannot hold it
    run, cost = _run_and_cost(tmp_path, tp=1, batch=1, tokens=1)
    body = "llama-3.1-70b (bf16) at tp=1 pp=1 needs 141.1 GB of weights per GPU"
    assert body in run and body in cost, (run, cost)
    assert run.endswith(cost.split("--tp 1: ", 1)[1]), (run, cost)  # the same message
    assert "cluster.tp" in run and "use tp >= 2" in run


def test_cost_and_run_both_accept_a_replica_that_fits() -> None:
    from sim.feasible import check_feasible
    from sim.scenario import load_scenario
    from sim.serving.costmodel import load_profile
    from sim.shipped import resolve_scenario

    # tp=2: 70.6 GB of weights per GPU and a 1-sequence workspace fit 134.3 GB
    sets = ["cluster.tp=2", "cluster.replica.max_num_batched_tokens=1",
            "cluster.replica.max_num_seqs=1"]  # fmt: skip
    sc = load_scenario(resolve_scenario("llama70b-h200"), sets)
    check_feasible(sc, load_catalogue(), load_profile("h200-sxm-vllm"))  # what run checks first
    out = cost_json("-m", "llama-3.1-70b", "-p", "h200-sxm-vllm", "--tp", "2", "--batch", "1")
    assert out["tp"] == 2 and float(str(out["seconds"])) > 0
