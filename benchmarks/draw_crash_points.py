"""How many of the files a killed writer can leave open, for the draw-store writer of a tree.

The harness of ``tests/test_draw_parts_crash_points.py``: a part is written (blocks of 1, 3,
2, 1 and 4 draws, then closed) through a file object that records HDF5's writes, and the file
a ``kill -9`` after each write would leave (also with that write stopped at a page boundary)
is rebuilt and opened with the tree's own ``open_draws``. Cuts start after the first commit
(before it there are no draws to lose). A cut fails when the file does not open, or opens
with fewer draws than were committed before the cut, or with draws that differ.

Run it on this tree and on a checkout of another, e.g. the format-1 writer before 9343bb5::

    python benchmarks/draw_crash_points.py
    git worktree add /tmp/format1 1930305
    python benchmarks/draw_crash_points.py --tree /tmp/format1

Results: ``benchmarks/results/draw_crash_points.md`` (``--out``; one line per tree).
"""

from __future__ import annotations

import argparse
import importlib.util
import shutil
import subprocess
import sys
import tempfile
import warnings
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

import test_draw_parts_crash_points as harness  # noqa: E402


def _files_module(tree: Path) -> Any:
    spec = importlib.util.spec_from_file_location("tree_files", tree / "pyro_flat" / "draws" /
                                                  "files.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _record(files: Any, folder: Path) -> tuple[bytes, list, list, bool]:
    """Write the harness's blocks with the tree's ``Part``; the bytes before the recorded
    writes, the writes, ``(writes so far, committed draws)`` marks, and whether the writer
    uses SWMR."""
    import h5netcdf
    import h5py

    path = folder / files.part_name(0)
    log: list[tuple] = []
    baseline = [b""]
    swmr = hasattr(files, "_open_swmr_writer")
    with harness.pytest.MonkeyPatch.context() as patch:
        if swmr:  # format 2: record from the switch to SWMR mode on (see the test)
            def recording(p: Path) -> Any:
                file = h5py.File(harness.RecordingFile(path, log), "r+", libver="latest")
                file.swmr_mode = True
                baseline[0] = path.read_bytes()
                log.clear()
                return file

            patch.setattr(files, "_open_swmr_writer", recording)
        else:  # format 1: the part is one h5netcdf file from its creation on
            real = h5netcdf.File
            path.touch()

            def opened(p: Any, mode: str = "r", **kwargs: Any) -> Any:
                if isinstance(p, (str, Path)) and Path(p) == path:
                    return real(harness.RecordingFile(path, log), "w", **kwargs)
                return real(p, mode, **kwargs)

            patch.setattr(h5netcdf, "File", opened)
        part = files.Part.create(path, harness.CHAINS, harness.SITES, harness.STATS,
                                 {"inference_library": "pyro"})
    marks, start = [(0, 0)], 0
    for n in harness.BLOCKS:
        part.append(*harness._block(start, n))
        part.flush()
        start += n
        marks.append((len(log), start))
    part.close({"next_draw": start}, complete=True)
    marks.append((len(log), start))
    return baseline[0], log, marks, swmr


def measure(tree: Path) -> dict[str, Any]:
    files = _files_module(tree)
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) / "recorded"
        folder.mkdir()
        baseline, log, marks, swmr = _record(files, folder)
        total = sum(harness.BLOCKS)
        reference, _, _ = harness._block(0, total)
        counts = {"cuts": 0, "unreadable": 0, "short or wrong": 0}
        for cut in range(marks[1][0], len(log) + 1):
            committed = max(n for mark, n in marks if mark <= cut)
            for torn in (False, True) if cut < len(log) and harness._torn(log[cut]) else (False,):
                counts["cuts"] += 1
                data = harness._replay(baseline, log, cut, torn)
                if swmr:
                    data = harness._as_a_file_writer_leaves(data)
                store = Path(tmp) / f"cut{counts['cuts']}"
                store.mkdir()
                (store / files.part_name(0)).write_bytes(data)
                try:
                    with warnings.catch_warnings():
                        warnings.simplefilter("ignore")
                        got = files.open_draws(store).posterior["b"].values
                except Exception:  # noqa: BLE001 - counted
                    counts["unreadable"] += 1
                    continue
                n = got.shape[1]
                if n < committed or not np.array_equal(got, reference["b"][:, :n]):
                    counts["short or wrong"] += 1
                shutil.rmtree(store)
    commit = subprocess.run(["git", "-C", str(tree), "rev-parse", "--short", "HEAD"],
                            capture_output=True, text=True).stdout.strip()
    return {"tree": str(tree), "commit": commit, "writes": len(log), **counts,
            "format": 2 if swmr else 1}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tree", type=Path, default=ROOT)
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" /
                        "draw_crash_points.md")
    args = parser.parse_args()
    r = measure(args.tree.resolve())
    line = (f"| {r['commit']} | {r['format']} | {r['writes']} | {r['cuts']} | "
            f"{r['unreadable']} | {r['short or wrong']} |")
    print(line)
    header = ("# Files a killed draw writer leaves\n\n"
              "`python benchmarks/draw_crash_points.py [--tree <checkout>]`: cuts from the "
              "first commit on.\n\n| commit | format | writes | cuts | do not open | short or "
              "wrong |\n|---|---|---|---|---|---|\n")
    text = args.out.read_text() if args.out.exists() else header
    args.out.write_text(text + line + "\n")


if __name__ == "__main__":
    main()
