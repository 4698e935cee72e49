"""The replicated log of one Raft replica (1-based indices; index 0 is the empty prefix).

Invariant: terms are non-decreasing along the log (a leader only appends entries of its
current term, and terms only grow), which :meth:`RaftLog.append` asserts.
"""

from __future__ import annotations

from collections.abc import Sequence

from sim.control.raft.messages import Entry


class RaftLog:
    """A list of :class:`Entry` addressed from 1; ``term_at(0) == 0``."""

    __slots__ = ("_entries",)

    def __init__(self, entries: Sequence[Entry] = ()) -> None:
        self._entries: list[Entry] = []
        for e in entries:
            self.append(e)

    @property
    def last_index(self) -> int:
        """Index of the last entry (0 when empty)."""
        return len(self._entries)

    @property
    def last_term(self) -> int:
        """Term of the last entry (0 when empty)."""
        return self._entries[-1].term if self._entries else 0

    def term_at(self, index: int) -> int:
        """Term of the entry at ``index`` (0 for index 0). ``index`` must be <= last_index."""
        if index == 0:
            return 0
        return self._entries[index - 1].term

    def entry(self, index: int) -> Entry:
        """The entry at ``index`` (1 <= index <= last_index)."""
        if index < 1:
            raise IndexError(index)
        return self._entries[index - 1]

    def slice(self, start: int, max_count: int) -> tuple[Entry, ...]:
        """Up to ``max_count`` entries from ``start`` (inclusive) onwards."""
        return tuple(self._entries[start - 1 : start - 1 + max_count])

    def append(self, entry: Entry) -> int:
        """Append ``entry``; return its index."""
        assert entry.term >= self.last_term, "log terms must be non-decreasing"
        self._entries.append(entry)
        return len(self._entries)

    def truncate_from(self, index: int) -> None:
        """Delete the entry at ``index`` and every entry after it."""
        del self._entries[index - 1 :]

    def first_index_of_term(self, index: int) -> int:
        """The first index of the run of entries sharing ``term_at(index)`` and ending at
        ``index`` (used as the conflict hint of a failed AppendEntries)."""
        term = self.term_at(index)
        i = index
        while i > 1 and self._entries[i - 2].term == term:
            i -= 1
        return i

    def terms(self) -> list[int]:
        """The term of every entry, in order (for checks and tests)."""
        return [e.term for e in self._entries]

    def entries(self) -> list[Entry]:
        """A copy of all entries."""
        return list(self._entries)

    def up_to_date(self, last_index: int, last_term: int) -> bool:
        """Raft's voting rule: is a log ending at (last_index, last_term) at least as
        up-to-date as this one? (Later last term wins; equal terms -> longer log wins.)"""
        if last_term != self.last_term:
            return last_term > self.last_term
        return last_index >= self.last_index
