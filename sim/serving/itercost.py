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
  model is a dense decoder: measured kernel times per op, a stated roofline where no table covers
  an op;
* **roofline** (:class:`sim.serving.iterprice.RooflinePass`) otherwise: layer kind by layer
  kind, ``max(compute, memory)`` per GPU;
* **mixture-of-experts roofline** (:class:`sim.serving.moeroofline.MoeRoofline`) for a model
  with experts, on any profile: the roofline with each expert layer reading only the experts
  the iteration's tokens touch. MLA models are refused (not priced yet).

All split the work over ``tp`` GPUs, add the all-reduces and the ``pp - 1`` pipeline
hand-offs, and count the replica's FLOPs and HBM bytes the same way (the roofline's counts:
MFU and MBU mean the same whichever prices the time).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from sim.serving.costmodel import Profile
    from sim.serving.models import ModelSpec


class IterationCost(Protocol):
    """Prices one iteration of one ``tp`` x ``pp`` replica (see the module docstring)."""

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
    profile: Profile, model: ModelSpec, tp: int = 1, pp: int = 1, gpus_per_server: int = 1
) -> IterationCost:
    """The iteration cost of ``model`` on a ``tp`` x ``pp`` replica of ``profile``'s GPUs
    (op tables for a decoder on a profile with ``ops``, else the roofline); a replica wider
    than ``gpus_per_server`` runs its collectives over the NIC. Raises
    :class:`engine.errors.InputError` for a ``tp`` the model's heads cannot be split by, and
    ValueError for sizes below 1; :class:`engine.errors.InputError` for an MLA model (not
    priced yet: docs/models.md). A mixture-of-experts model gets the roofline of the experts
    its batches touch (:class:`sim.serving.moeroofline.MoeRoofline`), op tables or not."""
    from sim.serving.roofline import roofline_pass

    if model.mla:
        from engine.errors import InputError

        raise InputError(
            f"model {model.name!r}: MLA (multi-head latent attention) pricing is not "
            "available yet (the catalogue describes the model; docs/models.md)"
        )
    if model.n_experts:
        from sim.serving.moeroofline import MoeRoofline

        return MoeRoofline(profile, model, tp=tp, pp=pp, gpus_per_server=gpus_per_server)

    roof = roofline_pass(profile, model, tp=tp, pp=pp, gpus_per_server=gpus_per_server)
    if profile.ops is not None and model.kind == "decoder":
        from sim.serving.opcost import OpCostModel

        return OpCostModel(profile, model, tp=tp, counts=roof)
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
