"""Every tutorial runs end to end in its quick mode (PYRO_FLAT_QUICK=1), in a fresh process."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

TUTORIALS = sorted((Path(__file__).resolve().parents[1] / "tutorials").glob("[0-9]*.py"))


@pytest.mark.slow
@pytest.mark.parametrize("path", TUTORIALS, ids=[p.stem for p in TUTORIALS])
def test_tutorial_runs_in_quick_mode(path, tmp_path):
    env = {**os.environ, "PYRO_FLAT_QUICK": "1", "MPLBACKEND": "Agg",
           "PYRO_FLAT_FIGURE": str(tmp_path / "figure.png")}
    done = subprocess.run([sys.executable, str(path)], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert (tmp_path / "figure.png").exists()


def test_there_are_tutorials():
    assert TUTORIALS
