"""sim.gcquiet: the collector's settings during a run and after it."""

from __future__ import annotations

import gc

import pytest

from sim.gcquiet import YOUNG_THRESHOLD, quiet_gc


def test_a_run_freezes_what_exists_and_restores_the_settings_after() -> None:
    before = gc.get_threshold()
    marker = [object()]  # exists before the block: frozen inside it
    with quiet_gc():
        assert gc.get_threshold() == (YOUNG_THRESHOLD, before[1], before[2])
        assert gc.get_freeze_count() > 0
        # the permanent generation: no collection (and no gc.get_objects) looks at it
        assert not any(o is marker for o in gc.get_objects())
    assert gc.get_threshold() == before
    assert gc.get_freeze_count() == 0
    assert any(o is marker for o in gc.get_objects())


def test_nested_uses_leave_the_settings_to_the_outermost() -> None:
    before = gc.get_threshold()
    with quiet_gc():
        frozen = gc.get_freeze_count()
        with quiet_gc():
            assert gc.get_freeze_count() == frozen
        assert gc.get_threshold()[0] == YOUNG_THRESHOLD  # the inner exit restored nothing
        assert gc.get_freeze_count() == frozen
    assert gc.get_threshold() == before


def test_the_settings_come_back_when_the_run_raises() -> None:
    before = gc.get_threshold()
    with pytest.raises(RuntimeError, match="boom"), quiet_gc():
        raise RuntimeError("boom")
    assert gc.get_threshold() == before
    assert gc.get_freeze_count() == 0
    with quiet_gc():  # and the depth counter is back to zero: this use freezes again
        assert gc.get_threshold()[0] == YOUNG_THRESHOLD
