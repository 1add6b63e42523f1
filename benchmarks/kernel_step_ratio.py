"""Step time of the flat-seeking kernels relative to an SGLD step of the same model.

Each kernel is set up once on the networks of ``benchmarks/step_overhead.py`` (MLP 784-100-100-10
and a small CNN, batch 128, 10 SG steps per draw) and then drawn from in short interleaved chunks
(``--chunk`` draws of each kernel in turn, the order rotating every round), so that a burst of
load on this shared machine hits all kernels alike; the ratio is the median over rounds of
(kernel time / SGLD time of the same round), for the wall clock, the process CPU time (all
threads) and the CPU time of the main thread. EntropyMCMC draws its guide's noise ahead on a
worker thread when a core is spare (``pyro_flat/infer/mcmc/noise.py``): the main thread's ratio
is then its step time on a machine where that thread has a core of its own, and the process
CPU ratio its step time on a single core, which the row "noise in line" measures directly.
The "total" column is the ratio of the summed times over all rounds (a mean step time), which a
few slow rounds move more than the median. ``--threads`` sets torch's intra-op threads (default
1, which leaves the second core of a 2-core machine spare; ``--threads 2`` is torch's default
there, and then EntropyMCMC draws its noise in line).
The underdamped form of EntropyMCMC is best read against the SGHMC row (same friction, momentum
updates of its own). Issue targets: EntropyMCMC <= 1.1x, SASGLD <= 2.2x (two gradients per
step), ContourSGLD <= 1.1x.

Run::

    .venv/bin/python benchmarks/kernel_step_ratio.py [--rounds 60 --chunk 3 --threads 1 --quick]

It prints a Markdown table and writes ``benchmarks/results/kernel_step_ratio.{json,md}``
(``kernel_step_ratio_threads<N>.*`` for ``--threads N`` other than 1).
"""

from __future__ import annotations

import argparse
import datetime
import gc
import json
import statistics
import sys
import time
from pathlib import Path

import pyro
import torch

sys.path.insert(0, str(Path(__file__).parent))
import step_overhead as so  # noqa: E402

from pyro_flat.infer import SASGLD, SGHMC, SGLD, ContourSGLD, EntropyMCMC  # noqa: E402

STEP = so.STEP_SIZE
KERNELS = {
    "SGLD": lambda m: SGLD(m, step_size=STEP, num_steps_per_sample=so.STEPS_PER_DRAW),
    "EntropyMCMC": lambda m: EntropyMCMC(m, step_size=STEP, eta=STEP / 0.025,
                                         num_steps_per_sample=so.STEPS_PER_DRAW),
    "EntropyMCMC (noise in line)": lambda m: in_line(EntropyMCMC(
        m, step_size=STEP, eta=STEP / 0.025, num_steps_per_sample=so.STEPS_PER_DRAW)),
    # the momentum baseline of the underdamped form (same friction and step)
    "SGHMC": lambda m: SGHMC(m, step_size=STEP, friction=0.1 / STEP,
                             num_steps_per_sample=so.STEPS_PER_DRAW),
    "EntropyMCMC (underdamped)": lambda m: EntropyMCMC(
        m, step_size=STEP, eta=STEP / 0.025, dynamics="underdamped", friction=0.1 / STEP,
        num_steps_per_sample=so.STEPS_PER_DRAW),
    "SASGLD": lambda m: SASGLD(m, step_size=STEP, rho=0.05,
                               num_steps_per_sample=so.STEPS_PER_DRAW),
    # bins bracketing both networks' energies (~2.8e4 CNN, ~1.05e5 MLP, mostly the prior); a
    # step costs the same wherever the bins are (one SA update and one multiplier per step)
    "ContourSGLD": lambda m: ContourSGLD(m, step_size=STEP, num_bins=100, min_energy=2e4,
                                         bin_width=2e3, zeta=1.0,
                                         num_steps_per_sample=so.STEPS_PER_DRAW),
}


def in_line(kernel: EntropyMCMC) -> EntropyMCMC:
    kernel.prefetch_noise = False
    return kernel


def timed(fn) -> tuple[float, float, float]:
    """Wall, process CPU and main-thread CPU time of ``fn()``, after a garbage collection."""
    gc.collect()
    wall, cpu, thread = time.perf_counter(), time.process_time(), time.thread_time()
    fn()
    return (time.perf_counter() - wall, time.process_time() - cpu, time.thread_time() - thread)


class Chain:
    """A kernel set up once and advanced ``draws`` draws at a time, as MCMC's loop does."""

    def __init__(self, kernel, data):
        self.kernel = kernel
        kernel.setup(0, *data)
        self.params = kernel.initial_params

    def advance(self, draws: int) -> None:
        for _ in range(draws):
            self.params = self.kernel.sample(self.params)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=60)
    parser.add_argument("--chunk", type=int, default=3, help="draws per kernel per round")
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results")
    args = parser.parse_args(argv)
    if args.quick:
        args.rounds, args.chunk = 4, 1
    if args.threads < 1:
        parser.error(f"--threads must be an integer >= 1, got {args.threads}")
    torch.set_num_threads(args.threads)
    lines = ["| network | kernel | ms/step | ratio to SGLD (wall, median [quartiles]) | "
             "ratio (wall, total) | ratio (process CPU) | ratio (main-thread CPU) |",
             "|---|---|---:|---|---:|---:|---:|"]
    rows = []
    for network, (make_net, input_shape) in so.NETWORKS.items():
        pyro.set_rng_seed(0)
        net, _ = so.bayesian(make_net())
        model, data = so.subsampled_model(net), so.random_data(input_shape)
        chains = {name: Chain(make(model), data) for name, make in KERNELS.items()}
        for chain in chains.values():  # warm up
            chain.advance(2)
        names = list(KERNELS)
        times: dict[str, list[tuple[float, float, float]]] = {name: [] for name in KERNELS}
        for r in range(args.rounds):
            for name in names[r % len(names):] + names[:r % len(names)]:
                times[name].append(timed(lambda c=chains[name]: c.advance(args.chunk)))
        base = times["SGLD"]
        steps = args.chunk * so.STEPS_PER_DRAW
        for name, ts in times.items():
            wall, cpu, thread = ([t[i] / b[i] for t, b in zip(ts, base, strict=True)]
                                 for i in range(3))
            q1, _, q3 = statistics.quantiles(wall, n=4)
            row = {
                "network": network, "kernel": name,
                "ms_per_step": 1e3 * statistics.median(t[0] for t in ts) / steps,
                "ratio_wall": statistics.median(wall), "ratio_wall_q1": q1,
                "ratio_wall_q3": q3,
                "ratio_wall_total": sum(t[0] for t in ts) / sum(b[0] for b in base),
                "ratio_cpu": statistics.median(cpu),
                "ratio_main_thread_cpu": statistics.median(thread),
            }
            rows.append(row)
            lines.append(f"| {network} | {name} | {row['ms_per_step']:.3f} | "
                         f"{row['ratio_wall']:.2f} [{q1:.2f}, {q3:.2f}] | "
                         f"{row['ratio_wall_total']:.2f} | "
                         f"{row['ratio_cpu']:.2f} | {row['ratio_main_thread_cpu']:.2f} |")
    table = "\n".join(lines)
    print(table)
    meta = {"command": " ".join(["python", *sys.argv]), "rounds": args.rounds,
            "threads": args.threads,
            "steps_per_chunk": args.chunk * so.STEPS_PER_DRAW, "torch": torch.__version__,
            "cpu": so.cpu_model(),
            "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")}
    suffix = ("_quick" if args.quick else "") + (
        f"_threads{args.threads}" if args.threads != 1 else "")
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"kernel_step_ratio{suffix}.json").write_text(
        json.dumps({"meta": meta, "rows": rows}, indent=1))
    (args.out / f"kernel_step_ratio{suffix}.md").write_text(
        f"# Kernel step time relative to SGLD (batch 128, {args.threads} thread(s), "
        "10 SG steps per draw)\n\n"
        + f"- command: `{meta['command']}`; {meta['rounds']} interleaved rounds of "
        + f"{meta['steps_per_chunk']} steps per kernel; "
        + f"{meta['cpu']}; torch {meta['torch']}; {meta['date']}\n\n" + table + "\n")


if __name__ == "__main__":
    main()
