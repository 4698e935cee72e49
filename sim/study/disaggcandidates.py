"""Candidate deployments of a compare plan and their analytic bounds.

A candidate is one aggregated deployment (``tp``, ``servers``: ``servers x gpus_per_server /
tp`` replicas) or one disaggregated one (prefill replicas x ``tp``, decode replicas x
``tp``). Before anything runs, each gets an **analytic capacity bound** in requests/s from
the cost model at the workload's mean prompt ``P`` and output ``O`` tokens, with full batches
(optimistic about batching; but prefill and decode are costed apart, so an iteration that
fuses both can beat it, hence the compare plan's ``bound_margin``):

* prefill work per request: ``t_p = prefill_time(min(P, budget)) x P / min(P, budget)``;
* a decode step at the largest batch the KV allows, ``B = min(max_num_seqs, KV / ((P + O) x
  kv_bytes_per_token))``: ``t_s = decode_step_time(B, B x (P + O / 2))``;
* aggregated: ``replicas / (t_p + O x t_s / B)``; disaggregated: ``min(prefill replicas /
  t_p, decode replicas x B / (O x t_s))``;

and a **TPOT floor**: one sequence's decode step, ``decode_step_time(1, P)``. A candidate whose
estimate is below ``bound_margin`` x the load, or whose floor is above a TPOT limit, is not
run.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from engine.errors import InputError

if TYPE_CHECKING:
    from sim.scenario import Scenario
    from sim.serving.costmodel import CostModel, Profile
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

    def __init__(
        self,
        sc: Scenario,
        catalogue: dict[str, ModelSpec],
        profile: Profile,
        cost_cls: type[CostModel],
    ) -> None:
        from sim.serving.workload import make_workload

        self.sc, self.profile, self.cost_cls = sc, profile, cost_cls
        self.spec = catalogue[sc.deployments[0].model]
        import numpy as np

        wl = make_workload(sc.workload, [1.0], np.random.default_rng(0))
        self.P = float(wl.inp.mean())
        self.O = float(wl.out.mean())
        self._memo: dict[int, tuple[float, float, int, str | None]] = {}

    def per_tp(self, tp: int) -> tuple[float, float, int, str | None]:
        """``(t_p, t_s, B, why infeasible)`` for one replica of ``tp`` GPUs."""
        if tp in self._memo:
            return self._memo[tp]
        from sim.serving.gpumemory import plan_memory

        sc = self.sc
        cl = sc.cluster.model_copy(update={"tp": tp, "pp": 1})
        psc = sc.model_copy(update={"cluster": cl})
        hbm = sc.cluster.gpu.hbm or int(self.profile.gpu.hbm_bytes)
        try:
            mem = plan_memory(psc, [self.spec], hbm, self.profile.name)
        except InputError as err:
            self._memo[tp] = (0.0, 0.0, 0, f"infeasible at tp={tp}: {err}")
            return self._memo[tp]
        cost = self.cost_cls(
            self.profile, self.spec, tp=tp, pp=1, gpus_per_server=cl.gpus_per_server
        )
        rc = sc.cluster.replica
        chunk = max(1, min(int(self.P), rc.max_num_batched_tokens))
        t_p = float(cost.prefill_time(chunk)) * self.P / chunk
        bpt = max(int(self.spec.kv_bytes_per_token), 1)
        b = int(min(rc.max_num_seqs, max(1, mem.kv // int((self.P + self.O) * bpt))))
        t_s = float(cost.decode_step_time(b, int(b * (self.P + self.O / 2))))
        floor = float(cost.decode_step_time(1, int(self.P)))
        self._memo[tp] = (t_p, t_s, b, None)
        self._floor = getattr(self, "_floor", {})
        self._floor[tp] = floor
        return self._memo[tp]

    def apply(self, c: Candidate) -> None:
        """Set ``c``'s bound, TPOT floor and infeasibility."""
        d = c.decode
        t_p_d, t_s, b, bad = self.per_tp(d["tp"])
        if bad is not None:
            c.infeasible = bad
            return
        c.tpot_floor_s = self._floor[d["tp"]]
        if c.prefill is None:
            c.bound_rps = d["replicas"] / (t_p_d + self.O * t_s / b)
            return
        t_p, _, _, bad_p = self.per_tp(c.prefill["tp"])
        if bad_p is not None:
            c.infeasible = bad_p
            return
        c.bound_rps = min(c.prefill["replicas"] / t_p, d["replicas"] * b / (self.O * t_s))
