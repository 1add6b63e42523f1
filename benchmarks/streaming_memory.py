"""Growth of a streamed run's memory with its draws (``DrawWriter``, nothing kept in memory).

What is measured
----------------
A one-site model (``mu ~ N(0, 1)``, 20 observations) run by SGLD (one chain, or
``vectorized_chains=4``) for ``--draws`` post-warmup draws (100,000 by default; 10 warmup
steps), each run in a fresh subprocess. After the first 10% of the draws (when every buffer,
cache and the writer's first block exist) the resident set size (``VmRSS``) is read every 10%
of the draws after a garbage collection; reported is the slope of a least-squares line
through those readings, in bytes per draw, and the rise from the first reading to the last.

Drivers and writers:

* ``lean+writer``: ``pyro_flat.LeanMCMC(save_params=[])`` + ``DrawWriter`` (the constant-memory
  configuration; target: at most 16 bytes per draw);
* ``mcmc+writer``: ``pyro.infer.MCMC(save_params=[])`` + ``DrawWriter``: Pyro's loop keeps an
  empty tensor per draw;
* ``lean``: ``LeanMCMC(save_params=[])`` without a writer: the kernel keeps every draw's
  statistics in memory (what the writer releases).

Run
---
    .venv/bin/python benchmarks/streaming_memory.py              # 100,000 draws, ~8 min
    .venv/bin/python benchmarks/streaming_memory.py --draws 20000   # a quicker look

Results go to ``benchmarks/results/streaming_memory.json`` and ``.md``. One torch thread.
"""

from __future__ import annotations

import argparse
import gc
import json
import platform
import subprocess
import sys
import tempfile
from datetime import UTC, datetime
from pathlib import Path

MODES = ("lean+writer", "mcmc+writer", "lean")
CHAINS = (1, 4)
TARGET_BYTES_PER_DRAW = 16


def rss() -> int:
    """This process's resident set size in bytes."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise KeyError("VmRSS")


def run(mode: str, chains: int, draws: int, store: str | None) -> list[tuple[int, int]]:
    """One streamed run in this process; the ``(draw, VmRSS)`` readings from 10% on."""
    import pyro
    import pyro.distributions as dist
    import torch
    from pyro.infer import MCMC

    import pyro_flat
    from pyro_flat.infer import SGLD

    torch.set_num_threads(1)
    pyro.set_rng_seed(0)

    def model(y: torch.Tensor) -> None:
        mu = pyro.sample("mu", dist.Normal(0.0, 1.0))
        with pyro.plate("data", len(y)):
            pyro.sample("y", dist.Normal(mu, 1.0), obs=y)

    writer = (pyro_flat.DrawWriter(store, num_samples=draws) if mode.endswith("+writer")
              else None)
    every = max(1, draws // 10)
    readings: list[tuple[int, int]] = []

    def hook(kernel, params, stage, i) -> None:
        if writer is not None:
            writer(kernel, params, stage, i)
        if stage.startswith("Sample") and i >= every and (i % every == 0 or i == draws - 1):
            gc.collect()
            readings.append((i, rss()))

    driver = MCMC if mode.startswith("mcmc") else pyro_flat.LeanMCMC
    kernel = SGLD(model, step_size=1e-2, vectorized_chains=None if chains == 1 else chains)
    mcmc = driver(kernel, num_samples=draws, warmup_steps=10, hook_fn=hook, save_params=[],
                  disable_progbar=True)
    mcmc.run(torch.randn(20, generator=torch.Generator().manual_seed(0)))
    return readings


def growth(readings: list[tuple[int, int]]) -> tuple[float, float]:
    """Least-squares slope (bytes per draw) of the readings, and their rise in bytes."""
    import numpy as np

    draw, size = np.array(readings, dtype=float).T
    slope = float(np.polyfit(draw, size, 1)[0])
    return slope, float(size[-1] - size[0])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--draws", type=int, default=100_000)
    parser.add_argument("--child", nargs=3, metavar=("MODE", "CHAINS", "STORE"))
    args = parser.parse_args()
    if args.child:
        mode, chains, store = args.child
        print(json.dumps(run(mode, int(chains), args.draws, store)))
        return
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for chains in CHAINS:
            for mode in MODES:
                store = str(Path(tmp) / f"{mode}-{chains}".replace("+", "-"))
                out = subprocess.run(
                    [sys.executable, __file__, "--draws", str(args.draws), "--child", mode,
                     str(chains), store], capture_output=True, text=True, check=True,
                    env={"OMP_NUM_THREADS": "1", "PATH": "/usr/bin:/bin"})
                readings = json.loads(out.stdout.strip().splitlines()[-1])
                slope, rise = growth(readings)
                rows.append({"mode": mode, "chains": chains, "draws": args.draws,
                             "bytes_per_draw": slope, "rise_mb": rise / 2**20,
                             "readings": readings})
                print(f"{mode:12s} chains {chains}  {slope:8.1f} bytes/draw  rise "
                      f"{rise / 2**20:6.2f} MB over draws {readings[0][0]:,}-"
                      f"{readings[-1][0]:,}", flush=True)
    write(rows, args.draws)


def write(rows: list[dict], draws: int) -> None:
    import torch

    results = Path(__file__).parent / "results"
    meta = {"date": datetime.now(UTC).isoformat(timespec="seconds"),
            "python": platform.python_version(), "torch": torch.__version__,
            "machine": platform.machine(), "draws": draws, "threads": 1,
            "target_bytes_per_draw": TARGET_BYTES_PER_DRAW}
    (results / "streaming_memory.json").write_text(
        json.dumps({"meta": meta, "rows": rows}, indent=2) + "\n")
    lines = [
        f"# Memory growth of a streamed run: {draws:,} draws, nothing kept in memory",
        "",
        f"{meta['date']}, Python {meta['python']}, torch {meta['torch']}, one thread; each row "
        "a fresh process. Slope: least-squares line through VmRSS read every 10% of the draws "
        "from 10% on (after a garbage collection); rise: last reading minus first. Target for "
        f"`lean+writer`: at most {TARGET_BYTES_PER_DRAW} bytes per draw.",
        "",
        "| driver | chains | bytes per draw | rise (MB) |",
        "|---|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(f"| {r['mode']} | {r['chains']} | {r['bytes_per_draw']:.1f} | "
                     f"{r['rise_mb']:.2f} |")
    lines += ["", "`lean+writer` = `pyro_flat.LeanMCMC(save_params=[])` + `DrawWriter`; "
              "`mcmc+writer` = `pyro.infer.MCMC(save_params=[])` + `DrawWriter` (Pyro's loop "
              "keeps an empty tensor per draw); `lean` = `LeanMCMC(save_params=[])` without a "
              "writer (the kernel keeps every draw's statistics).", ""]
    (results / "streaming_memory.md").write_text("\n".join(lines))


if __name__ == "__main__":
    main()
