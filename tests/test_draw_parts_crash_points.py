"""A part killed at any of HDF5's writes opens with its committed draws: exhaustive fault
injection on :class:`pyro_flat.draws.files.Part`.

A process killed with ``SIGKILL`` leaves on disk exactly the writes it made before it died (the
operating system keeps what was written to it). So the part is written through a file object
that records every write HDF5 makes (h5py's ``fileobj`` driver; the order of the writes is the
HDF5 library's, whatever the driver; HDF5 lets that driver switch to single-writer mode only
after opening, so the cuts start once it has), and for every write ``c`` of a run of blocks the
file a kill would leave is rebuilt: the writes before ``c``, and also write ``c`` stopped at a page
boundary (where the kernel can cut a write). Each such file must open with
:func:`pyro_flat.open_draws` and hold a bitwise prefix of the appended draws, no shorter than
the last block whose flush returned before write ``c``; the run's end (closing the part) is cut
the same way.

The format-1 parts written before (no single-writer mode, root attributes rewritten at every
flush) failed this: of the 129 cuts from the first commit on, 12 left a file that does not open
(``KeyError``: HDF5 had written an object header that points to blocks it had not written yet),
the fault a randomly timed ``kill -9`` of ``tests/test_draw_writer_sigkill.py`` once hit, and 6
more opened, with that writer's reader, with fewer draws than committed or other values
(``benchmarks/draw_crash_points.py --tree <format-1 checkout>``).
"""

from __future__ import annotations

import io
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from pyro_flat import open_draws
from pyro_flat.draws import files
from pyro_flat.draws.files import Part, part_name

SITES = {"w": ((6,), np.dtype(np.float32)), "b": ((), np.dtype(np.float64))}
STATS = {"lp": np.dtype(np.float64), "diverging": np.dtype(np.bool_)}
CHAINS = np.arange(2)
#: Draws per block: some blocks fit the first chunk of ``b``, others open new chunks.
BLOCKS = (1, 3, 2, 1, 4)


class RecordingFile(io.FileIO):
    """A file that logs each write ``("write", offset, bytes)`` and truncation."""

    def __init__(self, path: Path, log: list[tuple]):
        super().__init__(path, "r+")
        self.log = log

    def write(self, data: Any) -> int:
        self.log.append(("write", self.tell(), bytes(data)))
        return super().write(data)

    def truncate(self, size: int | None = None) -> int:
        size = self.tell() if size is None else size
        self.log.append(("truncate", size, b""))
        return super().truncate(size)


#: A killed process's write stops, if at all, at a page boundary: the kernel copies a write
#: page by page and checks for a fatal signal between pages.
PAGE = 4096


def _torn(write: tuple) -> tuple | None:
    """Write ``("write", offset, bytes)`` stopped at the first page boundary it crosses."""
    kind, offset, payload = write
    boundary = (offset // PAGE + 1) * PAGE
    if kind != "write" or offset + len(payload) <= boundary:
        return None
    return kind, offset, payload[:boundary - offset]


def _replay(baseline: bytes, log: list[tuple], cut: int, torn: bool) -> bytes:
    """The file after the first ``cut`` writes of ``log`` (and write ``cut`` torn)."""
    data = bytearray(baseline)
    ops = list(log[:cut])
    if torn:
        ops.append(_torn(log[cut]))
    for kind, offset, payload in ops:
        if kind == "truncate":
            del data[offset:]
            data.extend(b"\0" * (offset - len(data)))
            continue
        end = offset + len(payload)
        if end > len(data):
            data.extend(b"\0" * (end - len(data)))
        data[offset:end] = payload
    return bytes(data)


def _lookup3(data: bytes) -> int:
    """Bob Jenkins' lookup3 ``hashlittle`` with seed 0: HDF5's metadata checksum."""
    mask = 0xFFFFFFFF

    def rot(x: int, k: int) -> int:
        return ((x << k) | (x >> (32 - k))) & mask

    a = b = c = (0xDEADBEEF + len(data)) & mask
    rest = data
    while len(rest) > 12:
        a = (a + int.from_bytes(rest[0:4], "little")) & mask
        b = (b + int.from_bytes(rest[4:8], "little")) & mask
        c = (c + int.from_bytes(rest[8:12], "little")) & mask
        a = ((a - c) & mask) ^ rot(c, 4); c = (c + b) & mask  # noqa: E702
        b = ((b - a) & mask) ^ rot(a, 6); a = (a + c) & mask  # noqa: E702
        c = ((c - b) & mask) ^ rot(b, 8); b = (b + a) & mask  # noqa: E702
        a = ((a - c) & mask) ^ rot(c, 16); c = (c + b) & mask  # noqa: E702
        b = ((b - a) & mask) ^ rot(a, 19); a = (a + c) & mask  # noqa: E702
        c = ((c - b) & mask) ^ rot(b, 4); b = (b + a) & mask  # noqa: E702
        rest = rest[12:]
    if not rest:
        return c
    rest = rest + bytes(12 - len(rest))
    a = (a + int.from_bytes(rest[0:4], "little")) & mask
    b = (b + int.from_bytes(rest[4:8], "little")) & mask
    c = (c + int.from_bytes(rest[8:12], "little")) & mask
    for x, y, k in (("c", "b", 14), ("a", "c", 11), ("b", "a", 25), ("c", "b", 16),
                    ("a", "c", 4), ("b", "a", 14), ("c", "b", 24)):
        v = {"a": a, "b": b, "c": c}
        v[x] = ((v[x] ^ v[y]) - rot(v[y], k)) & mask
        a, b, c = v["a"], v["b"], v["c"]
    return c


#: Bytes of a version-3 superblock before its checksum (8-byte addresses), and the byte of its
#: status flags: a writer in SWMR mode sets 0x01 (open for writing) and 0x04 (SWMR writing).
SUPERBLOCK, FLAGS = 44, 11


def _as_a_file_writer_leaves(data: bytes) -> bytes:
    """The fileobj driver takes no file lock, so HDF5 leaves out the "open for writing" flag
    that it sets on a real file (0x04 instead of 0x05): set it as a killed writer leaves it,
    with the superblock's checksum."""
    assert data[8] == 3, "a version-3 superblock"
    head = bytearray(data[:SUPERBLOCK])
    assert int.from_bytes(data[SUPERBLOCK:SUPERBLOCK + 4], "little") == _lookup3(bytes(head))
    if head[FLAGS] & 0x04:  # still open: the writer was killed
        head[FLAGS] |= 0x01
    return bytes(head) + _lookup3(bytes(head)).to_bytes(4, "little") + data[SUPERBLOCK + 4:]


def _block(start: int, n: int) -> tuple[dict, dict, np.ndarray]:
    """Draws whose values name their chain and draw, so a prefix is checked bitwise."""
    index = np.arange(start, start + n)
    w = (index[None, :, None] + 10_000 * CHAINS[:, None, None] + np.arange(6)).astype(np.float32)
    b = (index[None, :] + 0.5 + 10_000 * CHAINS[:, None]).astype(np.float64)
    stats = {"lp": -b, "diverging": (index[None, :] % 3 == 0).repeat(2, 0).astype(np.int8)}
    return {"w": w, "b": b}, stats, index


def _write_recorded(folder: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[bytes, list, list]:
    """Create a part, append and flush ``BLOCKS``, close it; the part's bytes when it was opened
    for appending, the log of every write after that, and ``(writes so far, draws committed)``
    after each flush and after the close."""
    folder.mkdir()
    path = folder / part_name(0)
    log: list[tuple] = []
    baseline: list[bytes] = []

    def recording(p: Path) -> Any:
        import h5py

        file = h5py.File(RecordingFile(path, log), "r+", libver="latest")
        file.swmr_mode = True  # HDF5 opens a fileobj driver's file in SWMR mode only so
        baseline.append(path.read_bytes())
        log.clear()
        return file

    monkeypatch.setattr(files, "_open_swmr_writer", recording)
    part = Part.create(path, CHAINS, SITES, STATS, {"inference_library": "pyro"})
    marks = [(0, 0)]
    start = 0
    for n in BLOCKS:
        draws, stats, index = _block(start, n)
        part.append(draws, stats, index)
        part.flush()
        start += n
        marks.append((len(log), start))
    part.close({"next_draw": start, "num_sg_steps": [7, 7], "state_fingerprint": "0" * 16},
               complete=True)
    marks.append((len(log), start))
    monkeypatch.undo()
    assert len(baseline) == 1, "the part was opened for appending once"
    return baseline[0], log, marks


def test_a_part_cut_at_any_write_opens_with_its_committed_draws(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    baseline, log, marks = _write_recorded(tmp_path / "recorded", monkeypatch)
    total = sum(BLOCKS)
    reference, _, _ = _block(0, total)
    assert len(log) > 4 * len(BLOCKS), "HDF5's writes were not recorded"
    failures = []
    cuts = 0
    for cut in range(len(log) + 1):
        committed = max(n for mark, n in marks if mark <= cut)
        for torn in (False, True) if cut < len(log) and _torn(log[cut]) else (False,):
            cuts += 1
            store = tmp_path / f"cut{cuts}"  # a new path: xarray keeps files it opened open
            store.mkdir()
            (store / part_name(0)).write_bytes(
                _as_a_file_writer_leaves(_replay(baseline, log, cut, torn)))
            try:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore", RuntimeWarning)  # the run did not finish
                    data = open_draws(store)
                got = {k: data.posterior[k].values for k in ("w", "b")}
            except Exception as error:  # noqa: BLE001 - every failure is collected
                failures.append(f"write {cut}{' torn' if torn else ''}: {error}")
                continue
            n = got["b"].shape[1]
            if n < committed or n > total or any(
                    not np.array_equal(got[k], reference[k][:, :n]) for k in got):
                failures.append(f"write {cut}{' torn' if torn else ''}: {n} draws, "
                                f"{committed} committed")
    assert not failures, f"{len(failures)} of {cuts} cuts: " + "; ".join(failures[:5])


def test_a_complete_part_reads_its_end(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The recorded run itself, uncut: every draw, and the end of the run as it was written."""
    _write_recorded(tmp_path / "store", monkeypatch)
    attrs = files.part_attrs(tmp_path / "store" / part_name(0))
    assert attrs["complete"] == 1 and attrs["num_draws"] == sum(BLOCKS)
    assert attrs["next_draw"] == sum(BLOCKS) and list(attrs["num_sg_steps"]) == [7, 7]
    assert attrs["state_fingerprint"] == "0" * 16
    assert open_draws(tmp_path / "store").posterior["b"].shape == (2, sum(BLOCKS))


def test_a_killed_part_resumes_from_its_committed_draws(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A part whose writer was killed in the middle of a flush is marked as still open, so HDF5
    refuses to open it for writing: :meth:`Part.open` rewrites its committed draws into a fresh
    file, and appending continues after them."""
    baseline, log, marks = _write_recorded(tmp_path / "recorded", monkeypatch)
    (_, committed), (next_commit, _) = marks[2], marks[3]
    cut = (marks[2][0] + next_commit) // 2  # in the third block's append and flush
    store = tmp_path / "store"
    store.mkdir()
    path = store / part_name(0)
    path.write_bytes(_as_a_file_writer_leaves(_replay(baseline, log, cut, False)))
    assert files.part_attrs(path)["swmr"], "the killed part is marked as open by its writer"
    part = Part.open(path, SITES, STATS)
    assert part.num_draws == committed
    draws, stats, index = _block(committed, 5)
    part.append(draws, stats, index)
    part.flush()
    part.close({"next_draw": committed + 5}, complete=True)
    attrs = files.part_attrs(path)
    assert not attrs["swmr"] and attrs["complete"] == 1 and attrs["num_draws"] == committed + 5
    reference, _, _ = _block(0, committed + 5)
    got = open_draws(store).posterior
    for name in ("w", "b"):
        assert np.array_equal(got[name].values, reference[name]), name


def _format_1_part(path: Path, num_draws: int) -> None:
    """A part as format 1 wrote it: HDF5's earliest file format (not SWMR-capable), the run's
    attributes as netCDF writes them (arrays of one element, a variable-length fingerprint)."""
    import h5netcdf
    import h5py

    def earliest(p: Path, mode: str, **kwargs: Any) -> Any:
        kwargs.pop("libver", None)
        return h5py.File(p, mode, **kwargs)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(files, "_h5py_file", earliest)
        files._write_layout(path, CHAINS, SITES, STATS, {"inference_library": "pyro"})
    draws, stats, index = _block(0, num_draws)
    with h5netcdf.File(path, "a") as file:
        for group_name, values in (("posterior", draws), ("sample_stats", stats)):
            group = file[group_name]
            group.resize_dimension("draw", num_draws)
            group["draw"][:] = index
            for name, value in values.items():
                group[name][:, :num_draws] = value
        for key in files._run_attrs(0):
            del file.attrs[key]
        file.attrs.update({"pyro_flat_draws_format": 1, "num_draws": num_draws, "complete": 1,
                           "next_draw": num_draws, "num_sg_steps": [50, 50],
                           "state_fingerprint": "0123456789abcdef"})


def test_a_format_1_part_opens_and_resumes_as_format_2(tmp_path: Path) -> None:
    path = tmp_path / part_name(0)
    _format_1_part(path, 5)
    attrs = files.part_attrs(path)
    assert attrs["pyro_flat_draws_format"] == 1 and attrs["num_draws"] == 5
    assert attrs["state_fingerprint"] == "0123456789abcdef"
    assert list(attrs["num_sg_steps"]) == [50, 50]
    reference, _, _ = _block(0, 8)
    assert np.array_equal(open_draws(tmp_path).posterior["b"].values, reference["b"][:, :5])
    part = Part.open(path, SITES, STATS)  # rewritten in format 2, then appended to
    draws, stats, index = _block(5, 3)
    part.append(draws, stats, index)
    part.flush()
    part.close({"next_draw": 8}, complete=True)
    attrs = files.part_attrs(path)
    assert attrs["pyro_flat_draws_format"] == files.FORMAT_VERSION and attrs["num_draws"] == 8
    assert attrs["next_draw"] == 8 and list(attrs["num_sg_steps"]) == [50, 50]
    assert attrs["state_fingerprint"] == "0123456789abcdef"
    got = open_draws(tmp_path).posterior
    for name in ("w", "b"):
        assert np.array_equal(got[name].values, reference[name]), name
