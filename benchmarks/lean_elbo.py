"""LeanELBO against Trace_ELBO, a hand-written torch ELBO and SGLD; compare's SVI methods.

Part 1, one SVI step (minibatch 128, Adam lr 1e-3, one particle, Pyro's validation off as in
``pyro-flat compare``, one torch thread) on two Bayesian MLPs with N(0, 1) priors: 784-100-100-10
(89,610 parameters, random data) and compare's 40-100-100-10 (MNIST-1D shapes):

* ``hand``: a hand-written mean-field Gaussian ELBO step in plain torch: one flat vector of means
  and one of softplus scales, the draw ``w = mu + sigma * eps``, ``functional_call``, the closed
  forms of the prior and of log q, one backward pass, ``torch.optim.Adam`` (torch's default
  implementation on the CPU, a loop over the two tensors): the floor; ``hand, fused Adam`` is
  the same step with ``torch.optim.Adam(fused=True)``;
* ``Trace_ELBO`` and ``LeanELBO`` through ``pyro.infer.SVI`` with ``AutoNormal`` and with
  ``AutoDiagonalNormal``; ``SharpnessAwareELBO(rho=0.05)`` with ``AutoDiagonalNormal`` on the lean
  path and forced onto the trace path (as before LeanELBO existed);
* the lean variants also with :class:`pyro_flat.optim.MultiTensorAdam` (one torch Adam for all
  parameters, torch's fused kernel on the CPU, gradients released after the step) instead of
  ``pyro.optim.Adam`` (one torch Adam per parameter);
* ``SGLD``: one SG step through ``pyro.infer.MCMC`` (10 steps per draw).

Every variant runs ``--steps`` steps per round, in a rotating order; a ratio is the median over
rounds of (variant / reference of the same round), with quartiles; process CPU time (one thread:
the work done, less disturbed than wall time by other processes on a shared machine) and wall.

Part 2, ``pyro-flat compare``'s own runners (svi, hwa, sa-elbo and sgld,
``pyro_flat.compare``) on MNIST-1D with a budget of ``--compare-steps`` gradient evaluations,
interleaved rounds: time per gradient evaluation relative to sgld (the runner's fit only, not the
evaluation of the table's metrics).

Run::

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/lean_elbo.py [--rounds 15 --steps 40]

It prints the tables and writes ``benchmarks/results/lean_elbo.{json,md}``.
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import platform
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pyro
import torch
import torch.nn.functional as F
from pyro.infer import MCMC, SVI, Trace_ELBO
from pyro.infer.autoguide import AutoDiagonalNormal, AutoNormal
from torch.func import functional_call

from pyro_flat.compare.models import build_mlp
from pyro_flat.infer import SGLD, LeanELBO, SharpnessAwareELBO
from pyro_flat.models.bnn import BNN
from pyro_flat.models.likelihoods import Categorical
from pyro_flat.models.nn import make_bayesian
from pyro_flat.optim import MultiTensorAdam

NUM_DATA, BATCH = 4000, 128
NETWORKS = {"MLP 784-100-100-10": 784, "MLP 40-100-100-10 (compare)": 40}
HALF_LOG_2PI = 0.5 * math.log(2 * math.pi)


class HandELBO:
    """A hand-written mean-field Gaussian ELBO step in plain torch (the floor)."""

    def __init__(self, net: torch.nn.Module, x: torch.Tensor, y: torch.Tensor,
                 fused: bool | None = None):
        self.net, self.x, self.y = net, x, y
        self.names = [n for n, _ in net.named_parameters()]
        self.shapes = [p.shape for _, p in net.named_parameters()]
        self.sizes = [s.numel() for s in self.shapes]
        flat = torch.cat([p.detach().reshape(-1) for p in net.parameters()])
        self.loc = flat.clone().requires_grad_()
        self.rho = torch.full_like(flat, math.log(math.expm1(0.01))).requires_grad_()
        self.opt = torch.optim.Adam([self.loc, self.rho], lr=1e-3, fused=fused)

    def step(self) -> None:
        ind = torch.randint(0, NUM_DATA, (BATCH,))
        scale = F.softplus(self.rho)
        eps = torch.randn_like(self.loc)
        w = self.loc + eps * scale
        params = {n: t.view(s) for n, t, s in
                  zip(self.names, w.split(self.sizes), self.shapes, strict=True)}
        logits = functional_call(self.net, params, (self.x[ind],))
        nll = F.cross_entropy(logits, self.y[ind], reduction="sum") * (NUM_DATA / BATCH)
        log_prior = -0.5 * w.square().sum() - w.numel() * HALF_LOG_2PI
        log_q = -0.5 * eps.square().sum() - scale.log().sum() - w.numel() * HALF_LOG_2PI
        loss = log_q - log_prior + nll
        self.opt.zero_grad(set_to_none=True)
        loss.backward()
        self.opt.step()


def bnn(inputs: int) -> BNN:
    net = make_bayesian(build_mlp(inputs, 10, (100, 100)), prior_scale=1.0)
    return BNN(net, Categorical(), subsample_size=BATCH)


def svi_step(inputs: int, guide_cls: type, loss: Callable[[], object], data: tuple,
             force_trace: bool = False, optim: Callable[[dict], object] = pyro.optim.Adam
             ) -> Callable[[], None]:
    model = bnn(inputs)
    guide = guide_cls(model, init_scale=0.01)
    elbo = loss()
    if force_trace:  # the trace path of the same class (as before LeanELBO)
        elbo.lean_guide = lambda *a: None
    svi = SVI(model, guide, optim({"lr": 1e-3}), elbo)

    def step() -> None:
        with pyro.validation_enabled(False):
            svi.step(*data)

    return step


def sgld_steps(inputs: int, data: tuple) -> Callable[[int], None]:
    model = bnn(inputs)

    def run(steps: int) -> None:
        kernel = SGLD(model, step_size=1e-5, num_steps_per_sample=10)
        MCMC(kernel, num_samples=steps // 10, warmup_steps=0, disable_progbar=True).run(*data)

    return run


def repeat(step: Callable[[], None]) -> Callable[[int], None]:
    def run(n: int) -> None:
        for _ in range(n):
            step()

    return run


def variants(inputs: int) -> dict[str, Callable[[int], None]]:
    torch.manual_seed(0)
    pyro.clear_param_store()
    x, y = torch.randn(NUM_DATA, inputs), torch.randint(0, 10, (NUM_DATA,))
    data = (x, y)
    hand = HandELBO(build_mlp(inputs, 10, (100, 100)), x, y)
    fused = HandELBO(build_mlp(inputs, 10, (100, 100)), x, y, fused=True)
    steps: dict[str, Callable[[], None]] = {"hand": hand.step, "hand, fused Adam": fused.step}
    for guide_cls in (AutoNormal, AutoDiagonalNormal):
        g = guide_cls.__name__
        steps[f"Trace_ELBO {g}"] = svi_step(inputs, guide_cls, Trace_ELBO, data)
        steps[f"LeanELBO {g}"] = svi_step(inputs, guide_cls, LeanELBO, data)
        steps[f"LeanELBO {g}, MultiTensorAdam"] = svi_step(inputs, guide_cls, LeanELBO, data,
                                                           optim=MultiTensorAdam)
    sa = lambda: SharpnessAwareELBO(rho=0.05)  # noqa: E731
    steps["SharpnessAwareELBO AutoDiagonalNormal"] = svi_step(
        inputs, AutoDiagonalNormal, sa, data)
    steps["SharpnessAwareELBO AutoDiagonalNormal, trace path"] = svi_step(
        inputs, AutoDiagonalNormal, sa, data, force_trace=True)
    out: dict[str, Callable[[int], None]] = {k: repeat(f) for k, f in steps.items()}
    out["SGLD"] = sgld_steps(inputs, data)
    return out


def clock(fn: Callable[[], object]) -> tuple[float, float]:
    wall, cpu = time.perf_counter(), time.process_time()
    fn()
    return time.perf_counter() - wall, time.process_time() - cpu


def summary(ratios: list[float]) -> dict:
    q = statistics.quantiles(ratios, n=4) if len(ratios) > 1 else [ratios[0]] * 3
    return {"median": statistics.median(ratios), "q1": q[0], "q3": q[2]}


def interleave(fns: dict[str, Callable[[int], None]], rounds: int, steps: int
               ) -> dict[str, dict[str, list[float]]]:
    times = {k: {"wall": [], "cpu": []} for k in fns}
    for f in fns.values():  # warm up
        f(10)
    names = list(fns)
    for r in range(rounds):
        for k in names[r % len(names):] + names[:r % len(names)]:
            wall, cpu = clock(lambda k=k: fns[k](steps))
            times[k]["wall"].append(1e3 * wall / steps)
            times[k]["cpu"].append(1e3 * cpu / steps)
        print(f"  round {r + 1}/{rounds}", file=sys.stderr, flush=True)
    return times


def ratio_rows(times: dict, pairs: list[tuple[str, str]]) -> list[dict]:
    rows = []
    for num, den in pairs:
        row = {"variant": num, "reference": den}
        for c in ("cpu", "wall"):
            row[c] = summary([a / b for a, b in zip(times[num][c], times[den][c], strict=True)])
            row[f"{c}_ms"] = statistics.median(times[num][c])
        rows.append(row)
    return rows


def step_table(inputs: int, rounds: int, steps: int) -> list[dict]:
    times = interleave(variants(inputs), rounds, steps)
    pairs = [("Trace_ELBO AutoNormal", "hand"), ("LeanELBO AutoNormal", "hand"),
             ("LeanELBO AutoNormal, MultiTensorAdam", "hand"),
             ("Trace_ELBO AutoDiagonalNormal", "hand"), ("LeanELBO AutoDiagonalNormal", "hand"),
             ("LeanELBO AutoDiagonalNormal, MultiTensorAdam", "hand"),
             ("hand, fused Adam", "hand"),
             ("LeanELBO AutoNormal, MultiTensorAdam", "hand, fused Adam"),
             ("LeanELBO AutoDiagonalNormal, MultiTensorAdam", "hand, fused Adam"),
             ("LeanELBO AutoNormal", "Trace_ELBO AutoNormal"),
             ("LeanELBO AutoDiagonalNormal", "Trace_ELBO AutoDiagonalNormal"),
             ("SharpnessAwareELBO AutoDiagonalNormal", "LeanELBO AutoDiagonalNormal"),
             ("SharpnessAwareELBO AutoDiagonalNormal, trace path",
              "LeanELBO AutoDiagonalNormal"),
             ("hand", "SGLD"), ("LeanELBO AutoDiagonalNormal", "SGLD"),
             ("Trace_ELBO AutoDiagonalNormal", "SGLD")]
    return ratio_rows(times, pairs)


def compare_table(rounds: int, steps: int) -> list[dict]:
    from pyro_flat.compare.common import Context
    from pyro_flat.compare.config import Budget, Settings, make_plan
    from pyro_flat.compare.registry import ALL
    from pyro_flat.datasets import load_dataset

    settings = Settings()
    plan = make_plan(Budget(steps=steps), settings.exploration_fraction)
    ctx = Context(load_dataset("mnist1d", seed=0), settings, plan, seed=0, show_progress=False)
    methods = ["sgld", "svi", "hwa", "sa-elbo"]
    evals: dict[str, int] = {}

    def runner(name: str) -> Callable[[int], None]:
        def run(_: int) -> None:
            evals[name] = ALL[name].run(name, ctx).grad_evals
        return run

    times = interleave({m: runner(m) for m in methods}, rounds, 1)
    per_eval = {m: {c: [t / evals[m] for t in times[m][c]] for c in ("cpu", "wall")}
                for m in methods}
    rows = ratio_rows(per_eval, [(m, "sgld") for m in methods[1:]])
    for row in rows:
        row["grad_evals"] = evals[row["variant"]]
    return rows


def markdown(meta: dict, tables: dict[str, list[dict]]) -> str:
    lines = ["# LeanELBO step time", "", f"- command: `{meta['command']}`; {meta['machine']}; "
             f"torch {meta['torch']}, pyro {meta['pyro']}; {meta['date']}", ""]
    for title, rows in tables.items():
        lines += [f"## {title}", "", "| variant | reference | CPU ratio, median [quartiles] | "
                  "wall ratio, median [quartiles] | variant CPU ms |", "|---|---|---|---|---:|"]
        for r in rows:
            c, w = r["cpu"], r["wall"]
            lines.append(f"| {r['variant']} | {r['reference']} | {c['median']:.2f} "
                         f"[{c['q1']:.2f}, {c['q3']:.2f}] | {w['median']:.2f} "
                         f"[{w['q1']:.2f}, {w['q3']:.2f}] | {r['cpu_ms']:.2f} |")
        lines.append("")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--compare-rounds", type=int, default=5)
    parser.add_argument("--compare-steps", type=int, default=2000)
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results")
    args = parser.parse_args()
    torch.set_num_threads(1)
    tables = {}
    for title, inputs in NETWORKS.items():
        print(f"{title}: one SVI step", file=sys.stderr)
        tables[f"One step, {title}"] = step_table(inputs, args.rounds, args.steps)
    print("pyro-flat compare's runners", file=sys.stderr)
    tables["pyro-flat compare (MNIST-1D), time per gradient evaluation"] = compare_table(
        args.compare_rounds, args.compare_steps)
    meta = {"command": "python " + " ".join(sys.argv), "machine": platform.processor() or
            platform.machine(), "torch": torch.__version__, "pyro": pyro.__version__,
            "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
            "threads": torch.get_num_threads()}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "lean_elbo.json").write_text(json.dumps({"meta": meta, "tables": tables},
                                                        indent=1))
    text = markdown(meta, tables)
    (args.out / "lean_elbo.md").write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
