"""The longest context a replica holds (R12): storage layout plus attention memory."""

from __future__ import annotations

from pathlib import Path

from engine.kv import AttentionMemoryModel, KvStorageModel
from sim.cluster import build
from sim.scenario import load_scenario, variant
from sim.serving.costmodel import CostModel, load_profile
from sim.serving.gpumemory import context_limit, plan_memory
from sim.serving.models import load_catalogue

ROOT = Path(__file__).resolve().parents[3]
LONG = ROOT / "scenarios" / "long-context.yaml"


def _limits(overrides: list[str]) -> tuple[int, int, int]:
    """(limit the built cluster uses, KV budget, KV bytes per token) of long-context."""
    sc = load_scenario(LONG, overrides=[*overrides, "workload.duration=1s"])
    cat, prof = load_catalogue(), load_profile(sc.profile)
    spec = cat[sc.deployments[0].model]
    kv = plan_memory(sc, [spec], prof.gpu.hbm_bytes, prof.name).kv
    cl = build(sc, 0, cat, prof, CostModel)
    assert cl.ctx.models[0].max_context == context_limit(sc, spec, kv)
    return cl.ctx.models[0].max_context, kv, int(spec.kv_bytes_per_token)


def test_the_limit_comes_from_the_storage_model() -> None:
    cont, kv, bpt = _limits(["kv.storage=contiguous", "kv.attention=chunked"])
    chunk, kv2, _ = _limits(["kv.storage=chunked", "kv.attention=chunked"])
    assert kv == kv2 and bpt == 128 * 1024  # Llama-3.1-8B: 32 layers x 8 KV heads x 128 x 2 x 2
    scratch = 512 * (2 * 8 * 128 * 4) + 512 * 512 * (32 * 4)
    # chunked storage: whole 512-token chunks of the budget
    assert chunk == (kv - scratch) // bpt // 512 * 512
    # contiguous storage reaches a regrowth capacity whose high-water mark fits, the next
    # regrowth's does not (the buffers and their marks: tests/engine/kv/test_footprint.py)
    m = KvStorageModel("contiguous", chunk_tokens=512)
    assert m.slots(cont) * bpt + scratch <= kv < m.slots(cont + 1) * bpt + scratch
    assert m.slots(cont) > 1.5 * cont  # the copy and the freed buffers are charged
    assert cont < chunk / 1.5


def test_paged_storage_keeps_the_block_model() -> None:
    got, kv, bpt = _limits(["kv.storage=paged", "kv.attention=unchunked"])
    ref = AttentionMemoryModel(bpt, 2 * 8 * 128 * 4, 32 * 4, block_tokens=64, chunk_tokens=512)
    assert got == ref.max_context(kv, chunked=False)


def test_long_context_variants_differ_in_storage_only() -> None:
    sc = load_scenario(LONG)
    kvs = {v.name: variant(sc, v).kv for v in sc.variants}
    assert kvs["contiguous"].storage == "contiguous" and kvs["chunked"].storage == "chunked"
    assert kvs["contiguous"].attention == kvs["chunked"].attention
    assert kvs["contiguous"].regrowth == 1.5 and kvs["chunked"].chunk_tokens == 512
