"""The event loop dpproxy serves on: uvloop when it is installed (``auto``), else asyncio's own.

uvloop (libuv, written in Cython) spends less CPU per relayed message than asyncio's selector
loop, which matters most on the pass-through path (docs/benchmarks.md). Both run the same code:
`proxy.server.connection` uses only the transport methods both offer.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Final

from proxy.errors import ConfigError

__all__ = ["EVENT_LOOPS", "loop_factory", "loop_name"]

#: The values of ``listen.event_loop`` and ``dpproxy serve --loop``.
EVENT_LOOPS: Final = ("auto", "asyncio", "uvloop")


def loop_factory(choice: str) -> Callable[[], asyncio.AbstractEventLoop]:
    """What makes the loop for ``choice``: ``auto``, ``asyncio`` or ``uvloop``.

    ``auto`` takes uvloop if it can be imported (it is a dependency, but has no Windows
    build), else asyncio's loop, as uvicorn's ``--loop auto`` does.

    Raises:
        ConfigError: an unknown choice, or ``uvloop`` when uvloop is not installed.

    >>> loop_factory("asyncio") is asyncio.new_event_loop
    True
    """
    if choice not in EVENT_LOOPS:
        raise ConfigError(
            f"listen.event_loop: must be one of {', '.join(EVENT_LOOPS)}, got {choice!r}"
        )
    if choice == "asyncio":
        return asyncio.new_event_loop
    try:
        import uvloop
    except ImportError:
        if choice == "uvloop":
            raise ConfigError(
                "listen.event_loop: uvloop is not installed",
                hint="install it (pip install uvloop), or choose auto or asyncio",
            ) from None
        return asyncio.new_event_loop
    return uvloop.new_event_loop


def loop_name(loop: asyncio.AbstractEventLoop) -> str:
    """``uvloop`` or ``asyncio``: which kind of loop ``loop`` is, for the logs.

    >>> loop = asyncio.new_event_loop(); name = loop_name(loop); loop.close(); name
    'asyncio'
    """
    return "uvloop" if type(loop).__module__.startswith("uvloop") else "asyncio"
