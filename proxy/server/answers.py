"""What a session answers itself: DP queries and its ``dp.*`` settings.

Both protocols come here: the simple one (`proxy.server.session`) and the extended one
(`proxy.server.extended`). A DP query is translated with the session's settings and answered by
the server's `DpService`, through the memo; a CancelRequest stops the answer with 57014.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Hashable
from typing import Any, TypeVar

from sqlglot import exp

from proxy.dp.answering import DpResult, WrappedAnswer
from proxy.dp.results import Formats
from proxy.dp.routing import Statement
from proxy.dp.settings import DpSettings, SettingCommand, Verb
from proxy.errors import QueryCanceled
from proxy.logs import event
from proxy.server.context import SessionContext
from proxy.wire import CommandComplete, DataRow, Message, RowDescription
from proxy.wire.types import Oid, column
from sqlmap.postprocess import Wrapped
from sqlmap.translate import AnswerSpec

__all__ = ["LocalAnswers"]

T = TypeVar("T")


class LocalAnswers:
    """The DP answers and ``dp.*`` settings of one session.

    Args:
        ctx: the server's shared state.
        user: who asks (for the budget per user and the log).
        settings: the session's ``dp.*`` settings to start with.
    """

    def __init__(
        self, ctx: SessionContext, user: str = "", settings: DpSettings | None = None
    ) -> None:
        self.ctx = ctx
        self.user = user
        self.settings = self.start_settings = settings or DpSettings()
        self._running: asyncio.Future[Any] | None = None

    def cancel(self) -> bool:
        """Cancel the DP answer under way; False if there is none."""
        if self._running is None or self._running.done():
            return False
        self._running.cancel()
        return True

    def reset_settings(self) -> Callable[[], None]:
        """``RESET ALL`` / ``DISCARD ALL``: back to the settings the session started with.

        Returns:
            The undo, for when the backend refuses the statement after all.
        """
        previous, self.settings = self.settings, self.start_settings
        event("setting", user=self.user, setting="dp.*", value=None)

        def undo() -> None:
            self.settings = previous

        return undo

    def apply_setting(
        self, command: SettingCommand, formats: Formats, describe: bool
    ) -> list[Message]:
        """SET / RESET / SHOW of a dp.* setting; the messages that answer it."""
        if command.verb is Verb.SHOW:
            text = self.settings.show(command.name, self.ctx.defaults)
            header = [self.setting_description(command, formats)] if describe else []
            # text is the same bytes in both formats
            return [*header, DataRow((text.encode("utf-8"),)), CommandComplete("SHOW")]
        self.settings = self.settings.set(command.name, command.value, self.start_settings)
        event("setting", user=self.user, setting=command.name, value=command.value)
        return [CommandComplete(command.verb.value)]

    @staticmethod
    def setting_description(command: SettingCommand, formats: Formats) -> Message:
        """The RowDescription of SHOW dp.x (a text column named after the setting)."""
        return RowDescription((column(command.name, Oid.TEXT, formats(0, 1)),))

    async def translate(
        self, tree: exp.Expr, key: Hashable, bind: Callable[[], exp.Expr] | None = None
    ) -> tuple[AnswerSpec, Hashable]:
        """Translate with the session's accuracy settings, remembered under ``key``.

        ``key`` is the SQL text and any bound values; ``bind`` makes the tree to translate
        when the memo has none. Returns the spec and its full memo key.
        """
        defaults = self.settings.defaults(self.ctx.defaults)
        full_key = (key, defaults, self.settings.unbiased)  # the answer depends on both

        def translate() -> AnswerSpec:
            return self.ctx.translator.translate_parsed(
                bind() if bind is not None else tree, defaults
            )

        return await self.ctx.memo.spec(full_key, translate), full_key

    async def answer(self, tree: exp.Expr, key: str) -> DpResult:
        """Translate and answer a DP query with the session's settings; cancellable."""
        spec, full_key = await self.translate(tree, key)
        return await self.answer_spec(spec, full_key, key)

    async def answer_spec(self, spec: AnswerSpec, key: Hashable, sql: str) -> DpResult:
        """Answer a translated query; a CancelRequest stops it with 57014.

        ``sql`` is the query's text, for the audit log.

        An answer the memo holds for ``key`` (given from the same history) is sent again
        without asking the engine.
        """
        table = spec.cube.qualified_name
        memo = self.ctx.memo
        kept = memo.answer(key, spec.cube)
        if kept is not None:
            await self.ctx.service.log_repeat(spec, kept, self.user, sql)
            _log_answer(self.user, table, kept, memo=True)
            return kept
        version = memo.version(spec.cube)
        result = await self._cancellable(
            self.ctx.service.answer(spec, user=self.user, sql=sql, unbiased=self.settings.unbiased)
        )
        memo.remember(key, version, result, spec.cube)
        _log_answer(self.user, table, result)
        return result

    async def answer_wrapped(
        self, wrapped: Wrapped, sql: str, key: Hashable = None
    ) -> WrappedAnswer:
        """Answer a statement's cores as one batch and fill its wrapper in; cancellable.

        The wrapper, to run under the pass-through role, holds only the released values.
        ``key`` remembers the cores' translations (default ``sql``; with bound values, both).
        """
        specs = await self.translate_cores(wrapped, sql if key is None else key)
        answer = await self._cancellable(
            self.ctx.service.answer_wrapped(
                wrapped, specs, user=self.user, sql=sql, unbiased=self.settings.unbiased
            )
        )
        for spec, result in zip(specs, answer.results):
            _log_answer(self.user, spec.cube.qualified_name, result)
        return answer

    async def explain(self, statement: Statement) -> DpResult:
        """``EXPLAIN <DP query>``: how its values would be answered, at what cost.

        Nothing is spent.
        """
        if statement.wrapped is not None:
            specs = await self.translate_cores(statement.wrapped, statement.text)
        else:
            assert statement.parsed is not None
            specs = [(await self.translate(statement.parsed, statement.text))[0]]
        return await self._cancellable(self.ctx.service.preview(specs))

    async def translate_cores(self, wrapped: Wrapped, key: Hashable) -> list[AnswerSpec]:
        """The specs of the cores that ask the engine (the others list declared values)."""
        specs = []
        for index, core in enumerate(wrapped.cores):
            if core.rows is None:
                # keyed by the statement's text (and bound values): the core alone does not
                # show its accuracy
                specs.append((await self.translate(core.select, (key, index)))[0])
        return specs

    async def _cancellable(self, work: Awaitable[T]) -> T:
        """Await ``work`` as the session's DP answer: a CancelRequest stops it with 57014."""
        task = asyncio.ensure_future(work)
        self._running = task
        try:
            return await task
        except asyncio.CancelledError:
            current = asyncio.current_task()
            if current is not None and current.cancelling():  # the session itself is cancelled
                task.cancel()
                raise
            raise QueryCanceled("canceling statement due to user request") from None
        finally:
            self._running = None


def _log_answer(user: str, table: str, result: DpResult, memo: bool = False) -> None:
    """Who asked, on which table, where the answer came from and what it cost; no values."""
    sources = sorted({r.source for r in result.replies})
    charged = max((float(r.budget_charged) for r in result.replies), default=0.0)
    remaining = min((float(r.budget_remaining) for r in result.replies), default=None)
    event(
        "dp_answer",
        user=user,
        table=table,
        values=len(result.replies),
        source=",".join(sources),
        memo=memo or None,
        budget_charged_max=f"{charged:.6g}",
        budget_remaining=None if remaining is None else f"{remaining:.6g}",
    )
