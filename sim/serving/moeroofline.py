"""The roofline price of a mixture-of-experts decoder: :class:`MoeRoofline`.

A pass of ``T`` tokens multiplies each token by its ``top_k`` routed experts (the catalogue's
``flops_per_token`` already counts only those) and reads the weights of the distinct experts
the batch touches, not all of them. The experts are split by the replica's
:class:`sim.serving.moeparallel.ExpertParallel` (``ep``): an expert layer of one GPU reads its
non-expert weights' ``1 / tp`` share plus its ``1 / ep`` share of the
:func:`sim.serving.decoderblock.expected_experts` ``(E, top_k, T dp)`` experts the expert
group's tokens touch (uniform routing), each ``expert_bytes / moe_tp``; its routed-expert
FLOPs are the mean rank's times :func:`sim.serving.moeparallel.skew_imbalance` (the busiest rank
sets the time; every rank gets ``T top_k / tp`` routed tokens on average whatever the split).
With attention data parallelism (``dp > 1``) each expert layer adds a dispatch and a combine
all-to-all (:func:`sim.serving.moeparallel.alltoall_bytes` over the replica's link).
Everything else -- attention, KV reads, lookups, the LM head, all-reduces, hand-offs -- is
:class:`sim.serving.iterprice.RooflinePass`'s: a pass of ``T`` tokens is priced by the
roofline pass of the model with each expert layer's bytes and FLOPs set as above (memoised
per byte count).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from sim.serving.decoderblock import expected_experts
from sim.serving.moeparallel import (
    DEFAULT_ROUTING_SKEW,
    ExpertParallel,
    alltoall_bytes,
    alltoall_seconds,
    skew_imbalance,
)
from sim.serving.roofline import roofline_pass

if TYPE_CHECKING:
    from sim.serving.costmodel import Profile
    from sim.serving.iterprice import RooflinePass
    from sim.serving.models import ModelSpec


class MoeRoofline:
    """The roofline :class:`sim.serving.itercost.IterationCost` of a mixture-of-experts
    decoder on a ``tp`` x ``pp`` replica with its experts over ``ep`` GPUs, routed with
    ``routing_skew`` (see the module docstring). Holds only memoised passes."""

    def __init__(
        self,
        profile: Profile,
        model: ModelSpec,
        tp: int = 1,
        pp: int = 1,
        gpus_per_server: int = 1,
        ep: int = 1,
        routing_skew: float = DEFAULT_ROUTING_SKEW,
    ) -> None:
        self.profile = profile
        self.model = model
        self.tp = tp
        self.pp = pp
        self.gpus_per_server = gpus_per_server
        self.layout = ExpertParallel(tp, ep)
        self.imbalance = skew_imbalance(model.n_experts, self.layout.moe_ep, routing_skew)
        wide = tp * pp * self.layout.dp > gpus_per_server
        link = profile.links.rdma if wide else profile.links.nvlink
        self._link = (link.latency, link.bandwidth)
        self._passes: dict[tuple[tuple[tuple[int, int], int], ...], RooflinePass] = {}
        roofline_pass(profile, model, tp=tp, pp=pp, gpus_per_server=gpus_per_server)  # checks

    def pass_for(self, tokens: int) -> RooflinePass:
        """The roofline pass of a batch of ``tokens`` tokens: each expert layer's weight bytes
        are its non-expert bytes plus the expert bytes one GPU reads for the experts the
        group's tokens touch (scaled back by ``tp``), its FLOPs the routed experts' times the
        imbalance (see the module docstring)."""
        m, k, lay = self.model, self.model.top_k, self.layout
        share = lay.tp / (lay.ep * lay.moe_tp)  # one GPU's expert bytes x tp, over the touched
        read = {
            (ly.experts, ly.expert_bytes): round(
                expected_experts(ly.experts, k, tokens * lay.dp) * ly.expert_bytes * share
            )
            for ly in m.layers
            if ly.experts
        }
        key = tuple(sorted(read.items()))  # batches that read the same bytes share a pass
        found = self._passes.get(key)
        if found is not None:
            return found
        db = max(1, m.dtype_bytes)
        layers = [
            ly.model_copy(
                update={
                    "param_bytes": ly.param_bytes
                    - ly.experts * ly.expert_bytes
                    + read[(ly.experts, ly.expert_bytes)],
                    # 2 FLOPs per expert weight and routed token, the busiest rank's
                    "flops_per_token": ly.flops_per_token
                    + (self.imbalance - 1) * k * 2.0 * ly.expert_bytes / db,
                }
            )
            if ly.experts
            else ly
            for ly in m.layers
        ]
        touched = m.model_copy(update={"layers": layers})
        made = roofline_pass(
            self.profile, touched, tp=self.tp, pp=self.pp, gpus_per_server=self.gpus_per_server
        )
        self._passes[key] = made
        return made

    def work(
        self,
        prefill_tokens: int,
        prefill_sq: float,
        n_prompts: int,
        n_decode: int,
        decode_ctx: float,
    ) -> tuple[float, float, float, float]:
        """``(compute_s, collective_s, flops, bytes)`` of one iteration (all zeros without a
        token); :meth:`sim.serving.iterprice.RooflinePass.work` of :meth:`pass_for` its
        tokens."""
        tokens = prefill_tokens + n_decode
        c, k, f, b = self.pass_for(tokens).work(
            prefill_tokens, prefill_sq, n_prompts, n_decode, decode_ctx
        )
        return c, k + self.alltoall_time(tokens), f, b

    def handoff_time(self, tokens: float) -> float:
        """Seconds of the ``pp - 1`` activation hand-offs of ``tokens`` tokens (the roofline
        pass's; they do not depend on the experts)."""
        return self.pass_for(1).handoff_time(tokens)

    def alltoall_time(self, tokens: int) -> float:
        """Seconds of every expert layer's dispatch and combine for ``tokens`` tokens (0
        without attention data parallelism)."""
        m, lay = self.model, self.layout
        nbytes = alltoall_bytes(tokens, m.top_k, m.hidden, max(2, m.dtype_bytes), lay)
        latency, bandwidth = self._link
        return 2 * m.moe_layers * alltoall_seconds(nbytes, lay.group, latency, bandwidth)

    def breakdown(
        self,
        prefill_tokens: int,
        prefill_sq: float,
        n_prompts: int,
        n_decode: int,
        decode_ctx: float,
    ) -> list[tuple[str, float, str]]:
        """``(op, seconds, source)`` by layer kind, as
        :meth:`sim.serving.iterprice.RooflinePass.breakdown` of :meth:`pass_for` its tokens."""
        tokens = prefill_tokens + n_decode
        out = self.pass_for(tokens).breakdown(
            prefill_tokens, prefill_sq, n_prompts, n_decode, decode_ctx
        )
        a2a = self.alltoall_time(tokens)
        out.append(("moe_alltoall", a2a, "roofline" if a2a > 0 else "not run"))
        return out
