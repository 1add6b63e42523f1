"""What committing every block costs a streamed run (``DrawWriter``).

A small model (SGLD, 2 vectorised chains, 3 parameters, 20 points) streams ``--draws`` draws
to a store with ``block_size`` 1, 10 and the default (16 MiB), with the writer's commit as it
is (``Part.flush``: HDF5's ``H5Fflush`` of the block in SWMR mode, then the new ``num_draws``
and a second flush) and with no flush at all (HDF5 writes when its caches are full or the file
closes: a killed run's draws are lost). The runs alternate, ``--repeats`` times, and the table
gives the median seconds and their ratio. Results: ``benchmarks/results/draw_flush.{json,md}``.

Usage::

    python benchmarks/draw_flush.py [--draws 3000] [--repeats 3]
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import tempfile
import time
from pathlib import Path

import pyro
import pyro.distributions as dist
import torch
from pyro.infer import MCMC

from pyro_flat import DrawWriter
from pyro_flat.draws.files import Part
from pyro_flat.infer import SGLD

RESULTS = Path(__file__).parent / "results"


def model(y: torch.Tensor) -> None:
    mu = pyro.sample("mu", dist.Normal(0.0, 1.0).expand([3]).to_event(1))
    with pyro.plate("d", len(y)):
        pyro.sample("y", dist.Normal(mu.sum(), 1.0), obs=y)


def run(draws: int, block: int | None) -> float:
    y = torch.randn(20, generator=torch.Generator().manual_seed(1))
    pyro.set_rng_seed(0)
    with tempfile.TemporaryDirectory() as tmp:
        writer = DrawWriter(Path(tmp) / "draws", num_samples=draws, block_size=block)
        mcmc = MCMC(SGLD(model, step_size=1e-2, vectorized_chains=2), num_samples=draws,
                    warmup_steps=0, hook_fn=writer, save_params=[], disable_progbar=True)
        start = time.perf_counter()
        mcmc.run(y)
        return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--draws", type=int, default=3000)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    torch.set_num_threads(1)
    commit = Part.flush

    def no_flush(self: Part) -> None:
        pass

    rows = []
    for block in (1, 10, None):
        times: dict[str, list[float]] = {"commit": [], "no flush": []}
        for _ in range(args.repeats):
            for name, flush in (("commit", commit), ("no flush", no_flush)):
                Part.flush = flush
                times[name].append(run(args.draws, block))
        Part.flush = commit
        med = {k: statistics.median(v) for k, v in times.items()}
        rows.append({"block_size": block or "default", "seconds_commit": med["commit"],
                     "seconds_no_flush": med["no flush"],
                     "ratio": med["commit"] / med["no flush"]})
        print(json.dumps(rows[-1]), flush=True)
    lines = ["| block_size | s, commit per block | s, no flush | ratio |",
             "|---|---|---|---|"]
    lines += [f"| {r['block_size']} | {r['seconds_commit']:.2f} | "
              f"{r['seconds_no_flush']:.2f} | {r['ratio']:.2f} |" for r in rows]
    RESULTS.mkdir(exist_ok=True)
    meta = {"draws": args.draws, "repeats": args.repeats, "machine": platform.machine(),
            "torch": torch.__version__}
    (RESULTS / "draw_flush.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
    (RESULTS / "draw_flush.md").write_text(
        "# Committing every block of a draw store\n\n"
        f"`python benchmarks/draw_flush.py --draws {args.draws} --repeats {args.repeats}` "
        "(medians, runs alternating in one process).\n\n" + "\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
