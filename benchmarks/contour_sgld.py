"""ContourSGLD against SGLD: the two toys of ALGORITHMS.md §2 and a BNN on MNIST-1D.

- Toy A (the nine-mode 2-D energy, the author's settings: eps = 1e-3, T = 1, zeta = 0.75,
  100 bins over [-7.6655, 17.3333], omega0 = 3e-3, energy and gradient noise 0.32, moves
  leaving [-2.5, 2.5]^2 rejected): 64 chains from (2, 2), the start of the author's demo. Modes
  found (distinct mode cells visited, mean over chains) after 1,000 / 10,000 / all gradient
  evaluations; the error of the estimates of P(central cell) (truth 0.3072) and E[x1^2] by
  quadrature: ContourSGLD reweighted (each chain self-normalised, chains averaged; and all
  draws pooled, ``reweight`` without ``chain_dim``), SGLD plain averages. Draws after the first
  third of the run. The weights' effective sample size (``weights_ess``) per chain, median
  over chains, of those draws.
- Toy B (the 1-D mixture posterior at T = 50, N = 1000, batch 100; settings of
  ``tests/infer/mcmc/test_contour.py``: 48 bins of width 80 from 3,840, zeta = 20,
  sa_power = 1, omega0 = 0.01, box [-40, 60]): 32 chains from the left mode; estimates from
  the draws after the first 15,000 steps. Chains that reached the right mode, the mean
  gradient evaluations to the first crossing, and the error of P(left mode) (truth 0.5), per
  chain and pooled as for toy A; the median weights' ESS per chain.
- MNIST-1D: the MLP and settings of ``pyro-flat compare`` (in-100-100-10, batch 128, lr 0.2,
  prior scale 3 with the fan-in rule), the same number of SG steps for both; ContourSGLD with
  ``auto_bins`` (bins from the warmup energies), 50 bins, zeta = 0.5 (the paper's gain), the
  multiplier clipped to [-5, 5]; the model average weighted by the draws' importance weights.
  Accuracy, NLL, ECE on the test set, mean ± sd over seeds; ContourSGLD's weights' ESS (of 12)
  per seed.

Every kernel runs through ``pyro.infer.MCMC``; the toys use ``vectorized_chains`` (one potential
call for all chains) for ContourSGLD and the summed potential for SGLD.

Run::

    .venv/bin/python benchmarks/contour_sgld.py            # about 10 minutes on one core
    .venv/bin/python benchmarks/contour_sgld.py --quick    # a smoke run

It prints Markdown tables and writes ``benchmarks/results/contour_sgld.{json,md}``.
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import statistics
import sys
import time
from pathlib import Path

import pyro
import torch
from pyro.infer import MCMC

sys.path.insert(0, str(Path(__file__).parents[1] / "tests"))
sys.path.insert(0, str(Path(__file__).parents[1] / "tests" / "infer" / "mcmc"))
import test_contour as toys  # noqa: E402  (the toy potentials and their quadrature truths)

from pyro_flat import sample_stats
from pyro_flat.cli import Settings, build_mlp  # noqa: E402
from pyro_flat.datasets import load_dataset  # noqa: E402
from pyro_flat.evaluation import classification  # noqa: E402
from pyro_flat.evaluation.predictive import bma_probs  # noqa: E402
from pyro_flat.infer import SGLD, ContourSGLD, reweight  # noqa: E402
from pyro_flat.infer.mcmc.contour import weights_ess  # noqa: E402
from pyro_flat.models.bnn import BNN  # noqa: E402
from pyro_flat.models.likelihoods import Categorical  # noqa: E402
from pyro_flat.models.nn import make_bayesian  # noqa: E402

THIN = 10


def run(kernel, num_draws: int, *args) -> tuple[MCMC, float]:
    start = time.perf_counter()
    mcmc = MCMC(kernel, num_samples=num_draws, warmup_steps=0, disable_progbar=True)
    mcmc.run(*args)
    return mcmc, time.perf_counter() - start


def estimate(values: torch.Tensor, lw: torch.Tensor | None, pooled: bool = False) -> float:
    """Mean over chains of each chain's (reweighted) average, or (``pooled``) the reweighted
    average of all draws; values (draws, chains)."""
    if lw is None:
        return float(values.double().mean())
    return float(reweight(values, lw) if pooled else reweight(values, lw, chain_dim=1))


def median_ess(lw: torch.Tensor | None) -> float | None:
    """The median over chains of the weights' ESS of each chain; lw (draws, chains)."""
    return None if lw is None else float(weights_ess(lw).median())


def toy_a(steps: int, chains: int, seed: int) -> list[dict]:
    t = torch.linspace(-2.5, 2.5, 801, dtype=torch.float64)
    grid = torch.stack(torch.meshgrid(t, t, indexing="ij"), -1)
    w = torch.exp(-toys.toy_a_energy_and_grad(grid)[0])
    truth = {"P(central)": toys.toy_a_truth()[0],
             "E[x1^2]": float((w * grid[..., 0] ** 2).sum() / w.sum())}
    start = {"x": torch.full((chains, 2), 2.0, dtype=torch.float64)}
    rows = []
    for method in ("SGLD", "ContourSGLD"):
        pyro.set_rng_seed(seed)
        if method == "SGLD":
            kernel = SGLD(potential_fn=lambda p: toys.toy_a_potential_chains(p).sum(),
                          initial_params=start, step_size=1e-3, num_steps_per_sample=THIN)
            kernel.update = _with_bounds(kernel, (-2.5, 2.5))
        else:
            kernel = ContourSGLD(potential_fn=toys.toy_a_potential_chains, initial_params=start,
                                 step_size=1e-3, zeta=0.75, omega0=3e-3, bounds=(-2.5, 2.5),
                                 vectorized_chains=chains, num_steps_per_sample=THIN,
                                 **toys.TOY_A_BINS)
        mcmc, seconds = run(kernel, steps // THIN)
        x = mcmc.get_samples()["x"]  # (draws, chains, 2)
        cells = toys.toy_a_cell(x)
        found = {}
        for budget in (1_000, 10_000, steps):
            c = cells[: budget // THIN]
            found[budget] = statistics.fmean(c[:, k].unique().numel() for k in range(chains))
        keep = slice(len(x) // 3, None)
        lw = None
        if method == "ContourSGLD":
            lw = sample_stats(mcmc, group_by_chain=True)["log_weight"].T[keep]  # (draws, chains)
        central = (x[keep].abs() < 1 / 1.2).all(-1)
        est = {"P(central)": estimate(central, lw), "E[x1^2]": estimate(x[keep, :, 0] ** 2, lw)}
        pooled = {"P(central)": estimate(central, lw, True),
                  "E[x1^2]": estimate(x[keep, :, 0] ** 2, lw, True)}
        rows.append({"method": method, "modes_found": found, "estimates": est, "truth": truth,
                     "abs_error": {k: abs(est[k] - truth[k]) for k in est},
                     "pooled": pooled,
                     "pooled_abs_error": {k: abs(pooled[k] - truth[k]) for k in pooled},
                     "weights_ess_median": median_ess(lw), "draws_per_chain": len(central),
                     "wall_time_s": seconds})
    return rows


def _with_bounds(kernel: SGLD, bounds: tuple[float, float]):
    """SGLD with the author's box: a move leaving it is rejected (per chain)."""
    update = kernel.update

    def bounded(state, estimate, step_size):
        z = state.position
        before = z.clone()
        update(state, estimate, step_size)
        outside = ((z < bounds[0]) | (z > bounds[1])).reshape(-1, 2).any(1)
        z.view(-1, 2)[outside] = before.view(-1, 2)[outside]

    return bounded


def toy_b(steps: int, chains: int, seed: int) -> list[dict]:
    start = {"theta": torch.full((chains,), -5.0, dtype=torch.float64)}
    kw = dict(toys.TOY_B_KW, vectorized_chains=chains)
    rows = []
    for method in ("SGLD", "ContourSGLD"):
        pyro.set_rng_seed(seed)
        if method == "SGLD":
            kernel = SGLD(potential_fn=lambda p: toys.toy_b_potential(p).sum(),
                          initial_params=start, step_size=1e-3, temperature=toys.TOY_B_T,
                          num_steps_per_sample=THIN)
        else:
            kernel = ContourSGLD(potential_fn=toys.toy_b_potential, initial_params=start,
                                 num_steps_per_sample=THIN, **kw)
        mcmc, seconds = run(kernel, steps // THIN)
        theta = mcmc.get_samples()["theta"]  # (draws, chains)
        right = theta > 10
        crossed = right.any(0)
        first = [THIN * (int(right[:, k].nonzero()[0]) + 1) for k in range(chains)
                 if crossed[k]]
        keep = slice(len(theta) * 3 // 8, None)
        lw = None
        if method == "ContourSGLD":
            lw = sample_stats(mcmc, group_by_chain=True)["log_weight"].T[keep]  # (draws, chains)
        p_left = estimate(~right[keep], lw)
        pooled = estimate(~right[keep], lw, True)
        rows.append({"method": method, "chains_crossed": int(crossed.sum()), "chains": chains,
                     "mean_steps_to_first_crossing": statistics.fmean(first) if first else None,
                     "P(left)": p_left, "abs_error": abs(p_left - 0.5),
                     "P(left) pooled": pooled, "pooled_abs_error": abs(pooled - 0.5),
                     "weights_ess_median": median_ess(lw),
                     "draws_per_chain": int(right[keep].shape[0]), "wall_time_s": seconds})
    return rows


def bnn(steps: int, seed: int, kept: int = 12, warmup: int = 4) -> list[dict]:
    settings = Settings()
    data = load_dataset("mnist1d", seed=0)
    rows = []
    for method in ("SGLD", "ContourSGLD"):
        pyro.clear_param_store()
        pyro.set_rng_seed(seed)
        net = build_mlp(data.input_shape[0], data.num_classes, settings.hidden)
        net = make_bayesian(net, prior_scale=settings.prior_scale,
                            scale_rule=settings.scale_rule)
        model = BNN(net, Categorical(), subsample_size=settings.batch_size)
        eps = settings.lr / data.num_train
        thin = steps // (kept + warmup)
        if method == "SGLD":
            kernel = SGLD(model, step_size=eps, num_steps_per_sample=thin)
        else:
            kernel = ContourSGLD(model, step_size=eps, num_steps_per_sample=thin, num_bins=50,
                                 auto_bins=True, zeta=0.5, multiplier_clip=(-5.0, 5.0))
        start = time.perf_counter()
        mcmc = MCMC(kernel, num_samples=kept, warmup_steps=warmup, disable_progbar=True)
        mcmc.run(data.x_train, data.y_train)
        seconds = time.perf_counter() - start
        probs, per_draw = bma_probs(net, mcmc.get_samples(), data.x_test, return_per_draw=True)
        ess = None
        if method == "ContourSGLD":
            probs = reweight(per_draw, sample_stats(mcmc)["log_weight"])
            ess = float(weights_ess(sample_stats(mcmc)["log_weight"]))
        rows.append({"method": method, "seed": seed, "weights_ess": ess,
                     "accuracy": classification.accuracy(probs, data.y_test),
                     "nll": classification.nll(probs, data.y_test),
                     "ece": classification.ece(probs, data.y_test),
                     "grad_evals": kernel.num_steps, "wall_time_s": seconds})
    return rows


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="short runs, one seed")
    parser.add_argument("--seeds", type=int, default=3, help="seeds of the BNN runs")
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    quick = args.quick
    a_steps, b_steps, bnn_steps = (3_000, 3_000, 320) if quick else (30_000, 40_000, 12_000)
    seeds = range(1 if quick else args.seeds)
    report = {"command": " ".join(["python", *sys.argv]), "date":
              datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
              "torch": torch.__version__, "pyro": pyro.__version__}
    tables = []

    report["toy_a"] = rows = toy_a(a_steps, 64, 0)
    lines = [f"### Toy A: 64 chains from (2, 2), {a_steps} gradient evaluations each, seed 0", "",
             "| method | modes found @1k | @10k | @all | P(central) (error) | E[x1^2] (error) "
             "| pooled: P(central) (error) | E[x1^2] (error) | weights ESS per chain (median) "
             "| wall s |", "|---|---:|---:|---:|---|---|---|---|---:|---:|"]
    for r in rows:
        f, e, err = r["modes_found"], r["estimates"], r["abs_error"]
        pe, perr, ess = r["pooled"], r["pooled_abs_error"], r["weights_ess_median"]
        lines.append(f"| {r['method']} | " + " | ".join(f"{v:.2f}" for v in f.values())
                     + f" | {e['P(central)']:.3f} ({err['P(central)']:.3f}) | "
                     f"{e['E[x1^2]']:.3f} ({err['E[x1^2]']:.3f}) | "
                     + ("- | - | - | " if ess is None else
                        f"{pe['P(central)']:.3f} ({perr['P(central)']:.3f}) | "
                        f"{pe['E[x1^2]']:.3f} ({perr['E[x1^2]']:.3f}) | "
                        f"{ess:.1f} of {r['draws_per_chain']} | ")
                     + f"{r['wall_time_s']:.1f} |")
    lines.append(f"\nTruth by quadrature: P(central) {rows[0]['truth']['P(central)']:.4f}, "
                 f"E[x1^2] {rows[0]['truth']['E[x1^2]']:.4f}.")
    tables.append("\n".join(lines))
    print(tables[-1], "\n", flush=True)

    report["toy_b"] = rows = toy_b(b_steps, 32, 0)
    lines = [f"### Toy B: 32 chains from the left mode, {b_steps} gradient evaluations each, "
             "seed 0", "", "| method | chains that reached the right mode | mean steps to "
             "the first crossing | P(left) (error; truth 0.5) | pooled | weights ESS per "
             "chain (median) | wall s |", "|---|---:|---:|---|---|---|---:|"]
    for r in rows:
        first, ess = r["mean_steps_to_first_crossing"], r["weights_ess_median"]
        lines.append(f"| {r['method']} | {r['chains_crossed']} / {r['chains']} | "
                     f"{'-' if first is None else f'{first:.0f}'} | {r['P(left)']:.3f} "
                     f"({r['abs_error']:.3f}) | "
                     + ("- | - | " if ess is None else
                        f"{r['P(left) pooled']:.3f} ({r['pooled_abs_error']:.3f}) | "
                        f"{ess:.1f} of {r['draws_per_chain']} | ")
                     + f"{r['wall_time_s']:.1f} |")
    tables.append("\n".join(lines))
    print(tables[-1], "\n", flush=True)

    runs = [r for s in seeds for r in bnn(bnn_steps, s)]
    report["mnist1d"] = runs
    lines = [f"### MNIST-1D MLP: {bnn_steps} SG steps (gradients) per method, 12 kept draws "
             f"after 4 warmup draws, seeds {list(seeds)}", "",
             "| method | accuracy | NLL | ECE | wall s |", "|---|---|---|---|---:|"]
    for method in ("SGLD", "ContourSGLD"):
        group = [r for r in runs if r["method"] == method]
        cells = []
        for key in ("accuracy", "nll", "ece", "wall_time_s"):
            v = [r[key] for r in group]
            sd = statistics.stdev(v) if len(v) > 1 else 0.0
            cells.append(f"{statistics.fmean(v):.1f}" if key == "wall_time_s"
                         else f"{statistics.fmean(v):.4f} ± {sd:.4f}")
        lines.append(f"| {method} | " + " | ".join(cells) + " |")
    ess = [f"{r['weights_ess']:.2f}" for r in runs if r["weights_ess"] is not None]
    lines.append(f"\nContourSGLD's weights' ESS (of {runs[0].get('kept', 12)} draws) per seed: "
                 f"{', '.join(ess)}.")
    tables.append("\n".join(lines))
    print(tables[-1], "\n", flush=True)

    suffix = "_quick" if quick else ""
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"contour_sgld{suffix}.json").write_text(json.dumps(report, indent=1,
                                                                    default=_json))
    header = (f"# ContourSGLD vs SGLD\n\n- command: `{report['command']}`\n"
              f"- date: {report['date']}; torch {report['torch']}, pyro {report['pyro']}\n\n")
    (args.out / f"contour_sgld{suffix}.md").write_text(header + "\n\n".join(tables) + "\n")


def _json(value):
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return str(value)


if __name__ == "__main__":
    main()
