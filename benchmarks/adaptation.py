"""Warmup step-size adaptation against NUTS on regression BNNs with learned noise.

Two models, each written with :class:`pyro_flat.models.bnn.BNN`:

* ``diabetes``: scikit-learn's diabetes data (442 points, 10 standardised features,
  standardised target), a 10-50-1 tanh network, ``HomoskedasticGaussian()`` (learned noise
  ``obs_scale``);
* ``hetero``: a 1-D heteroscedastic toy (200 points, ``y = sin(2x) + (0.1 + 0.2|x|) e``), a
  1-50-2 tanh network, ``HeteroskedasticGaussian()`` (the noise scale is the second head; its
  value at ``x = 0`` stands for "the noise scale" in the ESS column).

NUTS (full batch, ``max_tree_depth=8``, JIT-compiled) is the reference. SGLD, SGHMC and
EntropyMCMC are built **without a step size**: warmup chooses it (``preconditioner="diag"``
where the kernel supports it; ``--preconditioner none`` and ``--stability-fraction`` vary the
rule). For each run the table gives the elpd_loo difference to NUTS with its standard error
(``dse``), computed as ``arviz.compare`` does from the two runs' pointwise elpd_loo, the bulk
ESS of the noise scale as a share of the draws, the largest Pareto k, the SG steps per draw and
the adapted step size. Chains run one after another in this process (``--chains``) and are
concatenated along ArviZ's ``chain`` dimension.

NUTS's pointwise elpd_loo is stored in ``results/adaptation_reference.json``, so that the SG
kernels can be run (and re-run with other settings) without repeating NUTS; each invocation
adds or replaces its rows in ``results/adaptation.{json,md}``. The rows of the committed table
come from::

    python benchmarks/adaptation.py --methods NUTS SGLD SGHMC EntropyMCMC   # thin 50, f 0.2
    python benchmarks/adaptation.py --problems hetero --methods SGLD --preconditioner none
    python benchmarks/adaptation.py --problems hetero --methods SGLD --thin 200
    python benchmarks/adaptation.py --problems hetero --methods SGLD --thin 100 \
        --stability-fraction 0.1
    python benchmarks/adaptation.py --problems hetero --methods SGLD --thin 200 \
        --stability-fraction 0.1
    python benchmarks/adaptation.py --problems diabetes --methods SGHMC --thin 250
    python benchmarks/adaptation.py --methods SGHMC --decay-always 0.1   # the ablation below
    python benchmarks/adaptation.py --problems hetero --methods SGHMC --decay-always 0.05

SGHMC's friction column: ``1`` (the default, given or left out: its rows before the damping
after a throw ran at friction 1, and none of these runs sees a throw), ``default`` (left
out), or ``decay a always``: an ablation that makes the friction follow a momentum decay of
``a`` per step from warmup's first estimate on (as warmup does after a throw), the value
chosen per chain in brackets.
    python benchmarks/adaptation.py --problems diabetes --methods SGLD --thin 1000

(``--cache DIR`` keeps each run's draws as netCDF and reuses them). NUTS takes about 12 minutes
per problem on one core, an SG run of 2 x 1,000 draws at 50 steps per draw two to three
minutes. ``--quick`` is a smoke run.
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
import torch
from pyro.infer import MCMC, NUTS
from sklearn.datasets import load_diabetes

from pyro_flat.draws.export import to_arviz
from pyro_flat.infer import SGHMC, SGLD, EntropyMCMC
from pyro_flat.infer.mcmc import friction as friction_module
from pyro_flat.models.bnn import BNN
from pyro_flat.models.likelihoods import HeteroskedasticGaussian, HomoskedasticGaussian

RESULTS = Path(__file__).parent / "results"
#: SG steps per draw of the SG kernels by default (``--thin``; NUTS draws are one trajectory
#: each).
THIN = 50
METHODS = ["NUTS", "SGLD", "SGHMC", "EntropyMCMC"]


def diabetes() -> tuple[torch.Tensor, torch.Tensor]:
    x, y = load_diabetes(return_X_y=True)
    x = (x - x.mean(0)) / x.std(0)
    y = (y - y.mean()) / y.std()
    return torch.tensor(x, dtype=torch.float32), torch.tensor(y, dtype=torch.float32)


def hetero(n: int = 200) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    x = torch.rand(n, 1, generator=g) * 6 - 3
    scale = 0.1 + 0.2 * x.abs().squeeze(1)
    y = torch.sin(2 * x).squeeze(1) + scale * torch.randn(n, generator=g)
    return x, y


PROBLEMS = {
    "diabetes": (diabetes, 10, 1, HomoskedasticGaussian),
    "hetero": (hetero, 1, 2, HeteroskedasticGaussian),
}


def build(problem: str, seed: int, subsample_size: int | None) -> BNN:
    _, d_in, d_out, likelihood = PROBLEMS[problem]
    torch.manual_seed(seed)
    net = torch.nn.Sequential(torch.nn.Linear(d_in, 50), torch.nn.Tanh(),
                              torch.nn.Linear(50, d_out))
    return BNN(net, likelihood(), prior_scale=1.0, subsample_size=subsample_size)


def kernel_for(method: str, model: BNN, thin: int, fraction: float = 0.2,
               preconditioner: str | None = "diag", friction: float | None = None,
               decay_always: float | None = None):
    if method == "NUTS":
        return NUTS(model, max_tree_depth=8, jit_compile=True, ignore_jit_warnings=True)
    if method == "SGLD":
        return SGLD(model, preconditioner=preconditioner, num_steps_per_sample=thin,
                    stability_fraction=fraction)
    if method == "SGHMC":
        kernel = SGHMC(model, preconditioner=preconditioner, num_steps_per_sample=thin,
                       stability_fraction=fraction, friction=friction)
        if decay_always is not None:  # the ablation: damped from the first estimate on
            friction_module.MOMENTUM_DECAY = decay_always
            kernel.noise_fit.damped = True
        return kernel
    if method == "EntropyMCMC":
        return EntropyMCMC(model, eta=0.1, num_steps_per_sample=thin, stability_fraction=fraction)
    raise ValueError(method)


def noise_scale(problem: str, model: BNN, idata, x: torch.Tensor) -> np.ndarray:
    """The noise scale per (chain, draw): ``obs_scale``, or the second head at x = 0."""
    post = idata.posterior
    if problem == "diabetes":
        return np.asarray(post["obs_scale"])
    chains, draws = post.sizes["chain"], post.sizes["draw"]
    samples = {k: torch.as_tensor(np.asarray(post[k])).reshape(chains * draws,
                                                               *post[k].shape[2:])
               for k in post.data_vars}
    x0 = torch.zeros(1, x.shape[1])
    out = []
    for i in range(chains * draws):
        draw = {k: v[i] for k, v in samples.items()}
        f = pyro.poutine.condition(model.net, data=draw)(x0)
        out.append(float(model.likelihood.distribution(f, {}).scale))
    return np.array(out).reshape(chains, draws)


def run(problem: str, method: str, chains: int, warmup: int, draws: int, thin: int,
        subsample_size: int | None, cache: Path | None = None, fraction: float = 0.2,
        preconditioner: str | None = "diag", friction: float | None = None,
        decay_always: float | None = None) -> dict:
    data, *_ = PROBLEMS[problem]
    x, y = data()
    parts, seconds, steps, frictions = [], 0.0, [], []
    stored = None if cache is None else cache / (
        f"{problem}-{method}-{chains}x{draws}" + ("" if method == "NUTS" else f"-thin{thin}")
        + ("" if subsample_size is None else f"-b{subsample_size}")
        + ("" if fraction == 0.2 or method == "NUTS" else f"-f{fraction}")
        + ("" if preconditioner == "diag" or method == "NUTS" else f"-{preconditioner}")
        + ("" if friction is None or method != "SGHMC" else f"-c{friction:g}")
        + ("" if decay_always is None or method != "SGHMC" else f"-a{decay_always:g}") + ".nc")
    if stored is not None and stored.exists():  # e.g. the NUTS reference of an earlier run
        idata = az.from_netcdf(stored)
        seconds = float(idata.attrs.get("seconds", math.nan))
        steps = list(np.atleast_1d(idata.attrs.get("adapted_step_size", [])))
        chains = 0  # nothing to run
    for c in range(chains):
        pyro.set_rng_seed(100 + c)
        model = build(problem, c, None if method == "NUTS" else subsample_size)
        kernel = kernel_for(method, model, thin, fraction, preconditioner, friction,
                            decay_always)
        mcmc = MCMC(kernel, num_samples=draws, warmup_steps=warmup, disable_progbar=True)
        start = time.perf_counter()
        mcmc.run(x, y)
        seconds += time.perf_counter() - start
        if method != "NUTS":
            last = mcmc.diagnostics()["step_size_adaptation"]["chain 0"][-1]
            steps.append(last["step_size"])
            if "friction" in last:
                frictions.append(last["friction"])
        idata = to_arviz(mcmc, model=build(problem, c, None), model_args=(x, y))
        parts.append(idata)
    if parts:
        idata = az.concat(*parts, dim="chain") if len(parts) > 1 else parts[0]
        if stored is not None:
            idata.attrs["seconds"] = seconds
            if steps:
                idata.attrs["adapted_step_size"] = steps
            idata.to_netcdf(stored)
    scale = noise_scale(problem, build(problem, 0, None), idata, x)
    ess = float(az.ess(scale, method="bulk"))
    loo = az.loo(idata, pointwise=True)
    return {"idata": idata, "loo_i": np.asarray(loo.loo_i).ravel(), "ess_noise": ess,
            "ess_share": ess / scale.size,
            "max_k": float(np.max(np.asarray(loo.pareto_k))), "seconds": seconds,
            "step_size": steps, "friction": frictions, "noise_mean": float(scale.mean())}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--problems", nargs="+", default=list(PROBLEMS))
    parser.add_argument("--methods", nargs="+", default=METHODS, choices=METHODS)
    parser.add_argument("--chains", type=int, default=2)
    parser.add_argument("--warmup", type=int, default=500)
    parser.add_argument("--draws", type=int, default=500)
    parser.add_argument("--subsample-size", type=int, default=None,
                        help="minibatch of the SG kernels (default: full batch)")
    parser.add_argument("--cache", type=Path, default=None,
                        help="keep each run's draws here and reuse them (e.g. NUTS's)")
    parser.add_argument("--thin", type=int, default=THIN, help="SG steps per draw")
    parser.add_argument("--stability-fraction", type=float, default=0.2,
                        help="the kernels' stability_fraction (their default: 0.2)")
    parser.add_argument("--preconditioner", default="diag", type=lambda v: None if v == "none"
                        else v, help="'diag' (default) or 'none' (SGLD and SGHMC)")
    parser.add_argument("--friction", type=float, default=None,
                        help="SGHMC's friction (default: its own, a momentum decay of 0.1)")
    parser.add_argument("--decay-always", type=float, default=None,
                        help="SGHMC ablation: the friction of this momentum decay per step from "
                             "warmup's first estimate on")
    parser.add_argument("--threads", type=int, default=1, help="torch threads")
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    if args.quick:
        args.warmup, args.draws, args.chains = 40, 40, 1
    torch.set_num_threads(args.threads)
    rows = []
    for problem in args.problems:
        results = {}
        for method in args.methods:
            results[method] = run(problem, method, args.chains, args.warmup, args.draws,
                                  args.thin, args.subsample_size, args.cache,
                                  args.stability_fraction, args.preconditioner,
                                  args.friction, args.decay_always)
            r = results[method]
            print(f"{problem} {method}: {r['seconds']:.0f} s, ESS share {r['ess_share']:.2f}",
                  flush=True)
        reference = _reference(problem, results, args.quick)
        for method, r in results.items():
            diff, dse = _difference(r["loo_i"], reference)
            rows.append({
                "problem": problem, "method": method,
                "elpd_loo": float(r["loo_i"].sum()),
                "elpd_diff_to_nuts": diff, "dse": dse, "within_2_dse": abs(diff) <= 2 * dse,
                "ess_noise_bulk": r["ess_noise"], "ess_share": r["ess_share"],
                "max_pareto_k": r["max_k"], "noise_scale_mean": r["noise_mean"],
                "adapted_step_size": r["step_size"], "seconds": r["seconds"],
                "friction": (None if method != "SGHMC" else
                             f"decay {args.decay_always:g} always" if args.decay_always
                             else "default" if args.friction is None else args.friction),
                "adapted_friction": r["friction"],
                "chains": args.chains, "warmup": args.warmup, "draws": args.draws,
                "thin": None if method == "NUTS" else args.thin,
                "stability_fraction": None if method == "NUTS" else args.stability_fraction,
                "preconditioner": None if method in ("NUTS", "EntropyMCMC")
                else args.preconditioner or "none",
                "subsample_size": args.subsample_size,
            })
    _write(rows, args)


def _reference(problem: str, results: dict, quick: bool) -> np.ndarray:
    """NUTS's pointwise elpd_loo: from this run (and stored), or as stored by an earlier run."""
    path = RESULTS / ("adaptation_quick_reference.json" if quick else
                      "adaptation_reference.json")
    stored = json.loads(path.read_text()) if path.exists() else {}
    if "NUTS" in results:
        stored[problem] = results["NUTS"]["loo_i"].tolist()
        RESULTS.mkdir(exist_ok=True)
        path.write_text(json.dumps(stored))
    if problem not in stored:
        raise SystemExit(f"no NUTS reference for {problem!r}: run with --methods NUTS first")
    return np.asarray(stored[problem])


def _key(row: dict) -> tuple:
    return (row["problem"], row["method"], row.get("thin"), row.get("subsample_size"),
            row.get("stability_fraction", 0.2), row.get("preconditioner", "diag"),
            row.get("friction"))


def _difference(loo_i: np.ndarray, reference: np.ndarray) -> tuple[float, float]:
    """elpd_loo difference to the reference and its standard error, as ``arviz.compare``."""
    d = loo_i - reference
    return float(d.sum()), float(math.sqrt(len(d) * np.var(d)))


def _write(rows: list[dict], args: argparse.Namespace) -> None:
    RESULTS.mkdir(exist_ok=True)
    settings = {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()}
    name = "adaptation_quick" if args.quick else "adaptation"
    path = RESULTS / f"{name}.json"
    if path.exists():  # keep the rows of the runs not repeated this time
        done = {_key(r) for r in rows}
        kept = [r for r in json.loads(path.read_text())["rows"] if _key(r) not in done]
        rows = sorted(kept + rows, key=lambda r: (r["problem"], METHODS.index(r["method"]),
                                                  r.get("thin") or 0))
    path.write_text(json.dumps({"settings": settings, "rows": rows}, indent=1))
    head = ("| problem | method | elpd_loo | diff to NUTS (dse) | within 2 dse | bulk ESS of "
            "noise / draws | max Pareto k | noise scale | SG steps per draw | fraction | metric | "
            "adapted step | friction | seconds |")
    lines = [head, "|" + "---|" * 14]
    for r in rows:
        steps = ", ".join(f"{s:.2e}" for s in r["adapted_step_size"]) or "NUTS"
        friction = r.get("friction")
        if isinstance(friction, str):
            chosen = ", ".join(f"{c:.3g}" for c in r.get("adapted_friction") or [])
            friction = f"{friction} ({chosen})"
        lines.append(
            f"| {r['problem']} | {r['method']} | {r['elpd_loo']:.1f} | "
            f"{r['elpd_diff_to_nuts']:+.1f} ({r['dse']:.1f}) | {r['within_2_dse']} | "
            f"{r['ess_noise_bulk']:.0f} / {r['ess_share']:.2f} | {r['max_pareto_k']:.2f} | "
            f"{r['noise_scale_mean']:.3f} | {r.get('thin') or '-'} | "
            f"{r.get('stability_fraction') or '-'} | {r.get('preconditioner') or '-'} | {steps} | "
            f"{friction if friction is not None else '-'} | {r['seconds']:.0f} |")
    text = "\n".join(lines)
    print(text)
    (RESULTS / f"{name}.md").write_text(
        "# Warmup step-size adaptation against NUTS\n\n"
        "Rows from `python benchmarks/adaptation.py` (each row's chains, warmup, draws and SG "
        f"steps per draw are in `{name}.json`); the last invocation: {settings}. Adapted step: "
        "the step size warmup chose, per chain; friction: SGHMC's, given, `default` or the "
        "ablation `decay a always` (see the script's docstring), as chosen per chain."
        "\n\n" + text + "\n")


if __name__ == "__main__":
    main()
