"""Memory of the draws of an ``MCMC`` run: in memory (Pyro's driver, ``LeanMCMC``) or on disk.

What is measured
----------------
The BNN of the MLP 784-100-100-10 (89,610 parameters, ``BNN(build_mlp(...), Categorical(),
subsample_size=32)`` on 1,000 random points), run for ``--draws`` post-warmup draws (1,000
by default; one SG step per draw, 10 warmup steps) by SGLD and by EntropyMCMC (which returns
its guide with every draw: twice the bytes). Each mode runs in a fresh subprocess, which
imports everything and builds the model first; then the kernel's peak resident set size
(``VmHWM``) is reset (``/proc/self/clear_refs``) and the run starts. Reported:

* ``peak rise``: ``VmHWM`` after the run minus ``VmRSS`` before it, in MB;
* ``held``: ``VmRSS`` after the run (the ``MCMC`` object still alive) minus before, in MB;
* both, less those of the mode ``none``, relative to the draws' bytes (``draws x D x 4``,
  with ``D`` the values of every site the run returns: 89,610, or 179,220 with EntropyMCMC's
  guide).

Modes: ``none`` (``MCMC`` with ``save_params=[]`` and no writer: what the run costs without
any draw, the reference the ratios subtract), ``stock`` (``pyro.infer.MCMC``, every site
kept), ``lean`` (``pyro_flat.LeanMCMC``), ``stream`` (``MCMC`` + ``DrawWriter``,
``save_params=[]``: nothing kept in memory) and ``stream+bias`` (the same, keeping the
10-value output bias in memory).

Run
---
    .venv/bin/python benchmarks/draw_memory.py            # 1,000 draws, a few minutes
    .venv/bin/python benchmarks/draw_memory.py --quick    # 100 draws, smoke run

Results go to ``benchmarks/results/draw_memory.json`` and ``.md`` (``--quick`` writes
``draw_memory_quick.*``). One torch thread.
"""

from __future__ import annotations

import argparse
import json
import platform
import subprocess
import sys
import tempfile
from datetime import UTC, datetime
from pathlib import Path

MODES = ("none", "stock", "lean", "stream", "stream+bias")
KERNELS = ("SGLD", "EntropyMCMC")
MB = 2**20


def _status(field: str) -> int:
    """A ``/proc/self/status`` field in bytes."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    raise KeyError(field)


def child(kernel_name: str, mode: str, draws: int, store: str) -> dict:
    """One run in this (fresh) process; returns its memory figures."""
    import pyro
    import torch
    from pyro.infer import MCMC

    import pyro_flat
    from pyro_flat.compare.models import build_mlp
    from pyro_flat.infer import SGLD, EntropyMCMC
    from pyro_flat.models.bnn import BNN
    from pyro_flat.models.likelihoods import Categorical

    torch.set_num_threads(1)
    pyro.set_rng_seed(0)
    x, y = torch.randn(1000, 784), torch.randint(0, 10, (1000,))
    model = BNN(build_mlp(784, 10, (100, 100)), Categorical(), subsample_size=32)
    kernel = (SGLD(model, step_size=1e-6) if kernel_name == "SGLD"
              else EntropyMCMC(model, step_size=1e-6, eta=1.0))
    kwargs: dict = {}
    driver = pyro_flat.LeanMCMC if mode == "lean" else MCMC
    if mode == "none":
        kwargs["save_params"] = []
    if mode.startswith("stream"):
        kwargs["hook_fn"] = pyro_flat.DrawWriter(store, num_samples=draws)
        kwargs["save_params"] = ["net.4.bias"] if mode == "stream+bias" else []
    mcmc = driver(kernel, num_samples=draws, warmup_steps=10, disable_progbar=True, **kwargs)
    import h5netcdf  # noqa: F401  (imported before the baseline in every mode)

    Path("/proc/self/clear_refs").write_text("5")  # reset VmHWM to the current VmRSS
    before = _status("VmRSS")
    mcmc.run(x, y)
    peak, after = _status("VmHWM"), _status("VmRSS")
    num_values = sum(s.numel for s in kernel._draw_layout.sites)
    draw_bytes = draws * num_values * 4
    return {"kernel": kernel_name, "mode": mode, "draws": draws, "values_per_draw": num_values,
            "draws_mb": draw_bytes / MB, "peak_rise_mb": (peak - before) / MB,
            "held_mb": (after - before) / MB, "kept_sites": sorted(mcmc.get_samples())[:3]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="100 draws")
    parser.add_argument("--draws", type=int, default=1000)
    parser.add_argument("--child", nargs=3, metavar=("KERNEL", "MODE", "STORE"))
    args = parser.parse_args()
    draws = 100 if args.quick else args.draws
    if args.child:
        print(json.dumps(child(args.child[0], args.child[1], draws, args.child[2])))
        return
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for kernel in KERNELS:
            for mode in MODES:
                store = str(Path(tmp) / f"{kernel}-{mode}".replace("+", "-"))
                out = subprocess.run(
                    [sys.executable, __file__, "--draws", str(draws), "--child", kernel, mode,
                     store], capture_output=True, text=True, check=True,
                    env={"OMP_NUM_THREADS": "1", "PATH": "/usr/bin:/bin"})
                row = json.loads(out.stdout.strip().splitlines()[-1])
                none = row if mode == "none" else next(
                    r for r in rows if r["kernel"] == kernel and r["mode"] == "none")
                row["peak_ratio"] = (row["peak_rise_mb"] - none["peak_rise_mb"]) / row["draws_mb"]
                row["held_ratio"] = (row["held_mb"] - none["held_mb"]) / row["draws_mb"]
                rows.append(row)
                print(f"{kernel:12s} {mode:12s} draws {row['draws_mb']:7.1f} MB  peak rise "
                      f"{row['peak_rise_mb']:7.1f} MB ({row['peak_ratio']:.2f}x)  held "
                      f"{row['held_mb']:7.1f} MB ({row['held_ratio']:.2f}x)", flush=True)
    write(rows, draws, quick=args.quick)


def write(rows: list[dict], draws: int, *, quick: bool) -> None:
    import torch

    name = "draw_memory_quick" if quick else "draw_memory"
    results = Path(__file__).parent / "results"
    meta = {"date": datetime.now(UTC).isoformat(timespec="seconds"),
            "python": platform.python_version(), "torch": torch.__version__,
            "machine": platform.machine(), "draws": draws, "threads": 1}
    (results / f"{name}.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=2)
                                          + "\n")
    lines = [
        f"# Memory of the draws: {draws} draws of the MLP 784-100-100-10 (89,610 parameters)",
        "",
        f"{meta['date']}, Python {meta['python']}, torch {meta['torch']}, one thread; each "
        "mode in a fresh process. Peak rise: peak RSS during `mcmc.run` minus RSS before it "
        "(the run builds the kernel: tracing, buffers); held: RSS after the run minus before; "
        "x: the rise above that of mode `none` (the same run keeping no draw), relative to the "
        "draws' bytes (every site the run returns, float32).",
        "",
        "| kernel | mode | draws (MB) | peak rise (MB) | peak / draws | held (MB) | "
        "held / draws |",
        "|---|---|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(f"| {r['kernel']} | {r['mode']} | {r['draws_mb']:.1f} | "
                     f"{r['peak_rise_mb']:.1f} | {r['peak_ratio']:.2f}x | {r['held_mb']:.1f} | "
                     f"{r['held_ratio']:.2f}x |")
    lines += ["", "Modes: `none` = `MCMC` with `save_params=[]`, no writer (the reference); "
              "`stock` = `pyro.infer.MCMC` (every site kept); `lean` = "
              "`pyro_flat.LeanMCMC`; `stream` = `MCMC` + `pyro_flat.DrawWriter`, "
              "`save_params=[]`; `stream+bias` = the same keeping the 10-value output bias.", ""]
    (results / f"{name}.md").write_text("\n".join(lines))


if __name__ == "__main__":
    main()
