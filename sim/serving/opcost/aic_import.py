"""Import measured kernel tables from the ``aiconfigurator`` package into a pdsim profile.

aiconfigurator (NVIDIA, Apache-2.0) ships per-system kernel timings as Parquet files under
``aiconfigurator_core/systems/data/<system>/<family>/<backend>/<version>/`` and the system's
hardware figures in ``systems/<system>.yaml``. Latencies there are milliseconds; all-reduce
message sizes are bf16 elements. Times are stored in seconds to 4 significant digits.
This module reads (per backend, the newest version that has
the file):

* ``gemm/.../gemm_perf.parquet`` -> :class:`GemmTable` for bf16 (``torch.nn.functional.linear``
  or the only bf16 kernel) and fp8 per-tensor (``CutlassFP8ScaledMMLinearKernel``), on the m
  knots of :data:`M_KNOTS` that were measured and every measured n and k. A grid cell that was
  not measured is estimated from the nearest measured (n, k) at the same m, scaled by
  ``n * k`` (counted in ``GemmTable.kernel``'s note);
* ``attention/.../context_attention_perf.parquet`` and ``generation_attention_perf.parquet``
  -> :class:`AttentionTable` per head layout (bf16 KV, no sliding window, head_dim 128,
  the most-measured kernel). Decode rows are at ``step`` tokens generated after a 1-token
  prompt, so their context is ``step + 1``;
* ``comm/.../custom_allreduce_perf.parquet`` -> :class:`CollectiveTable` per group size (the
  CUDA-graph variant when present), bytes = elements x 2;
* ``comm/.../moe_a2a_perf.parquet`` -> :class:`CollectiveTable` ``op: all_to_all`` per group
  size (DeepEP, the faster of its low-latency and high-throughput kernels per size), by the
  bytes one GPU sends;
* ``moe/.../moe_perf.parquet`` -> :class:`MoeTable` per (dtype: bf16, fp8_block; expert
  shape; moe_tp x moe_ep; routing distribution: balanced = skew 0, power_law_A = skew A);
* ``mla/.../mla_context_module_perf.parquet`` and ``mla_generation_module_perf.parquet`` ->
  :class:`MlaTable` per (phase, heads per GPU, projection dtype), bf16 latent cache, every
  kernel the backend picks by length, measured on DeepSeek-V3's dimensions (:data:`MLA_MODELS`).

There are no elementwise tables in the package (it times norms and activations with a
bandwidth formula); the profile's roofline terms take that formula's figures
(``mem_bw_empirical_scaling_factor`` -> ``memory_efficiency``,
``mem_empirical_constant_latency`` -> ``op_floor_s``). Host memory, NVMe and object-store
figures are not in the package and come from ``base`` (a datasheet profile). The serving
framework's own overheads (``ops.roofline.iteration_overhead_s`` and ``ops.framework``) are
not in the package either: they come from :mod:`sim.serving.opcost.frameworks` for a backend
with published figures (``vllm``), else the profile states none.
"""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Any, Literal

import pandas as pd
import yaml

from engine.errors import InputError
from sim.serving.costmodel import GpuProfile, LinkProfile, LinksProfile, Profile
from sim.serving.opcost.frameworks import framework_terms
from sim.serving.opcost.tables import (
    AttentionTable,
    CollectiveTable,
    Curves,
    GemmTable,
    Grid3,
    MlaTable,
    MoeTable,
    OpsProfile,
    TableOrigin,
)
from sim.serving.opcost.terms import RooflineTerms

#: m (token) knots kept from a GEMM table when measured there
M_KNOTS: tuple[int, ...] = (
    1, 2, 4, 8, 16, 32, 48, 64, 96, 128, 192, 256, 384, 512, 768, 1024, 1536, 2048, 3072,
    4096, 8192, 16384, 32768,
)  # fmt: skip
HEAD_DIMS: tuple[int, ...] = (128,)
MS = 1e-3  # aiconfigurator latencies are milliseconds
US = 1e-6  # except the expert all-to-all's, in microseconds (its columns say `_us`)


def _sec(ms: float) -> float:
    """Milliseconds to seconds, rounded to 4 significant digits (keeps shipped JSON small)."""
    return float(f"{ms * MS:.4g}")


def installed_systems_dir() -> tuple[Path, str]:
    """``(systems directory, package version)`` of the installed aiconfigurator;
    :class:`InputError` saying how to install it when it is missing."""
    try:
        from importlib.metadata import version
        from importlib.util import find_spec

        spec = find_spec("aiconfigurator_core")
        if spec is None or not spec.submodule_search_locations:
            raise ImportError
        root = Path(next(iter(spec.submodule_search_locations))) / "systems"
        return root, version("aiconfigurator")
    except Exception:  # any failure means "not usable"
        raise InputError(
            "the aiconfigurator package is not installed; install it with "
            "`pip install -e '.[aic]'` (or pass --systems-dir)"
        ) from None


def _newest(root: Path, system: str, family: str, backend: str, filename: str) -> Path | None:
    base = root / "data" / system / family / backend
    if not base.is_dir():
        return None
    found = [p for p in base.glob(f"*/{filename}") if p.is_file()]

    def key(p: Path) -> tuple[int, ...]:  # "0.24.0" -> (0, 24, 0); "1.3.0rc20" -> (1, 3, 0, 20)
        return tuple(int(x) for x in re.findall(r"\d+", p.parent.name))

    return max(found, key=key) if found else None


def _origin(df: pd.DataFrame, path: Path, root: Path, pkg: str) -> TableOrigin:
    row = df.iloc[0]
    return TableOrigin(
        device=str(row.get("device", "unknown")),
        framework=f"{str(row.get('framework', 'unknown')).lower()} {row.get('version', '')}".strip(),
        measured_at=f"shipped in aiconfigurator {pkg} (collection date not recorded)",
        source=f"aiconfigurator {pkg}: systems/{path.relative_to(root).as_posix()}",
    )


def _gemm_table(
    df: pd.DataFrame, dtype: Literal["bf16", "fp8"], origin: TableOrigin, kernel: str
) -> GemmTable:
    ms = [m for m in M_KNOTS if m in set(df["m"])]
    ns, ks = sorted(set(df["n"])), sorted(set(df["k"]))
    by = {(int(r.m), int(r.n), int(r.k)): _sec(float(r.latency)) for r in df.itertuples()}
    measured_nk = sorted({(n, k) for (_, n, k) in by})
    filled = 0
    grid = []
    for m in ms:
        plane = []
        for n in ns:
            row = []
            for k in ks:
                v = by.get((m, n, k))
                if v is None:
                    near = [nk for nk in measured_nk if (m, *nk) in by]
                    n2, k2 = min(near, key=lambda nk: abs(math.log(nk[0] * nk[1] / (n * k))))
                    v = float(f"{by[(m, n2, k2)] * (n * k) / (n2 * k2):.4g}")
                    filled += 1
                row.append(v)
            plane.append(row)
        grid.append(plane)
    note = (
        f"{kernel}; {filled} of {len(ms) * len(ns) * len(ks)} cells estimated" if filled else kernel
    )
    return GemmTable(
        origin=origin, dtype=dtype, kernel=note, grid=Grid3(m=ms, n=ns, k=ks, latency_s=grid)
    )


def _gemms(root: Path, system: str, backend: str, pkg: str) -> list[GemmTable]:
    path = _newest(root, system, "gemm", backend, "gemm_perf.parquet")
    if path is None:
        return []
    df = pd.read_parquet(path)
    out = []
    choices: tuple[tuple[Literal["bf16", "fp8"], str, str], ...] = (
        ("bf16", "bfloat16", "torch.nn.functional.linear"),
        ("fp8", "fp8", "CutlassFP8ScaledMMLinearKernel"),
    )
    for dtype, src, preferred in choices:
        sub = df[df["gemm_dtype"] == src]
        if sub.empty:
            continue
        kernels = sub["kernel_source"].value_counts()
        kernel = preferred if preferred in kernels.index else str(kernels.index[0])
        sub = (
            sub[sub["kernel_source"] == kernel]
            .groupby(["m", "n", "k"], as_index=False)["latency"]
            .median()
        )
        out.append(_gemm_table(sub, dtype, _origin(df, path, root, pkg), kernel))
    return out


def _attention(root: Path, system: str, backend: str, pkg: str) -> list[AttentionTable]:
    out: list[AttentionTable] = []
    files: tuple[tuple[Literal["prefill", "decode"], str], ...] = (
        ("prefill", "context_attention_perf.parquet"),
        ("decode", "generation_attention_perf.parquet"),
    )
    for phase, filename in files:
        path = _newest(root, system, "attention", backend, filename)
        if path is None:
            continue
        df = pd.read_parquet(path)
        origin = _origin(df, path, root, pkg)
        keep = df["head_dim"].isin(HEAD_DIMS)
        for col, value in (("kv_cache_dtype", "bfloat16"), ("window_size", 0), ("beam_width", 1)):
            if col in df.columns:
                keep &= df[col] == value
        df = df[keep]
        if df.empty:
            continue
        kernel = str(df["kernel_source"].value_counts().index[0])
        df = df[df["kernel_source"] == kernel].copy()
        df["x"] = df["isl"] if phase == "prefill" else df["step"] + 1
        keys = ["num_heads", "num_key_value_heads", "head_dim"]
        for (heads, kvh, hd), grp in df.groupby(keys):
            g = grp.groupby(["batch_size", "x"], as_index=False)["latency"].median()
            batches = sorted(int(b) for b in g["batch_size"].unique())
            xs, ys = [], []
            for b in batches:
                cur = g[g["batch_size"] == b].sort_values("x")
                xs.append([int(v) for v in cur["x"]])
                ys.append([_sec(float(v)) for v in cur["latency"]])
            out.append(
                AttentionTable(
                    origin=origin, phase=phase, heads=int(heads), kv_heads=int(kvh),
                    head_dim=int(hd), kv_dtype="bf16", kernel=kernel,
                    curves=Curves(batch=batches, x=xs, latency_s=ys),
                )
            )  # fmt: skip
    return out


def _allreduce(root: Path, system: str, backend: str, pkg: str) -> list[CollectiveTable]:
    path = _newest(root, system, "comm", backend, "custom_allreduce_perf.parquet")
    if path is None:
        return []
    df = pd.read_parquet(path)
    origin = _origin(df, path, root, pkg)
    if "backend" in df.columns and (df["backend"] == "vllm_graph").any():
        df = df[df["backend"] == "vllm_graph"]
    out = []
    for group, grp in df.groupby("num_gpus"):
        g = (
            grp.groupby("message_size", as_index=False)["latency"]
            .median()
            .sort_values("message_size")
        )
        out.append(
            CollectiveTable(
                origin=origin, group=int(group), kernel=str(grp["kernel_source"].iloc[0]),
                bytes=[int(v) * 2 for v in g["message_size"]],
                latency_s=[_sec(float(v)) for v in g["latency"]],
            )
        )  # fmt: skip
    return out


#: aiconfigurator MoE dtypes kept -> pdsim's name (the bf16 and the fp8 checkpoints served)
MOE_DTYPES: dict[str, Literal["bf16", "fp8", "fp8_block"]] = {
    "bfloat16": "bf16",
    "fp8_block": "fp8_block",
}


def _skew(distribution: str) -> float | None:
    """``balanced`` -> 0, ``power_law_1.2`` -> 1.2; None for anything else."""
    if distribution == "balanced":
        return 0.0
    found = re.fullmatch(r"power_law_([0-9.]+)", distribution)
    return float(found.group(1)) if found else None


def _moe(root: Path, system: str, backend: str, pkg: str) -> list[MoeTable]:
    """Expert tables per (dtype, shape, split, routing distribution): the most-measured
    kernel of each dtype, median seconds per token count."""
    path = _newest(root, system, "moe", backend, "moe_perf.parquet")
    if path is None:
        return []
    df = pd.read_parquet(path)
    origin = _origin(df, path, root, pkg)
    out: list[MoeTable] = []
    for src, dtype in MOE_DTYPES.items():
        sub = df[df["moe_dtype"] == src]
        if sub.empty:
            continue
        kernel = str(sub["kernel_source"].value_counts().index[0])
        sub = sub[sub["kernel_source"] == kernel]
        keys = ["hidden_size", "inter_size", "topk", "num_experts", "moe_tp_size",
                "moe_ep_size", "distribution"]  # fmt: skip
        for (h, inter, k, e, mtp, mep, dist), grp in sub.groupby(keys):
            skew = _skew(str(dist))
            if skew is None:
                continue
            g = grp.groupby("num_tokens", as_index=False)["latency"].median()
            g = g.sort_values("num_tokens")
            out.append(
                MoeTable(
                    origin=origin, dtype=dtype, kernel=kernel, hidden=int(h), moe_ffn=int(inter),
                    top_k=int(k), n_experts=int(e), moe_tp=int(mtp), moe_ep=int(mep),
                    routing_skew=skew, tokens=[int(v) for v in g["num_tokens"]],
                    latency_s=[_sec(float(v)) for v in g["latency"]],
                )
            )  # fmt: skip
    return out


def _all_to_all(root: Path, system: str, backend: str, pkg: str) -> list[CollectiveTable]:
    """Expert dispatch/combine tables per group size, by the bytes each GPU sends
    (``tokens x top_k x hidden x 2 x (ep - 1) / ep``, bf16 activations): the mean of
    dispatch and combine, the median over the measured shapes of one byte count, the faster
    kernel per byte count (latencies in microseconds there)."""
    path = _newest(root, system, "comm", backend, "moe_a2a_perf.parquet")
    if path is None:
        return []
    df = pd.read_parquet(path)
    origin = _origin(df, path, root, pkg)
    # what one GPU sends for its tokens: sim.serving.moeparallel.alltoall_bytes at tp = 1
    df = df.copy()
    ep = df["ep_size"]
    df["nbytes"] = df["num_tokens"] * df["topk"] * df["hidden_size"] * 2 * (ep - 1) // ep
    backend_col = "comm_backend" if "comm_backend" in df.columns else "kernel_source"
    out = []
    for group, grp in df.groupby("ep_size"):
        # per kernel: the mean of dispatch and combine, the median over the shapes of one byte
        # count; then per byte count the faster kernel (the engine runs the low-latency one
        # for small batches, the high-throughput one for large)
        keys = [backend_col, "nbytes", "hidden_size", "topk", "num_experts"]
        per_shape = grp.groupby(keys)["latency"].mean()
        per_kernel = per_shape.groupby([backend_col, "nbytes"]).median()
        g = per_kernel.groupby("nbytes").min().sort_index()
        kernels = sorted(str(k) for k in grp[backend_col].unique())
        kernel = f"{grp['kernel_source'].iloc[0]} ({', '.join(kernels)}: the faster per size)"
        out.append(
            CollectiveTable(
                origin=origin, op="all_to_all", group=int(group), kernel=kernel,
                bytes=[int(v) for v in g.index],
                latency_s=[float(f"{float(v) * US:.4g}") for v in g.values],
            )
        )  # fmt: skip
    return out


#: the MLA dimensions of the model aiconfigurator's MLA tables were measured on (the
#: DeepSeek-V3 config.json): hidden, q_lora_rank, kv_lora_rank, qk_rope_head_dim
MLA_MODELS: dict[str, tuple[int, int, int, int]] = {
    "deepseek-ai/DeepSeek-V3": (7168, 1536, 512, 64),
}


def _mla(root: Path, system: str, backend: str, pkg: str) -> list[MlaTable]:
    """MLA module tables per (phase, heads per GPU, gemm dtype) with a bf16 latent cache, the
    rows of every kernel the backend runs (by length); decode rows are at ``step`` tokens
    after a 1-token prompt."""
    out: list[MlaTable] = []
    files: tuple[tuple[Literal["prefill", "decode"], str], ...] = (
        ("prefill", "mla_context_module_perf.parquet"),
        ("decode", "mla_generation_module_perf.parquet"),
    )
    gemm_names: dict[str, Literal["bf16", "fp8_block"]] = {
        "bfloat16": "bf16", "fp8_block": "fp8_block"
    }  # fmt: skip
    for phase, filename in files:
        path = _newest(root, system, "mla", backend, filename)
        if path is None:
            continue
        df = pd.read_parquet(path)
        origin = _origin(df, path, root, pkg)
        df = df[(df["kv_cache_dtype"] == "bfloat16") & (df["tp_size"] == 1)]
        df = df[df["model"].isin(list(MLA_MODELS)) & df["gemm_type"].isin(list(gemm_names))]
        if df.empty:
            continue
        # vLLM switches kernels by length (FLASH_ATTN_MLA to 512 prompt tokens, FLASH_ATTN
        # from 1024): every kernel's rows are kept, each at the lengths it was run at
        kernel = "+".join(sorted(str(k) for k in df["kernel_source"].unique()))
        df = df.copy()
        df["x"] = df["isl"] if phase == "prefill" else df["step"] + 1
        for (model, gemm, heads), grp in df.groupby(["model", "gemm_type", "num_heads"]):
            hidden, q_rank, kv_rank, rope = MLA_MODELS[str(model)]
            g = grp.groupby(["batch_size", "x"], as_index=False)["latency"].median()
            batches = sorted(int(b) for b in g["batch_size"].unique())
            xs, ys = [], []
            for b in batches:
                cur = g[g["batch_size"] == b].sort_values("x")
                xs.append([int(v) for v in cur["x"]])
                ys.append([_sec(float(v)) for v in cur["latency"]])
            out.append(
                MlaTable(
                    origin=origin, phase=phase, heads=int(heads), hidden=hidden,
                    q_lora_rank=q_rank, kv_lora_rank=kv_rank, qk_rope_head_dim=rope,
                    gemm_dtype=gemm_names[str(gemm)], kv_dtype="bf16", kernel=kernel,
                    curves=Curves(batch=batches, x=xs, latency_s=ys),
                )
            )  # fmt: skip
    return out


def import_aiconfigurator(
    system: str,
    backend: str,
    base: Profile,
    name: str,
    systems_dir: Path | None = None,
) -> Profile:
    """A profile named ``name`` from aiconfigurator's tables for ``system`` / ``backend``
    (from ``systems_dir``, default the installed package's), host and storage figures from
    ``base``. :class:`InputError` when the system or backend has no tables."""
    if systems_dir is None:
        root, pkg = installed_systems_dir()
    else:
        root, pkg = Path(systems_dir), "(tables from a directory)"
    spec_path = root / f"{system}.yaml"
    systems = sorted(p.stem for p in root.glob("*.yaml")) if root.is_dir() else []
    if not spec_path.is_file():
        raise InputError(
            f"--system {system!r} not found in {root}; allowed: {', '.join(systems) or 'none'}"
        )
    spec: dict[str, Any] = yaml.safe_load(spec_path.read_text("utf-8")) or {}
    gpu_spec, node = spec.get("gpu", {}), spec.get("node", {})
    fw = framework_terms(backend)
    ops = OpsProfile(
        roofline=RooflineTerms(
            memory_efficiency=float(gpu_spec.get("mem_bw_empirical_scaling_factor", 0.8)),
            op_floor_s=float(gpu_spec.get("mem_empirical_constant_latency", 3e-6)),
            fused=["rope"],
            iteration_overhead_s=fw.iteration_overhead_s if fw is not None else 0.0,
        ),
        framework=fw.terms if fw is not None else None,
        gemm=_gemms(root, system, backend, pkg),
        attention=_attention(root, system, backend, pkg),
        all_reduce=_allreduce(root, system, backend, pkg) + _all_to_all(root, system, backend, pkg),
        moe=_moe(root, system, backend, pkg),
        mla=_mla(root, system, backend, pkg),
    )
    if not (ops.gemm or ops.attention or ops.all_reduce):
        raise InputError(
            f"--backend {backend!r}: no gemm, attention or all-reduce tables for {system}"
        )
    g = base.gpu
    gpu = GpuProfile(
        hbm_bytes=int(gpu_spec.get("mem_capacity", g.hbm_bytes)),
        hbm_bandwidth=float(gpu_spec.get("mem_bw", g.hbm_bandwidth)),
        flops_fp16=float(gpu_spec.get("bfloat16_tc_flops", g.flops_fp16)),
        flops_fp32=g.flops_fp32,
        compute_efficiency=g.compute_efficiency,
        kernel_launch_s=g.kernel_launch_s,
        per_layer_overhead_s=g.per_layer_overhead_s,
    )
    lat = float(node.get("p2p_latency", base.links.nvlink.latency))
    links = LinksProfile(
        pcie=LinkProfile(bandwidth=float(node.get("pcie_bw", base.links.pcie.bandwidth)), latency=base.links.pcie.latency),
        nvlink=LinkProfile(bandwidth=float(node.get("intra_node_bw", base.links.nvlink.bandwidth)), latency=lat),
        rdma=LinkProfile(bandwidth=float(node.get("inter_node_bw", base.links.rdma.bandwidth)), latency=base.links.rdma.latency),
        nvme=base.links.nvme,
        object_store=base.links.object_store,
    )  # fmt: skip
    return Profile(
        name=name,
        source="measured",
        measured_at=None,
        hostname=None,
        notes=(
            f"Op tables imported from aiconfigurator {pkg} (NVIDIA, Apache-2.0; see NOTICE) for "
            f"system {system}, backend {backend}: GEMM, attention, all-reduce, mixture-of-"
            f"experts, expert all-to-all and MLA module kernel timings. "
            f"GPU memory, bandwidth, bf16 peak and NVLink/PCIe/NIC bandwidths from its "
            f"{system}.yaml; fp32 peak, overheads, host DRAM, NVMe, object store and link "
            f"latencies (except NVLink) from the datasheet profile {base.name!r}. Elementwise ops "
            f"use the roofline (aiconfigurator has no elementwise tables). Each table's origin "
            f"says where it was measured."
        ),
        gpu=gpu,
        host=base.host,
        links=links,
        ops=ops,
    )
