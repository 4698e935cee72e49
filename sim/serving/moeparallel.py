"""How a mixture-of-experts replica splits its experts, and what that costs in traffic and
balance: :class:`ExpertParallel`, :func:`alltoall_bytes`, :func:`skew_imbalance`.

A replica runs attention on ``tp`` GPUs. Its routed experts are sharded over ``ep`` GPUs
(expert parallelism), two deployments:

* ``ep <= tp`` (``tp % ep == 0``): the experts are split over ``ep`` groups of the replica's
  own GPUs and each expert's inner dimension over the ``tp / ep`` GPUs of a group
  (``moe_tp = tp / ep``, ``moe_ep = ep``). Every GPU already holds every token's hidden
  state after the attention all-reduce, so dispatch moves nothing over a link and the
  combine is the layer's all-reduce (as for a dense MLP). ``ep = 1`` is plain tensor
  parallelism of every expert.
* ``ep > tp`` (``ep % tp == 0``): attention data parallelism -- ``dp = ep / tp`` replicas
  (each with its own scheduler, batch and KV) share one expert group of ``ep`` GPUs
  (``moe_tp = 1``, ``moe_ep = ep``), vLLM's ``--data-parallel-size`` with
  ``--enable-expert-parallel`` and SGLang's DP attention. An expert layer runs on the tokens
  of all ``dp`` replicas (priced as ``dp`` batches the size of this one: the ranks step in
  lockstep), and each token's hidden state travels to the GPUs of its ``top_k`` experts and
  back: an all-to-all dispatch and combine (:func:`alltoall_bytes`).

Load imbalance: expert popularity follows a power law with exponent ``routing_skew``
(0: every expert equally likely; aiconfigurator times its MoE kernels at 1.01 and 1.2 and
defaults to 1.2). The busiest expert-parallel rank sets the layer's time
(:func:`skew_imbalance`).
"""

from __future__ import annotations

from dataclasses import dataclass

from engine.errors import InputError

#: the routing skew every price uses unless told otherwise (aiconfigurator's default)
DEFAULT_ROUTING_SKEW = 1.2


@dataclass(frozen=True)
class ExpertParallel:
    """The expert split of one replica (see the module docstring)."""

    tp: int
    """Attention (tensor-parallel) GPUs of the replica."""
    ep: int
    """GPUs the routed experts are sharded over."""

    def __post_init__(self) -> None:
        tp, ep = self.tp, self.ep
        if tp < 1 or ep < 1 or (tp % ep and ep % tp):
            raise InputError(
                f"ep={ep} with tp={tp}: ep must divide tp (experts inside the replica) or be "
                "a multiple of it (attention data parallelism); both >= 1"
            )

    @property
    def moe_tp(self) -> int:
        """Ways each expert's inner dimension is split."""
        return self.tp // self.ep if self.ep <= self.tp else 1

    @property
    def moe_ep(self) -> int:
        """Ways the experts are sharded."""
        return self.ep

    @property
    def dp(self) -> int:
        """Replicas (attention data-parallel ranks) sharing one expert group."""
        return self.ep // self.tp if self.ep > self.tp else 1

    @property
    def group(self) -> int:
        """GPUs of one expert group (``max(tp, ep)``)."""
        return max(self.tp, self.ep)


def alltoall_bytes(
    tokens: int, top_k: int, hidden: int, act_bytes: int, layout: ExpertParallel
) -> int:
    """Bytes one GPU sends in one expert dispatch (the combine sends as many back) for a
    replica batch of ``tokens`` tokens: each token's ``hidden`` activations of ``act_bytes``
    go to each of its ``top_k`` experts that live on another GPU of the group, ``(ep - 1) /
    ep`` of them under uniform placement; a replica's tokens leave from its ``tp`` GPUs,
    each sending ``1 / tp`` of them. 0 without attention data parallelism (the tokens are
    on every GPU already)."""
    if layout.dp <= 1 or tokens <= 0:
        return 0
    ep = layout.ep
    return tokens * top_k * hidden * act_bytes * (ep - 1) // (ep * layout.tp)


def skew_imbalance(n_experts: int, ep: int, routing_skew: float) -> float:
    """The busiest of ``ep`` ranks' routed tokens over the mean rank's, when expert ``i`` (by
    popularity, 0-based) draws a share proportional to ``(i + 1) ** -routing_skew`` and the
    experts are dealt to the ranks in popularity order, round robin (rank 0 holds the
    most popular one). 1 for one rank, a balanced router or no experts; at most ``ep``."""
    if ep <= 1 or n_experts <= 0 or routing_skew <= 0:
        return 1.0
    weights = [float((i + 1) ** -routing_skew) for i in range(n_experts)]
    ranks = [0.0] * min(ep, n_experts)
    for i, w in enumerate(weights):
        ranks[i % len(ranks)] += w
    return max(ranks) / sum(weights) * ep


def alltoall_seconds(nbytes: float, group: int, latency: float, bandwidth: float) -> float:
    """Seconds of one all-to-all in which each of ``group`` GPUs sends ``nbytes`` over its
    own link of ``bandwidth`` bytes/s (a switched fabric: the GPUs send at once), paying the
    link ``latency`` once per peer: ``nbytes / bandwidth + (group - 1) x latency``; 0 when
    nothing moves."""
    if nbytes <= 0 or group <= 1:
        return 0.0
    return nbytes / bandwidth + (group - 1) * latency
