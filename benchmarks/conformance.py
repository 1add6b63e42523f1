"""Run the conformance matrix (``tests/conformance``) and write its table of results.

Every cell (model x kernel x data mode x step mode x chains) runs with the slow budget by
default, one after another in this process, and is checked against the NUTS or exact reference
of ``tests/conformance/reference.json`` (see ``tests/conformance/matrix.py`` for the settings,
the check and the bias allowances). Each cell's line is printed as it finishes, and the results
are written after every cell to ``benchmarks/results/conformance.{json,md}`` (``--name``), so a
run that is stopped keeps what it did; ``--resume`` skips the cells already written.

Examples::

    python benchmarks/conformance.py                          # every cell (many hours)
    python benchmarks/conformance.py --models linreg horseshoe --kernels SGLD SGHMC
    python benchmarks/conformance.py --cells 'mlp_hier/*/plate/*/vectorized'
    python benchmarks/conformance.py --fast                   # the CI cells, fast budget
    python benchmarks/conformance.py --models bnn_homoskedastic --compile auto

``--compile auto`` runs every kernel with ``compile="auto"`` (the potential compiled where
pyro_flat can read the model and a trial finds it faster; ``tests/conformance/matrix.py``);
the table marks the cells that ran compiled.
"""

from __future__ import annotations

import argparse
import fnmatch
import json
import multiprocessing
import os
import platform
import sys
import time
from collections import Counter
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from conformance.matrix import (  # noqa: E402
    CHAIN_MODES,
    COMPILE_MODES,
    COMPILE_VARIABLE,
    DATA_MODES,
    KERNELS,
    STEP_MODES,
    Cell,
    Z,
    all_cells,
    budget_in_ci,
    fast_cells,
    run_and_classify,
)
from conformance.models import PROBLEMS  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results"
OUTCOMES = ("pass", "expected-error", "known-limitation", "known-broken", "fixed", "fail",
            "error")


def select(args: argparse.Namespace) -> list[Cell]:
    cells = fast_cells() if args.fast else all_cells(args.models)
    keep = []
    for c in cells:
        if (c.model in args.models and c.kernel in args.kernels and c.data in args.data
                and c.step in args.step and c.chains in args.chains
                and (not args.cells or any(fnmatch.fnmatchcase(c.id, p) for p in args.cells))):
            keep.append(c)
    return keep


def worst_row(result: dict) -> str:
    """The check closest to (or furthest over) its tolerance, as ``stat quantity: value vs
    reference (tolerance)``."""
    rows = [r for r in result["rows"] if r["tolerance"] > 0]
    if not rows:
        return ""
    r = max(rows, key=lambda r: abs(r["value"] - r["reference"]) / r["tolerance"])
    return (f"{r['statistic']} {r['quantity']}: {r['value']:.4g} vs {r['reference']:.4g} "
            f"(tol {r['tolerance']:.3g}, bias part {r['bias']:.3g}, ESS {r['ess']:.0f})")


def write_atomically(path: Path, text: str) -> None:
    """Write ``text`` to a file beside ``path`` and rename it to ``path``: a run killed while
    writing keeps the results file of the cell before (``--resume`` reads it)."""
    temporary = path.with_name(path.name + ".partial")
    temporary.write_text(text)
    temporary.replace(path)


def write(results: dict[str, dict], meta: dict, name: str) -> None:
    RESULTS.mkdir(parents=True, exist_ok=True)
    write_atomically(RESULTS / f"{name}.json",
                     json.dumps({"meta": meta, "cells": results}, indent=1) + "\n")
    counts = Counter(r["outcome"] for r in results.values())
    lines = [
        "# Conformance matrix",
        "",
        f"- command: `{meta['command']}`; {meta['cpu']}; torch {meta['torch']}; "
        f"pyro {meta['pyro']}; {meta['date']}",
        f"- budget: {meta['budget']}; check: |estimate - reference| <= z sqrt(se^2 + "
        f"se_ref^2) + bias, z = {Z:g}, on the mean and the sd of each statistic "
        "(tests/conformance/matrix.py)",
        "- outcomes: " + ", ".join(f"{o} {counts[o]}" for o in OUTCOMES if counts[o]),
        "",
        "| cell | outcome | s | closest check | reason |",
        "|---|---|---:|---|---|",
    ]
    for cid in sorted(results):
        r = results[cid]
        reason = r["reason"].replace("|", "/").replace("\n", " ")[:240]
        if r.get("settings", {}).get("compile", {}).get("used"):
            reason = "compiled potential. " + reason
        lines.append(f"| {cid} | {r['outcome']} | {r['seconds']:.0f} | {worst_row(r)} | "
                     f"{reason} |")
    write_atomically(RESULTS / f"{name}.md", "\n".join(lines) + "\n")


def run_one(cell: Cell, budget: str) -> dict:
    """One cell, classified, as JSON (in a worker process with ``--jobs``); with the fast
    budget, the budget CI gives the cell."""
    torch.set_num_threads(1)
    return run_and_classify(cell, budget_in_ci(cell) if budget == "fast" else budget).to_json()


def record(results: dict[str, dict], cell: Cell, result: dict, i: int, n: int, meta: dict,
           name: str) -> None:
    results[cell.id] = result
    print(f"[{i}/{n}] {cell.id}: {result['outcome']} ({result['seconds']:.0f} s) "
          f"{result['reason'][:160]}", flush=True)
    write(results, meta, name)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--models", nargs="+", default=list(PROBLEMS), choices=list(PROBLEMS))
    parser.add_argument("--kernels", nargs="+", default=list(KERNELS), choices=KERNELS)
    parser.add_argument("--data", nargs="+", default=list(DATA_MODES), choices=DATA_MODES)
    parser.add_argument("--step", nargs="+", default=list(STEP_MODES), choices=STEP_MODES)
    parser.add_argument("--chains", nargs="+", default=list(CHAIN_MODES), choices=CHAIN_MODES)
    parser.add_argument("--cells", nargs="+", default=[],
                        help="fnmatch patterns of cell ids, e.g. 'linreg/SGLD/*'")
    parser.add_argument("--fast", action="store_true",
                        help="the CI cells with the fast budget")
    parser.add_argument("--name", default=None,
                        help="results basename (default: conformance, conformance_fast)")
    parser.add_argument("--resume", action="store_true",
                        help="keep the cells already in the results file and skip them")
    parser.add_argument("--jobs", type=int, default=1,
                        help="cells run at a time, each in a worker process (default 1)")
    parser.add_argument("--compile", choices=sorted(COMPILE_MODES), default=None,
                        help="the kernels' compile=: off (False, the default) or auto "
                             f"(sets {COMPILE_VARIABLE})")
    args = parser.parse_args(argv)
    if args.compile is not None:
        os.environ[COMPILE_VARIABLE] = args.compile  # read by the cells, here and in workers
    torch.set_num_threads(1)
    budget = "fast" if args.fast else "slow"
    name = args.name or ("conformance_fast" if args.fast else "conformance")
    cells = select(args)
    results: dict[str, dict] = {}
    path = RESULTS / f"{name}.json"
    if args.resume and path.exists():
        results = json.loads(path.read_text())["cells"]
    import pyro

    meta = {"command": "python " + " ".join(["benchmarks/conformance.py", *sys.argv[1:]]),
            "cpu": platform.processor() or platform.machine(), "torch": torch.__version__,
            "pyro": pyro.__version__, "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "budget": budget}
    todo = [c for c in cells if c.id not in results]
    print(f"{len(todo)} cells to run ({len(cells) - len(todo)} already done)", flush=True)
    if args.jobs > 1:
        context = multiprocessing.get_context("spawn")
        with ProcessPoolExecutor(args.jobs, mp_context=context) as pool:
            done = pool.map(run_one, todo, [budget] * len(todo))
            for i, (cell, result) in enumerate(zip(todo, done, strict=True), 1):
                record(results, cell, result, i, len(todo), meta, name)
    else:
        for i, cell in enumerate(todo, 1):
            record(results, cell, run_one(cell, budget), i, len(todo), meta, name)
    counts = Counter(r["outcome"] for r in results.values())
    print(", ".join(f"{o}: {counts[o]}" for o in OUTCOMES if counts[o]))
    return 1 if counts["fail"] or counts["error"] or counts["fixed"] else 0


if __name__ == "__main__":
    raise SystemExit(main())
