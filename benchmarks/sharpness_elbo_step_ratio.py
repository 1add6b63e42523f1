"""SharpnessAwareELBO step time relative to Trace_ELBO (issue 5 target: <= 2.2x per SVI step).

A Bayesian MLP 40-100-100-10 on MNIST-1D (prior N(0, 3^2/fan_in), minibatches of 128, Adam
lr 1e-3) with ``AutoNormal`` and with ``AutoDiagonalNormal``; for each guide one ``SVI`` with
``Trace_ELBO`` and one with ``SharpnessAwareELBO(rho=0.05)`` (and ``geometry=True``) on the same
parameters run in interleaved chunks of ``--chunk`` steps, the order rotating every round; the
ratio is the median over rounds of (chunk time / Trace_ELBO chunk time of the same round), with
quartiles. Wall and process CPU time. One torch thread.

Run::

    .venv/bin/python benchmarks/sharpness_elbo_step_ratio.py [--rounds 30 --chunk 10]

It prints a table and writes ``benchmarks/results/sharpness_elbo_step_ratio.{json,md}``.
"""

from __future__ import annotations

import argparse
import datetime
import json
import statistics
import sys
import time
from pathlib import Path

import pyro
import torch
from pyro.infer import SVI, Trace_ELBO
from pyro.infer.autoguide import AutoDiagonalNormal, AutoNormal

from pyro_flat.cli import build_mlp
from pyro_flat.datasets import load_dataset
from pyro_flat.infer import SharpnessAwareELBO
from pyro_flat.models.bnn import BNN
from pyro_flat.models.likelihoods import Categorical
from pyro_flat.models.nn import make_bayesian

LOSSES = {"Trace_ELBO": lambda: Trace_ELBO(),
          "SharpnessAwareELBO": lambda: SharpnessAwareELBO(rho=0.05),
          "SharpnessAwareELBO geometry": lambda: SharpnessAwareELBO(rho=0.05, geometry=True)}


def measure(guide_cls, data, rounds: int, chunk: int) -> list[dict]:
    pyro.clear_param_store()
    pyro.set_rng_seed(0)
    net = make_bayesian(build_mlp(data.input_shape[0], data.num_classes, (100, 100)),
                        prior_scale=3.0)
    model = BNN(net, Categorical(), subsample_size=128)
    guide = guide_cls(model, init_scale=0.01)
    svis = {name: SVI(model, guide, pyro.optim.Adam({"lr": 1e-3}), make())
            for name, make in LOSSES.items()}
    for svi in svis.values():  # warm up every path
        for _ in range(5):
            svi.step(data.x_train, data.y_train)
    names = list(svis)
    wall = {n: [] for n in names}
    cpu = {n: [] for n in names}
    for r in range(rounds):
        order = names[r % len(names):] + names[:r % len(names)]
        for name in order:
            w0, c0 = time.perf_counter(), time.process_time()
            for _ in range(chunk):
                svis[name].step(data.x_train, data.y_train)
            wall[name].append(time.perf_counter() - w0)
            cpu[name].append(time.process_time() - c0)
    rows = []
    for name in names:
        rw = [a / b for a, b in zip(wall[name], wall["Trace_ELBO"], strict=True)]
        rc = [a / b for a, b in zip(cpu[name], cpu["Trace_ELBO"], strict=True)]
        q1, med, q3 = statistics.quantiles(rw, n=4)
        rows.append({"guide": guide_cls.__name__, "loss": name,
                     "ms_per_step": 1e3 * statistics.median(wall[name]) / chunk,
                     "wall_ratio": med, "wall_q1": q1, "wall_q3": q3,
                     "cpu_ratio": statistics.median(rc)})
    return rows


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--chunk", type=int, default=10)
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    data = load_dataset("mnist1d", seed=0)
    rows = [r for g in (AutoNormal, AutoDiagonalNormal) for r in
            measure(g, data, args.rounds, args.chunk)]
    lines = ["| guide | loss | ms / step | wall ratio (median [q1, q3]) | CPU ratio |",
             "|---|---|---:|---|---:|"]
    for r in rows:
        lines.append(f"| {r['guide']} | {r['loss']} | {r['ms_per_step']:.2f} | "
                     f"{r['wall_ratio']:.2f} [{r['wall_q1']:.2f}, {r['wall_q3']:.2f}] | "
                     f"{r['cpu_ratio']:.2f} |")
    table = "\n".join(lines)
    print(table)
    meta = {"command": " ".join(["python", *sys.argv]),
            "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
            "torch": torch.__version__, "pyro": pyro.__version__, "rounds": args.rounds,
            "chunk": args.chunk}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "sharpness_elbo_step_ratio.json").write_text(
        json.dumps({"meta": meta, "rows": rows}, indent=1))
    (args.out / "sharpness_elbo_step_ratio.md").write_text(
        "# SharpnessAwareELBO step time / Trace_ELBO step time\n\n"
        f"- command: `{meta['command']}`\n- date: {meta['date']}; torch {meta['torch']}, "
        f"pyro {meta['pyro']}; MLP 40-100-100-10 on MNIST-1D, batch 128, one thread, "
        f"{args.rounds} interleaved rounds of {args.chunk} steps\n\n{table}\n")


if __name__ == "__main__":
    main()
