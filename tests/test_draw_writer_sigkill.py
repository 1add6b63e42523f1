"""Streamed draws survive ``kill -9``: fault injection on :class:`pyro_flat.DrawWriter`.

A child process streams the draws of a small model (SGLD, 2 vectorised chains) to a store and
prints the index of each draw after the writer has taken it; the test kills it with
``SIGKILL`` at a random moment (seeded), mostly in the middle of a block or of its flush
(``block_size`` 1 to 7: a flush every few draws). The reference is the uninterrupted run:
a first segment of ``DRAWS`` draws, a checkpoint saved with ``torch.save``, and a second
segment resumed from it into the same store.

* 12 kills in a first run: every store opens and holds a bitwise prefix of the reference's
  first segment, missing at most the last block (and the one draw whose statistics wait for
  the next step).
* 12 kills in a resumed segment: the same for the store (the first segment whole, a prefix of
  the second), and resuming once more from the checkpoint reproduces the reference bitwise.

Before the writer flushed at the HDF5 level (h5netcdf's ``File.flush`` writes netCDF
attributes only) none of the killed stores opened.
"""

from __future__ import annotations

import random
import shutil
import signal
import subprocess
import sys
import textwrap
import threading
import time
import warnings
from pathlib import Path

import numpy as np
import pytest

from pyro_flat import open_draws

DRAWS = 1500
KILLS = 12

CHILD = textwrap.dedent('''
    import sys, torch, pyro, pyro.distributions as dist
    from pyro.infer import MCMC
    from pyro_flat import DrawWriter
    from pyro_flat.infer import SGLD

    torch.set_num_threads(1)
    store, block, phase, checkpoint, draws = sys.argv[1:6]
    block, draws = int(block), int(draws)

    def model(y):
        mu = pyro.sample("mu", dist.Normal(0.0, 1.0).expand([3]).to_event(1))
        with pyro.plate("d", len(y)):
            pyro.sample("y", dist.Normal(mu.sum(), 1.0), obs=y)

    def said(kernel, params, stage, i):
        print(i, flush=True)

    y = torch.randn(20, generator=torch.Generator().manual_seed(1))
    kernel = SGLD(model, step_size=1e-2, vectorized_chains=2)
    pyro.set_rng_seed(0)
    if phase == "second":
        kernel.load_state_dict(torch.load(checkpoint))
    writer = DrawWriter(store, num_samples=draws, block_size=block, resume=phase == "second",
                        hook_fn=said)
    mcmc = MCMC(kernel, num_samples=draws, warmup_steps=0, hook_fn=writer, save_params=[],
                disable_progbar=True)
    print("start", flush=True)
    mcmc.run(y)
    if phase == "first":
        torch.save(kernel.state_dict(), checkpoint)
    print("done", flush=True)
''')


def _draws(store: Path) -> np.ndarray:
    return open_draws(store).posterior["mu"].values


def _run(child: Path, store: Path, block: int, phase: str, checkpoint: Path) -> None:
    subprocess.run([sys.executable, str(child), str(store), str(block), phase, str(checkpoint),
                    str(DRAWS)], check=True, capture_output=True)


def _killed(child: Path, store: Path, block: int, phase: str, checkpoint: Path,
            rng: random.Random) -> int:
    """Run the child and kill it at a random moment after its first draw; the last draw
    index it printed."""
    proc = subprocess.Popen([sys.executable, str(child), str(store), str(block), phase,
                             str(checkpoint), str(DRAWS)], stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, text=True)
    last = [-1]
    started = threading.Event()  # the first draw is in the writer: its part exists

    def read() -> None:
        for line in proc.stdout:
            if line.strip().isdigit():
                last[0] = int(line)
                started.set()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    assert started.wait(120), "the child did not start"
    deadline = time.monotonic() + rng.uniform(0.2, 1.5)
    while time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.01)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    reader.join(5)
    assert proc.returncode == -signal.SIGKILL, "the child finished before it was killed"
    return last[0]


@pytest.mark.slow
def test_streamed_draws_survive_sigkill(tmp_path: Path) -> None:
    child = tmp_path / "child.py"
    child.write_text(CHILD)
    rng = random.Random(20261126)
    reference, checkpoint = tmp_path / "reference", tmp_path / "reference.pt"
    _run(child, reference, 5, "first", checkpoint)
    first_segment = _draws(reference)
    segment_one = tmp_path / "segment_one"  # the store as the first segment left it
    shutil.copytree(reference, segment_one)
    _run(child, reference, 5, "second", checkpoint)
    whole = _draws(reference)
    assert whole.shape[1] == 2 * DRAWS

    for trial in range(KILLS):  # kills in a first run
        block = rng.randint(1, 7)
        store = tmp_path / f"first{trial}"
        printed = _killed(child, store, block, "first", tmp_path / f"unused{trial}.pt", rng)
        got = _draws(store)  # opens
        n = got.shape[1]
        assert np.array_equal(got, first_segment[:, :n]), f"kill {trial}: not a prefix"
        assert n >= printed + 1 - block - 1, (trial, n, printed, block)

    for trial in range(KILLS):  # kills in a resumed segment, then resume again
        block = rng.randint(1, 7)
        store = tmp_path / f"second{trial}"
        shutil.copytree(segment_one, store)
        printed = _killed(child, store, block, "second", checkpoint, rng)
        got = _draws(store)
        n = got.shape[1]
        assert n >= DRAWS, f"kill {trial}: the first segment lost draws ({n})"
        assert np.array_equal(got, whole[:, :n]), f"kill {trial}: not a prefix"
        assert n >= DRAWS + printed + 1 - block - 1, (trial, n, printed, block)
        _run(child, store, block, "second", checkpoint)
        assert np.array_equal(_draws(store), whole), f"kill {trial}: the resumed run differs"



def test_a_run_killed_before_its_first_block_leaves_a_store_that_opens(tmp_path: Path) -> None:
    """One block for the whole run (nothing written before its end), killed after the first
    draw: the part exists with no draws. It opens, empty, with the warning that the run did not
    finish (before the part was flushed at creation, it could not be read at all)."""
    child = tmp_path / "child.py"
    child.write_text(CHILD)
    store = tmp_path / "store"
    proc = subprocess.Popen([sys.executable, str(child), str(store), str(DRAWS), "first",
                             str(tmp_path / "unused.pt"), str(DRAWS)], stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, text=True)
    for line in proc.stdout:
        if line.strip().isdigit():  # draw 0 is in the writer: its part was created
            proc.send_signal(signal.SIGKILL)
            break
    proc.wait()
    assert proc.returncode == -signal.SIGKILL
    with pytest.warns(RuntimeWarning, match="did not finish"):
        draws = _draws(store)
    assert draws.shape == (2, 0, 3)


def test_a_store_opens_in_another_process_while_it_is_written(tmp_path: Path) -> None:
    """A reader in another process opens the store while the run is writing it (HDF5's SWMR
    readers) and gets the draws committed so far: a bitwise prefix of the finished run's. (A
    part of format 1 was locked by its writer: ``BlockingIOError``.)"""
    child = tmp_path / "child.py"
    child.write_text(CHILD)
    store = tmp_path / "store"
    proc = subprocess.Popen([sys.executable, str(child), str(store), "5", "first",
                             str(tmp_path / "unused.pt"), str(DRAWS)], stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, text=True)
    seen, printed = None, -1
    for line in proc.stdout:
        if line.strip().isdigit() and int(line) >= 100:
            printed = int(line)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", RuntimeWarning)  # the run has not finished
                seen = _draws(store)
            break
    proc.communicate()
    assert proc.returncode == 0 and seen is not None
    final = _draws(store)
    assert final.shape[1] == DRAWS
    assert seen.shape[1] >= printed + 1 - 5 - 1  # all but the last block and waiting draw
    assert np.array_equal(seen, final[:, :seen.shape[1]])
