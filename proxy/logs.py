"""Structured logs: one ``key=value`` line per event, on the ``dpproxy`` logger.

Events carry their facts as fields, never true answers or raw data: a DP answer is logged with
its user, table, source and budget, not with its value.
"""

from __future__ import annotations

import logging
import re
import sys
import time
from collections.abc import Mapping
from typing import Final, TextIO

__all__ = ["LOGGER", "event", "format_fields", "KeyValueFormatter", "setup"]

#: The logger every dpproxy module writes to.
LOGGER: Final = logging.getLogger("dpproxy")

_BARE: Final = re.compile(r"[A-Za-z0-9_.:/@+\-]+")


def _quote(value: object) -> str:
    text = str(value)
    if _BARE.fullmatch(text):
        return text
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


def format_fields(fields: Mapping[str, object]) -> str:
    r"""Render fields as ``key=value`` pairs, quoting values that need it.

    >>> format_fields({"user": "analyst", "msg": 'say "hi"', "n": 3})
    'user=analyst msg="say \\"hi\\"" n=3'
    """
    return " ".join(f"{key}={_quote(value)}" for key, value in fields.items() if value is not None)


def event(name: str, level: int = logging.INFO, **fields: object) -> None:
    """Log one event with its fields."""
    if LOGGER.isEnabledFor(level):
        LOGGER.log(level, name, extra={"fields": fields})


class KeyValueFormatter(logging.Formatter):
    """``ts=... level=... event=... key=value ...``."""

    def format(self, record: logging.LogRecord) -> str:  # noqa: D102
        fields: dict[str, object] = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "event": record.getMessage(),
        }
        fields.update(getattr(record, "fields", {}))
        if record.exc_info:
            fields["exc"] = self.formatException(record.exc_info)
        return format_fields(fields)


def setup(level: str = "INFO", stream: TextIO | None = None) -> None:
    """Send dpproxy's events to ``stream`` (stderr by default) as key=value lines."""
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(KeyValueFormatter())
    LOGGER.handlers[:] = [handler]
    LOGGER.setLevel(level)
    LOGGER.propagate = False
    # sqlglot warns on stderr when it keeps a statement it cannot parse as a Command; the router
    # handles those statements, so the warning is noise in a server log
    logging.getLogger("sqlglot").setLevel(logging.ERROR)
