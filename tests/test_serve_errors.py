"""`dpproxy serve` refusing to start: one line with a SQLSTATE and a hint, never a traceback."""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

from proxy.config import load_config
from proxy.storage.provision import provision_roles

ROOT = Path(__file__).parent.parent
DPPROXY = str(Path(sys.executable).parent / "dpproxy")


def _serve(config: Path, *flags: str) -> str:
    """Run `dpproxy serve` with --config after the command, as docs/deploy.md shows it."""
    result = subprocess.run(
        [DPPROXY, "serve", "--config", str(config), *flags],
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )
    assert result.returncode == 1, result.stderr
    assert "Traceback" not in result.stderr, result.stderr
    return result.stderr


def _config(tmp_path: Path, reader_dsn: str, passthrough_dsn: str) -> Path:
    config = tmp_path / "config.yaml"
    config.write_text(
        (ROOT / "config.yaml").read_text()
        + f"""
backend:
  dsn: "{reader_dsn}"
  passthrough_dsn: "{passthrough_dsn}"
"""
    )
    return config


def test_a_reader_that_cannot_create_the_ledger(adult_dsn: str, tmp_path: Path) -> None:
    # provisioned without this ledger schema: the reader has no CREATE on the analyst database
    roles = provision_roles(adult_dsn, load_config(ROOT / "config.yaml").cubes)
    config = _config(tmp_path, roles.reader_dsn, roles.passthrough_dsn)
    config.write_text(config.read_text() + "ledger:\n  schema: ledger_never_provisioned\n")
    err = _serve(config, "--port", "0")
    assert "dpproxy: 42501: backend: permission denied for database" in err
    assert "HINT: run `dpproxy provision --dsn <superuser DSN>`" in err


def test_an_unreachable_backend(tmp_path: Path) -> None:
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    reader = f"postgresql://dpproxy_reader@127.0.0.1:{port}/postgres"
    err = _serve(_config(tmp_path, reader, f"postgresql://127.0.0.1:{port}/demo"), "--port", "0")
    assert "dpproxy: 08006: backend.dsn: cannot connect" in err


def test_a_port_already_taken(adult_dsn: str, tmp_path: Path) -> None:
    roles = provision_roles(
        adult_dsn, load_config(ROOT / "config.yaml").cubes, ledger_schema="dpproxy"
    )
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        err = _serve(
            _config(tmp_path, roles.reader_dsn, roles.passthrough_dsn), "--port", str(port)
        )
    assert f"dpproxy: F0000: listen: cannot listen on 127.0.0.1:{port}" in err
    assert "HINT: another server may hold that port" in err


def test_a_missing_config_file(tmp_path: Path) -> None:
    err = _serve(tmp_path / "nowhere.yaml")
    assert "dpproxy: F0000:" in err and "nowhere.yaml" in err
