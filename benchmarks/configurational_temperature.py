"""The draws' configurational temperature of the kernels on a regression with a known answer.

The model is the Bayesian linear regression of the tests
(``tests/infer/mcmc/test_configurational_temperature.py``: ``w ~ N(0, I_2)``,
``s ~ HalfNormal(1)``, N = 400), run by SGLD, SGHMC and L2E with no step size (warmup's, or
L2E's rule), 4 vectorised chains, ``--warmup`` warmup and ``--draws`` draws
of 10 SG steps, on the full batch and minibatched by ``subsample_size`` 50 and 100. The table
gives ``diagnostics()["configurational_temperature"]`` per site (ratio to T, and its standard
error) beside the draws' sd of ``w[0]`` against NUTS's, and whether the run warned
(:mod:`pyro_flat.infer.mcmc.configurational_temperature`). A chain that samples the posterior
reads 1 (to its step's bias); a ratio ``a`` is about the square of the ratio of the sds.
Results: ``benchmarks/results/configurational_temperature.{json,md}``.

Usage::

    python benchmarks/configurational_temperature.py [--draws 400] [--warmup 200] [--seed 2]
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import warnings
from pathlib import Path

import pyro
import torch
from pyro.infer import MCMC, NUTS

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "infer" / "mcmc"))

from test_configurational_temperature import X, Y, regression  # noqa: E402

from pyro_flat.infer import L2E, SGHMC, SGLD  # noqa: E402

RESULTS = Path(__file__).parent / "results"
KERNELS = {"SGLD": SGLD, "SGHMC": SGHMC, "L2E": L2E}
BATCHES = (None, 50, 100)


def nuts_sd(seed: int) -> float:
    pyro.set_rng_seed(seed)
    mcmc = MCMC(NUTS(regression), num_samples=1000, warmup_steps=500, num_chains=1,
                disable_progbar=True)
    mcmc.run(X, Y)
    return float(mcmc.get_samples()["w"][:, 0].std())


def run(name: str, batch: int | None, args: argparse.Namespace) -> dict:
    pyro.set_rng_seed(args.seed)
    kernel = KERNELS[name](regression, num_steps_per_sample=10, vectorized_chains=4)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        mcmc = MCMC(kernel, num_samples=args.draws, warmup_steps=args.warmup,
                    disable_progbar=True)
        mcmc.run(X, Y, batch)
    reading = kernel.diagnostics()["configurational_temperature"]
    warned = any("configurational temperature" in str(w.message) for w in caught)
    w0 = mcmc.get_samples()["w"][..., 0]  # (draws, chains)
    return {"kernel": name, "subsample_size": batch, "reading": reading, "warned": warned,
            "sd_w0": float(w0.std(0).mean())}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--draws", type=int, default=400)
    parser.add_argument("--warmup", type=int, default=200)
    parser.add_argument("--seed", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(1)
    reference = nuts_sd(args.seed)
    rows = []
    for name in KERNELS:
        for batch in BATCHES:
            rows.append(run(name, batch, args))
            print(json.dumps(rows[-1]), flush=True)
    lines = ["| kernel | batch | `w`: ratio (se) | `s`: ratio (se) | sd of `w[0]` / NUTS's | "
             "warned |", "|---|---|---|---|---|---|"]
    for r in rows:
        cell = {k: f"{v['ratio']:.2f} ({v['se']:.2f})" for k, v in r["reading"].items()}
        lines.append(f"| {r['kernel']} | {r['subsample_size'] or 'full'} | {cell['w']} | "
                     f"{cell['s']} | {r['sd_w0'] / reference:.2f} | "
                     f"{'yes' if r['warned'] else 'no'} |")
    table = "\n".join(lines)
    print(table)
    meta = {"args": vars(args), "nuts_sd_w0": reference, "torch": torch.__version__,
            "python": platform.python_version()}
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "configurational_temperature.json").write_text(
        json.dumps({"meta": meta, "rows": rows}, indent=1))
    (RESULTS / "configurational_temperature.md").write_text(
        "# The draws' configurational temperature (`benchmarks/configurational_temperature.py`)"
        f"\n\nNUTS's sd of `w[0]`: {reference:.4f}. Ratio: the draws' temperature over T "
        "(1 for a chain that samples the posterior).\n\n" + table + "\n")


if __name__ == "__main__":
    main()
