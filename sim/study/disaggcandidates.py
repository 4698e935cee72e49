"""Candidate deployments of a compare plan and the analytic bounds that may skip them.

A candidate is one aggregated deployment (``tp``, ``servers``: ``servers x gpus_per_server /
tp`` replicas) or one disaggregated one (prefill replicas x ``tp``, decode replicas x
``tp``). Before anything runs, each replica kind gets **upper bounds on what it can serve**,
priced by the simulator's own iteration cost (:class:`sim.serving.itercost.IterationCost`,
per ``tp``, collectives included) plus the serving loop's gap per iteration. With ``P`` and
``O`` the workload's mean prompt and output tokens, ``budget`` the token budget and ``S``
``max_num_seqs``:

* an iteration of ``T`` tokens takes at least ``floor(T)``: its pass without attention
  (attention only adds time) and without sampling, plus the gap;
* **token rate**: ``R_tok = max over T <= budget of T / floor(T)`` tokens/s;
* **decode rate**: ``R_dec = max over d <= S of d / floor(d)`` (an iteration advances at most
  ``S`` sequences by one token);
* aggregated replica: ``min(R_tok / (P + O - 1), R_dec / (O - 1))`` requests/s (a request
  computes ``P`` prompt tokens and ``O - 1`` decode tokens; its first token comes with the
  prefill); prefill replica: ``R_tok / P``; decode replica: ``R_dec / (O - 1)``;
* a **TPOT floor**: one decode step of one sequence, ``floor(1)``: every iteration a
  request decodes in takes at least that long.

The time per request is linear in the tokens, so the mean over requests bounds the whole
workload's work. Each bound is optimistic by construction (it never charges what a run might
not), so a candidate whose bound is below the load, or whose TPOT floor is above a TPOT limit,
cannot meet the SLOs and is not run (``bound_margin`` scales the load it is held against).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from engine.errors import InputError

if TYPE_CHECKING:
    from sim.scenario import Scenario
    from sim.serving.costmodel import Profile
    from sim.serving.models import ModelSpec


@dataclass
class Candidate:
    """One deployment to evaluate; ``overrides`` are the scenario keys that make it."""

    family: str  # "aggregated" | "disaggregated"
    gpus: int
    prefill: dict[str, int] | None
    decode: dict[str, int]
    overrides: dict[str, Any]
    bound_rps: float = 0.0
    tpot_floor_s: float = 0.0
    infeasible: str | None = None
    metrics: list[dict[str, Any] | None] = field(default_factory=list)

    @property
    def label(self) -> str:
        if self.prefill is None:
            return f"agg {self.decode['replicas']}x tp{self.decode['tp']}"
        p, d = self.prefill, self.decode
        return f"P {p['replicas']}x tp{p['tp']} + D {d['replicas']}x tp{d['tp']}"


def aggregated(tps: list[int], gps: int, budget: int, max_replicas: int) -> list[Candidate]:
    """Every aggregated candidate of 1..``max_replicas`` replicas within ``budget`` GPUs.

    ``R`` replicas of ``tp`` GPUs run as ``R`` servers of ``tp`` GPUs each (the same replicas:
    TP inside one NVLink domain), so like a disaggregated pool a candidate is charged only the
    GPUs its replicas use, not whole 8-GPU servers."""
    out = []
    for tp in tps:
        if tp > gps or gps % tp:
            continue
        for reps in range(1, min(budget // tp, max_replicas) + 1):
            out.append(
                Candidate(
                    "aggregated",
                    reps * tp,
                    None,
                    {"replicas": reps, "tp": tp},
                    {
                        "disaggregation.enabled": False,
                        "cluster.tp": tp,
                        "cluster.pp": 1,
                        "cluster.gpus_per_server": tp,
                        "cluster.servers": reps,
                    },
                )
            )
    return out


def disaggregated(
    ptps: list[int], dtps: list[int], max_replicas: int, gps: int, budget: int, placement: str
) -> list[Candidate]:
    """Every disaggregated candidate within ``budget`` GPUs (each pool 1..``max_replicas``)."""
    out = []
    for ptp in ptps:
        for dtp in dtps:
            if gps % ptp or gps % dtp:
                continue
            for pn in range(1, max_replicas + 1):
                for dn in range(1, max_replicas + 1):
                    g = pn * ptp + dn * dtp
                    if g > budget:
                        continue
                    out.append(
                        Candidate(
                            "disaggregated",
                            g,
                            {"replicas": pn, "tp": ptp},
                            {"replicas": dn, "tp": dtp},
                            {
                                "disaggregation.enabled": True,
                                "disaggregation.placement": placement,
                                "disaggregation.prefill.replicas": pn,
                                "disaggregation.prefill.tp": ptp,
                                "disaggregation.decode.replicas": dn,
                                "disaggregation.decode.tp": dtp,
                            },
                        )
                    )
    return out


class Bounds:
    """The analytic bounds of the module docstring for one scenario (memoised per ``tp``)."""

    def __init__(self, sc: Scenario, catalogue: dict[str, ModelSpec], profile: Profile) -> None:
        import numpy as np

        from sim.serving.workload import make_workload

        self.sc, self.profile = sc, profile
        self.spec = catalogue[sc.deployments[0].model]
        wl = make_workload(sc.workload, [1.0], np.random.default_rng(0))
        self.P = float(wl.inp.mean())
        self.O = float(wl.out.mean())
        self._memo: dict[int, ReplicaBound] = {}

    def per_tp(self, tp: int) -> ReplicaBound:
        """The bounds of one replica of ``tp`` GPUs (``infeasible`` set when it does not fit
        in memory)."""
        if tp in self._memo:
            return self._memo[tp]
        from sim.serving.costmodel import CostModel
        from sim.serving.gpumemory import plan_memory

        sc = self.sc
        cl = sc.cluster.model_copy(update={"tp": tp, "pp": 1})
        psc = sc.model_copy(update={"cluster": cl})
        hbm = sc.cluster.gpu.hbm or int(self.profile.gpu.hbm_bytes)
        try:
            plan_memory(psc, [self.spec], hbm, self.profile.name)
        except InputError as err:
            self._memo[tp] = ReplicaBound(0.0, 0.0, 0.0, f"infeasible at tp={tp}: {err}")
            return self._memo[tp]
        cost = CostModel(self.profile, self.spec, tp=tp, pp=1, gpus_per_server=cl.gpus_per_server)
        rc = sc.cluster.replica
        budget = rc.max_num_batched_tokens

        def floor(t: int) -> float:
            ops = cost.iteration.breakdown(t, 0.0, 0, 0, 0.0)
            secs = sum(s for name, s, _ in ops if name not in _ATTENTION_OPS)
            return secs + cost.iter_gap_s

        # every token count: measured tables are not monotone to the last percent
        rates = {t: t / floor(t) for t in range(1, budget + 1)}
        r_tok = max(rates.values())
        r_dec = max(r for t, r in rates.items() if t <= rc.max_num_seqs)
        self._memo[tp] = ReplicaBound(r_tok, r_dec, floor(1), None)
        return self._memo[tp]

    def apply(self, c: Candidate) -> None:
        """Set ``c``'s bound (requests/s), TPOT floor and infeasibility."""
        d = c.decode
        bd = self.per_tp(d["tp"])
        if bd.infeasible is not None:
            c.infeasible = bd.infeasible
            return
        c.tpot_floor_s = bd.tpot_floor_s
        decodes = max(self.O - 1.0, 1e-9)
        dec_rate = bd.decode_rate / decodes
        if c.prefill is None:
            c.bound_rps = d["replicas"] * min(bd.token_rate / (self.P + self.O - 1.0), dec_rate)
            return
        bp = self.per_tp(c.prefill["tp"])
        if bp.infeasible is not None:
            c.infeasible = bp.infeasible
            return
        c.bound_rps = min(c.prefill["replicas"] * bp.token_rate / self.P, d["replicas"] * dec_rate)


#: the ops :meth:`Bounds.per_tp`'s floor leaves out: attention, and a calibrated engine's
#: per-prompt-token overhead (a decode token does not pay it)
_ATTENTION_OPS = frozenset({"attention_prefill", "attention_decode", "prompt_overhead"})


@dataclass(frozen=True)
class ReplicaBound:
    """Upper bounds of one replica kind: tokens/s of any iteration mix (``token_rate``),
    decode tokens/s (``decode_rate``), and the shortest decode step (``tpot_floor_s``);
    ``infeasible``: why it does not fit (the rates are then 0)."""

    token_rate: float
    decode_rate: float
    tpot_floor_s: float
    infeasible: str | None
