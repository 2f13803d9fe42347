"""A run of consecutive samples of one load-generator query: what a query source is asked to answer
at a time, and how it can tell that the runs it is handed belong to one query (so it may gather
that query's samples once, and serve each run as a slice of them)."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import overload


class QueryRows(Sequence[int]):
    """The samples ``indices[start:end]`` of one query, as a sequence of sample indices.

    ``indices`` is the query's whole list, shared (not copied) by every run of it: the same list
    object means the same query.
    """

    __slots__ = ("indices", "start", "end")

    def __init__(self, indices: list[int], start: int, end: int) -> None:
        self.indices = indices
        self.start = start
        self.end = end

    def __len__(self) -> int:
        return self.end - self.start

    @overload
    def __getitem__(self, item: int) -> int: ...

    @overload
    def __getitem__(self, item: slice) -> list[int]: ...

    def __getitem__(self, item: int | slice) -> int | list[int]:
        return self.indices[self.start : self.end][item]

    def __iter__(self) -> Iterator[int]:
        return iter(self.indices[self.start : self.end])

    def __repr__(self) -> str:
        return f"QueryRows({self.indices[self.start : self.end]!r})"
