"""Checkpoints of each protected table's factorization: files a restart reads instead of factoring.

An engine restarted from its ledger factors the whole history again (on the wide cube, 10,000
answers take ~4 s CPU, 100,000 half a minute). The factorization is a function of public
inputs only (:mod:`proxy.engine.snapshot`), so it is kept here, with the ledger's last id it
covers, and a restart that finds it and whose ledger matches its watermark folds only the rows
after it. Like a database's checkpoint over its write-ahead log, the ledger stays the record:
a missing, unreadable or mismatched checkpoint is ignored (the restart factors as without
one, and says why), never trusted over the ledger.

Where: one file per table in a directory the config names (``ledger.checkpoints``), not the
ledger's schema. A checkpoint is large (~220 MB on the wide cube at 10,000 answers, fronts
and products) and rewritten every ``ledger.checkpoint_every`` rows: in PostgreSQL each write
would pass through its write-ahead log and backups, and each start read it over the wire, for
a cache that any process can rebuild from the ledger. Every process on a shared ledger keeps
its own. Analysts reach only PostgreSQL (their pass-through roles), never the proxy's files;
the files are written with mode 0600 in a directory of mode 0700, and hold no noisy value.

A file is ``np.savez`` (uncompressed: floats hardly compress; never pickled, and read back
with ``allow_pickle=False``), written to a temporary file, fsync'd and renamed over the old
one, so a crash leaves the old checkpoint or the new, never a torn one; zip's CRC of each
array catches a corrupted one on reading.
"""

from __future__ import annotations

import json
import os
import re
import zipfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from proxy.engine.snapshot import Factorization

__all__ = ["Checkpoint", "CheckpointUnusable", "FactorizationCheckpoints"]

_META = "checkpoint.meta"  # the factorization's metadata and the ledger's last id, as JSON
_SUFFIX = ".factorization.npz"


class CheckpointUnusable(Exception):
    """No checkpoint to take: missing or unreadable (the message says which)."""


@dataclass(frozen=True, slots=True)
class Checkpoint:
    """A table's factorization and the ledger's last id among the rows it covers."""

    last_id: int
    factorization: Factorization


class FactorizationCheckpoints:
    """The checkpoints of a directory, one file per protected table.

    >>> import tempfile
    >>> store = FactorizationCheckpoints(Path(tempfile.mkdtemp()))
    >>> store.path("public.adult").name
    'public.adult.factorization.npz'
    """

    def __init__(self, directory: Path) -> None:
        self.directory = directory

    def path(self, table: str) -> Path:
        """The table's checkpoint file (``schema.table``, other characters escaped)."""
        return self.directory / (
            re.sub(r"[^A-Za-z0-9_.-]", lambda c: f"%{ord(c[0]):02x}", table) + _SUFFIX
        )

    def write(self, table: str, checkpoint: Checkpoint) -> int:
        """Replace the table's checkpoint, atomically and durably; returns the file's size."""
        self.directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        path = self.path(table)
        meta = json.dumps(
            {"last_id": checkpoint.last_id, "factorization": checkpoint.factorization.meta}
        )
        temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        descriptor = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            with os.fdopen(descriptor, "wb") as file:
                arrays = dict(checkpoint.factorization.arrays)  # (laid out here: a copy)
                arrays[_META] = np.frombuffer(meta.encode(), dtype=np.uint8)
                np.savez(file, allow_pickle=False, **arrays)
                file.flush()
                os.fsync(file.fileno())
            os.replace(temporary, path)
        except BaseException:
            temporary.unlink(missing_ok=True)
            raise
        directory = os.open(self.directory, os.O_RDONLY)
        try:
            os.fsync(directory)  # the rename too
        finally:
            os.close(directory)
        return path.stat().st_size

    def read(self, table: str) -> Checkpoint:
        """The table's checkpoint, every array read and checked against its CRC.

        Raises:
            CheckpointUnusable: there is none, or it cannot be read (truncated, corrupted, not
                a checkpoint).
        """
        path = self.path(table)
        try:
            with path.open("rb") as file, np.load(file, allow_pickle=False) as stored:
                arrays = {name: stored[name] for name in stored.files}
            meta = json.loads(arrays.pop(_META).tobytes())
            last_id, factorization = meta["last_id"], meta["factorization"]
            if not isinstance(last_id, int) or not isinstance(factorization, dict):
                raise ValueError("malformed metadata")
        except FileNotFoundError:
            raise CheckpointUnusable(f"no checkpoint at {path}") from None
        except (OSError, ValueError, KeyError, TypeError, EOFError, zipfile.BadZipFile) as error:
            raise CheckpointUnusable(f"{path} is unreadable: {error}") from error
        return Checkpoint(last_id, Factorization(factorization, arrays))
