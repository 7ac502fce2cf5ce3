"""The write-ahead log: framing, torn tails, group commit, orphan locking."""

from __future__ import annotations

import os
import random
import threading
from pathlib import Path

import pytest

from fleetlens.collector.wal import (
    FAULT_DISK_FULL_ENV,
    Wal,
    orphan_dirs,
    read_segment,
    remove_dir,
    segments,
)


def _fill(wal: Wal, count: int, rng: random.Random) -> list[bytes]:
    payloads = [rng.randbytes(rng.randint(0, 300)) for _ in range(count)]
    for i, payload in enumerate(payloads):
        wal.sync(wal.append(1 + i % 3, 1000 + i, payload))
    return payloads


def test_frames_round_trip(tmp_path) -> None:
    wal = Wal(tmp_path / "wal", "w1")
    payloads = _fill(wal, 50, random.Random(1))
    wal.close()
    result = read_segment(segments(tmp_path / "wal" / "w1")[0])
    assert result.lost_bytes == 0
    assert [r.payload for r in result.records] == payloads
    assert [r.received_ns for r in result.records] == list(range(1000, 1050))
    assert [r.signal for r in result.records] == [1 + i % 3 for i in range(50)]


@pytest.mark.parametrize("seed", range(20))
def test_truncation_at_any_offset_keeps_every_complete_frame(tmp_path, seed) -> None:
    rng = random.Random(seed)
    wal = Wal(tmp_path / "wal", "w1")
    payloads = _fill(wal, 30, rng)
    wal.close()
    path = segments(tmp_path / "wal" / "w1")[0]
    data = path.read_bytes()
    cut = rng.randrange(len(data))
    path.write_bytes(data[:cut])
    result = read_segment(path)
    kept = len(result.records)
    assert [r.payload for r in result.records] == payloads[:kept]
    # Every frame that ended before the cut is kept; what is after it is reported as torn.
    frame_ends = []
    end = 0
    for p in payloads:
        end += 8 + 9 + len(p)
        frame_ends.append(end)
    assert kept == sum(1 for e in frame_ends if e <= cut)
    assert result.torn_tail_bytes == cut - (frame_ends[kept - 1] if kept else 0)
    assert result.unreadable_bytes == 0  # a cut write is never mistaken for corruption


def test_a_flipped_bit_costs_only_its_own_frame(tmp_path) -> None:
    wal = Wal(tmp_path / "wal", "w1")
    payloads = _fill(wal, 10, random.Random(2))
    wal.close()
    path = segments(tmp_path / "wal" / "w1")[0]
    data = bytearray(path.read_bytes())
    offset = 8 + 9 + len(payloads[0]) + 8 + 3  # inside the second frame's body
    data[offset] ^= 0x01
    path.write_bytes(bytes(data))
    result = read_segment(path)
    # skipped by its length and CRC; every later frame is still read
    assert [r.payload for r in result.records] == [payloads[0], *payloads[2:]]
    assert result.unreadable_bytes == 8 + 9 + len(payloads[1])
    assert result.torn_tail_bytes == 0


def test_group_commit_shares_fsyncs_between_threads(tmp_path) -> None:
    wal = Wal(tmp_path / "wal", "w1")
    barrier = threading.Barrier(8)

    def writer() -> None:
        barrier.wait()
        for i in range(40):
            wal.sync(wal.append(1, i, b"x" * 200))

    threads = [threading.Thread(target=writer) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert 0 < wal.fsyncs < 320
    wal.close()
    assert len(read_segment(segments(tmp_path / "wal" / "w1")[0]).records) == 320


def test_rotate_seals_files_and_live_dirs_are_not_orphans(tmp_path) -> None:
    root = tmp_path / "wal"
    wal = Wal(root, "live")
    wal.sync(wal.append(1, 1, b"a"))
    sealed = wal.rotate()
    assert len(sealed) == 1 and read_segment(sealed[0]).records[0].payload == b"a"
    assert wal.rotate() == []  # nothing new was written
    assert list(orphan_dirs(root)) == []  # locked by a live writer
    wal.close()  # lock released: now it is an orphan
    found = list(orphan_dirs(root))
    assert [d.name for d, _ in found] == ["live"]
    remove_dir(*found[0])
    assert not (root / "live").exists()


def test_injected_disk_full_fails_append_and_sync(tmp_path, monkeypatch) -> None:
    flag = tmp_path / "full"
    monkeypatch.setenv(FAULT_DISK_FULL_ENV, str(flag))
    wal = Wal(tmp_path / "wal", "w1")
    wal.sync(wal.append(1, 1, b"ok"))
    flag.touch()
    with pytest.raises(OSError):
        wal.append(1, 2, b"refused")
    os.unlink(flag)
    wal.sync(wal.append(1, 3, b"again"))
    pending = wal.append(1, 4, b"written, not yet durable")
    flag.touch()  # the disk fills between the write and its fsync
    with pytest.raises(OSError):
        wal.sync(pending)  # so its request is never answered OK
    os.unlink(flag)
    with pytest.raises(OSError):
        wal.sync(pending)  # ... nor later: the kernel reports a failed fsync only once
    wal.sync(wal.append(1, 5, b"retried"))  # the client's retry goes to a new file
    wal.close()
    files = segments(tmp_path / "wal" / "w1")
    payloads = [r.payload for p in files for r in read_segment(p).records]
    assert payloads == [b"ok", b"again", b"written, not yet durable", b"retried"]
    assert len(files) == 3  # sealed after the failed write and after the failed fsync


def test_the_wal_dir_and_its_rename_are_fsynced_into_the_parent(tmp_path, monkeypatch) -> None:
    seen: list[tuple[str, list[str]]] = []
    real = os.fsync

    def fsync(fd: int) -> None:
        path = os.readlink(f"/proc/self/fd/{fd}")
        if os.path.isdir(path):
            seen.append((path, sorted(os.listdir(path))))
        real(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    root = tmp_path / "data" / "wal"
    Wal(root, "w1").close()
    assert (str(tmp_path / "data"), ["wal"]) in seen  # the new root
    assert (str(root), ["w1"]) in seen  # its entry after the rename, not the hidden name


def test_only_hidden_dirs_holding_wal_files_are_orphans(tmp_path) -> None:
    root = tmp_path / "wal"
    wal = Wal(root, "w1")
    wal.sync(wal.append(1, 1, b"a"))
    wal.close()
    (root / "w1").rename(root / ".new-w1-0a1b2c3d")  # power loss undid the rename
    (root / ".new-w2-00000000").mkdir()  # a live process between mkdir and flock
    (root / ".quarantine").mkdir()
    found = list(orphan_dirs(root))
    assert [d.name for d, _ in found] == [".new-w1-0a1b2c3d"]
    remove_dir(*found[0])
    assert sorted(p.name for p in root.iterdir()) == [".new-w2-00000000", ".quarantine"]


def _orphan_with(tmp_path, seed: int, count: int = 3) -> tuple[Path, Path, list[bytes]]:
    """A dead writer's WAL directory with ``count`` frames in one file."""
    root = tmp_path / "wal"
    wal = Wal(root, "w1")
    payloads = _fill(wal, count, random.Random(seed))
    wal.close()
    return root, segments(root / "w1")[0], payloads


def test_replay_quarantines_a_file_with_unreadable_bytes(tmp_path) -> None:
    root, path, _ = _orphan_with(tmp_path, 3)
    data = bytearray(path.read_bytes())
    data[20] ^= 0x01  # inside the first frame: an acknowledged record is unreadable
    path.write_bytes(bytes(data))
    remove_dir(*next(orphan_dirs(root)))
    (kept,) = (root / ".quarantine").iterdir()
    assert kept.name == "w1-000000000000.wal.bad" and kept.read_bytes() == bytes(data)
    assert not (root / "w1").exists()


def test_a_torn_tail_alone_is_reported_and_the_file_deleted(tmp_path) -> None:
    """A write cut short by SIGKILL (the kernel stops a large write between pages) was never
    acknowledged. Before, replay and the edge's forwarder quarantined such a file, so the
    quarantine grew with every crash (CI's SIGKILL test found one)."""
    root, path, payloads = _orphan_with(tmp_path, 3)
    frame = b"\x10\x00\x00\x00" + b"\xde\xad\xbe\xef" + b"\x01" * 5  # 16-byte body, 5 written
    path.write_bytes(path.read_bytes() + frame)
    result = read_segment(path)
    assert [r.payload for r in result.records] == payloads
    assert (result.torn_tail_bytes, result.unreadable_bytes) == (len(frame), 0)
    remove_dir(*next(orphan_dirs(root)))
    assert sorted(p.name for p in root.iterdir()) == []


@pytest.mark.parametrize("tail", [b"\x00" * 64, b"\x03\x00\x00\x00\x00\x00\x00\x00\x07"],
                         ids=["zeros", "impossible-length"])
def test_a_tail_no_cut_write_leaves_is_unreadable(tmp_path, tail: bytes) -> None:
    root, path, _ = _orphan_with(tmp_path, 4)
    path.write_bytes(path.read_bytes() + tail)
    result = read_segment(path)
    assert (result.unreadable_bytes, result.torn_tail_bytes) == (len(tail), 0)
    remove_dir(*next(orphan_dirs(root)))
    assert len(list((root / ".quarantine").iterdir())) == 1


def test_a_corrupted_length_costs_only_its_own_frame(tmp_path) -> None:
    """A length that runs past the end with good frames after it is corruption, not a cut
    write: the reader finds the next good frame (before, every later frame was lost)."""
    root, path, payloads = _orphan_with(tmp_path, 6)
    data = bytearray(path.read_bytes())
    second = 8 + 9 + len(payloads[0])
    data[second + 3] = 0x7F  # the second frame's length now runs far past the end
    path.write_bytes(bytes(data))
    result = read_segment(path)
    assert [r.payload for r in result.records] == [payloads[0], *payloads[2:]]
    assert (result.unreadable_bytes, result.torn_tail_bytes) == (8 + 9 + len(payloads[1]), 0)


def test_the_last_frame_with_a_corrupted_length_is_unreadable_not_torn(tmp_path) -> None:
    root, path, payloads = _orphan_with(tmp_path, 3)
    data = bytearray(path.read_bytes())
    last = sum(8 + 9 + len(p) for p in payloads[:-1])
    data[last + 3] = 0x7F  # its whole body is there, under its CRC: written, then damaged
    path.write_bytes(bytes(data))
    result = read_segment(path)
    assert [r.payload for r in result.records] == payloads[:-1]
    assert (result.unreadable_bytes, result.torn_tail_bytes) == (8 + 9 + len(payloads[-1]), 0)


@pytest.mark.parametrize("seed", range(30))
def test_any_damage_returns_only_written_records_and_accounts_for_every_byte(
        tmp_path, seed) -> None:
    rng = random.Random(seed)
    _root, path, payloads = _orphan_with(tmp_path, seed, count=12)
    data = bytearray(path.read_bytes())
    for _ in range(rng.randint(1, 4)):
        where = rng.randrange(len(data))
        damage = rng.choice(["flip", "zeros", "cut"])
        if damage == "flip":
            data[where] ^= 1 << rng.randrange(8)
        elif damage == "zeros":
            data[where:where + rng.randint(1, 600)] = bytes(rng.randint(1, 600))
        else:
            del data[where:]
    path.write_bytes(bytes(data))
    result = read_segment(path)
    got = [r.payload for r in result.records]
    it = iter(payloads)
    assert all(any(p == q for q in it) for p in got)  # written ones, in order
    framed = sum(8 + 9 + len(p) for p in got)
    assert framed + result.unreadable_bytes + result.torn_tail_bytes == len(data)
