"""References of the conformance matrix: NUTS (or the exact posterior) on each full-batch model.

For every problem of :mod:`models` this runs ``pyro.infer.NUTS`` on the full-batch model
(``NUTS_SETTINGS``: independent chains one after another, each seeded with its index), reduces
the draws to the problem's summary statistics and stores, per statistic, the posterior mean and
sd, the bulk ESS (ArviZ) and the Monte Carlo standard error ``sd / sqrt(ess)``, with the split
R-hat and NUTS's divergences. Where an exact posterior exists (``Problem.exact``) its mean and
sd replace NUTS's, with a standard error of 0; a problem whose every statistic is exact runs no
NUTS. It also stores ``curvature``: the median over a few NUTS draws of the largest eigenvalue
of the Hessian of the potential (unconstrained space, Pyro's transforms), from which the matrix
derives the given step sizes.

Regenerate (and commit) ``reference.json`` with::

    .venv/bin/python tests/conformance/reference.py             # every problem
    .venv/bin/python tests/conformance/reference.py linreg cnn  # some, the others kept
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
import warnings
from pathlib import Path
from typing import Any

import arviz as az
import numpy as np
import pyro
import torch
from pyro.infer import MCMC, NUTS
from pyro.infer.mcmc.util import initialize_model

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from conformance.models import PROBLEMS, Problem  # noqa: E402
from pyro_flat.evaluation.flatness import hessian_top_eigenvalue  # noqa: E402

REFERENCE_PATH = Path(__file__).with_name("reference.json")
#: NUTS as run for every reference (JIT-compiled potential, diagonal mass matrix).
NUTS_SETTINGS: dict[str, Any] = {"num_chains": 2, "warmup_steps": 300, "num_samples": 400,
                                 "target_accept_prob": 0.9, "max_tree_depth": 7}
#: NUTS draws (spread over the chains) at which the curvature is measured.
CURVATURE_DRAWS = 5


def load_reference(path: Path = REFERENCE_PATH) -> dict[str, Any]:
    """The cached references (``{"problems": {name: ...}}``); empty if none were made."""
    if not path.exists():
        return {"problems": {}}
    return json.loads(path.read_text())


def summarize_chains(per_chain: list[dict[str, np.ndarray]]) -> dict[str, dict[str, float]]:
    """Mean, sd, bulk ESS, the Monte Carlo standard errors of the mean (``se``) and of the sd
    (``sd_se``, from the ESS of the squared deviations) and R-hat of each statistic, from
    per-chain draws (each ``{statistic: (draws,)}``)."""
    from conformance.matrix import moments

    out = {}
    for name in per_chain[0]:
        x = np.stack([c[name] for c in per_chain])  # (chains, draws)
        m = moments(x)
        out[name] = {"mean": m.mean, "sd": m.sd, "ess": m.ess, "se": m.se, "sd_se": m.sd_se,
                     "rhat": float(az.rhat(x))}
    return out


def curvature(problem: Problem, draws: list[dict[str, torch.Tensor]]) -> float:
    """Median over ``draws`` of the largest Hessian eigenvalue of the full-batch potential in
    the unconstrained space (Pyro's potential, with the log-Jacobian of its transforms)."""
    data = problem.data()
    model = problem.build(None)
    _, potential_fn, transforms, _ = initialize_model(model, data.args)
    values = []
    for i, draw in enumerate(draws):
        params = {k: transforms[k](v) if k in transforms else v for k, v in draw.items()}
        lam, _ = hessian_top_eigenvalue(potential_fn, params, num_iters=200, tol=1e-4,
                                        generator=torch.Generator().manual_seed(i))
        values.append(abs(lam))
    return float(np.median(values))


def nuts_reference(problem: Problem, settings: dict[str, Any]) -> dict[str, Any]:
    """Run NUTS on the full-batch model and summarise it (see the module docstring)."""
    data = problem.data()
    model = problem.build(None)
    per_chain, divergences, picked = [], 0, []
    start = time.perf_counter()
    for chain in range(settings["num_chains"]):
        pyro.set_rng_seed(chain)
        kernel = NUTS(model, target_accept_prob=settings["target_accept_prob"],
                      max_tree_depth=settings["max_tree_depth"], jit_compile=True,
                      ignore_jit_warnings=True)
        mcmc = MCMC(kernel, num_samples=settings["num_samples"],
                    warmup_steps=settings["warmup_steps"], disable_progbar=True)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            mcmc.run(*data.args)
        draws = mcmc.get_samples()
        divergences += len(mcmc.diagnostics()["divergences"]["chain 0"])
        per_chain.append(problem.summarize(model, draws, data))
        n = settings["num_samples"]
        for i in np.linspace(0, n - 1, math.ceil(CURVATURE_DRAWS / settings["num_chains"]),
                             dtype=int):
            picked.append({k: v[i] for k, v in draws.items()})
    seconds = time.perf_counter() - start
    return {"method": "NUTS", "statistics": summarize_chains(per_chain),
            "divergences": divergences, "seconds": round(seconds, 1),
            "curvature": curvature(problem, picked[:CURVATURE_DRAWS]),
            "settings": dict(settings)}


def exact_curvature(problem: Problem) -> float:
    """The curvature at the posterior of a problem without NUTS draws: at draws of a short
    NUTS run (the Hessian of a conjugate regression is constant)."""
    short = dict(NUTS_SETTINGS, num_chains=1, warmup_steps=50, num_samples=10)
    data = problem.data()
    model = problem.build(None)
    pyro.set_rng_seed(0)
    mcmc = MCMC(NUTS(model, max_tree_depth=short["max_tree_depth"]),
                num_samples=short["num_samples"], warmup_steps=short["warmup_steps"],
                disable_progbar=True)
    mcmc.run(*data.args)
    draws = mcmc.get_samples()
    return curvature(problem, [{k: v[i] for k, v in draws.items()} for i in range(3)])


def make_reference(problem: Problem, settings: dict[str, Any] = NUTS_SETTINGS
                   ) -> dict[str, Any]:
    """The reference of one problem: exact where ``problem.exact`` covers every statistic,
    NUTS otherwise (with the exact values replacing NUTS's where they exist)."""
    data = problem.data()
    exact = problem.exact(data) if problem.exact is not None else {}
    model = problem.build(None)
    probe = problem.summarize(model, _prior_draws(model, data, 2), data)
    if exact and set(probe) <= set(exact):
        ref = {"method": "exact", "curvature": exact_curvature(problem),
               "statistics": {k: {"mean": m, "sd": s, "ess": None, "se": 0.0, "sd_se": 0.0,
                                  "rhat": 1.0} for k, (m, s) in exact.items()}}
    else:
        ref = nuts_reference(problem, settings)
        for k, (m, s) in exact.items():
            ref["statistics"][k] = {"mean": m, "sd": s, "ess": None, "se": 0.0,
                                    "sd_se": 0.0, "rhat": 1.0, "nuts": ref["statistics"][k]}
        if exact:
            ref["method"] = "NUTS and exact (" + ", ".join(sorted(exact)) + ")"
    ref["num_data"] = data.num_data
    return ref


def _prior_draws(model: Any, data: Any, n: int) -> dict[str, torch.Tensor]:
    """``n`` draws of the latent sites from the prior (to list a problem's statistics)."""
    rows = []
    for _ in range(n):
        tr = pyro.poutine.trace(model).get_trace(*data.args)
        rows.append({k: v["value"] for k, v in tr.nodes.items()
                     if v["type"] == "sample" and not v["is_observed"]
                     and not k.startswith("_") and v["fn"].__class__.__name__ != "_Subsample"})
    return {k: torch.stack([r[k] for r in rows]) for k in rows[0]}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("problems", nargs="*", help="default: every problem with a posterior")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    names = args.problems or [n for n, p in PROBLEMS.items()
                              if p.has_posterior and p.reference_of is None]
    reference = load_reference()
    reference.setdefault("problems", {})
    reference["nuts_settings"] = NUTS_SETTINGS
    reference["command"] = "python tests/conformance/reference.py " + " ".join(args.problems)
    for name in names:
        problem = PROBLEMS[name]
        if problem.reference_of is not None:
            raise SystemExit(f"{name} is compared with {problem.reference_of}'s reference")
        ref = make_reference(problem)
        reference["problems"][name] = ref
        worst = max(s["rhat"] for s in ref["statistics"].values())
        print(f"{name}: {ref['method']}, {ref.get('seconds', 0)} s, curvature "
              f"{ref['curvature']:.4g}, divergences {ref.get('divergences', 0)}, "
              f"max R-hat {worst:.3f}", flush=True)
        REFERENCE_PATH.write_text(json.dumps(reference, indent=1, sort_keys=True) + "\n")


if __name__ == "__main__":
    main()
