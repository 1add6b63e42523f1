"""The compiled fast path (``compile=``) against the eager path and the hand-written floor.

What is measured
----------------
For the MLP 784-100-100-10 and the small CNN of ``step_overhead.py`` (batch 128, N = 10,000
random points, one torch thread), the wall time of one SG step, as a ratio to the hand-written
eager SGLD step of ``step_overhead.py`` (the *floor*) timed in the same round:

* ``SGLD eager``: ``MCMC(SGLD(model, compile=False))`` through ``MCMC.run`` (setup, draw
  storage and driver included) at ``--steps-per-draw`` SG steps per draw (default 20);
* ``SGLD compile=True``: the same with the potential and gradient compiled
  (:mod:`pyro_flat.infer.mcmc.compilation`); its first run, before the rounds, compiles (the
  compile time is reported) and the timed runs reuse the process's cached graph;
* ``SGLD compile="auto"``: what the short trial at the start of each run chose (its setup,
  trial included, is part of the time);
* ``steady``: each SGLD variant less a one-draw run of it (setup, the start-of-run check and
  the ``"auto"`` trial), per remaining step;
* ``floor, gradient compiled``: the hand-written step with its potential and gradient compiled
  by ``torch.compile`` (the noise drawn eagerly), for reference.

Rounds alternate the variants so that machine noise hits all of them; each ratio is the median
(and range) over rounds. The draws of ``compile=True`` and ``compile=False`` from the same seed
are compared too (their largest difference, float32: rounding, which a ReLU or max-pool kink
can amplify along the chain; in float64 the two paths agree to 1e-16, ``tests/infer/mcmc/
test_compile.py``). torch's on-disk compile cache is a fresh folder unless ``--warm-cache``, so the
compile time is a cold compile's.

Run
---
    .venv/bin/python benchmarks/compiled_step.py            # a few minutes
    .venv/bin/python benchmarks/compiled_step.py --quick    # smoke run

Results go to ``benchmarks/results/compiled_step.json`` and ``.md`` (``--quick``:
``compiled_step_quick.*``). Project targets: SGLD compiled <= 0.65 of the floor on the MLP;
``"auto"`` never slower than eager on the CNN.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

import pyro
import torch
import torch.nn.functional as F
from pyro.infer import MCMC
from torch.func import functional_call, grad_and_value

sys.path.insert(0, str(Path(__file__).parent))
import step_overhead as so  # noqa: E402

from pyro_flat.infer import SGLD  # noqa: E402

RESULTS = Path(__file__).parent / "results"


class HandCompiledSGLD(so.HandSGLD):
    """The floor with its potential and gradient compiled; the update eager."""

    def __init__(self, *args: object) -> None:
        super().__init__(*args)
        net, scale = self.net, self.scale

        def potential(params: dict, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
            logits = functional_call(net, params, (x,))
            nll = F.cross_entropy(logits, y, reduction="sum")
            return 0.5 * sum(p.square().sum() for p in params.values()) + scale * nll

        self.compiled = torch.compile(grad_and_value(potential), dynamic=False)
        self.plain = {n: p.detach() for n, p in self.params.items()}

    def step(self) -> None:
        ind = self.indices.next()
        grads, _ = self.compiled(self.plain, self.x[ind], self.y[ind])
        with torch.no_grad():
            leaves = list(self.plain.values())
            torch._foreach_add_(leaves, list(grads.values()), alpha=-so.STEP_SIZE)
            for buffer in self.noise:
                buffer.normal_()
            torch._foreach_add_(leaves, self.noise, alpha=(2 * so.STEP_SIZE) ** 0.5)


#: ``--vectorized-chains``: the kernel runs this many chains (``None``: one); its times are per
#: chain-step.
CHAINS: int | None = None


def mcmc_run(model: object, data: tuple, draws: int, thin: int, compile: bool | str
             ) -> tuple[float, MCMC, SGLD]:
    kernel = SGLD(model, step_size=so.STEP_SIZE, num_steps_per_sample=thin, compile=compile,
                  vectorized_chains=CHAINS)
    mcmc = MCMC(kernel, num_samples=draws, warmup_steps=0, disable_progbar=True)
    start = time.perf_counter()
    mcmc.run(*data)
    return (time.perf_counter() - start) / (CHAINS or 1), mcmc, kernel


def measure(network: str, args: argparse.Namespace) -> dict:
    make, shape = so.NETWORKS[network]
    torch.manual_seed(0)
    x, y = so.random_data(shape)
    plain = make()
    hand = so.HandSGLD(plain, x, y, so.EpochIndices(len(x), so.BATCH_SIZE))
    hand_compiled = HandCompiledSGLD(plain, x, y, so.EpochIndices(len(x), so.BATCH_SIZE))
    start = time.perf_counter()
    hand_compiled.step()
    hand_compile_s = time.perf_counter() - start
    net, _ = so.bayesian(make())
    model = so.subsampled_model(net)
    data = (x, y)
    thin, steps = args.steps_per_draw, args.steps
    draws = steps // thin

    # first compiled run: the compilation; and the draws of both paths from one seed
    pyro.set_rng_seed(1)
    _, first, kernel = mcmc_run(model, data, 5, thin, True)
    compile_s = kernel.diagnostics()["compile"]["compile_seconds"]
    pyro.set_rng_seed(1)
    _, eager_first, _ = mcmc_run(model, data, 5, thin, False)
    a, b = first.get_samples(), eager_first.get_samples()
    draw_difference = max(float((a[n] - b[n]).abs().max()) for n in a)

    def floor_loop(stepper: so.HandSGLD) -> Callable[[], float]:
        def run() -> float:
            start = time.perf_counter()
            for _ in range(steps):
                stepper.step()
            return time.perf_counter() - start
        return run

    auto_choices = []

    def sgld(compile: bool | str) -> Callable[[], float]:
        def run() -> float:
            seconds, _, kernel = mcmc_run(model, data, draws, thin, compile)
            if compile == "auto":
                auto_choices.append(kernel.diagnostics()["compile"])
            # steady: less a one-draw run's time (the setup, the trial of "auto" included)
            steady[compile].append((seconds - mcmc_run(model, data, 1, thin, compile)[0])
                                   / (steps - thin))
            return seconds
        return run

    variants: dict[str, Callable[[], float]] = {
        "floor": floor_loop(hand),
        "floor, gradient compiled": floor_loop(hand_compiled),
        "SGLD eager": sgld(False),
        "SGLD compile=True": sgld(True),
        'SGLD compile="auto"': sgld("auto"),
    }
    steady: dict[bool | str, list[float]] = {False: [], True: [], "auto": []}
    times: dict[str, list[float]] = {name: [] for name in variants}
    for _ in range(args.rounds):
        for name, fn in variants.items():
            times[name].append(fn() / steps)
    for compile, name in ((False, "SGLD eager"), (True, "SGLD compile=True"),
                          ("auto", 'SGLD compile="auto"')):
        times[f"{name}, steady (no setup)"] = steady[compile]
    ratios = {name: [t / f for t, f in zip(ts, times["floor"], strict=True)]
              for name, ts in times.items()}
    return {
        "network": network, "steps": steps, "steps_per_draw": thin,
        "floor_ms": 1e3 * statistics.median(times["floor"]),
        "ratios": {n: {"median": statistics.median(r), "min": min(r), "max": max(r)}
                   for n, r in ratios.items()},
        "compile_seconds": compile_s, "hand_compile_seconds": hand_compile_s,
        "auto_used": [c["used"] for c in auto_choices],
        "auto_trial_ratio": [c["compiled_ms"] / c["eager_ms"] if c["eager_ms"] else None
                             for c in auto_choices],
        "max_draw_difference": draw_difference,
    }


def table(results: list[dict]) -> str:
    names = list(results[0]["ratios"])
    lines = ["| step / floor | " + " | ".join(r["network"] for r in results) + " |",
             "|---|" + "---|" * len(results)]
    for name in names:
        cells = [f"{r['ratios'][name]['median']:.2f} ({r['ratios'][name]['min']:.2f}-"
                 f"{r['ratios'][name]['max']:.2f})" for r in results]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    lines.append("| floor (ms per step) | " + " | ".join(f"{r['floor_ms']:.3f}"
                                                      for r in results) + " |")
    lines.append("| compile (s), first run | " + " | ".join(
        f"{r['compile_seconds']:.1f}" for r in results) + " |")
    lines.append('| "auto" kept compiled (runs) | ' + " | ".join(
        f"{sum(r['auto_used'])}/{len(r['auto_used'])}" for r in results) + " |")
    lines.append('| "auto" trial: compiled / eager | ' + " | ".join(
        ", ".join(f"{t:.2f}" for t in r["auto_trial_ratio"] if t is not None)
        for r in results) + " |")
    lines.append("| largest draw difference, compiled vs eager | " + " | ".join(
        f"{r['max_draw_difference']:.1e}" for r in results) + " |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("--steps-per-draw", type=int, default=20)
    parser.add_argument("--networks", nargs="*", default=list(so.NETWORKS))
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--vectorized-chains", type=int, default=None,
                        help="run the kernels with vectorized_chains=K; their times are per "
                             "chain-step (the floors stay one chain)")
    parser.add_argument("--out", default=None, help="results basename (default: compiled_step)")
    parser.add_argument("--warm-cache", action="store_true",
                        help="keep torch's on-disk compile cache (default: a fresh one, so the "
                             "compile time reported is a cold compile's)")
    args = parser.parse_args()
    global CHAINS
    CHAINS = args.vectorized_chains
    if not args.warm_cache:
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = tempfile.mkdtemp(prefix="compiled_step_")
    if args.quick:
        args.rounds, args.steps = 2, 40
    torch.set_num_threads(1)
    results = [measure(n, args) for n in args.networks]
    text = table(results)
    chains = f"; the kernels run {CHAINS} vectorised chains, times per chain-step" if CHAINS \
        else ""
    head = (f"# The compiled step\n\n{platform.processor() or platform.machine()}, one torch "
            f"thread, torch {torch.__version__}, {datetime.now(UTC):%Y-%m-%d}; "
            f"{args.rounds} rounds of {args.steps} SG steps at {args.steps_per_draw} per "
            f"draw; median (range) of the per-round ratios{chains}.\n\n"
            f"Command: `python {' '.join(sys.argv)}`"
            f"\n\n")
    print(text)
    name = args.out or ("compiled_step_quick" if args.quick else "compiled_step")
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / f"{name}.md").write_text(head + text + "\n")
    (RESULTS / f"{name}.json").write_text(json.dumps(results, indent=1) + "\n")


if __name__ == "__main__":
    main()
