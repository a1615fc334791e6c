"""A real dpproxy per test, in front of the session's real PostgreSQL.

Each proxy runs its own asyncio loop in a background thread and listens on a free port; its
log is captured and printed when the test fails.
"""

from __future__ import annotations

import asyncio
import io
import logging
import os
import threading
from collections.abc import Coroutine, Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, TypeVar

import pytest

from proxy import logs
from proxy.config import BackendConfig, Config, load_config
from proxy.server.listener import Server, open_server
from proxy.server.loops import loop_factory
from proxy.storage.provision import provision_roles

ROOT = Path(__file__).parent.parent.parent
CONFIG = load_config(ROOT / "config.yaml")
T = TypeVar("T")


@dataclass
class Proxy:
    """A running dpproxy and how to reach it."""

    server: Server
    loop: asyncio.AbstractEventLoop
    log: io.StringIO
    host: str = "127.0.0.1"

    @property
    def port(self) -> int:
        return self.server.port

    def dsn(
        self,
        user: str = "analyst",
        password: str = "analyst",
        database: str = "demo",
        **params: str,
    ) -> str:
        query = "&".join(f"{k}={v}" for k, v in params.items())
        return f"postgresql://{user}:{password}@{self.host}:{self.port}/{database}" + (
            f"?{query}" if query else ""
        )

    @property
    def kwargs(self) -> dict[str, Any]:
        """Connection keywords for asyncpg.connect."""
        return {
            "host": self.host,
            "port": self.port,
            "user": "analyst",
            "password": "analyst",
            "database": "demo",
        }

    def call(self, coro: Coroutine[Any, Any, T], timeout: float = 30) -> T:
        """Run a coroutine on the proxy's loop (e.g. to shut it down)."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)


@pytest.fixture(autouse=True)
def _close_raw_clients() -> Iterator[None]:
    from tests.e2e.rawclient import RawClient

    yield
    RawClient.close_all()


@pytest.fixture(scope="session")
def backend(adult_dsn: str) -> BackendConfig:
    """The two roles on the test PostgreSQL."""
    roles = provision_roles(adult_dsn, CONFIG.cubes)
    return BackendConfig(roles.reader_dsn, roles.passthrough_dsn)


def start_proxy(config: Config, backend: BackendConfig) -> tuple[Proxy, threading.Thread]:
    """Start a dpproxy on a free port in a thread of its own.

    It runs on the event loop ``dpproxy serve`` would pick (``listen.event_loop``: uvloop when
    installed); ``DPPROXY_TEST_LOOP=asyncio`` (or ``uvloop``) replaces ``auto``.
    """
    log = io.StringIO()
    logs.setup("DEBUG", log)
    choice = config.listen.event_loop
    if choice == "auto":
        choice = os.environ.get("DPPROXY_TEST_LOOP") or choice
    loop = loop_factory(choice)()
    ready: dict[str, Any] = {}
    started = threading.Event()

    def main() -> None:
        asyncio.set_event_loop(loop)
        try:
            ready["server"] = loop.run_until_complete(open_server(config, backend, "127.0.0.1", 0))
        except BaseException as e:  # reported to the test below
            ready["error"] = e
            started.set()
            return
        started.set()
        loop.run_forever()
        loop.run_until_complete(loop.shutdown_asyncgens())
        loop.close()

    thread = threading.Thread(target=main, name="dpproxy", daemon=True)
    thread.start()
    if not started.wait(60):
        raise TimeoutError("dpproxy did not start")
    if "error" in ready:
        raise ready["error"]
    return Proxy(ready["server"], loop, log), thread


def stop_proxy(proxy: Proxy, thread: threading.Thread) -> None:
    """Shut the proxy down in stages and stop its loop."""
    if not proxy.loop.is_closed():
        try:
            proxy.call(proxy.server.shutdown(2.0))
        finally:
            proxy.loop.call_soon_threadsafe(proxy.loop.stop)
    thread.join(10)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    outcome = yield
    report = outcome.get_result()  # type: ignore[attr-defined]
    setattr(item, f"rep_{report.when}", report)


@pytest.fixture()
def proxy_config() -> Config:
    """The config each test's proxy runs with (override in a module to change it)."""
    return CONFIG


@pytest.fixture()
def proxy(
    request: pytest.FixtureRequest, backend: BackendConfig, proxy_config: Config
) -> Iterator[Proxy]:
    """A fresh dpproxy (fresh budget, fresh history) for one test."""
    running, thread = start_proxy(proxy_config, backend)
    try:
        yield running
    finally:
        stop_proxy(running, thread)
        report = getattr(request.node, "rep_call", None)
        if report is not None and report.failed:
            print("---- dpproxy log ----")
            print(running.log.getvalue())
        _reset_logging()


@pytest.fixture(scope="module")
def shared_proxy(backend: BackendConfig) -> Iterator[Proxy]:
    """One dpproxy for a whole module (for long parametrized suites)."""
    running, thread = start_proxy(CONFIG, backend)
    try:
        yield running
    finally:
        stop_proxy(running, thread)
        _reset_logging()


def _reset_logging() -> None:
    """Undo logs.setup, so other tests see the dpproxy logger as they expect."""
    logger = logging.getLogger("dpproxy")
    logger.handlers.clear()
    logger.propagate = True
    logger.setLevel(logging.NOTSET)


def with_listen(config: Config, **changes: Any) -> Config:
    """The config with some listen keys changed."""
    return replace(config, listen=replace(config.listen, **changes))
