"""Reads the SQL corpora in tests/fixtures/sqlmap: blocks separated by blank lines.

A block may start with ``-- expect <SQLSTATE>: <message fragment>`` (refusal corpora) and may
carry other comments, which stay part of the SQL.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

FIXTURES = Path(__file__).parent.parent / "fixtures" / "sqlmap"
_EXPECT = re.compile(r"^-- expect (\w{5}): (.+)$")


@dataclass(frozen=True)
class Case:
    """One corpus entry."""

    file: str
    line: int
    sql: str
    sqlstate: str | None = None
    message: str | None = None

    @property
    def id(self) -> str:
        return f"{self.file}:{self.line}"


def read_corpus(name: str) -> list[Case]:
    """All blocks of ``tests/fixtures/sqlmap/<name>``."""
    cases = []
    lines = (FIXTURES / name).read_text().split("\n")
    block: list[str] = []
    start = 0
    for number, line in enumerate(lines + [""], start=1):
        if line.strip():
            if not block:
                start = number
            block.append(line)
            continue
        if block:
            expect = _EXPECT.match(block[0])
            sql = "\n".join(block[1:] if expect else block)
            cases.append(Case(name, start, sql, *(expect.groups() if expect else (None, None))))
            block = []
    return cases
