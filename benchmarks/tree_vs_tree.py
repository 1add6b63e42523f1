"""Per-step time of the same kernels in two source trees, side by side (a refactor must not slow
the chain).

Each round runs every workload once with the old tree and once with the new one, each in a
fresh process (``PYTHONPATH`` set to the tree, one torch thread), in alternating order; the
ratio new / old of each round's per-step times is reported as the median and range over the
rounds. Workloads, all through ``pyro.infer.MCMC`` with SGLD at a fixed step:

* ``mlp``: ``BNN`` of a 784-100-100-10 MLP, ``Categorical``, ``subsample_size=128``, 10,000
  random points, 10 SG steps per draw (the model's own cost dominates);
* ``small``: a 1-8-1 tanh regression ``BNN`` with learned noise on 160 points, full batch, 10
  steps per draw (the per-step overhead dominates);
* ``small_k4``: the same with ``vectorized_chains=4``;
* ``small_thin1``: the same single chain with one SG step per draw (the per-draw work);
* ``small_sasgld``, ``small_sasgld_k4``: ``small`` and ``small_k4`` with SASGLD (``rho=0.05``),
  whose sharpness-aware gradient takes two passes a step.

Run
---
    git worktree add /tmp/old HEAD      # or any checkout of the old tree
    python benchmarks/tree_vs_tree.py --old /tmp/old --new . --rounds 5

Results go to ``benchmarks/results/tree_vs_tree.{json,md}`` (``--out``).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

WORKLOAD = r"""
import sys, time, torch, pyro
from pyro.infer import MCMC
torch.set_num_threads(1)
from pyro_flat.infer import SASGLD, SGLD
try:  # the layout of either tree: pyro_flat.models since issue 33's grouping, top level before
    from pyro_flat.models.bnn import BNN
    from pyro_flat.models.likelihoods import Categorical, HomoskedasticGaussian
except ImportError:
    from pyro_flat.bnn import BNN
    from pyro_flat.likelihoods import Categorical, HomoskedasticGaussian
name, steps = sys.argv[1], int(sys.argv[2])
pyro.set_rng_seed(0)
if name == "mlp":
    x, y = torch.randn(10_000, 784), torch.randint(0, 10, (10_000,))
    net = torch.nn.Sequential(torch.nn.Linear(784, 100), torch.nn.ReLU(), torch.nn.Linear(100, 100),
                              torch.nn.ReLU(), torch.nn.Linear(100, 10))
    model, kw, thin = BNN(net, Categorical(), subsample_size=128), {}, 10
else:
    x = torch.linspace(-2, 2, 160).unsqueeze(-1)
    y = torch.sin(2 * x).squeeze(-1) + 0.1 * torch.randn(160)
    net = torch.nn.Sequential(torch.nn.Linear(1, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))
    model = BNN(net, HomoskedasticGaussian())
    kw = {"vectorized_chains": 4} if name.endswith("k4") else {}
    thin = 1 if name == "small_thin1" else 10
def run(draws):
    if name.startswith("small_sasgld"):  # two passes a step (the sharpness-aware gradient)
        kernel = SASGLD(model, step_size=1e-5, rho=0.05, num_steps_per_sample=thin, **kw)
    else:
        kernel = SGLD(model, step_size=1e-5, num_steps_per_sample=thin, **kw)
    mcmc = MCMC(kernel, num_samples=draws, warmup_steps=0, disable_progbar=True)
    start = time.perf_counter()
    mcmc.run(x, y)
    return time.perf_counter() - start
run(2)  # imports and first-call costs
one = run(1)
total = run(steps // thin)
print((total - one) / (steps - thin))
"""

WORKLOADS = ("mlp", "small", "small_k4", "small_thin1", "small_sasgld", "small_sasgld_k4")
STEPS = {"mlp": 300, "small": 3000, "small_k4": 3000, "small_thin1": 1500, "small_sasgld": 2000,
         "small_sasgld_k4": 2000}


def per_step(tree: Path, name: str, steps: int) -> float:
    env = {**os.environ, "PYTHONPATH": str(tree.resolve()), "OMP_NUM_THREADS": "1"}
    out = subprocess.run([sys.executable, "-c", WORKLOAD, name, str(steps)], env=env,
                         capture_output=True, text=True, check=True, cwd=tree)
    return float(out.stdout.strip().splitlines()[-1])


def _revision(tree: Path) -> str:
    """The tree's git commit (``+`` if it has uncommitted changes), if it is a checkout."""
    try:
        head = subprocess.run(["git", "-C", str(tree), "rev-parse", "--short", "HEAD"],
                              capture_output=True, text=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(tree), "status", "--porcelain", "--",
                                "pyro_flat"], capture_output=True, text=True, check=True).stdout
        return f"commit {head}{'+' if dirty.strip() else ''}"
    except (OSError, subprocess.CalledProcessError):
        return "not a git checkout"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--old", type=Path, required=True, help="the old source tree")
    parser.add_argument("--new", type=Path, default=Path("."), help="the new source tree")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--workloads", nargs="+", default=list(WORKLOADS), choices=WORKLOADS)
    parser.add_argument("--scale", type=float, default=1.0, help="multiply the SG steps")
    parser.add_argument("--out", type=Path,
                        default=Path(__file__).parent / "results" / "tree_vs_tree")
    args = parser.parse_args(argv)
    ratios: dict[str, list[float]] = {w: [] for w in args.workloads}
    times: dict[str, dict[str, list[float]]] = {w: {"old": [], "new": []} for w in args.workloads}
    for r in range(args.rounds):
        for w in args.workloads:
            steps = max(20, int(STEPS[w] * args.scale))
            order = ("old", "new") if r % 2 == 0 else ("new", "old")
            t = {side: per_step(getattr(args, side), w, steps) for side in order}
            for side in ("old", "new"):
                times[w][side].append(t[side])
            ratios[w].append(t["new"] / t["old"])
            print(f"round {r}: {w}: old {1e3 * t['old']:.3f} ms, new {1e3 * t['new']:.3f} ms, "
                  f"ratio {t['new'] / t['old']:.3f}", flush=True)
    lines = ["# Per-step time, new tree / old tree", "",
             f"- old: `{args.old}` ({_revision(args.old)}), new: `{args.new}` "
             f"({_revision(args.new)}); {args.rounds} rounds, one torch thread, "
             "a fresh process per measurement, alternating order", "",
             "| workload | old ms/step (median) | new ms/step (median) | ratio median | range |",
             "|---|---:|---:|---:|---:|"]
    for w in args.workloads:
        lines.append(f"| {w} | {1e3 * statistics.median(times[w]['old']):.3f} | "
                     f"{1e3 * statistics.median(times[w]['new']):.3f} | "
                     f"{statistics.median(ratios[w]):.3f} | "
                     f"{min(ratios[w]):.3f}-{max(ratios[w]):.3f} |")
    print("\n".join(lines))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.with_suffix(".md").write_text("\n".join(lines) + "\n")
    args.out.with_suffix(".json").write_text(json.dumps(
        {"old": str(args.old), "new": str(args.new), "times": times, "ratios": ratios},
        indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
