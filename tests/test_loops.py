"""The event loop choice: ``listen.event_loop``, ``dpproxy serve --loop``, and the fallback."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from proxy.cli import main
from proxy.config import Config, parse_config
from proxy.errors import ConfigError
from proxy.server import listener
from proxy.server.loops import loop_factory, loop_name

ROOT = Path(__file__).parent.parent
BASE = yaml.safe_load((ROOT / "config.yaml").read_text())
BACKEND = {"dsn": "postgresql://r@db/x", "passthrough_dsn": "postgresql://db/y"}


def config(**listen: Any) -> Config:
    return parse_config({**BASE, "listen": listen, "backend": BACKEND})


def name_of(choice: str) -> str:
    loop = loop_factory(choice)()
    try:
        return loop_name(loop)
    finally:
        loop.close()


def test_auto_is_uvloop_when_installed() -> None:
    pytest.importorskip("uvloop")
    assert config().listen.event_loop == "auto"
    assert name_of("auto") == "uvloop" and name_of("uvloop") == "uvloop"
    assert name_of("asyncio") == "asyncio"


def test_without_uvloop_auto_falls_back_and_uvloop_is_refused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(sys.modules, "uvloop", None)  # import uvloop raises ImportError
    assert name_of("auto") == "asyncio"
    with pytest.raises(ConfigError, match="uvloop is not installed"):
        loop_factory("uvloop")


def test_config_key_is_checked() -> None:
    assert config(event_loop="asyncio").listen.event_loop == "asyncio"
    with pytest.raises(ConfigError, match="listen.event_loop: must be one of auto, asyncio"):
        config(event_loop="trio")
    with pytest.raises(ConfigError, match="listen.event_loop"):
        loop_factory("trio")


@pytest.mark.parametrize("choice", ["asyncio", "uvloop"])
def test_run_serves_on_the_chosen_loop(monkeypatch: pytest.MonkeyPatch, choice: str) -> None:
    pytest.importorskip("uvloop")
    seen: list[str] = []

    async def serve(*args: object) -> None:
        seen.append(loop_name(asyncio.get_running_loop()))

    monkeypatch.setattr(listener, "_serve", serve)
    assert listener.run(config(event_loop=choice)) == 0
    assert seen == [choice]


@pytest.mark.parametrize("flag, expected", [([], "auto"), (["--loop", "asyncio"], "asyncio")])
def test_serve_flag_overrides_the_config(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, flag: list[str], expected: str
) -> None:
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump({**BASE, "backend": BACKEND}))
    seen: list[Config] = []

    def run(config: Config, host: str | None, port: int | None) -> int:
        seen.append(config)
        return 0

    monkeypatch.setattr(listener, "run", run)
    monkeypatch.setattr("proxy.logs.setup", lambda *args: None)
    assert main(["--config", str(path), "serve", *flag]) == 0
    assert seen[0].listen.event_loop == expected


def test_the_key_and_flag_are_documented() -> None:
    assert "| `event_loop`" in (ROOT / "docs" / "config.md").read_text()
    assert "#   event_loop: auto" in (ROOT / "config.yaml").read_text()
    assert "--loop asyncio" in (ROOT / "docs" / "deploy.md").read_text()
