"""Routed experts as parameter chunks (``experts:``; sim.serving.expertpath): residency,
a hand-computed LRU miss sequence from a routing trace, determinism and bad input."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from engine.errors import InputError
from sim.runner import run_scenario
from sim.scenario import load_scenario, validate
from sim.serving.paramstore import WeightStore

SCEN = Path(__file__).resolve().parents[3] / "scenarios" / "expert-offload.yaml"
SMALL = ["workload.requests=3", "workload.output_tokens.mean=6"]


def _variant(name: str, extra: list[str] | None = None) -> Any:
    sc = load_scenario(SCEN, [*SMALL, *(extra or [])])
    (v,) = [v for v in sc.variants if v.name == name]
    return sc.model_copy(update={"variants": [v]})


def test_full_budget_hits_every_expert_and_moves_nothing() -> None:
    """A budget holding every expert (warmed up): every expert access hits, no byte moves."""
    s = run_scenario(_variant("hbm100-lru"), seed=3).summary["variants"]["hbm100-lru"]
    e = s["experts"]
    assert e["accesses"] > 0
    assert e["hit_rate"] == 1.0 and e["hits"] == e["accesses"]
    assert e["bytes_moved"] == 0 and e["demand_fetched"] == 0
    assert sum(s["bytes_by_tier"].values()) == 0


def test_small_budget_misses_and_moves_bytes() -> None:
    """A quarter of the experts in HBM: misses happen and each one moves an expert."""
    s = run_scenario(_variant("hbm25-lru"), seed=3).summary["variants"]["hbm25-lru"]
    e = s["experts"]
    assert e["hit_rate"] < 1.0
    expert = 3 * 2048 * 768 * 2  # Qwen3-30B-A3B: gate, up, down of hidden 2048 x 768, bf16
    assert e["bytes_moved"] == e["demand_fetched"] * expert


def test_batches_of_eight_tokens_activate_at_most_eight_times_top_k() -> None:
    """1-token prompts and at most 8 sequences: no iteration holds more than 8 tokens, so no
    layer of Qwen3-30B-A3B (top-8 of 128) activates more than 64 experts in one iteration."""
    sc = _variant("hbm50-lru", ["workload.input_tokens.mean=1", "workload.requests=8"])
    e = run_scenario(sc, seed=2).summary["variants"]["hbm50-lru"]["experts"]
    assert 8 < e["max_active_per_layer"] <= 8 * 8


def test_same_seed_same_trace_hash_other_seed_differs() -> None:
    sc = _variant("hbm25-lruk-pf")
    a, b, c = (run_scenario(sc, seed=s) for s in (5, 5, 6))
    assert a.trace_hash == b.trace_hash
    assert a.summary["variants"] == b.summary["variants"]
    assert c.trace_hash != a.trace_hash


# -- a routing trace and a hand-computed LRU miss sequence -----------------------------------
# Mixtral-8x7B: 32 expert layers (blocks 0..31) of 8 experts. Budget 8/256 of the experts: the
# HBM expert cache holds 8 experts next to the dense weights (which keep a pin). One request of
# 16 prompt tokens and 5 output tokens runs 5 iterations (a prefill, then 4 decode steps):
# steps 0..4 of the trace. Only blocks 0 and 1 route; an expert is "layer.expert".
TRACE = """step,layer,expert,tokens
0,0,0,5
0,0,1,6
0,0,2,5
0,1,0,16
0,1,1,8
0,1,2,8
1,0,0,1
1,0,3,1
1,1,4,1
2,0,1,1
2,0,2,1
2,1,0,1
3,0,4,1
3,0,5,1
3,1,1,1
3,1,2,1
4,0,0,1
4,1,3,1
"""
# LRU order (least recent first) after each layer, 8 slots:
# step 0  L0 {0,1,2}: miss 0.0 0.1 0.2              -> 0.0 0.1 0.2
#         L1 {0,1,2}: miss 1.0 1.1 1.2              -> 0.0 0.1 0.2 1.0 1.1 1.2
# step 1  L0 {0,3}: hit 0.0, miss 0.3               -> 0.1 0.2 1.0 1.1 1.2 0.0 0.3
#         L1 {4}: miss 1.4                          -> 0.1 0.2 1.0 1.1 1.2 0.0 0.3 1.4 (full)
# step 2  L0 {1,2}: hits; L1 {0}: hit               -> 1.1 1.2 0.0 0.3 1.4 0.1 0.2 1.0
# step 3  L0 {4,5}: miss 0.4 (evicts 1.1), 0.5 (evicts 1.2)
#                                                   -> 0.0 0.3 1.4 0.1 0.2 1.0 0.4 0.5
#         L1 {1,2}: miss 1.1 (evicts 0.0), 1.2 (evicts 0.3)
#                                                   -> 1.4 0.1 0.2 1.0 0.4 0.5 1.1 1.2
# step 4  L0 {0}: miss 0.0 (evicts 1.4)             -> 0.1 0.2 1.0 0.4 0.5 1.1 1.2 0.0
#         L1 {3}: miss 1.3 (evicts 0.1)
EXPECTED_MISSES = [
    [(0, 0), (0, 1), (0, 2)],
    [(1, 0), (1, 1), (1, 2)],
    [(0, 3)],
    [(1, 4)],
    [(0, 4), (0, 5)],
    [(1, 1), (1, 2)],
    [(0, 0)],
    [(1, 3)],
]


def _trace_scenario(tmp: Path, trace: str = TRACE, **experts: Any) -> Any:
    (tmp / "routing.csv").write_text(trace, encoding="utf-8")
    cfg = {"enabled": True, "hbm_budget": 8 / 256, "routing": "trace", "trace": "routing.csv"}
    cfg.update(experts)
    sc = {
        "name": "trace",
        "profile": "h200-sxm",
        "deployments": [{"model": "mixtral-8x7b"}],
        "cluster": {
            "servers": 1,
            "param_servers": 1,
            "gpus_per_server": 1,
            "server": {"host": "128GiB"},
        },
        "prefetch": {"enabled": False},
        "cache": {"hbm_policy": "lru"},
        "experts": cfg,
        "workload": {
            "kind": "poisson",
            "requests": 1,
            "rate": 1,
            "input_tokens": {"dist": "fixed", "mean": 16},
            "output_tokens": {"dist": "fixed", "mean": 5},
        },
    }
    return validate(sc, source=str(tmp / "trace.yaml"))


def test_trace_misses_equal_hand_computed_lru(tmp_path: Path, monkeypatch: Any) -> None:
    fetched: list[list[tuple[int, int]]] = []
    real = WeightStore.fetch

    def spy(self: WeightStore, m: int, layer: int, cids: list[int], *a: Any, **k: Any) -> Any:
        tab = self.ctx.models[m].experts
        assert tab is not None
        j = tab.of_layer[layer]
        experts = [(tab.blocks[j], c - tab.first[j]) for c in cids if j >= 0 and c >= tab.first[j]]
        if experts:
            fetched.append(experts)
        return real(self, m, layer, cids, *a, **k)

    monkeypatch.setattr(WeightStore, "fetch", spy)
    s = run_scenario(_trace_scenario(tmp_path), seed=0).summary
    assert fetched == EXPECTED_MISSES
    e = s["experts"]
    # 18 expert uses in the trace; 14 misses above; the hits: 0.0 (step 1), 0.1 0.2 1.0 (step 2)
    assert e["accesses"] == 18 and e["demand_fetched"] == 14 and e["hits"] == 4


def test_trace_errors_name_file_and_line(tmp_path: Path) -> None:
    bad = TRACE.replace("1,1,4,1", "1,1,8,1")  # Mixtral has experts 0..7
    with pytest.raises(InputError, match=r"routing\.csv: line 10: expert 8 out of range 0\.\.7"):
        run_scenario(_trace_scenario(tmp_path, bad), seed=0)
    bad = TRACE.replace("2,1,0,1", "2,32,0,1")
    with pytest.raises(InputError, match=r"line 13: layer 32 is not an expert layer"):
        run_scenario(_trace_scenario(tmp_path, bad), seed=0)
    with pytest.raises(InputError, match=r"line 1: header must be step,layer,expert,tokens"):
        run_scenario(_trace_scenario(tmp_path, "step,layer,expert\n0,0,0\n"), seed=0)
    bad = TRACE.replace("1,0,3,1", "1,0,3,0")
    with pytest.raises(InputError, match=r"line 9: tokens must be >= 1"):
        run_scenario(_trace_scenario(tmp_path, bad), seed=0)
    bad = TRACE + "4,1,3,2\n"
    with pytest.raises(InputError, match=r"line 20: step 4, layer 1, expert 3 repeats"):
        run_scenario(_trace_scenario(tmp_path, bad), seed=0)


def test_bad_experts_config_names_the_field(tmp_path: Path) -> None:
    with pytest.raises(InputError, match=r"experts\.hbm_budget: .* at least one layer's worth"):
        run_scenario(_trace_scenario(tmp_path, hbm_budget=7 / 256), seed=0)
    sc = _trace_scenario(tmp_path).model_copy(update={"mode": "coupled"})
    with pytest.raises(InputError, match=r"experts\.enabled: .*mode: pd"):
        run_scenario(sc, seed=0)
    dense = _trace_scenario(tmp_path).model_dump(mode="json")
    dense["deployments"] = [{"model": "llama-2-7b"}]
    with pytest.raises(InputError, match=r"experts\.enabled: no deployed model has routed"):
        run_scenario(validate(dense, "x.yaml"), seed=0)
    split = _trace_scenario(tmp_path).model_dump(mode="json")
    split["cluster"]["ep"] = 2
    split["cluster"]["tp"] = 2
    split["cluster"]["gpus_per_server"] = 2
    with pytest.raises(InputError, match=r"experts\.enabled: .*expert parallelism"):
        run_scenario(validate(split, "x.yaml"), seed=0)
    scaled = _trace_scenario(tmp_path).model_dump(mode="json")
    scaled["autoscale"] = {"enabled": True}
    with pytest.raises(InputError, match=r"experts\.enabled: .*autoscale\.enabled"):
        run_scenario(validate(scaled, "x.yaml"), seed=0)
    with pytest.raises(InputError, match=r"routing: trace needs `trace`"):
        validate({"deployments": [{"model": "mixtral-8x7b"}], "experts": {"routing": "trace"}})


@pytest.mark.parametrize("policy", ["arc", "color-lru", "fifo", "lru-k", "pin", "priority"])
def test_every_registry_policy_runs_the_expert_cache(tmp_path: Path, policy: str) -> None:
    """Each online policy of the registry manages the expert cache: the trace's 11 distinct
    experts miss at least once (compulsory) and no use misses more than once per use (18)."""
    sc = _trace_scenario(tmp_path)
    sc = sc.model_copy(update={"cache": sc.cache.model_copy(update={"hbm_policy": policy})})
    e = run_scenario(sc, seed=0).summary["experts"]
    assert e["accesses"] == 18
    assert 11 <= e["demand_fetched"] <= 18
    assert e["hits"] + e["demand_fetched"] == 18
