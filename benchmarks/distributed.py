"""Wall time against world size for the two modes of ``pyro_flat.distributed``.

What is measured
----------------
Each job is launched as a user launches it, ``torchrun --nproc_per_node=W`` (gloo, CPU, one
torch thread per rank), and times only the sampling (``DistributedMCMC.run`` after one warm-up
run; process start and imports excluded):

* **chains across ranks**: every rank runs one SGLD chain of the MLP of ``pyro-flat compare``
  (40-100-100-10, N = 10,000 random points, minibatch 128, 10 SG steps per draw) and rank 0
  gathers the draws. Reported: the wall time of the job and its throughput in chain-steps per
  second; *efficiency* = throughput(W) / (W x throughput(1)) (1.0: perfect scale-out).
* **data-parallel**: one SGLD chain of the MLP 784-100-100-10 (N = 10,000, union minibatch
  ``B = 1024``), each rank holding N / W points and evaluating its part of the minibatch; the
  gradient is summed by ``all_reduce``. Reported: ms per SG step and the speed-up
  t(1) / t(W).

Rounds alternate the world sizes, so that machine noise hits both; figures are medians over
rounds.

Run
---
    .venv/bin/python benchmarks/distributed.py              # 3 rounds, a few minutes
    .venv/bin/python benchmarks/distributed.py --world-sizes 1 2 4 --rounds 5

Results go to ``benchmarks/results/distributed.json`` and ``.md``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

import torch

RESULTS = Path(__file__).parent / "results"
NUM_DATA, STEP = 10_000, 1e-5
CHAIN_BATCH, CHAIN_DRAWS, STEPS_PER_DRAW = 128, 20, 10
DP_BATCH, DP_STEPS = 1024, 100


def _worker(mode: str, out: Path) -> None:
    import pyro
    from torch import nn

    from pyro_flat.distributed import DistributedMCMC, data_parallel, process_group, shard_rows
    from pyro_flat.infer import SGLD
    from pyro_flat.models.bnn import BNN
    from pyro_flat.models.likelihoods import Categorical

    sys.path.insert(0, str(Path(__file__).parent))
    import step_overhead as so

    with process_group("gloo"):
        pyro.set_rng_seed(0)
        inputs = 40 if mode == "chains" else 784
        net = nn.Sequential(nn.Linear(inputs, 100), nn.ReLU(), nn.Linear(100, 100), nn.ReLU(),
                            nn.Linear(100, 10))
        net, _ = so.bayesian(net)
        model = BNN(net, Categorical())
        g = torch.Generator().manual_seed(0)
        x, y = torch.randn(NUM_DATA, inputs, generator=g), torch.randint(0, 10, (NUM_DATA,),
                                                                          generator=g)
        if mode == "chains":
            kernel = SGLD(model, STEP, subsample_size=CHAIN_BATCH,
                          num_steps_per_sample=STEPS_PER_DRAW)
            args, draws, steps = (x, y), CHAIN_DRAWS, CHAIN_DRAWS * STEPS_PER_DRAW
        else:
            kernel = data_parallel(SGLD(model, STEP, subsample_size=DP_BATCH), NUM_DATA)
            args, draws, steps = shard_rows(x, y), DP_STEPS, DP_STEPS
        mcmc = DistributedMCMC(kernel, num_samples=2, warmup_steps=0, seed=0)
        mcmc.run(*args)  # warm-up run
        mcmc = DistributedMCMC(kernel, num_samples=draws, warmup_steps=0, seed=0)
        start = time.perf_counter()
        mcmc.run(*args)
        seconds = time.perf_counter() - start
        if mcmc.rank == 0:
            out.write_text(json.dumps({"seconds": seconds, "sg_steps": steps,
                                       "world_size": mcmc.world_size}))


def _job(mode: str, world: int) -> dict:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "timing.json"
        cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={world}",
               "--master_addr=127.0.0.1", f"--master_port={port}", __file__, "--worker", mode,
               str(out)]
        env = {**os.environ, "OMP_NUM_THREADS": "1"}
        subprocess.run(cmd, env=env, check=True, capture_output=True, text=True)
        return json.loads(out.read_text())


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--world-sizes", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--worker", nargs=2, metavar=("MODE", "OUT"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        _worker(args.worker[0], Path(args.worker[1]))
        return
    times: dict[tuple[str, int], list[float]] = {}
    for r in range(args.rounds):
        for mode in ("chains", "data_parallel"):
            for world in args.world_sizes:
                t = _job(mode, world)
                times.setdefault((mode, world), []).append(t["seconds"])
                print(f"round {r}: {mode} W={world}: {t['seconds']:.2f} s", flush=True)
    rows = []
    for mode in ("chains", "data_parallel"):
        base = statistics.median(times[(mode, args.world_sizes[0])])
        for world in args.world_sizes:
            seconds = statistics.median(times[(mode, world)])
            row = {"mode": mode, "world_size": world, "seconds_median": seconds,
                   "seconds_all": times[(mode, world)]}
            if mode == "chains":
                steps = CHAIN_DRAWS * STEPS_PER_DRAW * world
                row["chain_steps_per_s"] = steps / seconds
                base_rate = CHAIN_DRAWS * STEPS_PER_DRAW * args.world_sizes[0] / base
                row["efficiency"] = row["chain_steps_per_s"] / (
                    base_rate * world / args.world_sizes[0])
            else:
                row["ms_per_step"] = 1e3 * seconds / DP_STEPS
                row["speedup"] = base / seconds
            rows.append(row)
    command = "python benchmarks/distributed.py " + " ".join(argv or sys.argv[1:])
    meta = {"date": datetime.now(UTC).isoformat(timespec="seconds"),
            "machine": platform.machine(), "torch": torch.__version__,
            "cores": len(os.sched_getaffinity(0)), "command": command.strip(),
            "gpu": torch.cuda.is_available()}
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "distributed.json").write_text(json.dumps({"meta": meta, "rows": rows},
                                                         indent=2))
    lines = ["# Distributed: wall time against world size", "",
             f"`{meta['command']}` on {meta['date']} ({meta['machine']}, torch {meta['torch']}, "
             f"{meta['cores']} cores, gloo, one thread per rank; "
             f"{'a GPU was present' if meta['gpu'] else 'no GPU'})", "",
             "Chains across ranks (one SGLD chain per rank, compare MLP, batch 128):", "",
             "| world size | chains | wall time, s | chain-steps / s | efficiency |",
             "|---:|---:|---:|---:|---:|"]
    for row in rows:
        if row["mode"] == "chains":
            lines.append(f"| {row['world_size']} | {row['world_size']} | "
                         f"{row['seconds_median']:.2f} | {row['chain_steps_per_s']:.0f} | "
                         f"{row['efficiency']:.2f} |")
    lines += ["", f"Data-parallel (one SGLD chain, MLP 784-100-100-10, union batch {DP_BATCH}):",
              "", "| world size | ms / SG step | speed-up |", "|---:|---:|---:|"]
    for row in rows:
        if row["mode"] == "data_parallel":
            lines.append(f"| {row['world_size']} | {row['ms_per_step']:.2f} | "
                         f"{row['speedup']:.2f} |")
    (RESULTS / "distributed.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
