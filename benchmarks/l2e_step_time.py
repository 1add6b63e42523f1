"""L2E step time against SGLD through ``pyro.infer.MCMC``, in a fresh process.

What is measured
----------------
On the MLP 784-100-100-10 of ``benchmarks/step_overhead.py`` (89,610 parameters, N(0, 1)
priors, N = 10,000 random points, batch 128, 10 SG steps per draw, one torch thread), the
steady time of one SG step of ``L2E`` (shipped meta-parameters) and of ``SGLD`` at the same
step size, each run as ``MCMC(kernel, num_samples=D, warmup_steps=0).run(x, y)``:

    step = (time of the last draw - time of the first draw) / (10 (D - 1))

read by MCMC's ``hook_fn`` after every draw, which leaves out the kernel's setup (model
tracing, first-touch allocations) and keeps the driver's own per-draw work. Each round runs
both kernels, in alternating order, so that machine noise hits both; the reported ratio
is the median (and quartiles) of the per-round ratios, on wall-clock and on process-CPU time
(the CPU time leaves out waiting for a core on a shared machine), next to the ratio of the
two kernels' fastest rounds (the least disturbed by other work on the machine). Minor page
faults per step come from ``resource.getrusage`` read at the same two draws: a kernel that
returns large temporaries to the OS and touches them again shows here.

The rounds run in a *fresh* Python process (a subprocess with ``OMP_NUM_THREADS=1``), so
nothing that an earlier benchmark warmed up (allocator caches, grown heap) helps: once with
the meta-network in the compiled kernel (:mod:`pyro_flat.infer.mcmc.l2e.native`, where it builds)
and once on torch's kernels (``PYRO_FLAT_NATIVE=0``), each against SGLD in its own rounds.
Target: L2E <= 4 x SGLD per step.

Run::

    .venv/bin/python benchmarks/l2e_step_time.py --rounds 24  # ~1 min
    .venv/bin/python benchmarks/l2e_step_time.py --quick     # smoke run, seconds

Results: ``benchmarks/results/l2e_step_time.json`` and ``.md`` (``--quick`` writes
``l2e_step_time_quick.*``).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

KERNELS = ("SGLD", "L2E")
TARGET = 4.0


def _worker(rounds: int, draws: int) -> dict:
    """Interleaved rounds in this process; per-step wall and CPU times and minor faults."""
    import pyro
    import torch
    from pyro.infer import MCMC

    from pyro_flat.infer import L2E, SGLD
    from pyro_flat.infer.mcmc.l2e import native

    sys.path.insert(0, str(Path(__file__).parent))
    import step_overhead as so

    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    pyro.set_rng_seed(0)
    model = so.subsampled_model(so.bayesian(so.make_mlp())[0])
    data = so.random_data((784,))
    make = {"SGLD": lambda: SGLD(model, step_size=so.STEP_SIZE,
                                 num_steps_per_sample=so.STEPS_PER_DRAW),
            "L2E": lambda: L2E(model, step_size=so.STEP_SIZE,
                               num_steps_per_sample=so.STEPS_PER_DRAW)}

    def measure(name: str, num_samples: int) -> tuple[float, float, float]:
        """Per-step wall, CPU and minor faults between the first and the last draw."""
        marks: list[tuple[float, float, int]] = []

        def hook(kernel, params, stage, i) -> None:
            marks.append((time.perf_counter(), time.process_time(),
                           resource.getrusage(resource.RUSAGE_SELF).ru_minflt))

        mcmc = MCMC(make[name](), num_samples=num_samples, warmup_steps=0, hook_fn=hook,
                    disable_progbar=True)
        mcmc.run(*data)
        steps = so.STEPS_PER_DRAW * (num_samples - 1)
        return tuple((last - first) / steps for first, last in zip(marks[0], marks[-1],
                                                                    strict=True))

    for name in KERNELS:  # warm-up: imports, first tracing, the meta-parameters file
        measure(name, 2)
    series: dict[str, dict[str, list[float]]] = {
        k: {"wall": [], "cpu": [], "faults": []} for k in KERNELS}
    for r in range(rounds):
        for name in (KERNELS if r % 2 == 0 else KERNELS[::-1]):
            for key, value in zip(("wall", "cpu", "faults"), measure(name, draws), strict=True):
                series[name][key].append(value)
    steps = so.STEPS_PER_DRAW * (draws - 1)
    num_params = sum(p.numel() for p in so.make_mlp().parameters())
    return {"series": series, "steps_per_run": steps, "num_params": num_params,
            "torch": torch.__version__, "pyro": pyro.__version__, "cpu": so.cpu_model(),
            "native": native.status()}


def summarise(raw: dict) -> dict:
    """Medians per kernel and the per-round L2E / SGLD ratios (median and quartiles)."""
    series = raw["series"]
    out: dict = {"num_params": raw["num_params"], "steps_per_run": raw["steps_per_run"],
                 "rounds": len(series["SGLD"]["wall"]), "native": raw["native"]}
    for clock in ("wall", "cpu"):
        ratios = [a / b for a, b in zip(series["L2E"][clock], series["SGLD"][clock],
                                        strict=True)]
        q1, _, q3 = statistics.quantiles(ratios, n=4) if len(ratios) > 1 else (ratios * 3)
        out[clock] = {"ms_SGLD": 1e3 * statistics.median(series["SGLD"][clock]),
                      "ms_L2E": 1e3 * statistics.median(series["L2E"][clock]),
                      "ratio": statistics.median(ratios), "ratio_q1": q1, "ratio_q3": q3,
                      "ratio_of_fastest": min(series["L2E"][clock]) / min(series["SGLD"][clock])}
    out["minor_faults_per_step"] = {k: statistics.median(series[k]["faults"]) for k in KERNELS}
    return out


def table(summaries: dict[str, dict]) -> str:
    lines = ["| meta-network on | clock | SGLD ms/step | L2E ms/step | L2E / SGLD, median "
             "[quartiles] | fastest L2E / fastest SGLD | minor faults/step SGLD | "
             "minor faults/step L2E |", "|---|---|---:|---:|---|---:|---:|---:|"]
    for kernel, summary in summaries.items():
        lines += _rows(kernel, summary)
    return "\n".join(lines)


def _rows(kernel: str, summary: dict) -> list[str]:
    faults = summary["minor_faults_per_step"]
    lines = []
    for clock in ("wall", "cpu"):
        s = summary[clock]
        lines.append(f"| {kernel} | {clock} | {s['ms_SGLD']:.2f} | {s['ms_L2E']:.2f} | "
                     f"{s['ratio']:.2f} "
                     f"[{s['ratio_q1']:.2f}, {s['ratio_q3']:.2f}] | {s['ratio_of_fastest']:.2f} | "
                     f"{faults['SGLD']:.1f} | "
                     f"{faults['L2E']:.1f} |")
    return lines


def run_fresh(rounds: int, draws: int, threads: int = 1, native: bool = True) -> dict:
    """The rounds in a fresh Python process with ``threads`` OpenMP threads, the meta-network
    in the compiled kernel (where it builds) or on torch's kernels."""
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads),
           "PYRO_FLAT_NATIVE": "1" if native else "0"}
    done = subprocess.run([sys.executable, __file__, "--worker", "--rounds", str(rounds),
                           "--draws", str(draws)], env=env, check=True, capture_output=True,
                          text=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=12)
    parser.add_argument("--draws", type=int, default=11, help="draws per run (>= 2)")
    parser.add_argument("--threads", type=int, default=1,
                        help="torch threads of the fresh process (results get a suffix if > 1)")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results")
    args = parser.parse_args(argv)
    if args.quick:
        args.rounds, args.draws = 2, 3
    if args.rounds < 1 or args.draws < 2:
        parser.error(f"--rounds must be >= 1 and --draws >= 2, got {args.rounds}, {args.draws}")
    if args.worker:
        print(json.dumps(_worker(args.rounds, args.draws)))
        return
    raws = {"compiled kernel": run_fresh(args.rounds, args.draws, args.threads, True),
            "torch": run_fresh(args.rounds, args.draws, args.threads, False)}
    summaries = {k: summarise(r) for k, r in raws.items()}
    raw, summary = raws["compiled kernel"], summaries["compiled kernel"]
    text = table(summaries)
    print(text)
    meta = {"command": " ".join(["python", *sys.argv]), "torch": raw["torch"],
            "pyro": raw["pyro"], "cpu": raw["cpu"], "target": f"L2E / SGLD <= {TARGET:g}",
            "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")}
    suffix = ("_quick" if args.quick else "") + (
        f"_threads{args.threads}" if args.threads != 1 else "")
    threads = "one thread" if args.threads == 1 else f"{args.threads} threads"
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"l2e_step_time{suffix}.json").write_text(json.dumps(
        {"meta": meta, "summaries": summaries,
         "series": {k: r["series"] for k, r in raws.items()}}, indent=1))
    (args.out / f"l2e_step_time{suffix}.md").write_text(
        "# L2E step time against SGLD, in a fresh process\n\n"
        f"- command: `{meta['command']}`; {meta['cpu']}; torch {meta['torch']}; "
        f"pyro {meta['pyro']}; {meta['date']}\n"
        f"- MLP 784-100-100-10 ({summary['num_params']} parameters), batch 128, {threads}, "
        f"10 SG steps per draw; steady step time through `MCMC.run` (first to last of "
        f"{args.draws} draws, read by `hook_fn`), {summary['rounds']} interleaved rounds; "
        f"target: "
        f"{meta['target']}\n- compiled kernel: {summary['native']}\n\n" + text + "\n")


if __name__ == "__main__":
    main()
