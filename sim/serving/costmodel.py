"""Hardware profiles, and what a replica of a model pays on them: :class:`CostModel`.

A :class:`Profile` is the JSON schema shared with hwbench calibration: datasheet profiles ship in
``sim/data/profiles/`` (``source: "datasheet"``), calibration writes ``source: "measured"``.
Unknown keys are errors; sizes and rates may be numbers (bytes, bytes/s, seconds) or strings in
human units (``"80GB"``, ``"2TB/s"``, ``"10us"``).

:class:`CostModel` gathers, for one model on a ``tp`` x ``pp`` replica of a profile's GPUs:

* ``iteration`` -- the price of one serving iteration, the one implementation every caller
  uses (:class:`sim.serving.itercost.IterationCost`: the profile's op tables, else the
  roofline; tensor/pipeline parallel, collectives included);
* the serving loop's own terms of a calibrated engine (``wake_s``, ``iter_gap_s``, the
  prefetch terms; 0 for datasheet and imported kernel profiles, which describe a warm machine);
* ``transfer_time(nbytes, link)`` -- ``latency + nbytes / bandwidth`` for a profile link
  (``pcie``, ``nvlink``, ``rdma``, ``nvme``, ``object_store``) or ``hbm`` / ``dram``.
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field

from engine.configfile import parse_mapping, read_mapping, validate_model
from engine.limits import CheckedModel
from engine.units import parse_duration, parse_rate, parse_size
from sim.serving.itercost import IterationCost, iteration_cost
from sim.serving.models import ModelSpec
from sim.serving.opcost.tables import OpsProfile
from sim.serving.opcost.terms import EngineTerms
from sim.serving.roofline import peak_flops

Size = Annotated[int, BeforeValidator(parse_size), Field(ge=0)]
Rate = Annotated[float, BeforeValidator(parse_rate), Field(gt=0)]
Seconds = Annotated[float, BeforeValidator(parse_duration), Field(ge=0)]

#: shipped profiles: datasheet figures, and op tables imported from measured kernel timings
#: (``*-vllm``; sim.serving.opcost.aic_import, attribution in NOTICE)
SHIPPED_PROFILES: tuple[str, ...] = (
    "a100-80gb",
    "h100-sxm",
    "h200-sxm",
    "a100-sxm-vllm",
    "h100-sxm-vllm",
    "h200-sxm-vllm",
    "b200-sxm-vllm",
)
LINK_NAMES: tuple[str, ...] = ("pcie", "nvlink", "rdma", "nvme", "object_store")


class _Strict(CheckedModel, BaseModel):  # BaseModel named too, for linters
    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)


class LinkProfile(_Strict):
    """A link's sustained bandwidth (bytes/s) and first-byte latency (s)."""

    bandwidth: Rate
    """Sustained bandwidth, bytes/s or a rate like `25GB/s` (> 0)."""
    latency: Seconds
    """First-byte latency, seconds or a duration like `5us`."""


class GpuProfile(_Strict):
    """One accelerator."""

    hbm_bytes: Size
    """Usable GPU memory per GPU (what the driver reports, not the marketing figure), bytes or
    a size like `79GiB`."""
    hbm_bandwidth: Rate
    """GPU memory bandwidth, bytes/s or a rate like `2TB/s`."""
    flops_fp16: float = Field(gt=0)
    """Dense FP16/BF16 peak, FLOP/s (used for models with dtype_bytes <= 2)."""
    flops_fp32: float = Field(gt=0)
    """Dense FP32 peak, FLOP/s (used for models with dtype_bytes > 2)."""
    compute_efficiency: float = Field(gt=0, le=1)
    """Achieved / peak FLOP/s for large matmuls, in (0, 1]."""
    kernel_launch_s: Seconds
    """Overhead charged once per prefill or decode step, seconds (R16)."""
    per_layer_overhead_s: Seconds
    """Overhead charged per layer call, seconds."""


class HostProfile(_Strict):
    """The host's DRAM (pinned host memory tier)."""

    dram_bytes: Size
    """Host DRAM per server (the pinned host memory tier's default size), bytes or a size."""
    dram_bandwidth: Rate
    """Host DRAM bandwidth, bytes/s or a rate."""


class LinksProfile(_Strict):
    """The links of a server, one profile each: `pcie`, `nvlink` and `rdma` per GPU (a server
    has one of each per GPU), `nvme` and `object_store` per server."""

    pcie: LinkProfile
    """Host <-> GPU PCIe link, per GPU."""
    nvlink: LinkProfile
    """GPU <-> GPU NVLink inside a server, per GPU and direction (TP all-reduce, PP hand-off)."""
    rdma: LinkProfile
    """NIC (RDMA) per GPU: parameter servers (R3), and TP/PP traffic across servers."""
    nvme: LinkProfile
    """Local NVMe SSD, per server."""
    object_store: LinkProfile
    """Object store (cold tier, R23), per server."""


class ColdStartProfile(_Strict):
    """What a new replica pays before its weights move (:mod:`sim.serving.coldstart`).

    Defaults are assumptions, not measurements: a server already allocated to the pool with
    the serving image cached starts its container and the engine's process in ~2 s; the
    engine's warm-up (CUDA-graph capture of the decode batch sizes, allocator set-up) takes
    ~1 s (vLLM reports graph capture of a few seconds for large models, 0 with eager mode)."""

    provision_s: Seconds = 2.0
    """Seconds from a scale-out decision to a process that can receive weights (server or
    container start)."""
    warmup_s: Seconds = 1.0
    """Seconds of engine warm-up (graph capture) before a replica serves."""


class Profile(_Strict):
    """A calibration profile (datasheet or measured). ``hostname`` names the machine measured;
    ``host`` is its DRAM. ``fitted`` holds optional fitted tables (rows of numbers by table
    name, e.g. ``{"matmul": [{"m": 4096, "n": 4096, "k": 4096, "flops_per_s": 6.1e14}]}``)."""

    name: str
    """Profile name, e.g. `a100-80gb`."""
    source: Literal["datasheet", "measured"]
    """`datasheet` (vendor figures) or `measured` (written by `pdsim calibrate`)."""
    measured_at: str | None = None
    """When it was measured (ISO 8601); null for datasheets."""
    hostname: str | None = None
    """Machine measured; null for datasheets."""
    notes: str = ""
    """Free text: sources of the figures, caveats."""
    gpu: GpuProfile
    """The accelerator."""
    host: HostProfile
    """The host's DRAM."""
    links: LinksProfile
    """The links a node uses."""
    fitted: dict[str, list[dict[str, float]]] = Field(default_factory=dict)
    """Optional fitted tables: rows of numbers by table name (e.g. `matmul`)."""
    ops: OpsProfile | None = None
    """Op tables (measured kernel times) and roofline terms for `sim.serving.opcost`; null: none."""
    coldstart: ColdStartProfile = ColdStartProfile()
    """A new replica's provisioning delay and engine warm-up (autoscaling)."""


def parse_profile(text: str, source: str) -> Profile:
    """Parse profile JSON ``text``; :class:`InputError` naming ``source`` and the field."""
    return validate_model(Profile, parse_mapping(text, source, "profile", fmt="json"), source)


def load_profile(name_or_path: str | Path) -> Profile:
    """A shipped profile by name (:data:`SHIPPED_PROFILES`) or a JSON file."""
    name = str(name_or_path)
    if name in SHIPPED_PROFILES:
        text = resources.files("sim").joinpath(f"data/profiles/{name}.json").read_text("utf-8")
        return parse_profile(text, f"sim/data/profiles/{name}.json")
    path = Path(name_or_path)
    hint = f"shipped profiles: {', '.join(SHIPPED_PROFILES)}"
    raw = read_mapping(path, "profile", hint=hint, fmt="json")
    return validate_model(Profile, raw, str(path))


class CostModel:
    """What a replica of one model on one profile's hardware pays: its iteration price, the
    serving loop's own terms and the copy time over each link (see the module docstring)."""

    def __init__(
        self,
        profile: Profile,
        model: ModelSpec,
        tp: int = 1,
        pp: int = 1,
        gpus_per_server: int = 1,
        ep: int = 1,
        routing_skew: float | None = None,
    ) -> None:
        """``tp`` x ``pp`` GPUs per replica, routed experts over ``ep`` GPUs with expert
        popularity skewed by ``routing_skew`` (:func:`sim.serving.itercost.iteration_cost`);
        a replica wider than ``gpus_per_server`` runs its collectives over the NIC (``rdma``)
        instead of NVLink."""
        self.profile = profile
        self.model = model
        self.tp, self.pp = tp, pp
        #: the price of one iteration (op tables or roofline; sim.serving.itercost)
        self.iteration: IterationCost = iteration_cost(
            profile, model, tp=tp, pp=pp, gpus_per_server=gpus_per_server, ep=ep,
            routing_skew=routing_skew,
        )  # fmt: skip
        eng = profile.ops.engine if profile.ops is not None and model.kind == "decoder" else None
        #: a calibrated engine's own terms (sim.serving.opcost.EngineTerms); None: a warm
        #: machine with no serving-loop costs (datasheet and imported kernel profiles)
        self.engine_terms: EngineTerms | None = eng
        #: seconds of the first iteration after the replica sat idle
        self.wake_s = eng.wake_s if eng is not None else 0.0
        #: seconds the serving loop spends between two back-to-back iterations (scheduling,
        #: bookkeeping: no compute), charged once per iteration
        self.iter_gap_s = eng.iter_gap_s if eng is not None else 0.0
        #: compute seconds lost per byte prefetched while computing, and seconds from a
        #: prefetch's planning to its copy's start
        self.prefetch_compute_s_per_byte = (
            eng.prefetch_compute_s_per_byte if eng is not None else 0.0
        )
        self.prefetch_handoff_s = eng.prefetch_handoff_s if eng is not None else 0.0
        self._links: dict[str, tuple[float, float]] = {
            name: (getattr(profile.links, name).latency, getattr(profile.links, name).bandwidth)
            for name in LINK_NAMES
        }
        self._links["hbm"] = (0.0, profile.gpu.hbm_bandwidth)
        self._links["dram"] = (0.0, profile.host.dram_bandwidth)

    def prefetch_s_per_byte_at(self, cache_bytes: int) -> float:
        """Compute seconds lost per prefetched byte on a replica whose HBM weight cache holds
        ``cache_bytes`` (:meth:`sim.serving.opcost.EngineTerms.prefetch_per_byte`; 0 without a
        calibrated engine)."""
        if self.engine_terms is None:
            return self.prefetch_compute_s_per_byte
        return float(self.engine_terms.prefetch_per_byte(float(cache_bytes)))

    # -- copies ---------------------------------------------------------------------------------
    def transfer_time(self, nbytes: int, link_name: str) -> float:
        """``latency + nbytes / bandwidth`` over a profile link, without contention."""
        try:
            latency, bandwidth = self._links[link_name]
        except KeyError:
            allowed = ", ".join(self._links)
            raise ValueError(f"unknown link {link_name!r}; allowed: {allowed}") from None
        return latency + nbytes / bandwidth

    def link(self, link_name: str) -> tuple[float, float]:
        """``(latency_s, bandwidth_Bps)`` of a link (see :meth:`transfer_time` for names)."""
        self.transfer_time(0, link_name)
        return self._links[link_name]

    def weights_fit(self, fraction: float = 1.0) -> bool:
        """Whether ``fraction`` of the model's weights fit in one GPU's HBM."""
        return self.model.param_bytes * fraction <= self.profile.gpu.hbm_bytes

    def summary(self) -> dict[str, Any]:
        """A few headline numbers (for logs and sanity checks)."""
        return {
            "profile": self.profile.name,
            "model": self.model.name,
            "flop_rate": peak_flops(self.profile, self.model),
            "hbm_bandwidth": self.profile.gpu.hbm_bandwidth,
            "weights_read_s": self.model.param_bytes / self.profile.gpu.hbm_bandwidth,
        }
