"""The committed comparison table: ``pyro-flat compare --budget full`` (MNIST-1D, every method).

Runs the command in this process, then copies its table and figures to
``benchmarks/results/compare_full.{md,json}`` and ``benchmarks/results/compare_full_*.png``
with the command line, versions, machine, load and the total wall and CPU time. The run itself
(draws, CSV, netCDF) goes to ``--out`` (default: a temporary folder, deleted afterwards).

Run::

    .venv/bin/python benchmarks/compare_full.py                  # --budget full, ~10 min CPU
    .venv/bin/python benchmarks/compare_full.py --budget 4000 --name compare_quick
    .venv/bin/python benchmarks/compare_full.py --dataset digits --seeds 5 --equal steps \
        --name compare_digits_5seeds   # means, standard errors and paired differences
    .venv/bin/python benchmarks/compare_full.py --dataset digits --seeds 5 --equal steps \
        --budget 5000 --tune --name evidence_digits   # the evidence protocol (README)

The committed table compares the methods at equal gradient evaluations (``--equal grads``, this
script's default); ``--equal steps`` is the command's default protocol.

The numbers reproduce from the command within seed noise: every method is seeded (``--seed``),
the data are generated from the same seed, torch runs on one thread.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import resource
import shutil
import sys
import tempfile
import time
from pathlib import Path

import pyro
import torch

from pyro_flat import __version__, cli

RESULTS = Path(__file__).resolve().parent / "results"
FIGURES = ("reliability.png", "uncertainty.png", "loss_slices.png", "paired_differences.png")


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _cpu_seconds() -> float:
    """User + system time of this process and of its finished children (the workers)."""
    own, children = (resource.getrusage(w) for w in (resource.RUSAGE_SELF,
                                                      resource.RUSAGE_CHILDREN))
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--budget", default="full")
    parser.add_argument("--dataset", default="mnist1d")
    parser.add_argument("--seed", default="0")
    parser.add_argument("--methods", default=None)
    parser.add_argument("--equal", default="grads", choices=("steps", "grads"),
                        help="the budget's unit (default grads: the committed table's protocol)")
    parser.add_argument("--seeds", default="1", help="seeds SEED, ..., SEED + K - 1")
    parser.add_argument("--protocol", default="shared", choices=("shared", "authors"))
    parser.add_argument("--model", default="mlp", choices=("mlp", "cnn"))
    parser.add_argument("--hidden", default=None, help="the MLP's hidden widths, e.g. 16")
    parser.add_argument("--reference", default="none", choices=("none", "hmc"))
    parser.add_argument("--tune", action="store_true",
                        help="choose each method's hyper-parameters on a validation split first")
    parser.add_argument("--name", default="compare_full", help="results file stem")
    parser.add_argument("--out", default=None, help="keep the run's folder here")
    args = parser.parse_args()

    out = Path(args.out) if args.out else Path(tempfile.mkdtemp(prefix="compare-")) / "run"
    argv = ["compare", "--budget", args.budget, "--dataset", args.dataset, "--seed", args.seed,
            "--equal", args.equal, "--seeds", args.seeds, "--protocol", args.protocol,
            "--model", args.model, "--out", str(out), "--no-progress"]
    if args.methods:
        argv += ["--methods", args.methods]
    if args.tune:
        argv += ["--tune"]
    if args.hidden:
        argv += ["--hidden", args.hidden]
    if args.reference != "none":
        argv += ["--reference", args.reference]
    load_before = os.getloadavg()
    wall, cpu = time.perf_counter(), _cpu_seconds()
    code = cli.main(argv)
    wall, cpu = time.perf_counter() - wall, _cpu_seconds() - cpu
    load_after = os.getloadavg()
    if not (out / "results.json").exists():
        return code or 1
    result = json.loads((out / "results.json").read_text())
    command = "pyro-flat " + " ".join(a for a in argv if a != "--no-progress").replace(
        str(out), "OUT")
    env = {
        "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "command": command,
        "script": "python benchmarks/compare_full.py " + " ".join(sys.argv[1:]),
        "pyro_flat": __version__, "torch": torch.__version__, "pyro": pyro.__version__,
        "python": platform.python_version(), "cpu": _cpu_model(),
        "cores": os.cpu_count(), "threads": 1,
        "load_average_before": [round(v, 2) for v in load_before],
        "load_average_after": [round(v, 2) for v in load_after],
        "wall_time_s": round(wall, 1), "cpu_time_s": round(cpu, 1), "exit_status": code,
    }
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / f"{args.name}.json").write_text(json.dumps({**env, **result}, indent=2) + "\n")
    table = (out / "results.md").read_text()
    notes = result.get("method_notes", {})
    plan = result["plan"]
    steps = plan["thin"] * (plan["num_draws"] + plan["warmup_draws"])
    unit = "SG steps" if plan.get("unit", "grads") == "steps" else "gradient evaluations"
    seeds = result.get("seeds", [result["seed"]])
    seed_text = (f"seed {seeds[0]}" if len(seeds) == 1 else
                 f"{len(seeds)} seeds ({seeds[0]}-{seeds[-1]}): mean ± standard error, and paired "
                 "differences with 95% Student t intervals (* excludes zero)")
    md = [
        f"# `{command}`",
        "",
        f"{result['dataset']}: {result['num_train']} train, {result['num_test']} test, "
        f"{result['num_ood']} OOD ({result['ood']}); {result['architecture']}; "
        f"{steps} {unit} per method, "
        f"{result['plan']['num_draws']} kept draws, {seed_text}; protocol "
        f"{result['settings'].get('protocol', 'shared')}.",
        "",
        table.rstrip(),
        "",
        "Model average over the kept draws (EntropyMCMC: theta and guide draws; ensembles: "
        "the members). Sharpness: mean over draws of L(theta + 0.05 g/|g|) - L(theta) on the "
        "first 1000 training points. Settings: `pyro_flat.cli` docstring and the JSON file.",
        "",
        f"Method notes: {json.dumps(notes)}" if any(notes.values()) else "",
        "",
        f"Run on {env['date']}: {env['cpu']}, {env['cores']} cores, torch {env['torch']}, "
        f"pyro {env['pyro']}, one torch thread per process, {result['jobs']} methods at a "
        f"time. Total wall time {env['wall_time_s']} s, CPU time {env['cpu_time_s']} s (all "
        f"processes); load average {env['load_average_before'][0]} before, "
        f"{env['load_average_after'][0]} after (the machine was shared: wall times of single "
        "methods are inflated by other work, CPU time is the better measure).",
        "",
        f"Figures: {', '.join(f'`{args.name}_{f}`' for f in FIGURES if (out / f).exists())}"
        + (f" (the per-method figures of seed {seeds[0]})." if len(seeds) > 1 else "."),
        "",
    ]
    (RESULTS / f"{args.name}.md").write_text("\n".join(md))
    for f in FIGURES:
        if (out / f).exists():
            shutil.copyfile(out / f, RESULTS / f"{args.name}_{f}")
    print(f"wrote {RESULTS / (args.name + '.md')} and .json, figures; wall {wall:.0f} s, "
          f"CPU {cpu:.0f} s")
    if not args.out:
        shutil.rmtree(out.parent, ignore_errors=True)
    return code


if __name__ == "__main__":
    sys.exit(main())
