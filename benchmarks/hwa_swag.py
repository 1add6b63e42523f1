"""Bayes-by-Backprop vs HWA, and SWAG vs F-SWAG (SAM), on the MNIST-1D and digits BNNs.

* BbB vs HWA: a mean-field Gaussian (``AutoNormal``) over an MLP d-100-100-10 (prior
  N(0, 3^2/fan_in), minibatches of 128) is fitted by SVI with Adam (lr 1e-3) for ``pretrain``
  steps; from that same state, plain SVI continues for ``steps`` more at lr 1e-3, and HWA runs
  ``steps`` steps with a learning rate cycling from 1e-3 down to 1e-4 every 50 steps, averaging
  every cycle. Both are scored by the model average over 32 draws of their guide (HWA: of its
  averaged guide).
* SWAG vs F-SWAG: the same MLP without priors trained by SGD (lr 0.05, momentum 0.9, weight
  decay 1e-4) or SAM around it (rho 0.05) for ``2 * steps`` steps, collecting every 20 steps in
  the second half (rank 10); scored by the average of 32 SWAG draws at scale 0.5.

Equal numbers of optimiser steps within each pair (SAM takes two gradients per step). Metrics:
test accuracy, NLL, ECE (15 bins), each the mean over ``--seeds`` (the data split, the
initialisation and the minibatches change with the seed), with the standard deviation across
seeds beside it.

Run::

    .venv/bin/python benchmarks/hwa_swag.py [--steps 2000 --pretrain 3000 --seeds 0 1 2]
"""

from __future__ import annotations

import argparse
import copy
import datetime
import json
import sys
from pathlib import Path

import pyro
import torch
from pyro.infer import SVI, Predictive, Trace_ELBO
from pyro.infer.autoguide import AutoNormal

from pyro_flat.cli import build_mlp
from pyro_flat.datasets import load_dataset
from pyro_flat.evaluation import classification
from pyro_flat.evaluation.predictive import bma_probs
from pyro_flat.infer import HWA, SWAG
from pyro_flat.models.bnn import BNN
from pyro_flat.models.likelihoods import Categorical
from pyro_flat.models.nn import make_bayesian
from pyro_flat.optim import SAM

DRAWS = 32


def scores(probs: torch.Tensor, y: torch.Tensor) -> dict:
    return {"accuracy": classification.accuracy(probs, y), "nll": classification.nll(probs, y),
            "ece": classification.ece(probs, y)}


def guide_probs(net, model, guide, base_guide, data) -> torch.Tensor:
    """The model average over DRAWS draws of ``guide`` (sites shaped as ``base_guide``'s)."""
    shapes = {k: v.shape for k, v in base_guide.median().items()}
    draws = Predictive(model, guide=guide, num_samples=DRAWS,
                       return_sites=list(shapes))(data.x_train, data.y_train)
    draws = {k: v.reshape(DRAWS, *shapes[k]) for k, v in draws.items()}
    return bma_probs(net, draws, data.x_test)


def bbb_vs_hwa(data, steps: int, pretrain: int, seed: int) -> list[dict]:
    pyro.clear_param_store()
    pyro.set_rng_seed(seed)
    net = make_bayesian(build_mlp(data.input_shape[0], data.num_classes, (100, 100)),
                        prior_scale=3.0)
    model = BNN(net, Categorical(), subsample_size=128)
    guide = AutoNormal(model, init_scale=0.01)
    svi = SVI(model, guide, pyro.optim.Adam({"lr": 1e-3}), Trace_ELBO())
    for _ in range(pretrain):
        svi.step(data.x_train, data.y_train)
    start = pyro.get_param_store().get_state()
    start = {"params": {k: v.detach().clone() for k, v in start["params"].items()},
             "constraints": start["constraints"]}
    rows = []
    for method in ("bbb", "hwa"):
        pyro.get_param_store().set_state(copy.deepcopy(start))
        for p in start["params"]:
            pyro.get_param_store()._params[p].requires_grad_(True)
        pyro.set_rng_seed(seed + 1)
        svi = SVI(model, guide, pyro.optim.Adam({"lr": 1e-3}), Trace_ELBO())
        stepper = svi.step if method == "bbb" else HWA(svi, (1e-4, 1e-3), 50).step
        for _ in range(steps):
            stepper(data.x_train, data.y_train)
        g = guide if method == "bbb" else stepper.__self__.averaged_guide()
        probs = guide_probs(net, model, g, guide, data)
        rows.append({"method": method, **scores(probs, data.y_test)})
    return rows


def _closure(opt, net, data, idx):
    def closure():
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(net(data.x_train[idx]), data.y_train[idx])
        loss.backward()
        return loss

    return closure


def swag_vs_fswag(data, steps: int, seed: int) -> list[dict]:
    rows = []
    for method in ("swag", "f-swag"):
        torch.manual_seed(seed)
        net = build_mlp(data.input_shape[0], data.num_classes, (100, 100))
        kw = dict(lr=0.05, momentum=0.9, weight_decay=1e-4)
        opt = (torch.optim.SGD(net.parameters(), **kw) if method == "swag"
               else SAM(net.parameters(), torch.optim.SGD, rho=0.05, **kw))
        swag = SWAG(net, max_rank=10)
        n = data.num_train
        for t in range(2 * steps):
            closure = _closure(opt, net, data, torch.randint(n, (128,)))
            if method == "swag":
                closure()
                opt.step()
            else:
                opt.step(closure)
            if t >= steps and (t - steps) % 20 == 0:
                swag.collect()
        probs = torch.zeros(len(data.x_test), data.num_classes)
        g = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            for _ in range(DRAWS):
                with swag.swapped(swag.sample(scale=0.5, generator=g)):
                    probs += torch.softmax(net(data.x_test), -1) / DRAWS
        rows.append({"method": method, **scores(probs, data.y_test)})
    return rows


def summarise(rows: list[dict]) -> list[dict]:
    """Mean and standard deviation over seeds of each (data set, method)."""
    keys = list(dict.fromkeys((r["dataset"], r["method"]) for r in rows))
    out = []
    for dataset, method in keys:
        group = [r for r in rows if r["dataset"] == dataset and r["method"] == method]
        row = {"dataset": dataset, "method": method, "seeds": len(group)}
        for m in ("accuracy", "nll", "ece"):
            values = torch.tensor([r[m] for r in group], dtype=torch.float64)
            row[m] = float(values.mean())
            row[m + "_sd"] = float(values.std()) if len(group) > 1 else 0.0
        out.append(row)
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("--pretrain", type=int, default=3000)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results")
    parser.add_argument("--name", default="hwa_swag", help="results file name (no suffix)")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    rows = []
    for name in ("mnist1d", "digits"):
        for seed in args.seeds:
            data = load_dataset(name, seed=seed)
            for row in bbb_vs_hwa(data, args.steps, args.pretrain, seed) + swag_vs_fswag(
                    data, args.steps, seed):
                rows.append({"dataset": name, "seed": seed, **row})
                print(rows[-1], flush=True)
    summary = summarise(rows)
    lines = ["| data set | method | accuracy | NLL | ECE |", "|---|---|---:|---:|---:|"]
    lines += [f"| {r['dataset']} | {r['method']} | {r['accuracy']:.4f} ± {r['accuracy_sd']:.4f} | "
              f"{r['nll']:.4f} ± {r['nll_sd']:.4f} | {r['ece']:.4f} ± {r['ece_sd']:.4f} |"
              for r in summary]
    table = "\n".join(lines)
    print(table)
    words = argv if argv is not None else sys.argv[1:]
    command = " ".join(["python benchmarks/hwa_swag.py", *words])
    meta = {"command": command, "steps": args.steps,
            "pretrain": args.pretrain, "seeds": args.seeds, "torch": torch.__version__,
            "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"{args.name}.json").write_text(
        json.dumps({"meta": meta, "summary": summary, "rows": rows}, indent=1))
    (args.out / f"{args.name}.md").write_text(
        "# BbB vs HWA, SWAG vs F-SWAG\n\n"
        f"- command: `{meta['command']}`; {args.pretrain} pretraining + {args.steps} SVI steps; "
        f"SWAG {2 * args.steps} steps; seeds {args.seeds} (mean ± sd over seeds); "
        f"torch {meta['torch']}; {meta['date']}\n\n{table}\n")


if __name__ == "__main__":
    main()
