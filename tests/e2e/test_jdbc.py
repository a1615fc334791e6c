"""pgjdbc (the Debian package) through dpproxy, with a Java client compiled at test time.

`.ci/run` installs libpostgresql-jdbc-java and a JDK when they are missing; without them this
module is skipped, saying why.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from tests.e2e.conftest import Proxy

JAR = Path("/usr/share/java/postgresql.jar")
SOURCE = Path(__file__).parent / "jdbc" / "JdbcCheck.java"

pytestmark = [
    pytest.mark.skipif(
        not JAR.exists(),
        reason=f"pgjdbc is not installed ({JAR}; apt-get install libpostgresql-jdbc-java)",
    ),
    pytest.mark.skipif(
        shutil.which("javac") is None or shutil.which("java") is None,
        reason="no JDK (javac/java) on PATH",
    ),
]


@pytest.fixture(scope="module")
def classes(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("jdbc")
    subprocess.run(
        ["javac", "-cp", str(JAR), "-d", str(out), str(SOURCE)],
        check=True,
        capture_output=True,
        timeout=120,
    )
    return out


def test_pgjdbc(proxy: Proxy, classes: Path) -> None:
    url = f"jdbc:postgresql://{proxy.host}:{proxy.port}/demo"
    result = subprocess.run(
        ["java", "-cp", f"{classes}:{JAR}", "JdbcCheck", url],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    lines = [line.split("=", 1) for line in result.stdout.splitlines() if "=" in line]
    out: dict[str, list[str]] = {}
    for key, value in lines:
        out.setdefault(key, []).append(value)
    assert float(out["count"][0]) > 10_000
    assert out["notice"][0].startswith("dp: count = ")
    assert out["group0"] == out["group2"] == ["Male:true;Female:true;"]
    assert out["param"] == ["true"]
    assert out["table"] == ["adult"] and out["column"] == ["int4"]
    assert out["refused"] == ["42501", "53400", "0A000"]
    assert out["committed"] == ["1"]
