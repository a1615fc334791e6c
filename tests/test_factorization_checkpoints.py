"""A factorization checkpoint: written atomically and privately, read back whole or not at all.

A restart takes what :meth:`FactorizationCheckpoints.read` returns only if the engine finds it
is the history's (tests/engine/test_checkpoint.py); here, that the file round-trips the
arrays bitwise (so the restarted engine answers as the writer), and that a missing, truncated
or corrupted file is reported as unusable, never returned; and that of processes sharing the
directory one writes, the holder of its writer lock, until it lets go or exits.
"""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from proxy.engine.snapshot import Factorization
from proxy.storage.factorization_checkpoints import (
    Checkpoint,
    CheckpointsHeldElsewhere,
    CheckpointUnusable,
    FactorizationCheckpoints,
)
from tests.engine.test_checkpoint import _answer_both, _engine, _measure, _written


@pytest.fixture(autouse=True)
def _fronts(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("proxy.engine.estimator._FRONTS_RANK", 0)


def _written_file(tmp_path: Path) -> tuple[FactorizationCheckpoints, Factorization, Path]:
    writer, _, _ = _written(8)
    factorization = writer.factorization()
    assert factorization is not None
    store = FactorizationCheckpoints(tmp_path / "checkpoints")
    size = store.write("public.adult", Checkpoint(41, factorization))
    path = store.path("public.adult")
    assert size == path.stat().st_size > factorization.nbytes
    return store, factorization, path


def test_a_checkpoint_round_trips_bitwise_and_privately(tmp_path: Path) -> None:
    store, factorization, path = _written_file(tmp_path)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    # no temporary left; the lock that makes this process the directory's writer
    assert sorted(p.name for p in path.parent.iterdir()) == [path.name, "writer.lock"]
    read = store.read("public.adult")
    assert read.last_id == 41
    assert read.factorization.meta == factorization.meta
    assert read.factorization.arrays.keys() == factorization.arrays.keys()
    for name, array in factorization.arrays.items():
        assert read.factorization.arrays[name].dtype == array.dtype
        assert np.array_equal(read.factorization.arrays[name], array), name
        # mapped from the file, aligned as numpy's own (else its loops round differently)
        assert read.factorization.arrays[name].ctypes.data % 64 == 0, name
    with np.load(path, allow_pickle=False) as stored:  # what np.savez writes
        assert np.array_equal(
            stored["fronts.factor.data"], factorization.arrays["fronts.factor.data"]
        )


def test_an_engine_restarted_from_the_file_answers_as_the_writer(tmp_path: Path) -> None:
    writer, kept, rng = _written(9)
    factorization = writer.factorization()
    assert factorization is not None
    store = FactorizationCheckpoints(tmp_path)
    store.write("public.adult", Checkpoint(len(kept.entries), factorization))
    restarted = _engine(list(kept.entries), store.read("public.adult").factorization)
    assert restarted.restart.startswith("restored")
    _answer_both(writer, restarted, rng, _measure(9), exact=True)


def test_a_missing_truncated_or_corrupted_checkpoint_is_unusable(tmp_path: Path) -> None:
    store, _, path = _written_file(tmp_path)
    with pytest.raises(CheckpointUnusable, match="no checkpoint"):
        store.read("public.other")
    whole = path.read_bytes()
    path.write_bytes(whole[: len(whole) // 2])
    with pytest.raises(CheckpointUnusable, match="unreadable"):
        store.read("public.adult")
    corrupted = bytearray(whole)
    corrupted[len(whole) // 2] ^= 0xFF  # a number inside some array: its CRC fails
    path.write_bytes(bytes(corrupted))
    with pytest.raises(CheckpointUnusable, match="unreadable"):
        store.read("public.adult")
    path.write_bytes(b"not a checkpoint")
    with pytest.raises(CheckpointUnusable, match="unreadable"):
        store.read("public.adult")


def test_one_process_writes_a_shared_directory_and_the_others_only_read(tmp_path: Path) -> None:
    store, factorization, path = _written_file(tmp_path)  # the writer: it holds the lock
    lock = path.parent / "writer.lock"
    assert lock.read_text() == f"{os.getpid()}\n" and stat.S_IMODE(lock.stat().st_mode) == 0o600
    other = FactorizationCheckpoints(path.parent)  # (flock: another open of the file conflicts)
    assert other.claim() == os.getpid()
    with pytest.raises(CheckpointsHeldElsewhere, match=f"process {os.getpid()} holds"):
        other.write("public.adult", Checkpoint(42, factorization))
    assert other.read("public.adult").last_id == 41  # reading takes no lock
    store.release()
    assert other.claim() is None
    assert other.write("public.adult", Checkpoint(42, factorization)) == path.stat().st_size
    other.release()

    # a writer that exits without letting go: the kernel drops its lock
    claim = (
        "import sys, time; from pathlib import Path; "
        "from proxy.storage.factorization_checkpoints import FactorizationCheckpoints; "
        f"assert FactorizationCheckpoints(Path({str(path.parent)!r})).claim() is None; "
        "print('held', flush=True); time.sleep(60)"
    )
    with subprocess.Popen(
        [sys.executable, "-c", claim], cwd=Path(__file__).parents[1], stdout=subprocess.PIPE
    ) as holder:
        try:
            assert holder.stdout is not None and holder.stdout.readline() == b"held\n"
            assert store.claim() == holder.pid
        finally:
            holder.kill()
    assert store.claim() is None
    store.release()
