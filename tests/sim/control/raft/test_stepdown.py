"""A leader that steps down while it has unsent appends must not replicate them.

Found by chaos-small seed 1269 (issue 22): a leader was paused, so client writes and a
message of a newer term reached it in one batch. It appended the writes (which marks
replication as due), adopted the newer term from the next message and became a follower,
then flushed the due replication anyway: AppendEntries of the *newer* term carrying its own
stale entries. A follower of that term's real leader accepted them as coming from its leader
and truncated entries the real leader had counted in ``matchIndex`` -- the real leader
could then commit entries no majority held.
"""

from __future__ import annotations

from typing import Any

from sim.control.raft import Command, Role
from sim.control.raft.messages import CLIENT_ID_BASE, AppendEntries, ClientRequest, RequestVote

from .util import make_group, wait_leader


def test_leader_stepping_down_in_the_batch_of_a_write_sends_no_append() -> None:
    env, g, tr = make_group(n=3, seed=1)
    g.start()
    lead = wait_leader(env, g)
    env.run(until=env.now + 0.2)  # followers have caught up; the group is quiet
    x = g.nodes[lead]
    term = x.current_term
    other = (lead + 1) % 3
    sent: list[AppendEntries] = []
    send = tr.send

    def spy(src: int, dst: int, msg: Any) -> None:
        if src == lead and isinstance(msg, AppendEntries):
            sent.append(msg)
        send(src, dst, msg)

    tr.send = spy  # type: ignore[method-assign]
    # one batch: a client write, then a candidate of a newer term (log behind: no vote)
    x.deliver(ClientRequest(CLIENT_ID_BASE, Command("put", "k", 1, CLIENT_ID_BASE, 1)))
    x.deliver(RequestVote(other, term + 1, 0, 0))
    env.run(until=env.now + 0.001)
    assert x.role is Role.FOLLOWER and x.current_term == term + 1
    assert x.log.last_index >= 1 and x.log.entry(x.log.last_index).term == term
    assert [(m.term, len(m.entries)) for m in sent] == []
    assert g.checker.ok, g.checker.violations


def test_a_leader_still_replicates_a_write_it_appended() -> None:
    """The same batch without the newer term: the write goes out at once."""
    env, g, tr = make_group(n=3, seed=1)
    g.start()
    lead = wait_leader(env, g)
    env.run(until=env.now + 0.2)
    x = g.nodes[lead]
    sent: list[AppendEntries] = []
    send = tr.send

    def spy(src: int, dst: int, msg: Any) -> None:
        if src == lead and isinstance(msg, AppendEntries):
            sent.append(msg)
        send(src, dst, msg)

    tr.send = spy  # type: ignore[method-assign]
    x.deliver(ClientRequest(CLIENT_ID_BASE, Command("put", "k", 1, CLIENT_ID_BASE, 1)))
    env.run(until=env.now + 0.001)
    assert sorted(len(m.entries) for m in sent) == [1, 1]
    assert {m.term for m in sent} == {x.current_term}
