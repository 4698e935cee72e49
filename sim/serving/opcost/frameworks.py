"""Published overheads of serving frameworks, for profiles whose kernel tables come from them.

A profile imported from kernel timings (``pdsim profile import aiconfigurator``) prices the
GPU's kernels only; the framework that launches them spends time of its own on the engine
loop's critical path. :data:`VLLM` holds vLLM's, from published measurements (see its
``origin``); :func:`framework_terms` gives the terms for a backend's name, or ``None`` for a
backend without published figures (then ``pdsim cost`` shows the ops as ``none in profile``).

Units: seconds per iteration, per request admitted, per token sampled.
"""

from __future__ import annotations

from dataclasses import dataclass

from sim.serving.opcost.terms import FrameworkTerms


@dataclass(frozen=True)
class FrameworkDefaults:
    """One framework's overheads: the per-iteration term (``ops.roofline.
    iteration_overhead_s``) and the per-request / per-token terms (``ops.framework``)."""

    iteration_overhead_s: float
    terms: FrameworkTerms


#: the vLLM v1 engine loop (scheduler, KV-block allocation, output update), per step, per
#: request and per token. Derivation in the origin text and docs/cost-model.md.
VLLM = FrameworkDefaults(
    iteration_overhead_s=1.53e-4,
    terms=FrameworkTerms(
        origin=(
            "vLLM engine-loop profile of openfabric-systems/simllm PR #204 (2026-09-07): "
            "cProfile of vLLM 0.27.1's EngineCore loop on its 128-request conformance workload, "
            "258 steps, 540.9 us per step amortised. iteration_overhead_s = the scheduler "
            "(18.6%) and scheduler-output update (9.7%) shares of a step = 0.283 x 540.9 us = "
            "153 us; token_output_s = the all-decode scheduler's growth per running request "
            "at the cap, 12.7 us per sequence per step; admission_s = the KV-block allocation "
            "share (16.1%) of the 258 steps over the 128 requests = 176 us per request. The "
            "frontend's output processing (11.6%: detokenisation, streaming) runs in vLLM "
            "v1's API-server process, overlapped with the engine core (vLLM V1 blog, "
            "2025-01-27), so it is not charged here. The study's absolute attribution was "
            "not certified (29.5% run-to-run drift): read each figure as +-30%. Not taken: "
            "aiconfigurator 0.12.0's vLLM corrections (0.8 ms per layer per request and a "
            "TTFT queueing factor 1 + log2(b)/8), fitted to TTFT rather than measured engine "
            "time; see docs/cost-model.md."
        ),
        admission_s=1.76e-4,
        token_output_s=1.27e-5,
    ),
)

_BY_BACKEND: dict[str, FrameworkDefaults] = {"vllm": VLLM}


def framework_terms(backend: str) -> FrameworkDefaults | None:
    """The published overheads of serving ``backend`` (``vllm``), or ``None`` when pdsim has
    none for it."""
    return _BY_BACKEND.get(backend)
