"""Starts the embedded PostgreSQL (the ``pgserver`` package's bundled binaries)."""

from __future__ import annotations

import warnings
from pathlib import Path

__all__ = ["start_embedded"]


def start_embedded(data_dir: Path) -> str:
    """Start (or reuse) a PostgreSQL server whose data lives in ``data_dir``; return its DSN.

    The server listens on a Unix socket only and stops when the last process using it exits.
    """
    with warnings.catch_warnings():
        # pgserver asks platformdirs for a runtime dir at import; without XDG_RUNTIME_DIR
        # (containers, CI) it warns and falls back to /tmp, which is what we want anyway.
        warnings.simplefilter("ignore")
        from pgserver.postgres_server import get_server

    data_dir.mkdir(parents=True, exist_ok=True)
    server = get_server(data_dir, cleanup_mode="stop")
    return str(server.get_uri())
