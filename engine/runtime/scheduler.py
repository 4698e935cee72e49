"""Continuous batching: which queued requests join the running batch at an iteration start.

The rules are the simulator node's (:mod:`sim.node`), so the engine and the simulator form the
same batches for the same arrivals:

* requests are taken from the head of the queue in arrival order (head-of-line: a request
  that does not fit stops admission, nothing overtakes it);
* at most ``max_batch`` requests run at once;
* the prompts admitted in one iteration hold at most ``max_batch_tokens`` tokens, except
  that the first one is always admitted;
* KV is reserved for a request's whole sequence (prompt + output) at admission, in whole
  blocks of ``block_tokens`` tokens of ``kv_bytes_per_token`` bytes; admission needs
  ``reserved + need <= kv_capacity`` (invariant: ``0 <= reserved <= kv_capacity``), so a
  running request never stalls for KV.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from engine.kv.prefix import num_blocks

__all__ = ["BatchScheduler"]


@dataclass
class BatchScheduler:
    """Admission state of one engine; see the module docstring."""

    max_batch: int
    max_batch_tokens: int
    kv_capacity: int
    kv_bytes_per_token: int
    block_tokens: int
    queue: deque[int] = field(default_factory=deque)
    running: list[int] = field(default_factory=list)
    reserved: int = 0
    _need: dict[int, int] = field(default_factory=dict)

    def kv_need(self, tokens: int) -> int:
        """Bytes reserved for a ``tokens``-token sequence (whole blocks)."""
        bt = self.block_tokens
        return num_blocks(tokens, bt) * bt * self.kv_bytes_per_token

    def fits_alone(self, tokens: int) -> bool:
        """Whether a sequence of ``tokens`` could ever be admitted (else reject it)."""
        return self.kv_need(tokens) <= self.kv_capacity

    def submit(self, rid: int) -> None:
        self.queue.append(rid)

    def admit(self, prompt_tokens: list[int], seq_tokens: list[int]) -> list[int]:
        """Admit from the queue; ``prompt_tokens[rid]``/``seq_tokens[rid]`` give the prompt
        and whole-sequence lengths. Returns the admitted ids, in order."""
        new: list[int] = []
        tokens = 0
        room = self.max_batch - len(self.running)
        q = self.queue
        while q and len(new) < room:
            rid = q[0]
            need = self.kv_need(seq_tokens[rid])
            t = prompt_tokens[rid]
            if self.reserved + need > self.kv_capacity or (
                new and tokens + t > self.max_batch_tokens
            ):
                break
            q.popleft()
            self.reserved += need
            self._need[rid] = need
            tokens += t
            new.append(rid)
        self.running.extend(new)
        return new

    def finish(self, rid: int) -> None:
        """``rid`` completed: release its KV reservation and batch slot."""
        self.reserved -= self._need.pop(rid)
        self.running.remove(rid)
