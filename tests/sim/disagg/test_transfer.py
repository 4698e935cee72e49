"""KV transfer between the pools: bytes moved equal the hand figure, the path (NVLink inside
a server, the NICs across), the transfer time on an idle path, and the request's life."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from sim.serving.metrics import DONE

from .conftest import KV_BYTES_PER_TOKEN, run, scenario


def test_kv_bytes_per_token_is_the_hand_figure() -> None:
    cl = run(scenario(workload={"requests": 2}))
    assert cl.ctx.models[0].kv_bytes_per_token == KV_BYTES_PER_TOKEN == 131072


@pytest.mark.parametrize("overlap", [True, False])
@pytest.mark.parametrize("placement", ["packed", "split"])
def test_bytes_moved_per_request_equal_prompt_tokens_times_kv_bytes(
    overlap: bool, placement: str
) -> None:
    sc = scenario(disaggregation={"overlap": overlap, "placement": placement})
    cl = run(sc)
    co, met, wl = cl.ctx.disagg, cl.ctx.metrics, cl.wl
    done = met.status == DONE
    assert done.all()
    handed = wl.out > 1  # a one-token answer finishes on the prefill replica
    expect = wl.inp.astype(np.int64) * KV_BYTES_PER_TOKEN
    assert np.array_equal(co.bytes_moved[handed], expect[handed].astype(float))
    assert np.all(co.bytes_moved[~handed] == 0)
    s = co.summary()
    assert s["kv_transfers"] == int(handed.sum())
    assert s["kv_bytes_moved"] == float(expect[handed].sum())
    if placement == "split":  # pools on separate servers: every transfer crosses the NICs
        assert s["rdma_transfers"] == s["kv_transfers"] and s["nvlink_transfers"] == 0
    else:  # one server holds both pools
        assert s["nvlink_transfers"] == s["kv_transfers"] and s["rdma_transfers"] == 0


def test_roles_prefill_emits_first_token_decode_generates() -> None:
    cl = run(scenario())
    met, co = cl.ctx.metrics, cl.ctx.disagg
    pre = {n.idx for n in co.prefill}
    # the scheduler's node of record is the prefill replica (TTFT there)
    assert set(met.node.astype(int).tolist()) <= pre
    assert all(n.role == "prefill" for n in co.prefill)
    assert all(n.role == "decode" for n in co.decode)
    assert sum(n.iterations for n in co.decode) > 0
    # tokens after the first come after the KV landed: end >= first + transfer wait
    handed = cl.wl.out > 1
    assert np.all(met.end[handed] >= met.first[handed] + co.wait[handed] - 1e-12)


def test_lone_transfer_takes_latency_plus_bytes_over_the_bottleneck() -> None:
    # one request, no overlap, pools split over two servers: bytes cross both NICs at once
    sc = scenario(
        workload={"requests": 1, "input_tokens": {"dist": "fixed", "mean": 4000}},
        disaggregation={
            "overlap": False,
            "placement": "split",
            "prefill": {"replicas": 1, "tp": 1},
            "decode": {"replicas": 1, "tp": 1},
        },
    )
    cl = run(sc)
    co = cl.ctx.disagg
    src, dst = co.prefill[0], co.decode[0]
    nbytes = 4000 * KV_BYTES_PER_TOKEN
    nic = src.ws.links["nic"]
    hand = 2 * nic.latency + nbytes / nic.bandwidth  # both NICs alike, 1 GPU each
    assert co.wait[0] == pytest.approx(hand, rel=1e-9)
    assert co.bytes_moved[0] == nbytes
    assert dst.ws.links["nic"].bandwidth == nic.bandwidth


def test_overlap_hides_all_but_the_last_layer() -> None:
    base = {
        "workload": {"requests": 1, "input_tokens": {"dist": "fixed", "mean": 4000}},
    }
    pools = {"prefill": {"replicas": 1, "tp": 1}, "decode": {"replicas": 1, "tp": 1}}
    seq = run(scenario(**base, disaggregation={**pools, "overlap": False, "placement": "split"}))
    ovl = run(scenario(**base, disaggregation={**pools, "overlap": True, "placement": "split"}))
    w_seq, w_ovl = seq.ctx.disagg.wait[0], ovl.ctx.disagg.wait[0]
    assert ovl.ctx.disagg.bytes_moved[0] == seq.ctx.disagg.bytes_moved[0]
    assert w_ovl < w_seq
    # the prefill (~0.09 s) outlasts the early flow, so only the last layer's share is left
    # (the model runs n_layers passes: embedding, 32 blocks, head)
    nic = seq.ctx.disagg.prefill[0].ws.links["nic"]
    total = 4000 * KV_BYTES_PER_TOKEN
    n_layers = ovl.ctx.models[0].n_layers
    last = total - total * (n_layers - 1) // n_layers
    assert w_ovl == pytest.approx(last / nic.bandwidth, rel=1e-9)
    assert w_seq == pytest.approx(total / nic.bandwidth, rel=1e-9)


@pytest.mark.parametrize(("routing", "full_sends"), [("kv-aware", 1), ("round-robin", 2)])
def test_kv_aware_decode_routing_reuses_a_held_prefix(
    tmp_path: Path, routing: str, full_sends: int
) -> None:
    # three requests with the same four 512-token blocks, 5 s apart (each runs alone)
    lines = [
        json.dumps(
            {"timestamp": t, "input_length": 2048, "output_length": 8, "hash_ids": [0, 1, 2, 3]}
        )
        for t in (0, 5000, 10000)
    ]
    trace = tmp_path / "t.jsonl"
    trace.write_text("\n".join(lines) + "\n")
    cl = run(
        scenario(
            workload={"kind": "trace", "trace": str(trace), "requests": 3},
            disaggregation={
                "prefill": {"replicas": 1, "tp": 1},
                "decode": {"replicas": 2, "tp": 1},
                "decode_routing": routing,
            },
        )
    )
    moved = cl.ctx.disagg.bytes_moved.tolist()
    full = 2048 * KV_BYTES_PER_TOKEN
    # kv-aware: every repeat goes where blocks 0..3 are held and sends nothing; round-robin
    # sends the whole prompt to the second decode replica once
    assert sorted(moved) == sorted([full] * full_sends + [0.0] * (3 - full_sends))
    assert moved[0] == full
