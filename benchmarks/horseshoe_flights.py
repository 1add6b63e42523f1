"""Underdamped chains thrown by an unstable step on the horseshoe regression, and what the
momentum watch reports (``pyro_flat.infer.mcmc.momentum_watch``).

The conformance matrix's horseshoe logistic regression (200 points, full batch, non-centred:
``beta_j = tau lam_j z_j``) has a top curvature that varies more than tenfold over its typical
set. Each configuration runs 16 vectorised chains (100 warmup draws and 200 draws of 50 SG
steps each), and counts the chains that *flew*: at some draw the held-out log predictive
density per point was below -0.55 (NUTS: -0.419, sd 0.020), i.e. ``tau`` near zero and every
coefficient with it. Beside it: the chains whose momentum the watch read as hot, the largest
momentum in sds, whether the run warned, and the held-out density's sd over all draws against
NUTS's. SGLD at the step it adapts is the overdamped contrast. A friction of ``default`` is
SGHMC's when none is given: 1, until warmup sees a throw, and then the one at which the
momentum decays by 0.1 per step, chosen with the step; the column gives the value in force.

Example::

    python benchmarks/horseshoe_flights.py            # about 8 minutes on one core
"""

from __future__ import annotations

import json
import platform
import sys
import time
import warnings
from pathlib import Path

import numpy as np
import pyro
import torch
from pyro.infer import MCMC

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from conformance import matrix  # noqa: E402
from conformance.reference import load_reference  # noqa: E402

from pyro_flat.infer import SGHMC, SGLD  # noqa: E402

CHAINS, WARMUP, DRAWS, THIN, SEED = 16, 100, 200, 50, 11
#: A draw's held-out log density per point below this is a flight (NUTS: -0.419 +- 0.020).
FLIGHT = -0.55
CONFIGS = (
    ("SGHMC", 0.02, 1.0), ("SGHMC", 0.02, 10.0), ("SGHMC", 0.01, 1.0), ("SGHMC", 0.01, 10.0),
    ("SGHMC", 0.01, 3.0), ("SGHMC", 0.01, 5.0),
    ("SGHMC", None, 1.0), ("SGHMC", None, 13.0), ("SGHMC", None, None), ("SGLD", None, None),
)


def run(kernel_name: str, step: float | None, friction: float | None) -> dict:
    problem = matrix.PROBLEMS["horseshoe"]
    data = problem.data()
    pyro.set_rng_seed(SEED)
    model = problem.build(None)
    common = {"num_steps_per_sample": THIN, "vectorized_chains": CHAINS}
    if step is not None:
        common["step_size"] = step
    kernel = (SGHMC(model, friction=friction, **common) if kernel_name == "SGHMC"
              else SGLD(model, **common))
    start = time.perf_counter()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        mcmc = MCMC(kernel, num_samples=DRAWS, warmup_steps=WARMUP, disable_progbar=True)
        mcmc.run(*data.args)
    seconds = time.perf_counter() - start
    draws = matrix._chain_draws(mcmc)
    heldout = matrix.summarize_run(problem, draws)["heldout_lpd"]  # (chains, draws)
    watch = kernel.momentum_watch
    flown = (heldout < FLIGHT).any(axis=1)
    hot = None if watch is None else (watch.hot_draws > 0).cpu().numpy()
    log = mcmc.diagnostics().get("step_size_adaptation", {}).get("chain 0", [])
    return {
        "kernel": kernel_name, "given_step": step, "given_friction": friction,
        "friction": getattr(kernel, "friction", None), "step": kernel.base_step_size,
        "warmup_backoffs": sum("after_hot_momentum" in r for r in log),
        "chains_flown": int(flown.sum()),
        "flown_and_hot": None if watch is None else int((flown & hot).sum()),
        "chains_hot": None if watch is None else int((watch.hot_draws > 0).sum()),
        "largest_sds": None if watch is None else round(float(watch.worst.max()), 1),
        "warned": any("momentum was beyond" in str(w.message) for w in caught),
        "heldout_sd": float(np.std(heldout)), "seconds": round(seconds, 1),
    }


def _friction(row: dict) -> str:
    """The friction column: the given value, or ``default`` and the value in force."""
    if row["friction"] is None:
        return "-"
    if row["given_friction"] is not None:
        return f"{row['given_friction']:g}"
    return f"default ({row['friction']:.3g})"


def main() -> None:
    ref = load_reference()["problems"]["horseshoe"]["statistics"]["heldout_lpd"]
    rows = []
    print(f"{'kernel':6} {'given':>6} {'friction':>16} {'step':>8} {'backoffs':>8} "
          f"{'flown':>5} {'hot':>4} {'both':>4} {'max sds':>7} {'warned':>6} {'heldout sd':>10}")
    for config in CONFIGS:
        r = run(*config)
        rows.append(r)
        print(f"{r['kernel']:6} {r['given_step'] or 'auto':>6} {_friction(r):>16} "
              f"{r['step']:8.4f} {r['warmup_backoffs']:>8} {r['chains_flown']:>3}/{CHAINS} "
              f"{r['chains_hot'] if r['chains_hot'] is not None else '-':>4} "
              f"{r['flown_and_hot'] if r['flown_and_hot'] is not None else '-':>4} "
              f"{r['largest_sds'] if r['largest_sds'] is not None else '-':>7} "
              f"{str(r['warned']):>6} {r['heldout_sd']:10.4f}", flush=True)
    meta = {"machine": platform.processor() or platform.machine(), "torch": torch.__version__,
            "chains": CHAINS, "warmup_draws": WARMUP, "draws": DRAWS, "steps_per_draw": THIN,
            "seed": SEED, "flight_below": FLIGHT, "nuts_heldout_sd": ref["sd"],
            "command": "python benchmarks/horseshoe_flights.py"}
    out = ROOT / "benchmarks" / "results"
    (out / "horseshoe_flights.json").write_text(json.dumps({"meta": meta, "rows": rows},
                                                           indent=1))
    lines = ["# Underdamped chains thrown by an unstable step (horseshoe, full batch)", "",
             f"`{meta['command']}`: {CHAINS} vectorised chains, {WARMUP} warmup draws and "
             f"{DRAWS} draws of {THIN} SG steps, seed {SEED}. *Flown*: chains with a draw "
             f"whose held-out log density per point is below {FLIGHT} (NUTS: "
             f"{ref['mean']:.3f}, sd {ref['sd']:.3f}). *Hot*: chains whose momentum the watch "
             "read beyond its bound; *both*: chains that flew and were read as hot.", "",
             "| kernel | given step | friction | step | warmup back-offs | flown | hot | "
             "flown and hot | largest momentum (sds) | warned | held-out sd |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['kernel']} | {r['given_step'] or 'adapted'} | "
                     f"{_friction(r)} | {r['step']:.4f} | {r['warmup_backoffs']} | "
                     f"{r['chains_flown']}/{CHAINS} | "
                     f"{'-' if r['chains_hot'] is None else r['chains_hot']} | "
                     f"{'-' if r['flown_and_hot'] is None else r['flown_and_hot']} | "
                     f"{'-' if r['largest_sds'] is None else r['largest_sds']} | "
                     f"{r['warned']} | {r['heldout_sd']:.4f} |")
    (out / "horseshoe_flights.md").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
