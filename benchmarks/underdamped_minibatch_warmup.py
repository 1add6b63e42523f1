"""The adapted underdamped kernels on a user's minibatched conjugate regression, against its exact
posterior.

The model and the kernels are those of ``tests/infer/mcmc/test_underdamped_minibatch_warmup.py``:
five weights, ``y ~ N(x w, 0.5^2)``, ``pyro.plate("data", 500, subsample_size=B)``, SGHMC and
the underdamped SASGLD (``rho=0``) and EntropyMCMC built without a step size, 8 vectorised
chains. For each kernel and minibatch size the table gives the largest posterior-mean error
in posterior sds, the Monte Carlo standard error of the means in the same unit (ArviZ's ESS
over the chains), the range of the sd ratio to the exact posterior's, the worst split R-hat,
and the friction and step size warmup chose last.

Usage::

    python benchmarks/underdamped_minibatch_warmup.py                     # B = 10, 100, 500
    python benchmarks/underdamped_minibatch_warmup.py --batch 10 --draws 400

Results: ``benchmarks/results/underdamped_minibatch_warmup.{json,md}``.
"""

from __future__ import annotations

import argparse
import json
import sys
import warnings
from pathlib import Path

import pyro
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "tests" / "infer" / "mcmc"))

import test_underdamped_minibatch_warmup as case  # noqa: E402
from harness import moments_with_errors  # noqa: E402

from pyro_flat.diagnostics import split_rhat  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results"


def run(name: str, batch: int, draws: int, warmup: int, thin: int, seed: int) -> dict:
    case.B = batch  # the model reads the minibatch size when it runs
    x, y = case.data()
    kernel = case.KERNELS[name](num_steps_per_sample=thin, vectorized_chains=8)
    pyro.set_rng_seed(seed)
    mcmc = pyro.infer.MCMC(kernel, num_samples=draws, warmup_steps=warmup, disable_progbar=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        mcmc.run(x, y)
    mean, sd = case.exact_posterior(x, y)
    chains = mcmc.get_samples()["w"].transpose(0, 1)
    m, c, se, _ = moments_with_errors(chains)
    ratio = c.diagonal().sqrt() / sd
    last = kernel.warmup.log[-1]
    return {"kernel": name, "batch": batch, "draws": draws, "warmup": warmup, "thin": thin,
            "max_mean_error_sd": float(((m - mean) / sd).abs().max()),
            "max_se_sd": float((se / sd).max()),
            "sd_ratio": [float(ratio.min()), float(ratio.max())],
            "max_rhat": float(split_rhat(chains).max()),
            "friction": kernel.momentum_friction(), "step_size": last["step_size"]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--batch", type=int, nargs="+", default=[10, 100, 500])
    parser.add_argument("--kernels", nargs="+", default=list(case.KERNELS),
                        choices=list(case.KERNELS))
    parser.add_argument("--draws", type=int, default=400)
    parser.add_argument("--warmup", type=int, default=200)
    parser.add_argument("--thin", type=int, default=20)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    rows = [run(k, b, args.draws, args.warmup, args.thin, args.seed)
            for b in args.batch for k in args.kernels]
    lines = ["| kernel | B | max mean error (sd) | max MC se (sd) | sd ratio | max R-hat | "
             "friction | step |", "|---|---:|---:|---:|---|---:|---:|---:|"]
    for r in rows:
        lines.append(f"| {r['kernel']} | {r['batch']} | {r['max_mean_error_sd']:.3f} | "
                     f"{r['max_se_sd']:.3f} | {r['sd_ratio'][0]:.2f}-{r['sd_ratio'][1]:.2f} | "
                     f"{r['max_rhat']:.3f} | {r['friction']:.4g} | {r['step_size']:.3g} |")
    table = "\n".join(lines)
    print(table)
    RESULTS.mkdir(parents=True, exist_ok=True)
    command = "python benchmarks/underdamped_minibatch_warmup.py " + " ".join(sys.argv[1:])
    (RESULTS / "underdamped_minibatch_warmup.json").write_text(
        json.dumps({"command": command.strip(), "rows": rows}, indent=1) + "\n")
    (RESULTS / "underdamped_minibatch_warmup.md").write_text(
        f"# Adapted underdamped kernels, minibatched regression, against the exact posterior\n\n"
        f"- command: `{command.strip()}`; {args.draws} draws of {args.thin} SG steps after "
        f"{args.warmup} warmup draws, 8 vectorised chains, seed {args.seed}\n\n{table}\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
