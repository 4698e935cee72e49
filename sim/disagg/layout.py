"""Where the replicas of the prefill and decode pools sit: servers and GPU offsets.

Every replica of a pool spans ``tp`` GPUs of ONE server (``tp`` must divide
``cluster.gpus_per_server``), at an offset that is a multiple of ``tp``. Replicas are laid
down in order, each on the first server with room after the previous one:

* ``packed``: prefill and decode replicas alternate (P, D, P, D, ... then the rest of the
  larger pool), so a server may hold both and their KV moves over NVLink;
* ``split``: the prefill pool, then the decode pool from a fresh server (KV over RDMA).
"""

from __future__ import annotations

from dataclasses import dataclass

from engine.errors import InputError


@dataclass(frozen=True)
class Slot:
    """One replica: its pool (``prefill`` / ``decode``), ``tp``, server and first GPU."""

    role: str
    tp: int
    server: int
    gpu: int


def _order(n_p: int, n_d: int, placement: str) -> list[str]:
    if placement == "split":
        return ["prefill"] * n_p + ["decode"] * n_d
    out: list[str] = []
    for i in range(max(n_p, n_d)):
        if i < n_p:
            out.append("prefill")
        if i < n_d:
            out.append("decode")
    return out


def place_pools(
    n_prefill: int,
    tp_prefill: int,
    n_decode: int,
    tp_decode: int,
    gpus_per_server: int,
    placement: str = "packed",
    source: str = "<memory>",
) -> list[Slot]:
    """The slots of every replica, prefill and decode interleaved as ``placement`` says
    (see the module docstring). ``InputError`` when a ``tp`` does not divide a server."""
    for role, tp in (("prefill", tp_prefill), ("decode", tp_decode)):
        if tp > gpus_per_server or gpus_per_server % tp:
            allowed = [d for d in range(1, gpus_per_server + 1) if gpus_per_server % d == 0]
            raise InputError(
                f"a {role} replica of tp={tp} must fit and divide a server of "
                f"{gpus_per_server} GPUs; use tp in {', '.join(map(str, allowed))}",
                source=source,
                where=f"disaggregation.{role}.tp",
            )
    tps = {"prefill": tp_prefill, "decode": tp_decode}
    slots: list[Slot] = []
    server, offset = 0, 0
    last_role = ""
    for role in _order(n_prefill, n_decode, placement):
        tp = tps[role]
        if placement == "split" and last_role == "prefill" and role == "decode" and offset:
            server, offset = server + 1, 0
        offset = -(-offset // tp) * tp  # align to the replica's width
        if offset + tp > gpus_per_server:
            server, offset = server + 1, 0
        slots.append(Slot(role, tp, server, offset))
        offset += tp
        last_role = role
    return slots


def servers_used(slots: list[Slot]) -> int:
    """How many servers the slots occupy (at least one)."""
    return max((s.server for s in slots), default=0) + 1
