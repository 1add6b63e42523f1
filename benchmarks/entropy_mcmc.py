"""EntropyMCMC against SGLD and cyclical SGLD on small BNNs, at an equal number of gradients.

Each method trains the same MLP (in-100-100-classes, ReLU, Gaussian prior with the fan-in rule,
the settings of ``pyro-flat compare``) for the same number of SG steps (one gradient each) on
MNIST-1D and scikit-learn digits, keeps the same number of draws, and is scored by the Bayesian
model average on the test set: accuracy, NLL, ECE; plus two flatness measures of the draws on
1,000 training points: the mean sharpness (:func:`pyro_flat.evaluation.flatness.sharpness`, rho =
0.05, the worst loss rise in a ball, which also grows with the gradient at a draw off a minimum) and
the mean top Hessian eigenvalue of the mean loss
(:func:`pyro_flat.evaluation.flatness.hessian_top_eigenvalue`, curvature alone; power iteration to a
relative change of 1e-3, on every third kept draw). EntropyMCMC is
scored three ways: the model average of its theta draws, of its guide (theta_a) draws, and of
both. Every number is the mean over seeds, with the standard deviation over seeds.

Run::

    .venv/bin/python benchmarks/entropy_mcmc.py            # about 5 minutes on 2 cores
    .venv/bin/python benchmarks/entropy_mcmc.py --quick    # a smoke run

It prints a Markdown table and writes ``benchmarks/results/entropy_mcmc.{json,md}``.
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
from pyro.infer import MCMC

from pyro_flat.cli import Settings, build_mlp
from pyro_flat.datasets import load_dataset
from pyro_flat.evaluation import classification
from pyro_flat.evaluation.flatness import hessian_top_eigenvalue, mean_loss, sharpness
from pyro_flat.evaluation.predictive import bma_probs
from pyro_flat.infer import SGLD, CyclicalSGLD, EntropyMCMC
from pyro_flat.infer.mcmc.entropy import select_draws
from pyro_flat.models.bnn import BNN
from pyro_flat.models.likelihoods import Categorical
from pyro_flat.models.nn import make_bayesian

SETTINGS = Settings()
#: epsilon / eta, the authors' CIFAR-10 ratio (lr 0.5 over 50,000 points, eta = 4e-4)
STEP_OVER_ETA = 0.025
KEPT, WARMUP = 12, 4  # draws kept and discarded, equal for every method
CURVATURE_EVERY = 3  # top Hessian eigenvalue of every third kept draw (4 of 12)


def mean_top_eigenvalue(net, draws: dict, x, y, seed: int) -> float:
    """Mean over every ``CURVATURE_EVERY``-th draw of the top Hessian eigenvalue of the loss."""
    loss = mean_loss(net, x, y)
    count = len(next(iter(draws.values())))
    generator = torch.Generator().manual_seed(seed)
    values = [hessian_top_eigenvalue(loss, {k: v[i] for k, v in draws.items()}, num_iters=100,
                                     tol=1e-3, generator=generator)[0]
              for i in range(0, count, CURVATURE_EVERY)]
    return statistics.fmean(values)


def run_method(method: str, data, steps: int, seed: int) -> list[dict]:
    pyro.clear_param_store()
    pyro.set_rng_seed(seed)
    net = build_mlp(data.input_shape[0], data.num_classes, SETTINGS.hidden)
    net = make_bayesian(net, prior_scale=SETTINGS.prior_scale, scale_rule=SETTINGS.scale_rule)
    model = BNN(net, Categorical(), subsample_size=SETTINGS.batch_size)
    eps = SETTINGS.lr / data.num_train
    thin = steps // (KEPT + WARMUP)
    if method == "SGLD":
        kernel = SGLD(model, step_size=eps, num_steps_per_sample=thin)
    elif method == "CyclicalSGLD":
        kernel = CyclicalSGLD(model, step_size=2 * eps, cycle_length=thin * 4,
                              exploration_fraction=SETTINGS.exploration_fraction,
                              draws_per_cycle=4)
    else:
        kernel = EntropyMCMC(model, step_size=eps, eta=eps / STEP_OVER_ETA,
                             num_steps_per_sample=thin)
    start = time.perf_counter()
    mcmc = MCMC(kernel, num_samples=KEPT, warmup_steps=WARMUP, disable_progbar=True)
    mcmc.run(data.x_train, data.y_train)
    seconds = time.perf_counter() - start
    samples = mcmc.get_samples()
    views = {"": samples}
    if method == "EntropyMCMC":
        views = {" theta": select_draws(samples, "theta"), " guide": select_draws(samples, "guide"),
                 " both": select_draws(samples, "both")}
    x_sharp, y_sharp = data.x_train[:1000], data.y_train[:1000]
    rows = []
    for suffix, draws in views.items():
        probs = bma_probs(net, draws, data.x_test)
        rows.append({
            "method": method + suffix,
            "accuracy": classification.accuracy(probs, data.y_test),
            "nll": classification.nll(probs, data.y_test),
            "ece": classification.ece(probs, data.y_test),
            "sharpness": float(sharpness(net, draws, x_sharp, y_sharp, rho=0.05).mean()),
            "top_eigenvalue": mean_top_eigenvalue(net, draws, x_sharp, y_sharp, seed),
            "grad_evals": kernel.num_steps,
            "draws": len(next(iter(draws.values()))),
            "wall_time_s": seconds,
        })
    return rows


def summarise(rows: list[dict]) -> list[dict]:
    out = []
    for method in dict.fromkeys(r["method"] for r in rows):
        group = [r for r in rows if r["method"] == method]
        entry = {"method": method, "seeds": len(group)}
        for key in ("accuracy", "nll", "ece", "sharpness", "top_eigenvalue", "wall_time_s"):
            values = [r[key] for r in group]
            entry[key] = statistics.fmean(values)
            entry[key + "_sd"] = statistics.stdev(values) if len(values) > 1 else 0.0
        entry["grad_evals"] = group[0]["grad_evals"]
        entry["draws"] = group[0]["draws"]
        out.append(entry)
    return out


def table(dataset: str, steps: int, summary: list[dict]) -> str:
    lines = [f"### {dataset}: {steps} SG steps (gradients) per method, batch "
             f"{SETTINGS.batch_size}, {KEPT} kept draws after {WARMUP} warmup draws", "",
             "| method | accuracy | NLL | ECE | sharpness | top Hessian eigenvalue | grad evals | "
             "draws | wall s |", "|---|---|---|---|---|---|---:|---:|---:|"]
    for e in summary:
        keys = ("accuracy", "nll", "ece", "sharpness")
        cells = [f"{e[k]:.4f} ± {e[k + '_sd']:.4f}" for k in keys]
        cells.append(f"{e['top_eigenvalue']:.3g} ± {e['top_eigenvalue_sd']:.2g}")
        lines.append(f"| {e['method']} | " + " | ".join(cells)
                     + f" | {e['grad_evals']} | {e['draws']} | {e['wall_time_s']:.1f} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="few steps, one seed")
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    plan = {"mnist1d": 12_000, "digits": 6_000}
    seeds = range(1 if args.quick else args.seeds)
    if args.quick:
        plan = {k: 400 for k in plan}
    report = {"command": " ".join(["python", *sys.argv]), "date":
              datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
              "torch": torch.__version__, "pyro": pyro.__version__, "settings": vars(SETTINGS),
              "step_over_eta": STEP_OVER_ETA, "datasets": {}}
    tables = []
    for name, steps in plan.items():
        data = load_dataset(name, seed=0)
        rows = [r for seed in seeds for m in ("SGLD", "CyclicalSGLD", "EntropyMCMC")
                for r in run_method(m, data, steps, seed)]
        summary = summarise(rows)
        report["datasets"][name] = {"steps": steps, "runs": rows, "summary": summary}
        tables.append(table(name, steps, summary))
        print(tables[-1], "\n", flush=True)
    suffix = "_quick" if args.quick else ""
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"entropy_mcmc{suffix}.json").write_text(json.dumps(report, indent=1))
    header = (f"# EntropyMCMC vs SGLD and cyclical SGLD\n\n- command: `{report['command']}`\n"
              f"- date: {report['date']}; torch {report['torch']}, pyro {report['pyro']}; "
              f"mean ± sd over {len(seeds)} seeds\n\n")
    (args.out / f"entropy_mcmc{suffix}.md").write_text(header + "\n\n".join(tables) + "\n")


if __name__ == "__main__":
    main()
