"""The SG step on a GPU: pyro_flat's kernels against a hand-written torch step, eager and
CUDA-graphed (issue 34, item 3).

What is measured
----------------
For each network, batch 128 of N = 10,000 random points on the device, N(0, 1) priors,
``BNN(net, Categorical(), subsample_size=128)``:

* ``MLP 784-100-100-10`` and ``CNN 8-16 conv`` (the networks of ``step_overhead.py``), and
* ``ResNet-18`` (``torchvision.models.resnet18(num_classes=10)``, BatchNorm in training mode)
  on CIFAR-shaped inputs (3 x 32 x 32),

the time of one SG step of

* ``hand eager``: a hand-written SGLD step (``step_overhead.HandSGLD``: minibatch indices,
  a ``torch.func.functional_call`` log joint, ``autograd.grad``, a ``_foreach`` Langevin update
  with noise drawn on the device), eager;
* ``hand CUDA graph``: the same step captured once in a CUDA graph (gradient, update and noise)
  and replayed, the minibatch gathered into the graph's static input by ``index_select``
  (CUDA only);
* ``SGLD``, ``SGLD thin 1`` and ``L2E`` through ``pyro.infer.MCMC`` (10 SG steps per draw; thin
  1: one per draw), and ``SGLD synchronous step``, SGLD with ``defer_finiteness_checks=False``
  (one host synchronisation per step, as on the CPU, where the GPU's default has none), timed
  from the first to the last draw by ``hook_fn`` with the device synchronised, so setup and
  compilation are left out;
* vectorised SGLD chains, ``vectorized_chains=K`` for ``--chains`` (the MLP only): the time of
  one chain-step, the step of ``K`` chains divided by ``K``.

Rounds alternate the measurements; each reported time is the median over rounds. The ratios
the issue sets targets for are printed under the table: SGLD / hand CUDA graph on the MLP
(<= 1.1), L2E / SGLD (<= 1.5), and the chain-step at K = 32 / one chain on the MLP (<= 0.1).

Run
---
    python benchmarks/gpu_step.py                    # on the GPU, a few minutes
    python benchmarks/gpu_step.py --device cpu --quick   # a smoke run of the script itself

Results go to ``benchmarks/results/gpu_step.{json,md}`` (``--out``), with the device named.
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pyro
import torch
import torch.nn.functional as F
from pyro.infer import MCMC
from torch import nn
from torch.func import functional_call

sys.path.insert(0, str(Path(__file__).parent))
import step_overhead as so  # noqa: E402

from pyro_flat.infer import L2E, SGLD  # noqa: E402
from pyro_flat.models.bnn import BNN  # noqa: E402
from pyro_flat.models.likelihoods import Categorical  # noqa: E402
from pyro_flat.models.nn import make_bayesian  # noqa: E402

STEP = so.STEP_SIZE
STEPS_PER_DRAW = 10


def make_resnet() -> nn.Module:
    import torchvision

    return torchvision.models.resnet18(num_classes=10)


NETWORKS: dict[str, tuple[Callable[[], nn.Module], tuple[int, ...]]] = {
    **so.NETWORKS,
    "ResNet-18": (make_resnet, (3, 32, 32)),
}


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class DeviceIndices(so.EpochIndices):
    """The hand-written step's minibatch indices, drawn on the device."""

    def __init__(self, n: int, batch_size: int, device: torch.device):
        self.device = device
        super().__init__(n, batch_size)
        self.perm = torch.randperm(n, device=device)

    def next(self) -> torch.Tensor:
        if self.pos + self.batch_size > self.n:
            self.perm, self.pos = torch.randperm(self.n, device=self.device), 0
        self.pos += self.batch_size
        return self.perm[self.pos - self.batch_size : self.pos]


class GraphedSGLD:
    """The hand-written SGLD step captured in one CUDA graph and replayed."""

    def __init__(self, net: nn.Module, x: torch.Tensor, y: torch.Tensor,
                 indices: DeviceIndices):
        self.net, self.x, self.y, self.indices = net, x, y, indices
        self.params = {n: p.detach().clone().requires_grad_() for n, p in net.named_parameters()}
        self.leaves = list(self.params.values())
        self.scale = x.shape[0] / indices.batch_size
        b = indices.batch_size
        self.x_batch = torch.empty((b, *x.shape[1:]), dtype=x.dtype, device=x.device)
        self.y_batch = torch.empty((b,), dtype=y.dtype, device=y.device)
        self.noise = [torch.empty_like(p) for p in self.leaves]
        self._load_batch()
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):  # warm up outside the graph, as CUDA graphs need
            for _ in range(3):
                self._step_body()
        torch.cuda.current_stream().wait_stream(stream)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph):
            self._step_body()

    def _load_batch(self) -> None:
        ind = self.indices.next()
        torch.index_select(self.x, 0, ind, out=self.x_batch)
        torch.index_select(self.y, 0, ind, out=self.y_batch)

    def _step_body(self) -> None:
        logits = functional_call(self.net, self.params, (self.x_batch,))
        nll = F.cross_entropy(logits, self.y_batch, reduction="sum")
        u = 0.5 * sum(p.square().sum() for p in self.leaves) + self.scale * nll
        grads = torch.autograd.grad(u, self.leaves)
        with torch.no_grad():
            torch._foreach_add_(self.leaves, grads, alpha=-STEP)
            for buffer in self.noise:
                buffer.normal_()
            torch._foreach_add_(self.leaves, self.noise, alpha=math.sqrt(2 * STEP))

    def step(self) -> None:
        self._load_batch()
        self.graph.replay()


def time_steps(step: Callable[[], None], steps: int, device: torch.device) -> float:
    """Seconds per call of ``step`` over ``steps`` calls, the device synchronised around."""
    step()
    synchronize(device)
    start = time.perf_counter()
    for _ in range(steps):
        step()
    synchronize(device)
    return (time.perf_counter() - start) / steps


def time_mcmc(kernel: object, data: tuple, draws: int, steps_per_draw: int,
              device: torch.device) -> float:
    """Seconds per SG step of ``MCMC(kernel)``, from its first draw to its last."""
    marks: list[float] = []

    def hook(kernel, params, stage, i):
        synchronize(device)
        if i == 0 or i == draws - 1:
            marks.append(time.perf_counter())

    mcmc = MCMC(kernel, num_samples=draws, warmup_steps=0, disable_progbar=True, hook_fn=hook)
    mcmc.run(*data)
    return (marks[-1] - marks[0]) / ((draws - 1) * steps_per_draw)


def bnn(net: nn.Module) -> BNN:
    return BNN(make_bayesian(net, prior_scale=1.0), Categorical(),
               subsample_size=so.BATCH_SIZE)


def synchronous(kernel: SGLD) -> SGLD:
    """The kernel with the step that learns at once whether every chain is finite (one host
    synchronisation per step), the CPU's step, for comparison with the GPU's default."""
    kernel.defer_finiteness_checks = False
    return kernel


def measure(network: str, args: argparse.Namespace, device: torch.device) -> dict:
    make, shape = NETWORKS[network]
    torch.manual_seed(0)
    x = torch.randn(so.NUM_DATA, *shape, device=device)
    y = torch.randint(0, 10, (so.NUM_DATA,), device=device)
    steps, draws = (20, 4) if args.quick else (200, 21)
    runs: dict[str, Callable[[], float]] = {}
    hand = so.HandSGLD(make().to(device), x, y, DeviceIndices(so.NUM_DATA, so.BATCH_SIZE, device))
    runs["hand eager"] = lambda: time_steps(hand.step, steps, device)
    if device.type == "cuda":
        graphed = GraphedSGLD(make().to(device), x, y,
                              DeviceIndices(so.NUM_DATA, so.BATCH_SIZE, device))
        runs["hand CUDA graph"] = lambda: time_steps(graphed.step, steps, device)

    def kernel_run(build: Callable[[BNN], object], steps_per_draw: int, k: int = 1
                   ) -> Callable[[], float]:
        def run() -> float:
            pyro.set_rng_seed(0)
            kernel = build(bnn(make().to(device)))
            num_draws = (draws - 1) * STEPS_PER_DRAW // steps_per_draw + 1  # the same steps
            return time_mcmc(kernel, (x, y), num_draws, steps_per_draw, device) / k
        return run

    runs["SGLD"] = kernel_run(lambda m: SGLD(m, STEP, num_steps_per_sample=STEPS_PER_DRAW),
                              STEPS_PER_DRAW)
    if not network.startswith("ResNet"):  # BatchNorm in training mode: not compilable
        runs["SGLD compile=True"] = kernel_run(
            lambda m: SGLD(m, STEP, num_steps_per_sample=STEPS_PER_DRAW, compile=True),
            STEPS_PER_DRAW)
    runs["SGLD thin 1"] = kernel_run(lambda m: SGLD(m, STEP, num_steps_per_sample=1), 1)
    runs["SGLD synchronous step"] = kernel_run(
        lambda m: synchronous(SGLD(m, STEP, num_steps_per_sample=STEPS_PER_DRAW)),
        STEPS_PER_DRAW)
    runs["L2E"] = kernel_run(lambda m: L2E(m, STEP, num_steps_per_sample=STEPS_PER_DRAW),
                             STEPS_PER_DRAW)
    if network.startswith("MLP"):
        for k in args.chains:
            runs[f"SGLD K={k} (per chain)"] = kernel_run(
                lambda m, k=k: SGLD(m, STEP, num_steps_per_sample=STEPS_PER_DRAW,
                                    vectorized_chains=k), STEPS_PER_DRAW, k)
    times: dict[str, list[float]] = {name: [] for name in runs}
    for r in range(args.rounds):
        order = list(runs) if r % 2 == 0 else list(reversed(runs))
        for name in order:
            times[name].append(runs[name]())
    return {name: statistics.median(t) * 1e3 for name, t in times.items()}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--chains", type=int, nargs="*", default=[8, 32, 128])
    parser.add_argument("--networks", nargs="*", default=list(NETWORKS))
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results")
    args = parser.parse_args(argv)
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: torch sees no CUDA device (use --device cpu for a smoke run)")
    if args.quick:
        args.rounds, args.chains = 1, args.chains[:1]
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else so.cpu_model()
    results = {network: measure(network, args, device) for network in args.networks}
    lines = [f"# The SG step on {name} ({device.type})", "",
             f"- command: `python benchmarks/gpu_step.py {' '.join(argv or sys.argv[1:])}`; "
             f"torch {torch.__version__}; {datetime.datetime.now(datetime.UTC).isoformat()}",
             f"- {args.rounds} rounds, median ms per SG step (per chain-step for K chains)", "",
             "| network | step | ms/step |", "|---|---|---:|"]
    for network, times in results.items():
        lines += [f"| {network} | {step} | {ms:.3f} |" for step, ms in times.items()]
    mlp = results.get("MLP 784-100-100-10", {})
    lines.append("")
    if "hand CUDA graph" in mlp:
        lines.append(f"- SGLD / hand CUDA graph, MLP: {mlp['SGLD'] / mlp['hand CUDA graph']:.2f}"
                     " (target <= 1.1)")
    for network, times in results.items():
        lines.append(f"- L2E / SGLD, {network}: {times['L2E'] / times['SGLD']:.2f} "
                     "(target <= 1.5)")
    if "SGLD K=32 (per chain)" in mlp:
        lines.append(f"- chain-step at K = 32 / one chain, MLP: "
                     f"{mlp['SGLD K=32 (per chain)'] / mlp['SGLD']:.3f} (target <= 0.1)")
    text = "\n".join(lines) + "\n"
    print(text)
    stem = "gpu_step_quick" if args.quick else "gpu_step"
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"{stem}.md").write_text(text)
    (args.out / f"{stem}.json").write_text(json.dumps(
        {"device": name, "device_type": device.type, "results": results}, indent=1) + "\n")


if __name__ == "__main__":
    main()
