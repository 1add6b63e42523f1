"""Flat-seeking vs plain, with only rho changed: SGLD vs SASGLD, SGVB vs F-SGVB (+ geometry).

The same Bayesian MLP (in-100-100-classes, ReLU, prior N(0, 3^2/fan_in), minibatches of 128:
the settings of ``pyro-flat compare``) on MNIST-1D and scikit-learn digits.

* SG-MCMC: SGLD and SASGLD (``rho = 0.05``) at the same step size (``lr / N``, lr 0.2), the
  same number of SG steps (SASGLD takes two gradients per step), 12 kept draws after 4 warmup
  draws, equally thinned.
* Variational: a mean-field ``AutoNormal`` guide (initial scale 0.01, means from the network's
  own initialisation) fitted by SVI with Adam (lr 3e-3) for the same number of steps with
  ``Trace_ELBO`` (SGVB), ``SharpnessAwareELBO(rho=0.05)`` (F-SGVB) and
  ``SharpnessAwareELBO(rho=0.05, geometry=True)`` (F-SGVB + geometry), and the first two with
  local reparameterisation (``LocalReparameterization``: SGVB-LRT, F-SGVB-LRT), one particle;
  16 draws of the guide.

Scores: the Bayesian model average on the test set (accuracy, NLL, ECE with 15 equal-width
bins) and the mean sharpness of the draws (:func:`pyro_flat.evaluation.flatness.sharpness`, rho =
0.05, the paper's measure, on 1,000 training points). Mean and standard deviation over seeds.

Run::

    .venv/bin/python benchmarks/sharpness_aware.py            # 26 min wall, shared machine
    .venv/bin/python benchmarks/sharpness_aware.py --quick    # a smoke run

It prints Markdown tables and writes ``benchmarks/results/sharpness_aware.{json,md}``.
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
from pyro.infer import MCMC, SVI, Trace_ELBO
from pyro.infer.autoguide import AutoNormal

from pyro_flat.cli import Settings, build_mlp
from pyro_flat.datasets import load_dataset
from pyro_flat.evaluation import classification
from pyro_flat.evaluation.flatness import sharpness
from pyro_flat.evaluation.predictive import bma_probs, guide_draws
from pyro_flat.infer import SASGLD, SGLD, LocalReparameterization, SharpnessAwareELBO
from pyro_flat.models.bnn import BNN
from pyro_flat.models.likelihoods import Categorical
from pyro_flat.models.nn import init_to_network, make_bayesian

SETTINGS = Settings()
RHO = 0.05
SVI_LR = 3e-3
KEPT, WARMUP = 12, 4  # MCMC draws kept and discarded
GUIDE_DRAWS = 16
METHODS = ("SGLD", "SASGLD", "SGVB", "F-SGVB", "F-SGVB + geometry", "SGVB-LRT", "F-SGVB-LRT")
BASELINE = {"SASGLD": "SGLD", "F-SGVB": "SGVB", "F-SGVB + geometry": "SGVB",
            "F-SGVB-LRT": "SGVB-LRT"}


def network(data):
    net = build_mlp(data.input_shape[0], data.num_classes, SETTINGS.hidden)
    return make_bayesian(net, prior_scale=SETTINGS.prior_scale, scale_rule=SETTINGS.scale_rule)


def fit(method: str, data, mcmc_steps: int, svi_steps: int, seed: int):
    """The network and its draws ``{site: (S, ...)}`` after fitting with ``method``."""
    pyro.clear_param_store()
    pyro.set_rng_seed(seed)
    net = network(data)
    model = BNN(net, Categorical(), subsample_size=SETTINGS.batch_size)
    x, y = data.x_train, data.y_train
    if method in ("SGLD", "SASGLD"):
        eps = SETTINGS.lr / data.num_train
        thin = mcmc_steps // (KEPT + WARMUP)
        kernel = (SGLD(model, step_size=eps, num_steps_per_sample=thin) if method == "SGLD"
                  else SASGLD(model, step_size=eps, rho=RHO, num_steps_per_sample=thin))
        mcmc = MCMC(kernel, num_samples=KEPT, warmup_steps=WARMUP, disable_progbar=True)
        mcmc.run(x, y)
        grads = kernel.num_steps * (2 if method == "SASGLD" else 1)
        return net, mcmc.get_samples(), grads
    loss = {"SGVB": Trace_ELBO(), "F-SGVB": SharpnessAwareELBO(rho=RHO),
            "F-SGVB + geometry": SharpnessAwareELBO(rho=RHO, geometry=True),
            "SGVB-LRT": Trace_ELBO(), "F-SGVB-LRT": SharpnessAwareELBO(rho=RHO)}[method]
    guide = AutoNormal(model, init_loc_fn=init_to_network, init_scale=SETTINGS.svi_init_scale)
    svi_model, svi_guide = model, guide
    if method.endswith("LRT"):
        lrt = LocalReparameterization()
        svi_model, svi_guide = lrt.model(model), lrt.guide(guide)
    svi = SVI(svi_model, svi_guide, pyro.optim.Adam({"lr": SVI_LR}), loss)
    for _ in range(svi_steps):
        svi.step(x, y)
    grads = svi_steps * (2 if method.startswith("F-") else 1)
    return net, guide_draws(guide, GUIDE_DRAWS, x, y), grads


def run(method: str, data, mcmc_steps: int, svi_steps: int, seed: int) -> dict:
    start = time.perf_counter()
    net, draws, grads = fit(method, data, mcmc_steps, svi_steps, seed)
    seconds = time.perf_counter() - start
    probs = bma_probs(net, draws, data.x_test)
    with pyro.poutine.block():
        sharp = sharpness(net, draws, data.x_train[:1000], data.y_train[:1000], rho=RHO)
    return {"method": method, "seed": seed,
            "accuracy": classification.accuracy(probs, data.y_test),
            "nll": classification.nll(probs, data.y_test),
            "ece": classification.ece(probs, data.y_test),
            "sharpness": float(sharp.mean()), "grad_evals": grads,
            "draws": len(next(iter(draws.values()))), "fit_s": seconds}


def summarise(rows: list[dict]) -> list[dict]:
    out = []
    for method in METHODS:
        group = [r for r in rows if r["method"] == method]
        entry = {"method": method, "seeds": len(group), "grad_evals": group[0]["grad_evals"],
                 "draws": group[0]["draws"]}
        for key in ("accuracy", "nll", "ece", "sharpness", "fit_s"):
            values = [r[key] for r in group]
            entry[key] = statistics.fmean(values)
            entry[key + "_sd"] = statistics.stdev(values) if len(values) > 1 else 0.0
        base = BASELINE.get(method)
        if base is not None:  # seed-by-seed: is the flat variant's sharpness lower?
            pairs = zip(group, [r for r in rows if r["method"] == base], strict=True)
            entry["lower_sharpness_seeds"] = sum(a["sharpness"] < b["sharpness"]
                                                 for a, b in pairs)
        out.append(entry)
    return out


def table(name: str, plan: dict, summary: list[dict]) -> str:
    lines = [f"### {name}: SG-MCMC {plan['mcmc_steps']} SG steps ({KEPT} kept draws), SVI "
             f"{plan['svi_steps']} steps ({GUIDE_DRAWS} guide draws); rho = {RHO}", "",
             "| method | accuracy | NLL | ECE | sharpness | lower sharpness than baseline "
             "(seeds) | grad evals | fit s |", "|---|---|---|---|---|---|---:|---:|"]
    for e in summary:
        cells = [f"{e[k]:.4f} ± {e[k + '_sd']:.4f}" for k in ("accuracy", "nll", "ece",
                                                              "sharpness")]
        lower = (f"{e['lower_sharpness_seeds']}/{e['seeds']}" if "lower_sharpness_seeds" in e
                 else "baseline")
        lines.append(f"| {e['method']} | " + " | ".join(cells)
                     + f" | {lower} | {e['grad_evals']} | {e['fit_s']:.1f} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="few steps, one seed")
    parser.add_argument("--seeds", type=int, default=2)
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    plans = {"mnist1d": {"mcmc_steps": 4800, "svi_steps": 1500},
             "digits": {"mcmc_steps": 3200, "svi_steps": 1000}}
    seeds = range(1 if args.quick else args.seeds)
    if args.quick:
        plans = {k: {"mcmc_steps": 160, "svi_steps": 50} for k in plans}
    report = {"command": " ".join(["python", *sys.argv]), "date":
              datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
              "torch": torch.__version__, "pyro": pyro.__version__, "settings": vars(SETTINGS),
              "rho": RHO, "svi_lr": SVI_LR, "datasets": {}}
    tables = []
    total = time.perf_counter()
    for name, plan in plans.items():
        data = load_dataset(name, seed=0)
        rows = [run(m, data, plan["mcmc_steps"], plan["svi_steps"], seed)
                for seed in seeds for m in METHODS]
        summary = summarise(rows)
        report["datasets"][name] = {**plan, "runs": rows, "summary": summary}
        tables.append(table(name, plan, summary))
        print(tables[-1], "\n", flush=True)
    report["total_s"] = time.perf_counter() - total
    suffix = "_quick" if args.quick else ""
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"sharpness_aware{suffix}.json").write_text(json.dumps(report, indent=1))
    header = (f"# Flat-seeking vs plain at equal settings (only rho changed)\n\n"
              f"- command: `{report['command']}`\n"
              f"- date: {report['date']}; torch {report['torch']}, pyro {report['pyro']}; "
              f"mean ± sd over {len(seeds)} seeds; total {report['total_s']:.0f} s\n"
              "- sharpness: `pyro_flat.evaluation.flatness.sharpness` (rho 0.05, 1,000 training "
              "points), mean over the draws; \"lower ... (seeds)\" counts the seeds where the "
              "flat variant's sharpness is below its baseline's at the same seed\n\n")
    (args.out / f"sharpness_aware{suffix}.md").write_text(header + "\n\n".join(tables) + "\n")


if __name__ == "__main__":
    main()
