"""Knobs of a Raft group."""

from __future__ import annotations

from dataclasses import dataclass

from engine.errors import InputError


@dataclass(frozen=True, slots=True)
class RaftConfig:
    """Configuration shared by every replica of one group (times in seconds).

    ``election_timeout``: a follower/candidate waits ``U(lo, hi)`` without hearing from a
    leader before starting an election (drawn from the replica's seeded Generator).
    ``heartbeat_interval``: a leader sends AppendEntries (heartbeat or retransmission) this
    often; must be well below ``election_timeout[0]``.
    ``max_batch``: most entries in one AppendEntries.
    ``leader_noop``: a new leader appends a no-op entry of its term at once (Raft section 8), so
    earlier-term entries commit without waiting for a client write.
    ``unsafe_commit_old_terms``: TEST-ONLY planted bug -- a leader commits entries of earlier
    terms by counting replicas, violating the figure 8 rule. Never set it outside tests.
    """

    n: int = 3
    election_timeout: tuple[float, float] = (0.150, 0.300)
    heartbeat_interval: float = 0.050
    max_batch: int = 64
    leader_noop: bool = False
    unsafe_commit_old_terms: bool = False

    def validate(self) -> RaftConfig:
        """Raise :class:`InputError` naming the bad field; return ``self`` when valid."""
        if self.n not in (1, 3, 5, 7):
            raise InputError(f"raft.n = {self.n!r}; allowed: 1, 3, 5 or 7 replicas")
        lo, hi = self.election_timeout
        if not 0 < lo <= hi:
            raise InputError(
                f"raft.election_timeout = {self.election_timeout!r}; allowed: 0 < lo <= hi"
            )
        if not 0 < self.heartbeat_interval < lo:
            raise InputError(
                f"raft.heartbeat_interval = {self.heartbeat_interval!r}; "
                f"allowed: 0 < value < election_timeout[0] ({lo})"
            )
        if self.max_batch < 1:
            raise InputError(f"raft.max_batch = {self.max_batch!r}; allowed: >= 1")
        return self
