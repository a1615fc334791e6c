"""The dpproxy command line, run as a user would run it."""

from __future__ import annotations

import shlex
import subprocess
import sys
from pathlib import Path

import psycopg
import pytest

from proxy.cli import _parser, main
from proxy.config import load_config
from proxy.storage.provision import provision_roles

ROOT = Path(__file__).parent.parent


def test_translate_prints_groups_and_sensitivity(capsys: pytest.CaptureFixture[str]) -> None:
    status = main(
        [
            "--config",
            str(ROOT / "config.yaml"),
            "translate",
            "SELECT sex, 2 * COUNT(*) FROM adult GROUP BY sex WITH ACCURACY 20",
        ]
    )
    out = capsys.readouterr().out
    assert status == 0
    assert "accuracy: +-20 at confidence 0.95" in out
    assert "rows: 2 (GROUP BY sex)" in out
    assert "['Male'] ?column? = 2 * COUNT(*): 5760 cells, sensitivity 2, offset 0" in out


def test_refused_query_exits_non_zero_with_sqlstate(capsys: pytest.CaptureFixture[str]) -> None:
    status = main(["--config", str(ROOT / "config.yaml"), "translate", "SELECT * FROM adult"])
    assert status == 1
    assert (
        "dpproxy: 0A000: SELECT * would return rows of the protected table"
        in capsys.readouterr().err
    )


def test_bad_config_path(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    assert main(["--config", str(tmp_path / "x.yaml"), "check"]) == 1
    assert "F0000" in capsys.readouterr().err


def test_check_against_backend(adult_dsn: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--config", str(ROOT / "config.yaml"), "check", "--dsn", adult_dsn]) == 0
    out = capsys.readouterr().out
    assert "public.adult: 11520 cells" in out
    assert "every dimension and measure matches its column in the backend" in out


def test_console_script_is_installed() -> None:
    result = subprocess.run(
        [
            str(Path(sys.executable).parent / "dpproxy"),
            "--config",
            str(ROOT / "config.yaml"),
            "check",
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert "public.adult" in result.stdout


def test_passwd_prints_a_verifier_line() -> None:
    result = subprocess.run(
        [str(Path(sys.executable).parent / "dpproxy"), "passwd", "alice"],
        input="s3cret\n",
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    user, _, verifier = result.stdout.strip().partition(": ")
    assert user == "alice" and verifier.startswith('"SCRAM-SHA-256$4096:')


def test_serve_refuses_a_passthrough_role_that_can_reach_the_tables(
    adult_dsn: str, tmp_path: Path
) -> None:
    roles = provision_roles(
        adult_dsn, load_config(ROOT / "config.yaml").cubes, role_template="leaky_{user}"
    )
    config = tmp_path / "config.yaml"
    config.write_text(
        (ROOT / "config.yaml").read_text()
        + f"""
backend:
  dsn: "{roles.reader_dsn}"
  passthrough_dsn: "{roles.passthrough_dsn}"
  passthrough_role: "leaky_{{user}}"
"""
    )
    with psycopg.connect(adult_dsn, autocommit=True) as conn:
        conn.execute("GRANT CONNECT ON DATABASE postgres TO leaky_analyst")
    try:
        result = subprocess.run(
            [
                str(Path(sys.executable).parent / "dpproxy"),
                "--config",
                str(config),
                "serve",
                "--port",
                "0",
            ],
            capture_output=True,
            text=True,
            check=False,
            timeout=60,
        )
    finally:
        with psycopg.connect(adult_dsn, autocommit=True) as conn:
            conn.execute("REVOKE CONNECT ON DATABASE postgres FROM leaky_analyst")
    assert result.returncode == 1
    assert "F0000" in result.stderr and "leaky_analyst may connect to postgres" in result.stderr


def test_the_readme_commands_parse_as_written() -> None:
    """Each `uv run dpproxy ...` line of the README runs as pasted: one command, valid flags."""
    lines = [
        line.split("#")[0].strip()
        for line in (ROOT / "README.md").read_text().splitlines()
        if line.startswith("uv run dpproxy ")
    ]
    assert len(lines) >= 8
    for line in lines:
        words = shlex.split(line.split(" > ")[0])  # a redirection is the shell's
        assert not {"|", ";", "&&"} & set(words), line  # no shell pipeline by mistake
        _parser().parse_args(words[3:])  # exits (SystemExit) on an unknown flag or command
