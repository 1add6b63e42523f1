"""Vectorised chains against one chain: the cost of a chain-step with ``vectorized_chains=K``.

What is measured
----------------
For each network (the MLP of ``pyro-flat compare``, 40-100-100-10, and the MLP 784-100-100-10;
batch 128 of N = 10,000 random points, N(0, 1) priors, ``BNN(net, Categorical(),
subsample_size=128)``) and each kernel, the wall time of one SG step of

* one chain (``vectorized_chains=None``, the plain single-chain path), and
* ``K`` chains in one kernel (``vectorized_chains=K``: the model's potential evaluated for all
  chains by ``torch.func.vmap``, each chain with its own minibatch),

both advanced through the kernel's ``sample`` as ``pyro.infer.MCMC`` does (10 SG steps per
draw). The reported ratio is (time of a vectorised step / K) / (time of a single-chain step):
the cost of one chain-step, vectorised, relative to one chain alone. Rounds alternate the two so
that machine noise hits both; the ratio is the median over rounds, with its quartiles.

The row "floor (hand-written)" is the same ratio for hand-written steps without Pyro: one
chain's minibatch log joint (Normal prior as a sum of squares, ``-(N/B) * cross_entropy``)
through ``torch.func.functional_call``, its gradient and an SGLD update, against the same for
``K`` chains with batched matrix products (``torch.baddbmm``, each chain its own minibatch)
and one update of the stacked parameters: what batching alone buys on this machine.

Run
---
    .venv/bin/python benchmarks/vectorized_chains.py            # full run, a few minutes
    .venv/bin/python benchmarks/vectorized_chains.py --quick    # smoke run, seconds

Results go to ``benchmarks/results/vectorized_chains.json`` and ``.md`` (``--quick`` writes
``vectorized_chains_quick.*``). One torch thread (``--threads``) unless told otherwise.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

import pyro
import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).parent))
import step_overhead as so  # noqa: E402

from pyro_flat.infer import (  # noqa: E402
    L2E,
    SASGLD,
    SGHMC,
    SGLD,
    ContourSGLD,
    CyclicalSGLD,
    EntropyMCMC,
)

STEP = so.STEP_SIZE
#: kernel -> factory of (model, **kwargs): the settings of benchmarks/kernel_step_ratio.py
KERNELS = {
    "SGLD": lambda m, **kw: SGLD(m, STEP, **kw),
    "SGHMC": lambda m, **kw: SGHMC(m, STEP, friction=0.1 / STEP, **kw),
    "CyclicalSGLD": lambda m, **kw: CyclicalSGLD(m, STEP, cycle_length=50, **kw),
    "EntropyMCMC": lambda m, **kw: EntropyMCMC(m, STEP, eta=STEP / 0.025, **kw),
    "ContourSGLD": lambda m, **kw: ContourSGLD(m, STEP, num_bins=100, min_energy=2e4,
                                               bin_width=2e3, zeta=1.0, **kw),
    "SASGLD": lambda m, **kw: SASGLD(m, STEP, rho=0.05, **kw),
    "L2E": lambda m, **kw: L2E(m, STEP, **kw),
}


def compare_mlp() -> nn.Module:
    """The network of ``pyro-flat compare`` on MNIST-1D (40 inputs)."""
    return nn.Sequential(nn.Linear(40, 100), nn.ReLU(), nn.Linear(100, 100), nn.ReLU(),
                         nn.Linear(100, 10))


NETWORKS = {
    "compare MLP 40-100-100-10": (compare_mlp, (40,)),
    "MLP 784-100-100-10": (so.make_mlp, (784,)),
}


class Chains:
    """A kernel set up once and advanced ``draws`` draws at a time, as MCMC's loop does."""

    def __init__(self, kernel, data):
        self.kernel = kernel
        pyro.set_rng_seed(0)
        kernel.setup(0, *data)
        self.params = kernel.initial_params

    def advance(self, draws: int) -> float:
        start = time.perf_counter()
        for _ in range(draws):
            self.params = self.kernel.sample(self.params)
        return time.perf_counter() - start


def steps_per_draw(name: str) -> dict:
    return {} if name == "CyclicalSGLD" else {"num_steps_per_sample": so.STEPS_PER_DRAW}


def measure(name: str, network: str, k: int, rounds: int, draws: int) -> dict:
    make_net, input_shape = NETWORKS[network]
    pyro.set_rng_seed(0)
    net, _ = so.bayesian(make_net())
    model, data = so.subsampled_model(net), so.random_data(input_shape)
    single = Chains(KERNELS[name](model, **steps_per_draw(name)), data)
    together = Chains(KERNELS[name](model, vectorized_chains=k, **steps_per_draw(name)), data)
    single.advance(2)
    together.advance(2)
    sg_steps = draws * single.kernel.steps_for_next_draw()
    ratios, one, many = [], [], []
    for _ in range(rounds):
        t1 = single.advance(draws) / sg_steps
        tk = together.advance(draws) / sg_steps
        one.append(t1)
        many.append(tk)
        ratios.append(tk / k / t1)
    q = statistics.quantiles(ratios, n=4) if len(ratios) > 1 else [ratios[0]] * 3
    return {"network": network, "kernel": name, "K": k,
            "ms_per_step_single": 1e3 * statistics.median(one),
            "ms_per_step_vectorized": 1e3 * statistics.median(many),
            "ratio_median": statistics.median(ratios), "ratio_q1": q[0], "ratio_q3": q[2]}


def measure_floor(network: str, k: int, rounds: int, steps: int = 20) -> dict:
    """The hand-written single-chain step against a hand-written batched step of K chains."""
    make_net, input_shape = NETWORKS[network]
    torch.manual_seed(0)
    net = make_net()
    x, y = so.random_data(input_shape)
    n, b = so.NUM_DATA, so.BATCH_SIZE
    linears = [m for m in net if isinstance(m, nn.Linear)]
    one = [p.detach().clone().requires_grad_() for m in linears for p in (m.weight, m.bias)]
    many = [p.detach().unsqueeze(0).repeat(k, *[1] * p.dim()).requires_grad_() for p in one]

    def log_joint(params, xb, yb, batched):
        h = xb
        for i in range(0, len(params), 2):
            w, bias = params[i], params[i + 1]
            h = (torch.baddbmm(bias.unsqueeze(1), h, w.transpose(1, 2)) if batched
                 else torch.nn.functional.linear(h, w, bias))
            if i + 2 < len(params):
                h = h.relu()
        logits = h.reshape(-1, h.shape[-1])
        ll = -(n / b) * torch.nn.functional.cross_entropy(logits, yb.reshape(-1), reduction="sum")
        return ll - 0.5 * sum((p * p).sum() for p in params)

    def step(params, batched):
        if batched:
            idx = torch.stack([torch.randint(n, (b,)) for _ in range(k)])
            xb, yb = x[idx], y[idx]
        else:
            idx = torch.randint(n, (b,))
            xb, yb = x[idx], y[idx]
        grads = torch.autograd.grad(log_joint(params, xb, yb, batched), params)
        with torch.no_grad():
            torch._foreach_add_(params, grads, alpha=STEP)
            torch._foreach_add_(params, [torch.randn_like(p) for p in params],
                                alpha=(2 * STEP) ** 0.5)

    def timed(params, batched):
        start = time.perf_counter()
        for _ in range(steps):
            step(params, batched)
        return (time.perf_counter() - start) / steps

    timed(one, False), timed(many, True)
    ratios, t1s, tks = [], [], []
    for _ in range(rounds):
        t1, tk = timed(one, False), timed(many, True)
        t1s.append(t1)
        tks.append(tk)
        ratios.append(tk / k / t1)
    q = statistics.quantiles(ratios, n=4) if len(ratios) > 1 else [ratios[0]] * 3
    return {"network": network, "kernel": "floor (hand-written)", "K": k,
            "ms_per_step_single": 1e3 * statistics.median(t1s),
            "ms_per_step_vectorized": 1e3 * statistics.median(tks),
            "ratio_median": statistics.median(ratios), "ratio_q1": q[0], "ratio_q3": q[2]}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--chains", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--draws", type=int, default=2, help="draws per chain set per round")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--kernels", nargs="*", default=list(KERNELS))
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results")
    args = parser.parse_args(argv)
    if args.quick:
        args.rounds, args.draws, args.kernels = 3, 1, ["SGLD"]
    torch.set_num_threads(args.threads)
    rows = []
    for network in NETWORKS:
        rows.append(measure_floor(network, args.chains, args.rounds))
        rows += [measure(name, network, args.chains, args.rounds, args.draws)
                 for name in args.kernels]
    lines = [f"| network | kernel | one chain, ms/step | {args.chains} vectorised chains, "
             "ms/step | chain-step cost, vectorised / one chain (median [quartiles]) |",
             "|---|---|---:|---:|---|"]
    for r in rows:
        lines.append(f"| {r['network']} | {r['kernel']} | {r['ms_per_step_single']:.2f} | "
                     f"{r['ms_per_step_vectorized']:.2f} | {r['ratio_median']:.2f} "
                     f"[{r['ratio_q1']:.2f}, {r['ratio_q3']:.2f}] |")
    table = "\n".join(lines)
    print(table)
    stem = "vectorized_chains_quick" if args.quick else "vectorized_chains"
    command = "python benchmarks/vectorized_chains.py " + " ".join(argv or sys.argv[1:])
    meta = {"date": datetime.now(UTC).isoformat(timespec="seconds"), "command": command.strip(),
            "machine": platform.machine(), "processor": platform.processor(),
            "torch": torch.__version__, "threads": args.threads, "device": "cpu"}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"{stem}.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=2))
    (args.out / f"{stem}.md").write_text(
        f"# Vectorised chains: cost of a chain-step\n\n`{meta['command']}` on {meta['date']} "
        f"({meta['machine']}, torch {meta['torch']}, {args.threads} thread(s), CPU; no GPU was "
        f"available)\n\n{table}\n")


if __name__ == "__main__":
    main()
