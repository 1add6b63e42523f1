"""Reproduce the shipped L2E meta-parameters from scratch
(``pyro_flat/infer/mcmc/l2e/l2e_meta_params.npz``).

Antithetic-ES meta-training (:mod:`pyro_flat.infer.mcmc.l2e.training.meta`) from the planted
initialisation, on the task distribution of :mod:`pyro_flat.infer.mcmc.l2e.training.tasks`, one
CPU thread. Every ``--eval-every`` outer steps the meta-loss is measured on a fixed validation set
of tasks (drawn from the same distribution with another seed); the parameters with the lowest
validation meta-loss are written, if they beat the initial ones. The run checkpoints every 10
outer steps and resumes from ``--checkpoint`` after an interruption (same results as an
uninterrupted run).

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/l2e_meta_train.py            # ~50 min
    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/l2e_meta_train.py --quick    # smoke run
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path

import torch

from pyro_flat.infer.mcmc.l2e.meta_net import SHIPPED_FILE
from pyro_flat.infer.mcmc.l2e.training import MetaTrainConfig, MetaTrainer, meta_loss, sample_task

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"


def validation_tasks(num: int, seed: int = 12345):
    g = torch.Generator().manual_seed(seed)
    tasks = [sample_task(g) for _ in range(num)]
    return tasks, list(range(1000, 1000 + num))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--outer-steps", type=int, default=500)
    p.add_argument("--inner-steps", type=int, default=400)
    p.add_argument("--eval-every", type=int, default=50)
    p.add_argument("--num-val-tasks", type=int, default=8)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--checkpoint", default=str(RESULTS / "l2e_meta_train_checkpoint.pt"))
    p.add_argument("--output", default=str(ROOT / "pyro_flat" / "data" / SHIPPED_FILE))
    p.add_argument("--quick", action="store_true", help="a few steps, writes under /tmp")
    args = p.parse_args()
    torch.set_num_threads(1)
    name = "l2e_meta_train"
    if args.quick:
        args.outer_steps, args.inner_steps, args.eval_every, args.num_val_tasks = 4, 60, 2, 2
        args.checkpoint, args.output = "/tmp/l2e_quick.pt", "/tmp/l2e_quick.npz"
        name = "l2e_meta_train_quick"
    cfg = MetaTrainConfig(outer_steps=args.outer_steps, inner_steps=args.inner_steps,
                          seed=args.seed,
                          snapshot_every=20 if args.inner_steps >= 200 else 5)
    log_path = (RESULTS if not args.quick else Path("/tmp")) / f"{name}.log"
    log_file = open(log_path, "a")  # noqa: SIM115 (kept open for the whole run)

    def log(line: str) -> None:
        print(line, flush=True)
        log_file.write(line + "\n")
        log_file.flush()

    log(f"# {' '.join(sys.argv)}  torch {torch.__version__}  {platform.processor()}  "
        f"{time.strftime('%Y-%m-%d %H:%M:%S')}  config {cfg}")
    tasks, seeds = validation_tasks(args.num_val_tasks)
    log("# validation tasks: " + ", ".join(t.name for t in tasks))
    trainer = MetaTrainer(cfg, log=log)
    if Path(args.checkpoint).exists():
        trainer.load(args.checkpoint)
        log(f"resumed from {args.checkpoint} at step {trainer.num_steps}")
    evals = trainer.extra.setdefault("evals", {})
    best = trainer.extra.setdefault("best", {"step": None, "loss": float("inf"), "phi": None})
    if 0 not in evals:
        evals[0] = meta_loss(trainer.net, tasks, cfg, seeds)
    log(f"eval step 0: validation meta-loss {evals[0]:.4f} (initial)")

    def callback(tr: MetaTrainer) -> None:
        s = tr.num_steps
        if s % args.eval_every == 0 or s == cfg.outer_steps:
            evals[s] = meta_loss(tr.net, tasks, cfg, seeds)
            log(f"eval step {s}: validation meta-loss {evals[s]:.4f}")
            if evals[s] < best["loss"]:
                best.update(step=s, loss=evals[s], phi=tr.phi.detach().clone())
        if s % 10 == 0 or s == cfg.outer_steps:
            tr.save(args.checkpoint)

    start = time.time()
    trainer.run(checkpoint=args.checkpoint, checkpoint_every=10**9, callback=callback)
    log(f"# finished {trainer.num_steps} outer steps; this session {time.time() - start:.0f}s, "
        f"total {trainer._elapsed:.0f}s of outer steps")
    result = {"config": cfg.__dict__, "validation_meta_loss": evals,
              "history": trainer.history, "best_step": best["step"],
              "best_loss": best["loss"], "initial_loss": evals[0],
              "validation_tasks": [t.name for t in tasks], "command": " ".join(sys.argv)}
    if best["phi"] is not None and best["loss"] < evals[0]:
        from pyro_flat.infer.mcmc.l2e.meta_net import MetaNet
        info = trainer.provenance()
        info.update(selected_step=best["step"], validation_meta_loss=best["loss"],
                    initial_validation_meta_loss=evals[0])
        MetaNet.from_flat(best["phi"], info).save(args.output)
        log(f"wrote {args.output}: step {best['step']}, validation meta-loss "
            f"{best['loss']:.4f} (initial {evals[0]:.4f})")
        result["written"] = str(args.output)
    else:
        log("no evaluated parameters beat the initial ones; nothing written")
    out = (RESULTS if not args.quick else Path("/tmp")) / f"{name}.json"
    out.write_text(json.dumps(result, indent=1, default=str))
    lines = ["# L2E meta-training", "", f"Command: `{' '.join(sys.argv)}`", "",
             f"Outer steps: {trainer.num_steps}, time in outer steps: {trainer._elapsed:.0f} s "
             "(one thread)", "", "| outer step | validation meta-loss (BMA NLL) |", "|---|---|"]
    lines += [f"| {k} | {v:.4f} |" for k, v in sorted(evals.items())]
    lines += ["", f"Shipped: step {best['step']} ({best['loss']:.4f} vs initial {evals[0]:.4f})"]
    out.with_suffix(".md").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
