"""Memos that make a repeated DP query cost no parsing and no engine time.

Routing and translation are pure functions of the SQL text (and the session's accuracy
defaults), so their results are kept by text. An answer given entirely from history is a pure
function of the query and the history, so it is kept until the table's history grows (the
engine's ``history_size``): the engine would return exactly the same estimates, intervals and
(zero) charges, so nothing about privacy changes, only the time spent. Fresh or combined
answers are never kept.

A memo hit skips the engine, not the audit: the session records it in the ledger's answer log
(`DpService.log_repeat`), and dpproxy's own log marks it ``memo=true``.

A kept answer is kept without its replies' error laws (``Reply.scales``, one term per history row
each: 0.8 MB a value at 100,000 rows, and a GROUP BY has up to 500 values): a repeat sends the
rows built from them and logs the replies' figures, and never reads a law again. An answer is
forgotten as soon as its table's history has grown, since it can never be sent again. Kept whole
and until 2,048 newer ones, they grew a server at 100,000 answers to 2 GB.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Hashable
from dataclasses import replace
from typing import Generic, TypeVar

import numpy as np
import numpy.typing as npt

from proxy.dp.answering import DpResult, DpService
from proxy.dp.routing import Router, Statement
from sqlmap.cube import Cube
from sqlmap.translate import AnswerSpec

__all__ = ["LRU", "DpMemo"]


K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


class LRU(Generic[K, V]):
    """A bounded mapping that forgets the least recently used entry first.

    >>> lru: LRU[str, int] = LRU(2)
    >>> lru.put("a", 1); lru.put("b", 2); lru.get("a"); lru.put("c", 3)
    1
    >>> lru.get("b") is None, lru.get("a"), len(lru)
    (True, 1, 2)
    """

    def __init__(self, size: int) -> None:
        self._size = size
        self._items: OrderedDict[K, V] = OrderedDict()

    def get(self, key: K) -> V | None:
        """The value, marked as used; None if absent."""
        value = self._items.get(key)
        if value is not None:
            self._items.move_to_end(key)
        return value

    def put(self, key: K, value: V) -> None:
        """Keep ``value``, forgetting the oldest entry if full."""
        self._items[key] = value
        self._items.move_to_end(key)
        if len(self._items) > self._size:
            self._items.popitem(last=False)

    def discard(self, key: K) -> None:
        """Forget ``key``'s entry, if any."""
        self._items.pop(key, None)

    def discard_values(self, stale: Callable[[V], bool]) -> None:
        """Forget every entry whose value is ``stale``."""
        for key in [k for k, value in self._items.items() if stale(value)]:
            del self._items[key]

    def __len__(self) -> int:
        return len(self._items)


class DpMemo:
    """One server's memos of routes, translations and answers from history."""

    def __init__(self, router: Router, service: DpService, size: int = 2048) -> None:
        self._router = router
        self._service = service
        self._routes: LRU[str, list[Statement]] = LRU(size)
        self._specs: LRU[Hashable, AnswerSpec] = LRU(size)
        self._answers = _Answers(size)

    async def route(self, sql: str) -> list[Statement]:
        """`Router.route`, remembered by text (refusals are not remembered: they raise).

        Parsing runs in a worker: a long statement must not hold up the event loop.
        """
        statements = self._routes.get(sql)
        if statements is None:
            statements = await self._service.workers.run(lambda: self._router.route(sql))
            self._routes.put(sql, statements)
        return statements

    async def spec(self, key: Hashable, translate: Callable[[], AnswerSpec]) -> AnswerSpec:
        """The translation kept under ``key`` (SQL text, bound values, accuracy defaults).

        Translating runs in a worker, as parsing does.
        """
        spec = self._specs.get(key)
        if spec is None:
            spec = await self._service.workers.run(translate)
            self._specs.put(key, spec)
        return spec

    def answer(self, key: Hashable, cube: Cube) -> DpResult | None:
        """The answer kept under ``key`` if the table's history has not grown since."""
        return self._answers.get(key, cube.qualified_name, self.version(cube))

    def remember(self, key: Hashable, version: int, result: DpResult, cube: Cube) -> None:
        """Keep an answer given entirely from ``cube``'s history of size ``version``."""
        if result.replies and all(r.source == "history" for r in result.replies):
            self._answers.put(key, cube.qualified_name, version, result)

    def version(self, cube: Cube) -> int:
        """The size of the table's history; read it before answering."""
        return self._service.engine(cube).history_size


class _Answers:
    """Answers from history by key, each with its table and history size, in an :class:`LRU`.

    Their replies are kept without error laws. Only answers at a table's latest history size
    can be sent again, so a newer size forgets the table's others.
    """

    def __init__(self, size: int) -> None:
        self._kept: LRU[Hashable, tuple[str, int, DpResult]] = LRU(size)
        self._latest: dict[str, int] = {}  # table -> the history size of its kept answers

    def get(self, key: Hashable, table: str, version: int) -> DpResult | None:
        item = self._kept.get(key)
        if item is None:
            return None
        if item[:2] != (table, version):
            self._kept.discard(key)
            return None
        return item[2]

    def put(self, key: Hashable, table: str, version: int, result: DpResult) -> None:
        latest = self._latest.get(table, version)
        if latest > version:
            return  # answered from a history that has grown since: never sent again
        if latest < version:
            self._kept.discard_values(lambda item: item[0] == table)
        self._latest[table] = version
        replies = tuple(replace(r, scales=_NO_LAW) for r in result.replies)
        self._kept.put(key, (table, version, replace(result, replies=replies)))

    def __len__(self) -> int:
        return len(self._kept)


_NO_LAW: npt.NDArray[np.float64] = np.zeros(0)
_NO_LAW.flags.writeable = False
