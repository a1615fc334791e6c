"""bench/sql_workload's end to end at scale (``--history``), run for real on a small scale.

The bench starts its own embedded PostgreSQL, fills a ledger, starts ``dpproxy serve`` on it and
streams statements through it: a minute or so, hence ``slow``.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from bench import sql_workload

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("wide", [False, True], ids=["demo", "wide"])
def test_history_runs_the_stream_on_a_filled_ledger(
    wide: bool, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["--skip-e2e", "--skip-backend", "--statements", "8", "--history", "30", "60"]
    argv += ["--data-dir", str(tmp_path / "pgdata"), *(["--wide"] if wide else [])]
    sql_workload.main(argv)
    out = capsys.readouterr().out
    for m in (30, 60):
        assert f"## End to end on a history of {m} measurements" in out
        assert f"(ledger filled with {m} measurements in" in out
    assert "## End to end: " not in out  # --skip-e2e: no run on an empty ledger
    assert out.count("(server listening after") == 2
    assert out.count("| all | ") == 2
    assert out.count("Targets (DP / plain, median of ratios): every statement") == 2
