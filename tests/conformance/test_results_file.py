"""The matrix's results file survives a ``kill -9`` of ``benchmarks/conformance.py`` while it
writes: ``--resume`` reads it, and a truncated file would lose every cell run before."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

#: A child that imports the benchmark's writer, says so, then rewrites one large results file
#: without pause (two versions in turn), as a long matrix run does after every cell.
_WRITER = """
import importlib.util, json, sys
spec = importlib.util.spec_from_file_location("bench", sys.argv[1] + "/benchmarks/conformance.py")
bench = importlib.util.module_from_spec(spec); spec.loader.exec_module(bench)
from pathlib import Path
path = Path(sys.argv[2])
texts = [json.dumps({"cells": {f"cell{i}": "x" * 200 for i in range(40000)}, "v": v})
         for v in (0, 1)]
bench.write_atomically(path, texts[0])
print("ready", flush=True)
i = 0
while True:
    i += 1
    bench.write_atomically(path, texts[i % 2])
"""


@pytest.mark.skipif(not hasattr(signal, "SIGKILL"), reason="needs SIGKILL")
def test_a_run_killed_while_writing_keeps_its_results(tmp_path: Path) -> None:
    """Killed at 6 moments while it rewrites an 8 MB results file, the writer leaves a
    complete file each time (one of the two versions). With a plain ``write_text`` the
    file is truncated while most of those kills land."""
    path = tmp_path / "results.json"
    for delay in (0.05, 0.11, 0.17, 0.23, 0.31, 0.43):
        child = subprocess.Popen([sys.executable, "-c", _WRITER, str(ROOT), str(path)],
                                 stdout=subprocess.PIPE, text=True)
        try:
            assert child.stdout.readline().strip() == "ready"
            time.sleep(delay)
            os.kill(child.pid, signal.SIGKILL)
            child.wait(timeout=30)
        finally:
            if child.poll() is None:
                child.kill()
        assert json.loads(path.read_text())["v"] in (0, 1), f"truncated after {delay} s"
