"""RaftLog helpers against a plain list model, and RaftConfig validation."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from engine.errors import InputError
from sim.control.raft import RaftConfig, RaftLog

from .util import entries

term_lists = st.lists(st.integers(1, 4), max_size=12).map(sorted)


@given(term_lists, st.integers(0, 14), st.integers(0, 5))
def test_log_against_list_model(terms: list[int], other_len: int, other_term: int) -> None:
    log = RaftLog(entries(terms))
    assert log.terms() == terms and log.last_index == len(terms)
    assert log.last_term == (terms[-1] if terms else 0)
    assert log.term_at(0) == 0
    for i in range(1, len(terms) + 1):
        assert log.term_at(i) == terms[i - 1]
        first = log.first_index_of_term(i)
        assert all(terms[j - 1] == terms[i - 1] for j in range(first, i + 1))
        assert first == 1 or terms[first - 2] != terms[i - 1]
    mine = (log.last_term, log.last_index)
    assert log.up_to_date(other_len, other_term) == ((other_term, other_len) >= mine)
    if terms:
        cut = len(terms) // 2 + 1
        log.truncate_from(cut)
        assert log.terms() == terms[: cut - 1]
        assert log.slice(1, 3) == tuple(entries(terms)[: min(3, cut - 1)])


def test_log_rejects_decreasing_terms() -> None:
    log = RaftLog(entries([1, 3]))
    with pytest.raises(AssertionError):
        log.append(entries([2])[0])


@pytest.mark.parametrize(
    ("kw", "field"),
    [
        ({"n": 4}, "raft.n"),
        ({"election_timeout": (0.3, 0.1)}, "raft.election_timeout"),
        ({"heartbeat_interval": 0.2}, "raft.heartbeat_interval"),
        ({"max_batch": 0}, "raft.max_batch"),
    ],
)
def test_config_validation(kw: dict[str, object], field: str) -> None:
    with pytest.raises(InputError, match=field):
        RaftConfig(**kw).validate()  # type: ignore[arg-type]
    assert RaftConfig(n=5).validate().n == 5
