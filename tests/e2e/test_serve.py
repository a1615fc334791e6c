"""`dpproxy serve` as a user runs it: the embedded default, the printed hint, SIGTERM."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
from pathlib import Path

import psycopg
import pytest

ROOT = Path(__file__).parent.parent.parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_serve_embedded_default_then_sigterm(tmp_path: Path) -> None:
    port = free_port()
    env = {**os.environ, "DPPROXY_DATA_DIR": str(tmp_path / "pgdata")}
    process = subprocess.Popen(
        [str(Path(sys.executable).parent / "dpproxy"), "--config", str(ROOT / "config.yaml"),
         "serve", "--port", str(port)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=tmp_path,
    )  # fmt: skip
    try:
        assert process.stdout is not None
        line = process.stdout.readline()  # blocks until the server is ready (or exits)
        match = re.search(r'psql "(postgresql://analyst:analyst@127\.0\.0\.1:\d+/demo)"', line)
        assert match, line + (process.stderr.read() if process.stderr else "")
        with psycopg.connect(match.group(1), autocommit=True, connect_timeout=10) as conn:
            (n,) = conn.execute("SELECT COUNT(*) FROM adult WITH ACCURACY 100").fetchone() or (0,)
            assert n > 10_000
            idle = psycopg.connect(match.group(1), connect_timeout=10)
            process.send_signal(signal.SIGTERM)
            _, err = process.communicate(timeout=60)
        assert process.returncode == 0, err
        assert "event=shutdown" in err and "event=stopped" in err
        assert "dp_answer" in err and "source=fresh" in err
        with pytest.raises(
            psycopg.OperationalError, match="terminating connection due to administrator"
        ):
            idle.execute("SELECT 1")  # the idle session was closed with 57P01
        idle.close()
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(10)
