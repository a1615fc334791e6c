"""pgjdbc (the Debian package) and a JDK for end-to-end tests: whether they are there, and
compiling a Java client of `tests/e2e/jdbc/` against the driver at test time.

`.ci/run` installs libpostgresql-jdbc-java and a JDK when they are missing; a module that uses
:data:`NEEDS_PGJDBC` is skipped without them, saying why.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

JAR = Path("/usr/share/java/postgresql.jar")
SOURCES = Path(__file__).parent / "jdbc"

NEEDS_PGJDBC = [
    pytest.mark.skipif(
        not JAR.exists(),
        reason=f"pgjdbc is not installed ({JAR}; apt-get install libpostgresql-jdbc-java)",
    ),
    pytest.mark.skipif(
        shutil.which("javac") is None or shutil.which("java") is None,
        reason="no JDK (javac/java) on PATH",
    ),
]


def compile_client(out: Path, source: str) -> Path:
    """Compile ``tests/e2e/jdbc/<source>`` against pgjdbc into ``out``; the classpath's folder."""
    subprocess.run(
        ["javac", "-cp", str(JAR), "-d", str(out), str(SOURCES / source)],
        check=True,
        capture_output=True,
        timeout=120,
    )
    return out


def java(classes: Path, main: str, *args: str) -> list[str]:
    """The command that runs ``main`` from ``classes`` with pgjdbc on the classpath."""
    return ["java", "-cp", f"{classes}:{JAR}", main, *args]
