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

A file is ``np.savez`` (uncompressed: floats hardly compress; never pickled), written to a
temporary file, fsync'd and renamed over the old one, so a crash leaves the old checkpoint or
the new, never a torn one. It is read by mapping it: each array a view of its zip member
(copied on write; its numbers aligned to 64 bytes by the writer), whose CRC is checked first
(a corrupted file is refused). ``np.load`` copies each array twice (the member, then the
array): 0.49 s CPU for the wide cube's 221 MB, the mapped read 0.10 s, and its pages are the
page cache's, not the heap's.

Processes on one ledger may share the directory (one config on a host): each reads the
checkpoints at its start, but only one writes them, the one holding the directory's
``writer.lock`` (an ``flock``, which the kernel drops when its holder exits; the file names its
pid). Two writers would each rewrite ~220 MB every ``checkpoint_every`` rows, the later rename
wins, and each file covers the rows its own writer had folded: readers stay correct (the
watermark is checked) but the writes are wasted.
"""

from __future__ import annotations

import fcntl
import io
import json
import math
import mmap
import os
import re
import struct
import zipfile
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

import numpy as np

from proxy.engine.snapshot import Factorization

__all__ = [
    "Checkpoint",
    "CheckpointUnusable",
    "CheckpointsHeldElsewhere",
    "FactorizationCheckpoints",
]

_META = "checkpoint.meta"  # the factorization's metadata and the ledger's last id, as JSON
_SUFFIX = ".factorization.npz"
_PADDING = 0x6470  # the id of the extra field that aligns a member's numbers ("dp")
_HEADER = 1 << 16  # the most an npy header takes (its length is a 2- or 4-byte field: ample)
_WRITER_LOCK = "writer.lock"


class CheckpointUnusable(Exception):
    """No checkpoint to take: missing or unreadable (the message says which)."""


class CheckpointsHeldElsewhere(Exception):
    """Another process writes this directory's checkpoints (it holds ``writer.lock``)."""

    def __init__(self, pid: int) -> None:
        super().__init__(f"process {pid or '(unknown)'} holds the writer lock")
        self.pid = pid


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
        self._lock: int | None = None  # the writer lock's descriptor, while this one holds it

    def claim(self) -> int | None:
        """Make this the directory's writer unless another holds it; None once this one does.

        Returns the pid the holder wrote in the lock file (0 if unreadable) when another
        holds it. Held until :meth:`release` or the process's exit.

        Raises:
            OSError: the directory or its lock file cannot be made.
        """
        if self._lock is not None:
            return None
        self.directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        descriptor = os.open(self.directory / _WRITER_LOCK, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.read(descriptor, 32).strip()
            os.close(descriptor)
            return int(holder) if holder.isdigit() else 0
        except BaseException:
            os.close(descriptor)
            raise
        os.ftruncate(descriptor, 0)
        os.pwrite(descriptor, f"{os.getpid()}\n".encode(), 0)
        self._lock = descriptor
        return None

    def release(self) -> None:
        """Let another process write the checkpoints (closing the lock's descriptor drops it)."""
        if self._lock is not None:
            os.close(self._lock)
            self._lock = None

    def path(self, table: str) -> Path:
        """The table's checkpoint file (``schema.table``, other characters escaped)."""
        return self.directory / (
            re.sub(r"[^A-Za-z0-9_.-]", lambda c: f"%{ord(c[0]):02x}", table) + _SUFFIX
        )

    def write(self, table: str, checkpoint: Checkpoint) -> int:
        """Replace the table's checkpoint, atomically and durably; returns the file's size.

        Raises:
            CheckpointsHeldElsewhere: another process is the directory's writer.
        """
        holder = self.claim()
        if holder is not None:
            raise CheckpointsHeldElsewhere(holder)
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
                _save_aligned(file, arrays)
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
            arrays = _mapped(path)
            meta = json.loads(arrays.pop(_META).tobytes())
            last_id, factorization = meta["last_id"], meta["factorization"]
            if not isinstance(last_id, int) or not isinstance(factorization, dict):
                raise ValueError("malformed metadata")
        except FileNotFoundError:
            raise CheckpointUnusable(f"no checkpoint at {path}") from None
        except (OSError, ValueError, KeyError, TypeError, EOFError, zipfile.BadZipFile) as error:
            raise CheckpointUnusable(f"{path} is unreadable: {error}") from error
        return Checkpoint(last_id, Factorization(factorization, arrays))


def _save_aligned(file: BinaryIO, arrays: dict[str, np.ndarray]) -> None:
    """What ``np.savez`` writes, each array's numbers starting at a multiple of 64 bytes.

    An npy header pads the numbers to 64 bytes from the member's start; the member's start is
    padded here (an extra field of its local header), so that arrays mapped from the file are
    aligned as numpy's own: unaligned, numpy's loops take other paths and round differently.
    """
    with zipfile.ZipFile(file, "w", zipfile.ZIP_STORED, allowZip64=True) as archive:
        for name, array in arrays.items():
            info = zipfile.ZipInfo(f"{name}.npy", date_time=(1980, 1, 1, 0, 0, 0))
            # local header: 30 bytes, the name, this padding (4 bytes and more), zip64's 20
            used = archive.fp.tell() + 30 + len(info.filename.encode()) + 4 + 20  # type: ignore[union-attr]
            info.extra = struct.pack("<HH", _PADDING, -used % 64) + bytes(-used % 64)
            with archive.open(info, "w", force_zip64=True) as member:
                np.lib.format.write_array(member, array, allow_pickle=False)


def _mapped(path: Path) -> dict[str, np.ndarray]:
    """The arrays of an ``np.savez`` file, as views of the file mapped in memory.

    Raises:
        zipfile.BadZipFile: a member is torn or its CRC fails.
        ValueError: a member is not a stored array of numbers.
    """
    with path.open("rb") as file:
        infos = zipfile.ZipFile(file).infolist()
        # copy on write: the engine may write into what it holds (never into the file)
        mapped = mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_COPY)
    view = memoryview(mapped)
    arrays = {}
    for info in infos:
        if info.compress_type != zipfile.ZIP_STORED or not info.filename.endswith(".npy"):
            raise ValueError(f"{info.filename}: not a stored array")
        start = info.header_offset
        local = view[start : start + 30]  # a member's local header: its name and extra after
        if len(local) < 30 or bytes(local[:4]) != b"PK\x03\x04":
            raise zipfile.BadZipFile(f"{info.filename}: no local header")
        names, extra = struct.unpack("<HH", local[26:30])
        start += 30 + names + extra
        member = view[start : start + info.file_size]
        if len(member) != info.file_size or zlib.crc32(member) != info.CRC:
            raise zipfile.BadZipFile(f"{info.filename}: torn or corrupted (CRC)")
        head = io.BytesIO(member[:_HEADER])
        version = np.lib.format.read_magic(head)
        if version not in ((1, 0), (2, 0)):
            raise ValueError(f"{info.filename}: npy format {version}")
        read_header = (
            np.lib.format.read_array_header_1_0
            if version == (1, 0)
            else np.lib.format.read_array_header_2_0
        )
        shape, fortran, dtype = read_header(head)
        if dtype.hasobject:
            raise ValueError(f"{info.filename}: objects, not numbers")
        array = np.frombuffer(member, dtype, math.prod(shape), offset=head.tell())
        if array.ctypes.data % 64:  # (not written by _save_aligned): a copy, aligned
            array = array.copy()
        arrays[info.filename[: -len(".npy")]] = array.reshape(shape, order="F" if fortran else "C")
    return arrays
