"""Time HWA adds to the SVI steps it wraps (issue 6 target: <= 5%).

A Bayesian MLP 40-100-100-10 on MNIST-1D (``AutoNormal``, minibatches of 128, Adam) runs
plain ``svi.step`` and ``hwa.step`` (cycle length 10) in interleaved chunks of 20 steps, the order
alternating every round; the ratio is the median over rounds. One torch thread.

Run::

    .venv/bin/python benchmarks/hwa_overhead.py [--rounds 30]

It prints the result and writes ``benchmarks/results/hwa_overhead.{json,md}``.
"""

from __future__ import annotations

import argparse
import datetime
import json
import statistics
import time
from pathlib import Path

import pyro
import torch
from pyro.infer import SVI, Trace_ELBO
from pyro.infer.autoguide import AutoNormal

from pyro_flat.cli import build_mlp
from pyro_flat.datasets import load_dataset
from pyro_flat.infer import HWA
from pyro_flat.models.bnn import BNN
from pyro_flat.models.likelihoods import Categorical
from pyro_flat.models.nn import make_bayesian


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--chunk", type=int, default=20)
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    pyro.set_rng_seed(0)
    pyro.clear_param_store()
    data = load_dataset("mnist1d")
    net = make_bayesian(build_mlp(data.input_shape[0], data.num_classes, (100, 100)),
                        prior_scale=3.0)
    model = BNN(net, Categorical(), subsample_size=128)
    guide = AutoNormal(model)
    svi = SVI(model, guide, pyro.optim.Adam({"lr": 1e-3}), Trace_ELBO())
    hwa = HWA(svi, lr_bounds=(1e-4, 1e-3), cycle_length=10)
    for _ in range(20):
        svi.step(data.x_train, data.y_train)

    def chunk(step) -> float:
        start = time.perf_counter()
        for _ in range(args.chunk):
            step(data.x_train, data.y_train)
        return time.perf_counter() - start

    ratios = []
    for r in range(args.rounds):
        if r % 2:
            t_hwa, t_svi = chunk(hwa.step), chunk(svi.step)
        else:
            t_svi, t_hwa = chunk(svi.step), chunk(hwa.step)
        ratios.append(t_hwa / t_svi)
    q1, median, q3 = statistics.quantiles(ratios, n=4)
    line = (f"HWA / SVI step time: median {median:.3f} [quartiles {q1:.3f}, {q3:.3f}] over "
            f"{args.rounds} interleaved rounds of {args.chunk} steps; {hwa.num_snapshots} "
            f"snapshots of {sum(v.numel() for v in hwa.mean.values())} numbers")
    print(line)
    meta = {"date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
            "torch": torch.__version__, "rounds": args.rounds, "chunk": args.chunk}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "hwa_overhead.json").write_text(json.dumps(
        {"meta": meta, "ratio_median": median, "ratio_q1": q1, "ratio_q3": q3}, indent=1))
    (args.out / "hwa_overhead.md").write_text(
        "# HWA overhead\n\n- command: `python benchmarks/hwa_overhead.py`; "
        f"{meta['date']}; torch {meta['torch']}\n\n{line}\n")


if __name__ == "__main__":
    main()
