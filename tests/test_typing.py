"""proxy/ and sqlmap/ pass strict mypy (configured in pyproject.toml)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path


def test_mypy_strict() -> None:
    root = Path(__file__).parent.parent
    result = subprocess.run(
        [sys.executable, "-m", "mypy", "--no-incremental"],
        cwd=root,
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
