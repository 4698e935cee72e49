"""The roofline price of a mixture-of-experts decoder: :class:`MoeRoofline`.

A pass of ``T`` tokens multiplies each token by its ``top_k`` routed experts (the catalogue's
``flops_per_token`` already counts only those) and reads the weights of the distinct experts
the batch touches, not all of them: per expert layer its non-expert weights plus
:func:`sim.serving.decoderblock.expected_experts` ``(E, top_k, T)`` experts of ``expert_bytes`` each
(uniform routing). Every expert is sharded over the ``tp`` ranks like a dense MLP (tensor
parallelism; no expert parallelism). Everything else -- attention, KV reads, lookups, the LM
head, all-reduces, hand-offs -- is :class:`sim.serving.iterprice.RooflinePass`'s: a pass of
``T`` tokens is priced by the roofline pass of the model with each expert layer's bytes set
to what ``T`` tokens read (memoised per ``T``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from sim.serving.decoderblock import expected_experts
from sim.serving.roofline import roofline_pass

if TYPE_CHECKING:
    from sim.serving.costmodel import Profile
    from sim.serving.iterprice import RooflinePass
    from sim.serving.models import ModelSpec


class MoeRoofline:
    """The roofline :class:`sim.serving.itercost.IterationCost` of a mixture-of-experts
    decoder on a ``tp`` x ``pp`` replica (see the module docstring). Holds only memoised
    passes."""

    def __init__(
        self, profile: Profile, model: ModelSpec, tp: int = 1, pp: int = 1, gpus_per_server: int = 1
    ) -> None:
        self.profile = profile
        self.model = model
        self.tp = tp
        self.pp = pp
        self.gpus_per_server = gpus_per_server
        self._passes: dict[tuple[tuple[tuple[int, int], int], ...], RooflinePass] = {}
        roofline_pass(profile, model, tp=tp, pp=pp, gpus_per_server=gpus_per_server)  # checks

    def pass_for(self, tokens: int) -> RooflinePass:
        """The roofline pass of a batch of ``tokens`` tokens: each expert layer's weight bytes
        are its non-expert bytes plus those of the experts ``tokens`` tokens touch."""
        m, k = self.model, self.model.top_k
        read = {
            (ly.experts, ly.expert_bytes): round(
                expected_experts(ly.experts, k, tokens) * ly.expert_bytes
            )
            for ly in m.layers
            if ly.experts
        }
        key = tuple(sorted(read.items()))  # batches that read the same bytes share a pass
        found = self._passes.get(key)
        if found is not None:
            return found
        layers = [
            ly.model_copy(
                update={
                    "param_bytes": ly.param_bytes
                    - ly.experts * ly.expert_bytes
                    + read[(ly.experts, ly.expert_bytes)]
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
        return self.pass_for(tokens).work(
            prefill_tokens, prefill_sq, n_prompts, n_decode, decode_ctx
        )

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
        return self.pass_for(tokens).breakdown(
            prefill_tokens, prefill_sq, n_prompts, n_decode, decode_ctx
        )
