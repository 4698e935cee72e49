"""The one price of a serving iteration: :class:`IterationCost` and its two implementations.

An iteration of a replica (vLLM v1 / SGLang style) runs prompt chunks and one token of each
decoding sequence in ONE fused pass over the weights. Its shape is five numbers:

* ``prefill_tokens`` -- prompt tokens computed in it;
* ``prefill_sq`` -- the chunks' squared lengths plus twice length x prior context, summed (a
  whole prompt of ``P`` tokens in one chunk: ``P**2``);
* ``n_prompts`` -- prompts whose prefill ends in it (each samples its first token);
* ``n_decode`` -- decoding sequences (one token each);
* ``decode_ctx`` -- the tokens of KV those sequences hold, in all.

Every price of an iteration -- the simulator's replicas, ``pdsim cost``, the planners' bounds
and calibration -- comes from an :class:`IterationCost` built by :func:`iteration_cost` for a
``tp`` x ``pp`` replica of one model on one profile:

* **op tables** (:class:`sim.serving.opcost.OpCostModel`) when the profile has ``ops`` and the
  model is a decoder (a mixture-of-experts or MLA one with its shape): measured kernel times per
  op -- GEMMs, attention, MLA modules, grouped expert GEMMs, all-reduces and expert
  all-to-alls -- and a stated roofline where no table covers an op;
* **roofline** (:class:`sim.serving.iterprice.RooflinePass`) otherwise: layer kind by layer
  kind, ``max(compute, memory)`` per GPU;
* **mixture-of-experts roofline** (:class:`sim.serving.moeroofline.MoeRoofline`) for a model
  with experts on a profile without op tables: the roofline with each expert layer reading
  only the experts the iteration's tokens touch.

Experts are split over ``ep`` GPUs (:class:`sim.serving.moeparallel.ExpertParallel`: inside the
replica's ``tp`` GPUs, or over ``ep / tp`` attention data-parallel replicas that step
together and exchange tokens by all-to-all); ``routing_skew`` sets the load imbalance.

All split the work over ``tp`` GPUs, add the all-reduces and the ``pp - 1`` pipeline
hand-offs, and count the replica's FLOPs and HBM bytes the same way (the roofline's counts:
MFU and MBU mean the same whichever prices the time).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from sim.serving.costmodel import Profile
    from sim.serving.iterprice import RooflinePass
    from sim.serving.models import ModelSpec
    from sim.serving.moeroofline import MoeRoofline


class IterationCost(Protocol):
    """Prices one iteration of one ``tp`` x ``pp`` replica (see the module docstring); with
    attention data parallelism, one replica's batch while its peers run batches as large."""

    tp: int
    pp: int

    def work(
        self,
        prefill_tokens: int,
        prefill_sq: float,
        n_prompts: int,
        n_decode: int,
        decode_ctx: float,
    ) -> tuple[float, float, float, float]:
        """``(compute_s, collective_s, flops, bytes)``: seconds of the pass's kernels, seconds
        of its collectives (all-reduces and hand-offs not already inside a measured op), and
        the replica's model FLOPs and HBM bytes read. All zero when it runs no token.
        Non-decreasing in every argument for the roofline; measured tables may dip between
        neighbouring shapes by their own measurement noise (about 1%)."""
        ...

    def breakdown(
        self,
        prefill_tokens: int,
        prefill_sq: float,
        n_prompts: int,
        n_decode: int,
        decode_ctx: float,
    ) -> list[tuple[str, float, str]]:
        """``(op, seconds, source)`` of every op of the iteration; the seconds sum to
        ``compute_s + collective_s`` of :meth:`work` up to rounding."""
        ...


def iteration_cost(
    profile: Profile,
    model: ModelSpec,
    tp: int = 1,
    pp: int = 1,
    gpus_per_server: int = 1,
    ep: int = 1,
    routing_skew: float | None = None,
) -> IterationCost:
    """The iteration cost of ``model`` on a ``tp`` x ``pp`` replica of ``profile``'s GPUs
    with its routed experts over ``ep`` GPUs (:class:`sim.serving.moeparallel.ExpertParallel`)
    and expert popularity skewed by ``routing_skew`` (None:
    :data:`sim.serving.moeparallel.DEFAULT_ROUTING_SKEW`): op tables for a decoder on a
    profile with ``ops`` (a mixture-of-experts or MLA decoder needs its shape), else the
    roofline (:class:`sim.serving.moeroofline.MoeRoofline` for a model with experts). A
    replica wider than ``gpus_per_server`` runs its collectives over the NIC. Raises
    :class:`engine.errors.InputError` for a ``tp`` the model's heads cannot be split by, an
    ``ep`` above 1 on a dense model or one that neither divides nor is a multiple of ``tp``,
    and ValueError for sizes below 1."""
    from sim.serving.moeparallel import DEFAULT_ROUTING_SKEW, ExpertParallel
    from sim.serving.roofline import roofline_pass

    skew = DEFAULT_ROUTING_SKEW if routing_skew is None else routing_skew
    if ep != 1:
        if not model.n_experts:
            from engine.errors import InputError

            raise InputError(f"ep={ep}: model {model.name!r} has no experts; ep must be 1")
        ExpertParallel(tp, ep)  # checks
    roof: RooflinePass | MoeRoofline
    if model.n_experts:
        from sim.serving.moeroofline import MoeRoofline

        roof = MoeRoofline(
            profile, model, tp=tp, pp=pp, gpus_per_server=gpus_per_server, ep=ep,
            routing_skew=skew,
        )  # fmt: skip
    else:
        roof = roofline_pass(profile, model, tp=tp, pp=pp, gpus_per_server=gpus_per_server)
    tables = profile.ops is not None and model.kind == "decoder"
    if tables and (model.shape is not None or not (model.n_experts or model.mla)):
        from sim.serving.opcost import OpCostModel

        # the roofline counts the FLOPs and bytes (the experts touched, for MFU and MBU)
        return OpCostModel(
            profile, model, tp=tp, counts=roof, ep=ep, routing_skew=skew,
            gpus_per_server=gpus_per_server,
        )  # fmt: skip
    return roof


def iteration_seconds(
    cost: IterationCost,
    prefill_tokens: int,
    prefill_sq: float,
    n_prompts: int,
    n_decode: int,
    decode_ctx: float,
) -> float:
    """Seconds of one iteration: :meth:`IterationCost.work`'s compute plus collectives."""
    c, k, _, _ = cost.work(prefill_tokens, prefill_sq, n_prompts, n_decode, decode_ctx)
    return c + k
