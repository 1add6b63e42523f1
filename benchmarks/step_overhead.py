"""Per-step overhead of the SG-MCMC kernels run through ``pyro.infer.MCMC``.

What is measured
----------------
For each network (MLP 784-100-100-10 and a small CNN on 1x28x28, batch 128, N = 10,000 random
points) and each kernel (SGLD, SGHMC, CyclicalSGLD), the wall time of one SG step taken by
``MCMC(kernel, num_samples=steps / 10, warmup_steps=0).run(x, y)`` with 10 SG steps per draw,
divided by the time of one hand-written SGLD step on the same network in the same process:

* hand-written step: draw the minibatch indices, ``x[ind]``, a ``torch.func.functional_call``
  log joint (Normal(0, 1) prior as a sum of squares plus ``-(N/B) * cross_entropy(..., "sum")``),
  ``torch.autograd.grad``, and an in-place Langevin update of every parameter with
  ``torch._foreach_add_`` (gradient, then Gaussian noise scaled by ``sqrt(2 eps)``);
* kernel step: the same network made Bayesian with :func:`pyro_flat.models.nn.make_bayesian`, as the
  model ``BNN(net, Categorical(), subsample_size=B)`` (Pyro's subsampling idiom: indices drawn
  in the plate, the network run outside it); the wall
  time of ``MCMC.run`` (kernel setup, draw storage and the driver included) divided by the
  number of SG steps.

Rounds alternate hand-written and kernel measurements so that machine noise hits both; the
reported ratio is the median (and range) of the per-round ratios. Each round also times a run
with ``num_samples=1`` (setup plus 10 SG steps), which gives the setup time and a *steady* per-step
time ``(T_run - T_one) / (steps - 10)`` without the setup. Peak memory is the rise of the peak
resident set size (``VmHWM``, reset through ``/proc/self/clear_refs`` after ``malloc_trim``)
during one kernel run, next to the bytes of the stored draws. A second table compares the
potential and its gradient alone (``kernel.potential_and_grad`` against the hand-written log
joint and ``autograd.grad``).

The hand-written step draws its indices as the kernel's minibatch stream does (one permutation
per epoch, sliced); ``--hand-indices randperm`` draws ``randperm(N)[:B]`` at every step instead,
as Pyro's plate does on its own.

Run
---
    .venv/bin/python benchmarks/step_overhead.py            # full run, a few minutes
    .venv/bin/python benchmarks/step_overhead.py --quick    # smoke run, seconds

Results go to ``benchmarks/results/step_overhead.json`` and ``.md`` (``--out`` changes both;
``--quick`` writes ``step_overhead_quick.*`` so as not to overwrite the reference numbers).
The project target is a ratio <= 1.3 for the three kernels on the MLP.
"""

from __future__ import annotations

import argparse
import ctypes
import gc
import json
import math
import platform
import re
import resource
import shlex
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, NamedTuple

import pyro
import pyro.distributions as dist
import torch
import torch.nn.functional as F
from pyro.infer import MCMC
from pyro.nn import PyroModule, PyroSample
from pyro.nn.module import to_pyro_module_
from torch import nn
from torch.func import functional_call

from pyro_flat.infer import SGHMC, SGLD, CyclicalSGLD, SGMCMCKernel
from pyro_flat.models.bnn import BNN
from pyro_flat.models.likelihoods import Categorical

NUM_DATA = 10_000
BATCH_SIZE = 128
STEPS_PER_DRAW = 10
#: The driver of the kernel runs (``--driver``): Pyro's ``MCMC`` or pyro_flat's ``LeanMCMC``.
DRIVER: type = MCMC
LEARNING_RATE = 0.1  # SGD learning rate on the mean loss; step_size = lr / N
STEP_SIZE = LEARNING_RATE / NUM_DATA
KERNELS = ("SGLD", "SGHMC", "CyclicalSGLD")


# ---------------------------------------------------------------------------------- networks


def make_mlp() -> nn.Module:
    return nn.Sequential(
        nn.Flatten(), nn.Linear(784, 100), nn.ReLU(), nn.Linear(100, 100), nn.ReLU(),
        nn.Linear(100, 10),
    )


def make_cnn() -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(1, 8, 3), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(8, 16, 3), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(16 * 5 * 5, 10),
    )


NETWORKS: dict[str, tuple[Callable[[], nn.Module], tuple[int, ...]]] = {
    "MLP 784-100-100-10": (make_mlp, (784,)),
    "CNN 8-16 conv": (make_cnn, (1, 28, 28)),
}


def random_data(input_shape: tuple[int, ...]) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.randn(NUM_DATA, *input_shape), torch.randint(0, 10, (NUM_DATA,))


def bayesian(net: nn.Module) -> tuple[PyroModule, str]:
    """``net`` as a PyroModule with N(0, 1) priors, and which builder made it."""
    try:
        from pyro_flat.models.nn import make_bayesian

        return make_bayesian(net, prior_scale=1.0), "pyro_flat.models.nn.make_bayesian"
    except Exception as error:  # the helper is work in progress: fall back to the plain idiom
        print(f"make_bayesian failed ({error!r}); building the priors by hand", file=sys.stderr)
    to_pyro_module_(net)
    for module in net.modules():
        for name, p in list(module.named_parameters(recurse=False)):
            prior = dist.Normal(torch.zeros(()), torch.ones(())).expand(p.shape)
            setattr(module, name, PyroSample(prior.to_event(p.dim())))
    return net, "PyroSample by hand"


def subsampled_model(net: PyroModule) -> BNN:
    """The Bayesian network as a Pyro model on minibatches of ``BATCH_SIZE``."""
    return BNN(net, Categorical(), subsample_size=BATCH_SIZE)


# ---------------------------------------------------------------------------------- hand-written


class EpochIndices:
    """Minibatch indices: one permutation of ``range(n)`` per epoch, cut into batches."""

    def __init__(self, n: int, batch_size: int, per_step_randperm: bool = False):
        self.n, self.batch_size, self.per_step = n, batch_size, per_step_randperm
        self.perm = torch.randperm(n)
        self.pos = 0

    def next(self) -> torch.Tensor:
        if self.per_step:
            return torch.randperm(self.n)[: self.batch_size]
        if self.pos + self.batch_size > self.n:
            self.perm, self.pos = torch.randperm(self.n), 0
        self.pos += self.batch_size
        return self.perm[self.pos - self.batch_size : self.pos]


class HandSGLD:
    """A hand-written SGLD step on a plain network, the baseline of the ratio."""

    def __init__(self, net: nn.Module, x: torch.Tensor, y: torch.Tensor, indices: EpochIndices):
        self.net, self.x, self.y, self.indices = net, x, y, indices
        self.params = {n: p.detach().clone().requires_grad_() for n, p in net.named_parameters()}
        self.leaves = list(self.params.values())
        self.noise = [torch.empty_like(p) for p in self.leaves]
        self.scale = x.shape[0] / indices.batch_size

    def potential_and_grad(self) -> tuple[torch.Tensor, tuple[torch.Tensor, ...]]:
        ind = self.indices.next()
        logits = functional_call(self.net, self.params, (self.x[ind],))
        nll = F.cross_entropy(logits, self.y[ind], reduction="sum")
        u = 0.5 * sum(p.square().sum() for p in self.leaves) + self.scale * nll
        return u, torch.autograd.grad(u, self.leaves)

    def step(self) -> None:
        _, grads = self.potential_and_grad()
        with torch.no_grad():
            torch._foreach_add_(self.leaves, grads, alpha=-STEP_SIZE)
            for buffer in self.noise:
                buffer.normal_()
            torch._foreach_add_(self.leaves, self.noise, alpha=math.sqrt(2 * STEP_SIZE))


def storing_draws(hand: HandSGLD, steps: int) -> Callable[[], None]:
    """``steps`` hand-written steps that also copy the parameters into a buffer of draws every
    ``STEPS_PER_DRAW`` steps, allocated for the run as a driver's is (its first touch counted):
    the floor of a run that keeps its draws (``--hand-stores-draws``)."""
    def run() -> None:
        buffer = torch.empty(steps // STEPS_PER_DRAW, sum(p.numel() for p in hand.leaves))
        for i in range(steps):
            hand.step()
            if (i + 1) % STEPS_PER_DRAW == 0:
                torch.cat([p.detach().reshape(-1) for p in hand.leaves],
                          out=buffer[i // STEPS_PER_DRAW])

    return run


# ---------------------------------------------------------------------------------- kernels


def make_kernel(name: str, model: BNN) -> SGMCMCKernel:
    """A kernel taking one draw every ``STEPS_PER_DRAW`` SG steps at a comparable step size."""
    if name == "SGLD":
        return SGLD(model, step_size=STEP_SIZE, num_steps_per_sample=STEPS_PER_DRAW)
    if name == "SGHMC":  # SGD with momentum 0.9 at the same effective learning rate lr / (1 - mu)
        return SGHMC.from_sgd(
            model, 0.1 * LEARNING_RATE, 0.9, NUM_DATA, num_steps_per_sample=STEPS_PER_DRAW
        )
    if name == "CyclicalSGLD":  # a draw at the end of every 10-step cycle, no noiseless stage
        return CyclicalSGLD(
            model, step_size=2 * STEP_SIZE, cycle_length=STEPS_PER_DRAW,
            exploration_fraction=0.0, draws_per_cycle=1,
        )
    raise ValueError(f"unknown kernel {name!r}")


def run_mcmc(kernel_name: str, model: BNN, data: tuple, num_draws: int) -> MCMC:
    mcmc = DRIVER(make_kernel(kernel_name, model), num_samples=num_draws, warmup_steps=0,
                disable_progbar=True)
    mcmc.run(*data)
    return mcmc


# ---------------------------------------------------------------------------------- timing


class Timing(NamedTuple):
    """Seconds of wall-clock time and of process CPU time."""

    wall: float
    cpu: float

    def __sub__(self, other: Timing) -> Timing:
        return Timing(self.wall - other.wall, self.cpu - other.cpu)

    def per_step_ms(self, steps: int) -> Timing:
        return Timing(1e3 * self.wall / steps, 1e3 * self.cpu / steps)


def timed(fn: Callable[[], Any]) -> Timing:
    """Wall and CPU time of ``fn()``, after a garbage collection.

    CPU time leaves out the time the process waits for a core, the main noise on a shared
    machine; with one torch thread it is the work done.
    """
    gc.collect()
    wall, cpu = time.perf_counter(), time.process_time()
    fn()
    return Timing(time.perf_counter() - wall, time.process_time() - cpu)


def repeat(fn: Callable[[], Any], steps: int) -> Callable[[], None]:
    def loop() -> None:
        for _ in range(steps):
            fn()

    return loop


def mcmc_timing(kernel_name: str, model: BNN, data: tuple, steps: int) -> Timing:
    return timed(lambda: run_mcmc(kernel_name, model, data, steps // STEPS_PER_DRAW))


# ---------------------------------------------------------------------------------- memory


def _status_kib(key: str) -> int:
    with open("/proc/self/status") as f:
        return int(re.search(rf"^{key}:\s+(\d+)", f.read(), re.M).group(1))


def _release_free_memory() -> None:
    """Hand freed heap memory back to the OS, so that a run's allocations show up in its RSS.

    Without it glibc keeps the blocks freed by earlier runs, and a later run reusing them shows
    no rise at all.
    """
    gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):  # not glibc
        pass


def peak_rss_rise_mb(fn: Callable[[], Any]) -> tuple[float, Any, str]:
    """Rise of the peak resident set size while ``fn()`` runs, its result and the method used."""
    _release_free_memory()
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # reset VmHWM to the current RSS (Linux >= 4.0)
        before, method = _status_kib("VmRSS"), "VmHWM after malloc_trim and clear_refs"
    except OSError:
        before, method = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, "ru_maxrss"
    result = fn()
    after = _status_kib("VmHWM") if method.startswith("VmHWM") else (
        resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    )
    return (after - before) / 1024, result, method


def draws_mb(mcmc: MCMC) -> float:
    return sum(v.numel() * v.element_size() for v in mcmc.get_samples().values()) / 2**20


# ---------------------------------------------------------------------------------- one network


def _ratios(num: list[float], den: list[float]) -> list[float]:
    return [a / b for a, b in zip(num, den, strict=True)]


@dataclass
class Row:
    """Per-round times (ms per SG step, wall and CPU) of one kernel and its paired hand step."""

    network: str
    kernel: str
    num_params: int
    hand_ms: list[float] = field(default_factory=list)
    kernel_ms: list[float] = field(default_factory=list)
    steady_ms: list[float] = field(default_factory=list)
    hand_cpu_ms: list[float] = field(default_factory=list)
    kernel_cpu_ms: list[float] = field(default_factory=list)
    one_draw_s: list[float] = field(default_factory=list)
    fixed_s: list[float] = field(default_factory=list)
    peak_rss_mb: float = math.nan
    hand_peak_rss_mb: float = math.nan
    draws_mb: float = math.nan

    def add_round(self, hand: Timing, run: Timing, one: Timing, steps: int) -> None:
        steady = (run - one).per_step_ms(steps - STEPS_PER_DRAW)
        self.hand_ms.append(hand.per_step_ms(steps).wall)
        self.hand_cpu_ms.append(hand.per_step_ms(steps).cpu)
        self.kernel_ms.append(run.per_step_ms(steps).wall)
        self.kernel_cpu_ms.append(run.per_step_ms(steps).cpu)
        self.steady_ms.append(steady.wall)
        self.one_draw_s.append(one.wall)
        self.fixed_s.append(one.wall - STEPS_PER_DRAW * steady.wall / 1e3)

    @property
    def ratios(self) -> list[float]:
        return _ratios(self.kernel_ms, self.hand_ms)

    @property
    def steady_ratios(self) -> list[float]:
        return _ratios(self.steady_ms, self.hand_ms)

    @property
    def cpu_ratios(self) -> list[float]:
        return _ratios(self.kernel_cpu_ms, self.hand_cpu_ms)

    @property
    def best_ratio(self) -> float:
        """Fastest kernel round over fastest hand round: noise only ever adds time."""
        return min(self.kernel_ms) / min(self.hand_ms)


@dataclass
class PotentialRow:
    """Per-round times (ms, wall and CPU) of the potential and its gradient alone."""

    network: str
    hand_ms: list[float] = field(default_factory=list)
    kernel_ms: list[float] = field(default_factory=list)
    hand_cpu_ms: list[float] = field(default_factory=list)
    kernel_cpu_ms: list[float] = field(default_factory=list)

    def add(self, who: str, timing: Timing) -> None:
        getattr(self, f"{who}_ms").append(timing.wall)
        getattr(self, f"{who}_cpu_ms").append(timing.cpu)

    @property
    def ratios(self) -> list[float]:
        return _ratios(self.kernel_ms, self.hand_ms)

    @property
    def cpu_ratios(self) -> list[float]:
        return _ratios(self.kernel_cpu_ms, self.hand_cpu_ms)


def kernel_potential(model: BNN, data: tuple, indices: EpochIndices) -> Callable:
    """``kernel.potential_and_grad`` of a set-up SGLD kernel on fresh minibatches.

    Distribution validation is off, as ``MCMC.run`` turns it off (``disable_validation=True``).
    """
    kernel = make_kernel("SGLD", model)
    kernel.setup(0, *data)

    def potential_and_grad() -> Any:
        with pyro.validation_enabled(False):
            return kernel.potential_and_grad(indices.next())

    return potential_and_grad


def measure_network(network: str, args: argparse.Namespace) -> tuple[list[Row], PotentialRow]:
    factory, input_shape = NETWORKS[network]
    data = random_data(input_shape)
    per_step = args.hand_indices == "randperm"
    hand = HandSGLD(factory(), *data, EpochIndices(NUM_DATA, BATCH_SIZE, per_step))
    net, builder = bayesian(factory())
    model = subsampled_model(net)
    num_params = sum(p.numel() for p in hand.leaves)
    print(f"\n{network}: {num_params:,} parameters, priors from {builder}", flush=True)
    kernels = tuple(args.kernels)
    rows = {k: Row(network, k, num_params) for k in kernels}
    pot = PotentialRow(network)
    pot_kernel = kernel_potential(model, data, EpochIndices(NUM_DATA, BATCH_SIZE, per_step))
    hand_pot = hand.potential_and_grad

    warm = max(args.steps // 3, STEPS_PER_DRAW)
    for fn in (hand.step, hand_pot, pot_kernel):
        timed(repeat(fn, warm))
    for k in kernels:
        mcmc_timing(k, model, data, warm)

    for r in range(args.rounds):
        order = kernels[r % len(kernels):] + kernels[: r % len(kernels)]
        for k in order:  # each kernel measurement next to its own hand-written one
            hand_t = timed(storing_draws(hand, args.steps) if args.hand_stores_draws
                           else repeat(hand.step, args.steps))
            run_t = mcmc_timing(k, model, data, args.steps)
            one_t = mcmc_timing(k, model, data, STEPS_PER_DRAW)
            rows[k].add_round(hand_t, run_t, one_t, args.steps)
        pot_steps = args.steps // 2
        pair = [("hand", hand_pot), ("kernel", pot_kernel)]
        for who, fn in pair if r % 2 == 0 else pair[::-1]:
            pot.add(who, timed(repeat(fn, pot_steps)).per_step_ms(pot_steps))
        print(f"  round {r + 1}/{args.rounds}: "
              + ", ".join(f"{k} {rows[k].ratios[-1]:.2f}x" for k in kernels), flush=True)

    for k in kernels:
        rise, mcmc, method = peak_rss_rise_mb(
            lambda k=k: run_mcmc(k, model, data, args.steps // STEPS_PER_DRAW)
        )
        rows[k].peak_rss_mb, rows[k].draws_mb = rise, draws_mb(mcmc)
    hand_rise = peak_rss_rise_mb(repeat(hand.step, args.steps))[0]
    for row in rows.values():
        row.hand_peak_rss_mb = hand_rise
    args.memory_method = method
    return list(rows.values()), pot


# ---------------------------------------------------------------------------------- report


def median_range(values: list[float], fmt: str = "{:.2f}") -> str:
    return (f"{fmt.format(statistics.median(values))} "
            f"[{fmt.format(min(values))}, {fmt.format(max(values))}]")


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            match = re.search(r"^model name\s*:\s*(.+)$", f.read(), re.M)
        return match.group(1).strip() if match else platform.processor()
    except OSError:
        return platform.processor()


def markdown(rows: list[Row], pots: list[PotentialRow], meta: dict[str, Any]) -> str:
    med = statistics.median
    lines = [
        "# SG step overhead: kernel through `pyro.infer.MCMC` vs hand-written SGLD",
        "",
        f"- command: `{meta['command']}`",
        f"- date: {meta['date']}; torch {meta['torch']}, pyro-ppl {meta['pyro']}, "
        f"Python {meta['python']}",
        f"- CPU: {meta['cpu']} ({meta['cpu_count']} cores visible), torch threads: "
        f"{meta['threads']}",
        f"- N = {NUM_DATA}, batch {BATCH_SIZE}, {STEPS_PER_DRAW} SG steps per draw, "
        f"{meta['steps']} steps per measurement, {meta['rounds']} rounds; hand-written minibatch "
        f"indices: {meta['hand_indices']}; driver: {meta.get('driver', 'MCMC')}; hand-written "
        f"run stores its draws: {meta.get('hand_stores_draws', False)}",
        "",
        "Ratio = kernel ms/step (wall time of `MCMC.run` incl. setup / SG steps) over hand-written "
        "ms/step, median [min, max] over rounds (the JSON also has the ratios of process CPU "
        "time). Best = fastest kernel round over fastest hand round. Steady ratio leaves out "
        f"the setup: (T_run - T_1draw) / (steps - {STEPS_PER_DRAW}). Setup s = wall time of a run "
        f"with `num_samples=1` (setup, {STEPS_PER_DRAW} SG steps, final diagnostics); fixed s = "
        f"that minus {STEPS_PER_DRAW} steady steps, the per-run cost. Peak MB = rise of peak RSS "
        f"during one kernel run ({meta['memory_method']}; a hand-written run of as many steps "
        "in brackets); draws MB = bytes of the stored draws.",
        "",
        "| network | kernel | hand ms/step | kernel ms/step | ratio | best | steady ratio "
        "| setup s | fixed s | peak MB | draws MB |",
        "|---|---|---:|---:|---|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(
            f"| {r.network} | {r.kernel} | {med(r.hand_ms):.3f} | {med(r.kernel_ms):.3f} "
            f"| {median_range(r.ratios)} | {r.best_ratio:.2f} "
            f"| {med(r.steady_ratios):.2f} | {med(r.one_draw_s):.3f} | {med(r.fixed_s):.3f} "
            f"| {r.peak_rss_mb:.1f} [{r.hand_peak_rss_mb:.1f}] | {r.draws_mb:.1f} |"
        )
    lines += [
        "",
        "Potential and gradient alone (`kernel.potential_and_grad` vs hand-written log joint + "
        "`autograd.grad`, same minibatch draw):",
        "",
        "| network | hand ms | kernel ms | ratio | best |",
        "|---|---:|---:|---|---:|",
    ]
    for p in pots:
        lines.append(f"| {p.network} | {med(p.hand_ms):.3f} | {med(p.kernel_ms):.3f} "
                     f"| {median_range(p.ratios)} | {min(p.kernel_ms) / min(p.hand_ms):.2f} |")
    return "\n".join(lines) + "\n"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    global STEPS_PER_DRAW, DRIVER
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps-per-draw", type=int, default=STEPS_PER_DRAW,
                        help="SG steps per draw (1: thin 1, a draw's work in every step; "
                        "CyclicalSGLD needs at least 2)")
    parser.add_argument("--kernels", nargs="+", choices=KERNELS, default=list(KERNELS))
    parser.add_argument("--driver", choices=("MCMC", "LeanMCMC"), default="MCMC",
                        help="pyro.infer.MCMC (stacks the draws at the end) or "
                        "pyro_flat.LeanMCMC (copies each into one preallocated buffer)")
    parser.add_argument("--steps", type=int, default=300, help="SG steps per measurement")
    parser.add_argument("--rounds", type=int, default=7, help="interleaved measurement rounds")
    parser.add_argument("--threads", type=int, default=1, help="torch.set_num_threads")
    parser.add_argument("--quick", action="store_true", help="smoke run: 30 steps, 2 rounds")
    parser.add_argument("--hand-indices", choices=("epoch", "randperm"), default="epoch",
                        help="how the hand-written step draws its minibatch indices")
    parser.add_argument("--hand-stores-draws", action="store_true",
                        help="the hand-written run also copies every draw into a buffer of "
                        "draws (the floor of a run that keeps them)")
    parser.add_argument("--out", type=Path, default=None,
                        help="JSON path, the table goes next to it as .md (default: "
                        "benchmarks/results/step_overhead.json, step_overhead_quick.json with "
                        "--quick)")
    args = parser.parse_args(argv)
    if args.quick:
        args.steps, args.rounds = 30, 2
    if args.steps_per_draw < 1 or (args.steps_per_draw < 2 and "CyclicalSGLD" in args.kernels):
        parser.error("--steps-per-draw must be at least 1 (2 with CyclicalSGLD, whose cycle "
                     "ends each draw)")
    STEPS_PER_DRAW = args.steps_per_draw
    if args.driver == "LeanMCMC":
        from pyro_flat import LeanMCMC

        DRIVER = LeanMCMC
    if args.out is None:
        name = "step_overhead_quick.json" if args.quick else "step_overhead.json"
        args.out = Path("benchmarks/results") / name
    if args.steps < 2 * STEPS_PER_DRAW or args.steps % STEPS_PER_DRAW:
        parser.error(f"--steps must be a multiple of {STEPS_PER_DRAW}, at least "
                     f"{2 * STEPS_PER_DRAW}")
    if args.rounds < 1 or args.threads < 1:
        parser.error("--rounds and --threads must be at least 1")
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    pyro.set_rng_seed(0)
    rows: list[Row] = []
    pots: list[PotentialRow] = []
    for network in NETWORKS:
        net_rows, pot = measure_network(network, args)
        rows += net_rows
        pots.append(pot)
    meta = {
        "command": shlex.join([Path(sys.executable).name, *sys.argv]),
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "torch": torch.__version__, "pyro": pyro.__version__, "python": platform.python_version(),
        "cpu": cpu_model(), "cpu_count": torch.multiprocessing.cpu_count(),
        "threads": torch.get_num_threads(), "steps": args.steps, "rounds": args.rounds,
        "hand_indices": args.hand_indices, "driver": args.driver,
        "hand_stores_draws": args.hand_stores_draws,
        "memory_method": args.memory_method,
        "num_data": NUM_DATA, "batch_size": BATCH_SIZE, "steps_per_draw": STEPS_PER_DRAW,
        "step_size": STEP_SIZE,
    }
    table = markdown(rows, pots, meta)
    print("\n" + table)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    results = [
        {**asdict(r), "ratios": r.ratios, "cpu_ratios": r.cpu_ratios,
         "steady_ratios": r.steady_ratios, "best_ratio": r.best_ratio}
        for r in rows
    ]
    potentials = [{**asdict(p), "ratios": p.ratios, "cpu_ratios": p.cpu_ratios} for p in pots]
    payload = {"meta": meta, "results": results, "potential": potentials}
    args.out.write_text(json.dumps(payload, indent=2) + "\n")
    args.out.with_suffix(".md").write_text(table)
    print(f"wrote {args.out} and {args.out.with_suffix('.md')}")


if __name__ == "__main__":
    main()
