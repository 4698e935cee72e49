"""The metadata state machine (exactly-once, chunk versions via vector clocks) and the watch
hub, against a dict reference model; and the group-level watch API end to end."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from engine.errors import InputError
from sim.control.raft import Change, Command, MetadataStateMachine, WatchHub
from sim.control.vclock import VectorClock, Version

from .util import make_group, wait_leader

ops = st.lists(
    st.tuples(
        st.sampled_from(["put", "get", "delete"]),
        st.sampled_from(["ring/a", "ring/b", "repl/s1", "k"]),
        st.integers(0, 5),
        st.integers(0, 2),  # client
        st.booleans(),  # retry (reuse the client's last seq)
    ),
    max_size=40,
)


@given(ops)
def test_state_machine_matches_dict_model(seq: list[tuple[str, str, int, int, bool]]) -> None:
    sm = MetadataStateMachine()
    model: dict[str, Any] = {}
    seqs = [0, 0, 0]
    cache: dict[int, Any] = {}
    changes: list[Change] = []
    hub = WatchHub()
    hub.subscribe("ring/", changes.append)
    expected_changes: list[tuple[str, Any, Any]] = []
    for index, (op, key, val, client, retry) in enumerate(seq, start=1):
        if not (retry and seqs[client]):
            seqs[client] += 1
            fresh = True
        else:
            fresh = False
        result, change = sm.apply(index, Command(op, key, val, client, seqs[client]))
        hub.on_apply(index, change)
        if not fresh:  # a retry returns the first answer and changes nothing
            assert result == cache[client] and change is None
            continue
        old = model.get(key)
        if op == "put":
            model[key] = val
            want = val
        elif op == "delete":
            want = model.pop(key, None)
        else:
            want = old
        if key.startswith("ring/") and model.get(key) != old:
            expected_changes.append((key, old, model.get(key)))
        elif key.startswith("ring/") and op == "put":
            expected_changes.append((key, old, val))
        cache[client] = want
        assert result == want
    assert sm.data == model
    assert [(c.key, c.old, c.new) for c in changes] == expected_changes
    assert [c.index for c in changes] == sorted({c.index for c in changes})


def test_chunk_versions_resolve_conflicts() -> None:
    sm = MetadataStateMachine()
    v1 = Version(VectorClock.of({"ps1": 1}), "ps1", (1, ("n1", "n2")))
    v2a = Version(VectorClock.of({"ps1": 2}), "ps1", (2, ("n1",)))
    v2b = Version(VectorClock.of({"ps1": 1, "ps2": 1}), "ps2", (2, ("n3",)))
    sm.apply(1, Command("chunk", "chunk/7", v1, 1, 1))
    r, ch = sm.apply(2, Command("chunk", "chunk/7", v2a, 1, 2))
    assert r == v2a and ch is not None and ch.old == v1
    r, ch = sm.apply(3, Command("chunk", "chunk/7", v2b, 2, 1))  # concurrent with v2a
    # equal Lamport sums (2): the higher writer id wins; the loser is recorded
    assert r.writer == "ps2" and r.value == (2, ("n3",))
    assert len(sm.conflicts) == 1 and sm.conflicts[0].loser == v2a
    r2, ch2 = sm.apply(4, Command("chunk", "chunk/7", v1, 3, 1))  # stale: ignored
    assert r2 == r and ch2 is None


def test_bad_commands() -> None:
    sm = MetadataStateMachine()
    with pytest.raises(InputError, match="allowed: put, get, delete, chunk"):
        sm.apply(1, Command("frob", "k", 1, 1, 1))
    with pytest.raises(InputError, match="Version"):
        sm.apply(1, Command("chunk", "chunk/1", 5, 1, 2))


def test_watch_through_the_group_sees_each_change_once_in_order() -> None:
    env, g, _ = make_group(n=3, seed=6, loss=0.05)
    seen: list[tuple[int, str, Any]] = []
    cancel = g.watch("ring/", lambda ch: seen.append((ch.index, ch.key, ch.new)))
    g.start()
    lead = wait_leader(env, g)
    c = g.client(timeout=0.2)

    def load():  # type: ignore[no-untyped-def]
        yield env.process(c.call("put", "ring/n1", 1))
        yield env.process(c.call("put", "repl/shard9", 3))
        yield env.process(c.call("put", "ring/n2", 1))
        g.crash(lead)  # replicas replaying their logs must not re-notify
        yield env.timeout(0.5)
        g.restart(lead)
        yield env.process(c.call("delete", "ring/n1"))
        cancel()
        yield env.process(c.call("put", "ring/n3", 1))

    env.process(load())
    env.run(until=5.0)
    assert [(k, v) for _, k, v in seen] == [("ring/n1", 1), ("ring/n2", 1), ("ring/n1", None)]
    assert [i for i, _, _ in seen] == sorted(i for i, _, _ in seen)
    assert all(x.sm.data.get("ring/n3") == 1 for x in g.nodes)
