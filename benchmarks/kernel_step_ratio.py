"""Step time of the flat-seeking kernels relative to an SGLD step of the same model.

Each kernel runs through ``pyro.infer.MCMC`` (10 SG steps per draw) on the networks of
``benchmarks/step_overhead.py`` (MLP 784-100-100-10 and a small CNN) at batch 128, alternating
with SGLD in interleaved rounds so that machine noise hits both; the ratio is the median over
rounds of (kernel time / SGLD time), wall clock and process CPU time. Issue targets:
EntropyMCMC <= 1.1x, SASGLD <= 2.2x (two gradients per step).

Run::

    .venv/bin/python benchmarks/kernel_step_ratio.py [--rounds 7 --steps 300 --quick]

It prints a Markdown table and writes ``benchmarks/results/kernel_step_ratio.{json,md}``.
"""

from __future__ import annotations

import argparse
import datetime
import json
import statistics
import sys
from pathlib import Path

import pyro
import torch
from pyro.infer import MCMC

sys.path.insert(0, str(Path(__file__).parent))
import step_overhead as so  # noqa: E402

from pyro_flat.infer import SASGLD, SGLD, EntropyMCMC  # noqa: E402

STEP = so.STEP_SIZE
KERNELS = {
    "SGLD": lambda m: SGLD(m, step_size=STEP, num_steps_per_sample=so.STEPS_PER_DRAW),
    "EntropyMCMC": lambda m: EntropyMCMC(m, step_size=STEP, eta=STEP / 0.025,
                                         num_steps_per_sample=so.STEPS_PER_DRAW),
    "EntropyMCMC (underdamped)": lambda m: EntropyMCMC(
        m, step_size=STEP, eta=STEP / 0.025, friction=0.1 / STEP,
        num_steps_per_sample=so.STEPS_PER_DRAW),
    "SASGLD": lambda m: SASGLD(m, step_size=STEP, rho=0.05,
                               num_steps_per_sample=so.STEPS_PER_DRAW),
}


def timing(name: str, model, data, steps: int) -> so.Timing:
    def run() -> None:
        MCMC(KERNELS[name](model), num_samples=steps // so.STEPS_PER_DRAW, warmup_steps=0,
             disable_progbar=True).run(*data)

    return so.timed(run)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results")
    args = parser.parse_args(argv)
    if args.quick:
        args.rounds, args.steps = 2, 40
    torch.set_num_threads(1)
    lines = ["| network | kernel | ms/step | ratio to SGLD (wall, median [min, max]) | "
             "ratio (CPU) |", "|---|---|---:|---|---:|"]
    rows = []
    for network, (make_net, input_shape) in so.NETWORKS.items():
        pyro.set_rng_seed(0)
        net, _ = so.bayesian(make_net())
        model, data = so.SubsampledModel(net), so.random_data(input_shape)
        for name in KERNELS:  # warm up
            timing(name, model, data, 2 * so.STEPS_PER_DRAW)
        times: dict[str, list[so.Timing]] = {name: [] for name in KERNELS}
        for _ in range(args.rounds):
            for name in KERNELS:
                times[name].append(timing(name, model, data, args.steps))
        base = times["SGLD"]
        for name, ts in times.items():
            wall = [t.wall / b.wall for t, b in zip(ts, base, strict=True)]
            cpu = [t.cpu / b.cpu for t, b in zip(ts, base, strict=True)]
            row = {
                "network": network, "kernel": name,
                "ms_per_step": 1e3 * statistics.median(t.wall for t in ts) / args.steps,
                "ratio_wall": statistics.median(wall), "ratio_wall_min": min(wall),
                "ratio_wall_max": max(wall), "ratio_cpu": statistics.median(cpu),
            }
            rows.append(row)
            lines.append(f"| {network} | {name} | {row['ms_per_step']:.3f} | "
                         f"{row['ratio_wall']:.2f} [{row['ratio_wall_min']:.2f}, "
                         f"{row['ratio_wall_max']:.2f}] | {row['ratio_cpu']:.2f} |")
    table = "\n".join(lines)
    print(table)
    meta = {"command": " ".join(["python", *sys.argv]), "rounds": args.rounds,
            "steps": args.steps, "torch": torch.__version__, "cpu": so.cpu_model(),
            "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")}
    suffix = "_quick" if args.quick else ""
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"kernel_step_ratio{suffix}.json").write_text(
        json.dumps({"meta": meta, "rows": rows}, indent=1))
    (args.out / f"kernel_step_ratio{suffix}.md").write_text(
        "# Kernel step time relative to SGLD (batch 128, 1 thread, 10 SG steps per draw)\n\n"
        + f"- command: `{meta['command']}`; {meta['rounds']} rounds of {meta['steps']} steps; "
        + f"{meta['cpu']}; torch {meta['torch']}; {meta['date']}\n\n" + table + "\n")


if __name__ == "__main__":
    main()
