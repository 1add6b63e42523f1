"""Every SG kernel with its defaults against NUTS, full batch and minibatched, on user-written BNNs.

What a user gets with no step size and (``--thin auto``, the default) no thinning: warmup
chooses the step from the curvature and the measured minibatch gradient noise, and the SG
steps per draw from the warmup's autocorrelations. Two regression BNNs with learned noise,
written as a user would:

* ``small``: a 1-8-1 tanh ``PyroModule`` with ``PyroSample`` N(0, 1) weights and a
  ``HalfNormal(1)`` noise scale ``sigma``, 160 points of a noisy sine;
* ``diabetes``: a 10-8-1 tanh network in :class:`pyro_flat.models.bnn.BNN` with
  ``HomoskedasticGaussian()`` (learned ``obs_scale``) on scikit-learn's diabetes data
  (442 points, standardised).

Each is run by NUTS (full batch; 4 chains one after another; gradient evaluations counted
from its trees) and by each SG kernel with 4 vectorised chains, on the full batch and
minibatched with ``subsample_size = N // 8`` (the same model; the kernel subsamples). The
table gives the elpd_loo difference to NUTS with its standard error (as ``arviz.compare``),
the noise scale's posterior mean and bulk ESS against NUTS's (the difference in units of its
Monte Carlo standard error), the excess temperature and SG steps per draw chosen in warmup,
and the gradient work in full-data gradients (a minibatch gradient counts ``B/N``; the
warmup's curvature and noise estimates included), against NUTS's.

Usage::

    python benchmarks/minibatch_noise.py                       # every kernel, both problems
    python benchmarks/minibatch_noise.py --kernels SGLD SGHMC --problems small
    python benchmarks/minibatch_noise.py --thin 20              # a fixed thinning instead
    python benchmarks/minibatch_noise.py --problems diabetes --kernels SGHMC --thin 25 \
        --batch 64 [--before]     # the issue's case; --before: warmup without the noise rule
    python benchmarks/minibatch_noise.py --preconditioner diag  # with a diagonal metric

A minibatched row also gives its elpd_loo minus the same kernel's full-batch one ("to full
batch": the sum is exact from the two differences to NUTS; its standard error needs both
rows' pointwise values, which the JSON keeps for rows run since they were added).

Results: ``benchmarks/results/minibatch_noise.{json,md}`` (rows replaced by key, so kernels
can be run separately); NUTS's scores are stored in ``results/minibatch_noise_nuts_*.json``
(committed: NUTS takes 20-40 minutes per problem here), its draws in ``*.nc`` (not committed).
"""

from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path

import arviz as az
import numpy as np
import pyro
import pyro.distributions as dist
import pyro.ops.integrator
import torch
from pyro.infer import MCMC, NUTS
from pyro.nn import PyroModule, PyroSample
from sklearn.datasets import load_diabetes

from pyro_flat.draws.export import to_arviz
from pyro_flat.infer import L2E, SASGLD, SGHMC, SGLD, ContourSGLD, EntropyMCMC
from pyro_flat.models.bnn import BNN
from pyro_flat.models.likelihoods import HomoskedasticGaussian

RESULTS = Path(__file__).parent / "results"
CHAINS, WARMUP, DRAWS = 4, 300, 400


class SmallBNN(PyroModule):
    """1-8-1 tanh network, N(0, 1) weights, HalfNormal(1) noise scale."""

    def __init__(self, hidden: int = 8):
        super().__init__()
        self.hidden = PyroModule[torch.nn.Linear](1, hidden)
        self.hidden.weight = PyroSample(dist.Normal(0.0, 1.0).expand([hidden, 1]).to_event(2))
        self.hidden.bias = PyroSample(dist.Normal(0.0, 1.0).expand([hidden]).to_event(1))
        self.out = PyroModule[torch.nn.Linear](hidden, 1)
        self.out.weight = PyroSample(dist.Normal(0.0, 1.0).expand([1, hidden]).to_event(2))
        self.out.bias = PyroSample(dist.Normal(0.0, 1.0).expand([1]).to_event(1))

    def forward(self, x: torch.Tensor, y: torch.Tensor | None = None) -> torch.Tensor:
        mean = self.out(torch.tanh(self.hidden(x))).squeeze(-1)
        sigma = pyro.sample("sigma", dist.HalfNormal(1.0))
        with pyro.plate("data", x.shape[0]):
            pyro.sample("obs", dist.Normal(mean, sigma), obs=y)
        return mean


def small_data() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    x = torch.rand(160, 1, generator=g) * 4 - 2
    y = torch.sin(2 * x).squeeze(-1) + 0.3 * torch.randn(160, generator=g)
    return x, y


def diabetes_data() -> tuple[torch.Tensor, torch.Tensor]:
    x, y = load_diabetes(return_X_y=True)
    x = (x - x.mean(0)) / x.std(0)
    y = (y - y.mean()) / y.std()
    return torch.tensor(x, dtype=torch.float32), torch.tensor(y, dtype=torch.float32)


def small_model(seed: int):
    torch.manual_seed(seed)
    return SmallBNN()


def diabetes_model(seed: int):
    torch.manual_seed(seed)
    net = torch.nn.Sequential(torch.nn.Linear(10, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))
    return BNN(net, HomoskedasticGaussian(), prior_scale=1.0)


PROBLEMS = {"small": (small_data, small_model, "sigma"),
            "diabetes": (diabetes_data, diabetes_model, "obs_scale")}

KERNELS = {
    "SGLD": lambda m, **kw: SGLD(m, **kw),
    "SGHMC": lambda m, **kw: SGHMC(m, **kw),
    "EntropyMCMC": lambda m, **kw: EntropyMCMC(m, eta=0.1, **kw),
    "ContourSGLD": lambda m, **kw: ContourSGLD(m, num_bins=20, auto_bins=True, zeta=0.5, **kw),
    "SASGLD": lambda m, **kw: SASGLD(m, rho=0.01, **kw),
    "CyclicalSGLD": None,  # needs a step size and cycles: no "use the defaults" form
    "L2E": lambda m, **kw: L2E(m, **kw),
}


#: Gradient evaluations per SG step where it is more than one (SASGLD's ascent step).
GRADIENTS_PER_STEP = {"SASGLD": 2}


def nuts_reference(problem: str) -> dict:
    """NUTS's scores (pointwise elpd_loo, the noise scale's mean, MCSE and ESS share), its
    gradient evaluations and seconds: from ``results/minibatch_noise_nuts_{problem}.json``, or
    run and stored there."""
    path = RESULTS / f"minibatch_noise_nuts_{problem}.json"
    if path.exists():
        stored = json.loads(path.read_text())
        stored["loo_i"] = np.asarray(stored["loo_i"])
        return stored
    idata, gradients, seconds = run_nuts(problem)
    ref = scores(idata, PROBLEMS[problem][2])
    ref.update(gradients=gradients, seconds=seconds)
    RESULTS.mkdir(exist_ok=True)
    path.write_text(json.dumps({**ref, "loo_i": ref["loo_i"].tolist()}))
    return ref


def run_nuts(problem: str) -> tuple[az.InferenceData, int, float]:
    """NUTS's draws (cached as netCDF), its gradient evaluations and its seconds."""
    path = RESULTS / f"minibatch_noise_nuts_{problem}.nc"
    if path.exists():
        idata = az.from_netcdf(path)
        return idata, int(idata.attrs["gradients"]), float(idata.attrs["seconds"])
    data, make, _ = PROBLEMS[problem]
    x, y = data()
    count = [0]
    plain = pyro.ops.integrator.potential_grad

    def counted(*args, **kwargs):
        count[0] += 1
        return plain(*args, **kwargs)

    pyro.ops.integrator.potential_grad = counted
    parts, start = [], time.perf_counter()
    try:
        for c in range(CHAINS):
            pyro.set_rng_seed(100 + c)
            model = make(c)
            nuts = NUTS(model, max_tree_depth=8, jit_compile=True, ignore_jit_warnings=True)
            mcmc = MCMC(nuts, num_samples=DRAWS, warmup_steps=WARMUP, disable_progbar=True)
            mcmc.run(x, y)
            parts.append(to_arviz(mcmc, model=make(c), model_args=(x, y)))
    finally:
        pyro.ops.integrator.potential_grad = plain
    seconds = time.perf_counter() - start
    idata = az.concat(*parts, dim="chain")
    idata.attrs["gradients"] = count[0]
    idata.attrs["seconds"] = seconds
    RESULTS.mkdir(exist_ok=True)
    idata.to_netcdf(path)
    return idata, count[0], seconds


def run_sg(problem: str, kernel: str, minibatched: bool, thin: str | int,
           preconditioner: str | None = None, batch_size: int | None = None) -> dict:
    data, make, _ = PROBLEMS[problem]
    x, y = data()
    n = len(y)
    batch = (batch_size or n // 8) if minibatched else None
    pyro.set_rng_seed(0)
    model = make(0)
    extra = {"preconditioner": preconditioner} if preconditioner else {}
    k = KERNELS[kernel](model, subsample_size=batch, num_steps_per_sample=thin,
                        vectorized_chains=CHAINS, **extra)
    mcmc = MCMC(k, num_samples=DRAWS, warmup_steps=WARMUP, disable_progbar=True)
    start = time.perf_counter()
    mcmc.run(x, y)
    seconds = time.perf_counter() - start
    diag = k.diagnostics()
    steps = diag["num_sg_steps"]
    adapt = diag.get("step_size_adaptation", [])
    # warmup extras per chain: power iterations (two gradients each) and noise minibatches
    extras = sum(2 * 30 for _ in adapt) + (32 * 4 if minibatched else 0) * (batch or n) / n
    noise = diag.get("gradient_noise", {})
    return {"idata": to_arviz(mcmc, model=make(0), model_args=(x, y)), "seconds": seconds,
            "gradients": CHAINS * (GRADIENTS_PER_STEP.get(kernel, 1) * steps * (batch or n) / n
                                   + extras),
            "thin": diag.get("num_steps_per_sample", thin),
            "step_size": adapt[-1]["step_size"] if adapt else k.step_size,
            "temperature_excess": noise.get("temperature_excess", 0.0),
            "noise_ratio": noise.get("noise_ratio", 0.0),
            "friction": noise.get("friction")}


def scores(idata: az.InferenceData, site: str) -> dict:
    scale = np.asarray(idata.posterior[site]).reshape(idata.posterior.sizes["chain"], -1)
    ess = float(az.ess(scale, method="bulk"))
    mcse = float(az.mcse(scale, method="mean"))
    loo = az.loo(idata, pointwise=True)
    return {"loo_i": np.asarray(loo.loo_i).ravel(), "noise_mean": float(scale.mean()),
            "noise_mcse": mcse, "ess_share": ess / scale.size}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--problems", nargs="+", default=list(PROBLEMS), choices=PROBLEMS)
    parser.add_argument("--kernels", nargs="+", default=[k for k, v in KERNELS.items() if v],
                        choices=[k for k, v in KERNELS.items() if v])
    parser.add_argument("--modes", nargs="+", default=["full", "minibatch"],
                        choices=["full", "minibatch"])
    parser.add_argument("--nuts-only", action="store_true", help="only NUTS's reference")
    parser.add_argument("--thin", default="auto", type=lambda v: v if v == "auto" else int(v))
    parser.add_argument("--preconditioner", default=None, choices=[None, "diag"],
                        help="also learn a diagonal metric in warmup (SGLD, SGHMC, ContourSGLD)")
    parser.add_argument("--batch", type=int, default=None,
                        help="the minibatch size (default N // 8)")
    parser.add_argument("--before", action="store_true",
                        help="warmup as before issue 31: no minibatch noise measured, so the "
                             "step from the curvature alone and SGHMC without its correction")
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    if args.before:
        from pyro_flat.infer.mcmc.warmup import Warmup

        Warmup.measure_noise = lambda self: None
    path = RESULTS / "minibatch_noise.json"
    rows = json.loads(path.read_text())["rows"] if path.exists() else []
    for problem in args.problems:
        site = PROBLEMS[problem][2]
        ref = nuts_reference(problem)
        nuts_grads, nuts_seconds = ref["gradients"], ref["seconds"]
        if args.nuts_only:
            continue
        for kernel in args.kernels:
            for mode in args.modes:
                r = run_sg(problem, kernel, mode == "minibatch", args.thin,
                           args.preconditioner, args.batch)
                s = scores(r["idata"], site)
                d = s["loo_i"] - ref["loo_i"]
                diff, dse = float(d.sum()), float(math.sqrt(len(d) * np.var(d)))
                z = (s["noise_mean"] - ref["noise_mean"]) / math.hypot(s["noise_mcse"],
                                                                        ref["noise_mcse"])
                row = {"problem": problem, "kernel": kernel, "mode": mode,
                       "thin_arg": str(args.thin),
                       "preconditioner": args.preconditioner or "none",
                       "batch": (args.batch or len(ref["loo_i"]) // 8) if mode == "minibatch"
                       else "N", "warmup": "before" if args.before else "noise-aware",
                       "elpd_diff": diff, "dse": dse,
                       "within_2_dse": abs(diff) <= 2 * dse, "noise_mean": s["noise_mean"],
                       "nuts_noise_mean": ref["noise_mean"], "noise_z": z,
                       "ess_share": s["ess_share"], "nuts_ess_share": ref["ess_share"],
                       "thin": r["thin"], "step_size": r["step_size"],
                       "temperature_excess": r["temperature_excess"],
                       "noise_ratio": r["noise_ratio"], "friction": r["friction"],
                       "gradients": r["gradients"], "nuts_gradients": nuts_grads,
                       "seconds": r["seconds"], "nuts_seconds": nuts_seconds,
                       "loo_i": [round(float(v), 5) for v in s["loo_i"]]}
                print(json.dumps({k: v for k, v in row.items() if k != "loo_i"}), flush=True)
                rows = [x for x in rows if key(x) != key(row)] + [row]
                write(rows)


def key(row: dict) -> tuple:
    """The settings that identify a row (a rerun replaces the row of the same key)."""
    return (row["problem"], row["kernel"], row["mode"], row["thin_arg"],
            row.get("preconditioner", "none"), str(row.get("batch", "")),
            row.get("warmup", "noise-aware"))


def to_full_batch(row: dict, rows: list[dict]) -> str:
    """A minibatched row's elpd_loo minus the same kernel's full-batch one, with the standard
    error of the pointwise difference where both rows hold their pointwise values."""
    full = [x for x in rows if x["mode"] == "full" and all(
        x.get(k) == row.get(k) for k in ("problem", "kernel", "thin_arg", "preconditioner"))]
    if row["mode"] == "full" or not full:
        return ""
    if "loo_i" not in row or "loo_i" not in full[0]:  # the sum is exact, the error needs both
        return f"{row['elpd_diff'] - full[0]['elpd_diff']:+.1f}"
    d = np.asarray(row["loo_i"]) - np.asarray(full[0]["loo_i"])
    return f"{d.sum():+.1f} ({math.sqrt(len(d) * d.var()):.1f})"


def write(rows: list[dict]) -> None:
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "minibatch_noise.json").write_text(json.dumps({"rows": rows}, indent=1))
    head = ("| problem | kernel | data | B | warmup | thinning | metric | "
            "elpd diff to NUTS (dse) | within 2 dse | to full batch (dse) | "
            "noise scale (NUTS) | z | noise ESS / draws (NUTS) | excess T | "
            "SG steps per draw | gradients (NUTS) |")
    lines = [head, "|" + "---|" * 16]
    for r in sorted(rows, key=key):
        lines.append(
            f"| {r['problem']} | {r['kernel']} | {r['mode']} | {r.get('batch', '')} | "
            f"{r.get('warmup', 'noise-aware')} | {r['thin_arg']} | "
            f"{r.get('preconditioner', 'none')} | "
            f"{r['elpd_diff']:+.1f} ({r['dse']:.1f}) | {r['within_2_dse']} | "
            f"{to_full_batch(r, rows)} | "
            f"{r['noise_mean']:.3f} ({r['nuts_noise_mean']:.3f}) | {r['noise_z']:+.1f} | "
            f"{r['ess_share']:.2f} ({r['nuts_ess_share']:.2f}) | "
            f"{100 * r['temperature_excess']:.0f}% | {r['thin']} | "
            f"{r['gradients']:.0f} ({r['nuts_gradients']}) |")
    text = "\n".join(lines)
    print(text)
    (RESULTS / "minibatch_noise.md").write_text(
        "# SG kernels with their defaults against NUTS, full batch and minibatched\n\n"
        "Rows from `python benchmarks/minibatch_noise.py` (4 chains, 300 warmup + 400 draws; "
        "minibatched: `subsample_size = N // 8`). z: the noise scale's mean minus NUTS's in "
        "units of their joint Monte Carlo standard error. Gradients: full-data gradient "
        "evaluations (a minibatch gradient counts B/N), all chains.\n\n" + text + "\n")


if __name__ == "__main__":
    main()
