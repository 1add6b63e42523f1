"""What the momentum watch costs an SGHMC step (``pyro_flat.infer.mcmc.momentum_watch``).

Two SGHMC chains on each network of ``benchmarks/step_overhead.py`` (MLP 784-100-100-10 and a
small CNN, batch 128, 10 SG steps per draw, one torch thread), one with the watch and one
without (``kernel.momentum_watch = None``), advanced 3 draws at a time in interleaved rounds,
the order alternating; the ratio is the median over rounds of (with / without), with its
quartiles. The watch adds one reduction of the momentum per SG step and one per draw.

Run::

    python benchmarks/momentum_watch_cost.py [--rounds 60]

It prints a Markdown table and writes ``benchmarks/results/momentum_watch_cost.{json,md}``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

import pyro
import torch

sys.path.insert(0, str(Path(__file__).parent))
import kernel_step_ratio as ksr  # noqa: E402
import step_overhead as so  # noqa: E402

from pyro_flat.infer import SGHMC  # noqa: E402


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=60)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    lines = ["| network | with / without the watch (wall, median [quartiles]) |", "|---|---|"]
    rows = []
    for network, (make_net, shape) in so.NETWORKS.items():
        pyro.set_rng_seed(0)
        net, _ = so.bayesian(make_net())
        model, data = so.subsampled_model(net), so.random_data(shape)

        def make(model=model):
            return SGHMC(model, step_size=so.STEP_SIZE, friction=0.1 / so.STEP_SIZE,
                         num_steps_per_sample=so.STEPS_PER_DRAW)

        with_watch, without = ksr.Chain(make(), data), ksr.Chain(make(), data)
        without.kernel.momentum_watch = None
        for chain in (with_watch, without):
            chain.advance(2)
        ratios = []
        for r in range(args.rounds):
            order = (with_watch, without) if r % 2 else (without, with_watch)
            times = {id(c): ksr.timed(lambda c=c: c.advance(3))[0] for c in order}
            ratios.append(times[id(with_watch)] / times[id(without)])
        q1, median, q3 = statistics.quantiles(ratios, n=4)
        rows.append({"network": network, "ratio": median, "q1": q1, "q3": q3})
        lines.append(f"| {network} | {median:.3f} [{q1:.3f}, {q3:.3f}] |")
    table = "\n".join(lines)
    print(table)
    meta = {"command": " ".join(["python", *sys.argv]), "rounds": args.rounds,
            "torch": torch.__version__, "cpu": so.cpu_model()}
    out = Path(__file__).parent / "results"
    (out / "momentum_watch_cost.json").write_text(json.dumps({"meta": meta, "rows": rows},
                                                             indent=1))
    (out / "momentum_watch_cost.md").write_text(
        f"# What the momentum watch costs an SGHMC step\n\n`{meta['command']}` on "
        f"{meta['cpu']}, torch {meta['torch']}, one thread.\n\n{table}\n")


if __name__ == "__main__":
    main()
