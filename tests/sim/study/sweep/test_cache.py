"""The per-run cache: atomic records, failures never count as done, corrupt files re-run."""

from __future__ import annotations

import json
from pathlib import Path

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from sim.study.sweep import RunCache


def _rec(h: str, status: str = "ok", x: float = 1.0) -> dict[str, object]:
    return {"config_hash": h, "seed": 0, "params": {}, "status": status, "metrics": {"x": x}}


def test_round_trip_and_no_temporary_files(tmp_path: Path) -> None:
    c = RunCache(tmp_path / "sw")
    assert c.get("abc") is None and c.done() == []
    assert not (tmp_path / "sw").exists()  # no I/O until used
    c.put(_rec("abc", x=2.5))
    assert c.get("abc") == _rec("abc", x=2.5)
    assert c.done() == ["abc"]
    assert [p.name for p in (tmp_path / "sw" / "runs").iterdir()] == ["abc.json"]


def test_failure_is_kept_but_not_done_and_cleared_by_success(tmp_path: Path) -> None:
    c = RunCache(tmp_path)
    c.put({**_rec("h1", "failed"), "error": "boom"})
    assert c.get("h1") is None and c.done() == []
    assert c.failure("h1")["error"] == "boom"  # type: ignore[index]
    c.put(_rec("h1"))
    assert c.done() == ["h1"] and c.failure("h1") is None


def test_corrupt_or_mismatched_record_is_missing(tmp_path: Path) -> None:
    c = RunCache(tmp_path)
    c.put(_rec("good"))
    (tmp_path / "runs" / "torn.json").write_text('{"config_hash": "torn", "sta')
    (tmp_path / "runs" / "other.json").write_text(json.dumps(_rec("not-other")))
    assert c.get("torn") is None and c.get("other") is None
    assert c.done() == ["good"]


class CacheMachine(RuleBasedStateMachine):
    """The cache against a dict model: done == hashes whose last write was "ok"."""

    def __init__(self) -> None:
        super().__init__()
        import tempfile

        self.dir = Path(tempfile.mkdtemp(prefix="h10cache-"))
        self.cache = RunCache(self.dir)
        self.ok: dict[str, float] = {}

    @rule(h=st.sampled_from(["a", "b", "c", "d"]), x=st.floats(0, 10, allow_nan=False))
    def put_ok(self, h: str, x: float) -> None:
        self.cache.put(_rec(h, x=x))
        self.ok[h] = x

    @rule(h=st.sampled_from(["a", "b", "c", "d"]))
    def put_failed(self, h: str) -> None:
        # a later failure of an already finished run does not erase the finished record
        self.cache.put({**_rec(h, "failed"), "error": "e"})

    @rule(h=st.sampled_from(["a", "b", "c", "d"]))
    def corrupt(self, h: str) -> None:
        p = self.dir / "runs" / f"{h}.json"
        if p.exists():
            p.write_text("{")
            self.ok.pop(h, None)

    @invariant()
    def matches_model(self) -> None:
        assert self.cache.done() == sorted(self.ok)
        for h, x in self.ok.items():
            rec = self.cache.get(h)
            assert rec is not None and rec["metrics"] == {"x": x}


TestCacheMachine = CacheMachine.TestCase
TestCacheMachine.settings = settings(max_examples=25, stateful_step_count=15, deadline=None)
