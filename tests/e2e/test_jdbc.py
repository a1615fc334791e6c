"""pgjdbc (the Debian package) through dpproxy, with a Java client compiled at test time.

`.ci/run` installs libpostgresql-jdbc-java and a JDK when they are missing; without them this
module is skipped, saying why.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tests.e2e.conftest import Proxy
from tests.e2e.pgjdbc import NEEDS_PGJDBC, compile_client, java

pytestmark = NEEDS_PGJDBC


@pytest.fixture(scope="module")
def classes(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return compile_client(tmp_path_factory.mktemp("jdbc"), "JdbcCheck.java")


def test_pgjdbc(proxy: Proxy, classes: Path) -> None:
    url = f"jdbc:postgresql://{proxy.host}:{proxy.port}/demo"
    result = subprocess.run(
        java(classes, "JdbcCheck", url),
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
