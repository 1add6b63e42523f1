"""The ``pyro-flat`` command: compare the samplers on a built-in data set.

``pyro-flat compare`` trains one Bayesian MLP with each requested SG-MCMC kernel at an equal
budget of minibatch gradient evaluations, plus a plain SGD/MAP network of the same
architecture for reference, and reports test accuracy, NLL, ECE, Brier score and OOD AUROC of
the Bayesian model average and the mean sharpness of the draws, prints one table and writes
``results.csv``, ``results.json`` and the draws of each MCMC method (``draws_<method>.nc``,
ArviZ netCDF) into the output folder.

Setup (the same for every method; see :class:`Settings`):

* Network: MLP ``d-100-100-10`` with ReLU, every weight and bias with the prior
  ``N(0, 3^2 / fan_in)`` (``make_bayesian(net, prior_scale=3.0, scale_rule="fan_in")``). The
  fan-in scaling keeps the scale of the activations bounded for networks drawn near the prior
  (a gain of about 2 per ReLU layer here); the factor 3 keeps the prior's pull weak. Measured
  with the quick budget: ``N(0, 1/fan_in)`` acts on the mean loss as an L2 penalty of
  ``fan_in / N`` per weight (0.025 for a 100-unit layer on MNIST-1D's 4000 points), too strong:
  its MAP reaches 48% *train* accuracy on MNIST-1D. A fixed ``N(0, 1)`` lets the chains drift
  to weights of RMS about 1, where each 100-unit layer amplifies by about 7, the loss gets
  sharp and SGLD at ``lr = 0.2`` blows up on digits (weights RMS 0.9 to 100 within 750 steps).
* Likelihood ``Categorical(logits=net(x))`` on minibatches of 128, scaled by ``N/B``; posterior
  temperature 1.
* Step sizes come from one SGD-like learning rate ``lr`` on the *mean* loss (``lr = 0.2``): the
  kernels' step sizes act on ``U = -log prior - (N/B) sum log lik``, ``N`` times the mean loss,
  so a step of SGD with rate ``lr`` is ``step_size = lr / N``. SGLD uses ``lr / N``; SGHMC is
  SGD with momentum 0.9 and rate ``lr * (1 - 0.9)`` (the same effective rate ``lr``) through
  ``SGHMC.from_sgd``; cyclical SGLD starts each cosine cycle at ``2 lr / N`` (mean ``lr / N``
  over the cycle), the first 80% of each cycle noiseless; the SGD reference uses the same rate
  and momentum as SGHMC, on the mean loss plus the prior's penalty (its MAP). EntropyMCMC
  uses ``lr / N`` with ``eta = 40 lr / N`` (the authors' ratio ``step / eta = 0.025``) and
  averages the predictions of its theta and guide draws, as the authors do. SASGLD uses
  ``lr / N`` with ``rho = 0.05`` and, with two gradients per step, half the steps.
* Sharpness: the mean over the kept draws of ``L(theta + rho g/|g|) - L(theta)`` (mean loss on
  the first 1,000 training points, ``rho = 0.05``; :func:`pyro_flat.flatness.sharpness`); for
  the SGD reference, of its one point.
* Budget: every method spends the same number of gradient evaluations (SG steps, halved for
  SASGLD). The first quarter is warmup
  (discarded); the rest yields the kept draws, evenly spaced for SGLD and SGHMC (thinning) and
  at the end of each cosine cycle for cyclical SGLD (4 cycles in the quick mode, of which the
  first is warmup). Predictions are the Bayesian model average over the kept draws. The
  ``grad evals`` column is the minibatch gradients each method took (``kernel.num_steps``
  for the kernels, twice that for SASGLD); the kernels' one extra evaluation at the end, which
  fills in the last draw's ``lp`` statistic, is not counted. ``wall time`` covers building,
  sampling (or training) and predicting.
* torch runs on one CPU thread by default (``--threads``): the small networks gain nothing
  from more, and lose a lot when the machine is busy.

Exit status: 0 on success; 1 if a method failed (its row says why, the others are written)
or the results could not be written; 2 on a usage error (one line on stderr, nothing written).
The output folder is written at the end, into a temporary folder next to it that is then
renamed, so an interrupted or failed run leaves no half-written output behind.

Measured with ``time ./dev pyro-flat compare`` (quick mode, MNIST-1D, seed 0) on 2 CPU cores:
98 s, test accuracy 0.74 (SGLD), 0.73 (SGHMC), 0.67 (cyclical SGLD), 0.70 (EntropyMCMC),
0.70 (SASGLD), 0.65 (SGD).
"""

from __future__ import annotations

import argparse
import copy
import csv
import json
import math
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, NoReturn

import torch

__all__ = ["main"]

#: The MCMC methods ``compare`` runs, by name, and the kernel each one uses.
IMPLEMENTED = {"sgld": "SGLD", "sghmc": "SGHMC", "csgld": "CyclicalSGLD", "entropy": "EntropyMCMC",
               "sasgld": "SASGLD"}
#: Gradient evaluations per SG step, where not one: such methods take fewer steps, so that every
#: method spends the same number of gradient evaluations.
GRADS_PER_STEP = {"sasgld": 2}
#: The radius of the sharpness-aware ascent step (SASGLD) and of the measured sharpness.
RHO = 0.05
#: Training points on which the sharpness of the draws is measured (the first ones).
SHARPNESS_POINTS = 1000
#: EntropyMCMC's step_size / eta, the authors' CIFAR-10 ratio (lr 0.5 over 50,000, eta 4e-4).
ENTROPY_STEP_OVER_ETA = 0.025
#: Other spellings accepted by ``--methods``.
ALIASES = {"cyclical-sgld": "csgld", "cyclicalsgld": "csgld", "cyclical_sgld": "csgld"}
#: Methods of the mission that do not exist yet: requesting one is an error, never a fake row.
PLANNED = ("contour", "l2e", "svi", "sa-elbo", "hwa", "swag", "ensembles")
#: The reference that every comparison includes.
BASELINE = "sgd"
DATASETS = ("mnist1d", "digits")
MODELS = ("mlp",)
#: Files ``compare`` writes; an existing output folder holding only these may be replaced.
RESULT_FILES = ("results.csv", "results.json")
DRAWS_PATTERN = "draws_{}.nc"
METRICS = ("accuracy", "nll", "ece", "brier", "ood_auroc", "sharpness")
COLUMNS = ("method", *METRICS, "grad_evals", "draws", "wall_time_s", "status")


@dataclass(frozen=True)
class Budget:
    """SG steps per method and the shape of the run: cycles and draws kept per cycle.

    SGLD and SGHMC take ``num_cycles * draws_per_cycle`` evenly spaced draws, of which the
    first ``warmup_cycles * draws_per_cycle`` are warmup; cyclical SGLD runs ``num_cycles``
    cosine cycles, the first ``warmup_cycles`` of them discarded.
    """

    steps: int
    num_cycles: int = 4
    warmup_cycles: int = 1
    draws_per_cycle: int = 4


BUDGETS = {
    "quick": Budget(steps=12_000),
    "full": Budget(steps=120_000, num_cycles=8, warmup_cycles=2, draws_per_cycle=6),
}
#: The smallest integer budget: 4 cycles of 5 steps, each with one step of sampling stage.
MIN_STEPS = 20


@dataclass(frozen=True)
class Settings:
    """The hyperparameters shared by every method (see the module docstring)."""

    hidden: tuple[int, ...] = (100, 100)
    prior_scale: float = 3.0
    scale_rule: str = "fan_in"
    batch_size: int = 128
    lr: float = 0.2
    momentum: float = 0.9
    temperature: float = 1.0
    exploration_fraction: float = 0.8


# ------------------------------------------------------------------------------------ parsing


class _Parser(argparse.ArgumentParser):
    """An argument parser whose errors are one line on stderr (exit status 2)."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message}\n")


def _budget(text: str) -> str | int:
    text = text.strip().lower()
    if text in BUDGETS:
        return text
    try:
        steps = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"must be 'quick', 'full' or a positive integer number of SG steps, got {text!r}"
        ) from None
    if steps < MIN_STEPS:
        raise argparse.ArgumentTypeError(
            f"must be 'quick', 'full' or an integer >= {MIN_STEPS} SG steps, got {text!r}"
        )
    return steps


def _seed(text: str) -> int:
    try:
        seed = int(text)
    except ValueError:
        seed = -1
    if not 0 <= seed < 2**32:
        raise argparse.ArgumentTypeError(f"must be an integer in [0, 2**32), got {text!r}")
    return seed


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {text!r}")
    return value


def _methods(parser: argparse.ArgumentParser, text: str) -> list[str]:
    """The requested methods in order, without duplicates; a usage error for bad names."""
    names = []
    for raw in text.split(","):
        name = ALIASES.get(raw.strip().lower(), raw.strip().lower())
        if name and name not in names:
            names.append(name)
    implemented = ", ".join(IMPLEMENTED)
    planned = [n for n in names if n in PLANNED]
    unknown = [n for n in names if n not in IMPLEMENTED and n not in PLANNED and n != BASELINE]
    if unknown:
        parser.error(
            f"argument --methods: unknown method(s) {', '.join(unknown)} (implemented: "
            f"{implemented}; planned: {', '.join(PLANNED)})"
        )
    if planned:
        parser.error(
            f"argument --methods: not implemented yet: {', '.join(planned)} (implemented: "
            f"{implemented})"
        )
    names = [n for n in names if n != BASELINE]
    if not names:
        parser.error(f"argument --methods: name at least one of {implemented}")
    return names


def _device(parser: argparse.ArgumentParser, text: str) -> torch.device:
    try:
        device = torch.device(text)
    except (RuntimeError, ValueError):
        parser.error(f"argument --device: not a torch device: {text!r} (e.g. cpu, cuda, cuda:0)")
    if device.type == "cuda" and not torch.cuda.is_available():
        parser.error(f"argument --device: {text!r} requested but CUDA is not available")
    if device.type == "mps" and not torch.backends.mps.is_available():
        parser.error(f"argument --device: {text!r} requested but MPS is not available")
    if device.type not in ("cpu", "cuda", "mps"):
        parser.error(f"argument --device: unsupported device type {device.type!r}")
    return device


def _kept(budget: Budget) -> int:
    return (budget.num_cycles - budget.warmup_cycles) * budget.draws_per_cycle


def _build_parser() -> _Parser:
    from pyro_flat import __version__

    parser = _Parser(
        prog="pyro-flat",
        description="Flat-seeking inference for Bayesian neural networks in Pyro.",
    )
    parser.add_argument("--version", action="version", version=f"pyro-flat {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    commands.required = True
    s = Settings()
    quick, full = BUDGETS["quick"], BUDGETS["full"]
    compare = commands.add_parser(
        "compare",
        help="compare the SG-MCMC kernels and an SGD baseline on a built-in data set",
        description=(
            "Train one Bayesian MLP (ReLU, hidden layers "
            f"{'-'.join(map(str, s.hidden))}, prior N(0, {s.prior_scale:g}^2/fan_in) on every "
            "weight and bias) "
            "with each method at an equal budget of SG steps (minibatches of "
            f"{s.batch_size}), plus a plain SGD/MAP network for reference; print one table of "
            "test accuracy, NLL, ECE, Brier score and OOD AUROC (by predictive entropy) of the "
            "Bayesian model average; write results.csv, results.json and the draws of each "
            "MCMC method (draws_<method>.nc, ArviZ netCDF) into the output folder. Step sizes "
            f"come from one SGD learning rate lr={s.lr:g} on the mean loss: SGLD step_size = "
            f"lr/N; SGHMC = SGD with momentum {s.momentum:g} and rate lr*(1-momentum); "
            "cyclical SGLD starts each cosine cycle at 2*lr/N."
        ),
    )
    compare.add_argument(
        "--dataset", default="mnist1d", choices=DATASETS,
        help="data set, generated or shipped locally (default: %(default)s)",
    )
    compare.add_argument(
        "--methods", default=",".join(IMPLEMENTED), metavar="LIST",
        help=(
            f"comma-separated MCMC methods among {', '.join(IMPLEMENTED)} (csgld: cyclical "
            f"SGLD); the SGD reference always runs; default: %(default)s. Planned but not "
            f"implemented yet, hence refused: {', '.join(PLANNED)}"
        ),
    )
    compare.add_argument(
        "--budget", default="quick", type=_budget, metavar="BUDGET",
        help=(
            f"SG steps (gradient evaluations) per method, the first quarter warmup: 'quick' "
            f"= {quick.steps} steps, {_kept(quick)} kept draws (about a minute on 2 CPU "
            f"cores); 'full' = {full.steps} steps, {_kept(full)} kept draws (about ten "
            f"minutes); or an integer >= {MIN_STEPS} "
            "(the quick layout with that many steps); default: %(default)s"
        ),
    )
    compare.add_argument(
        "--seed", default=0, type=_seed,
        help="seed of the data split and of every method (default: %(default)s)",
    )
    compare.add_argument(
        "--device", default="cpu", help="torch device, e.g. cpu or cuda (default: %(default)s)"
    )
    compare.add_argument(
        "--threads", default=1, type=_positive_int,
        help=(
            "CPU threads for torch (default: %(default)s; the small networks run fastest on "
            "one, and more threads slow down badly on a busy machine)"
        ),
    )
    compare.add_argument(
        "--out", default="pyro-flat-out", type=Path, metavar="FOLDER",
        help=(
            "output folder (default: %(default)s); written at the end, all at once; an "
            "existing folder is replaced only if it is empty or holds a previous pyro-flat "
            "output"
        ),
    )
    compare.add_argument(
        "--model", default="mlp", choices=MODELS,
        help="network architecture (default: %(default)s)",
    )
    compare.set_defaults(handler=compare_command, subparser=compare)
    return parser


# ------------------------------------------------------------------------------ output folder


def _is_previous_output(path: Path) -> bool:
    """Whether ``path`` is an empty folder or holds only files that ``compare`` writes."""
    try:
        entries = list(path.iterdir())
    except OSError:
        return False
    prefix, suffix = DRAWS_PATTERN.split("{}")
    for entry in entries:
        name = entry.name
        ours = name in RESULT_FILES or (name.startswith(prefix) and name.endswith(suffix))
        if not (ours and entry.is_file() and not entry.is_symlink()):
            return False
    return True


def _check_output(parser: argparse.ArgumentParser, out: Path) -> Path:
    """Fail early (a usage error) if ``out`` cannot be written or must not be replaced."""
    out = Path(os.path.abspath(out.expanduser()))
    if out.exists() or out.is_symlink():
        if not out.is_dir() or out.is_symlink():
            parser.error(f"argument --out: {str(out)!r} exists and is not a folder")
        if not _is_previous_output(out):
            parser.error(
                f"argument --out: {str(out)!r} exists and holds files pyro-flat did not write; "
                "choose a new or empty folder"
            )
    ancestor = out.parent
    while not ancestor.exists():
        ancestor = ancestor.parent
    if not ancestor.is_dir():
        parser.error(f"argument --out: cannot create {str(out)!r}: {str(ancestor)!r} is a file")
    if not os.access(ancestor, os.W_OK | os.X_OK):
        parser.error(f"argument --out: cannot write into {str(ancestor)!r} (permission denied)")
    return out


def _write_atomically(out: Path, write: Any) -> None:
    """Call ``write(folder)`` on a fresh folder next to ``out``, then move it to ``out``.

    On any failure nothing is left behind: neither the temporary folder, nor parent folders
    created for it, and a previous output at ``out`` is restored.
    """
    missing = []
    parent = out.parent
    while not parent.exists():
        missing.append(parent)
        parent = parent.parent
    tmp = old = None
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-", dir=out.parent))
        umask = os.umask(0)
        os.umask(umask)
        tmp.chmod(0o777 & ~umask)  # mkdtemp makes it private
        write(tmp)
        if out.exists():
            old = Path(tempfile.mkdtemp(prefix=f".{out.name}.old-", dir=out.parent))
            old.rmdir()
            out.rename(old)
        tmp.rename(out)
        tmp = None
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
            old = None
    except BaseException:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
        if old is not None and not out.exists():
            old.rename(out)
        for folder in missing:  # deepest first
            try:
                folder.rmdir()
            except OSError:
                break
        raise


# ----------------------------------------------------------------------------------- methods


class ClassifierModel:
    """The Pyro model: ``Categorical(logits=net(x))`` on a minibatch of ``batch_size``.

    A class rather than a closure so that it pickles (worker processes). The minibatch indices
    are drawn first and the network runs outside the plate, so that its ``PyroSample`` priors
    are not batched over the plate.
    """

    def __init__(self, net: torch.nn.Module, batch_size: int):
        self.net = net
        self.batch_size = batch_size

    def __call__(self, x: torch.Tensor, y: torch.Tensor) -> None:
        import pyro
        import pyro.distributions as dist

        plate = pyro.plate("data", x.shape[0], subsample_size=min(self.batch_size, x.shape[0]))
        with plate as ind:
            pass
        logits = self.net(x[ind])
        with plate:
            pyro.sample("obs", dist.Categorical(logits=logits), obs=y[ind])


def build_mlp(in_features: int, num_classes: int, hidden: Sequence[int]) -> torch.nn.Sequential:
    """``in_features - hidden... - num_classes`` with ReLU between the linear layers."""
    layers: list[torch.nn.Module] = []
    width = in_features
    for h in hidden:
        layers += [torch.nn.Linear(width, h), torch.nn.ReLU()]
        width = h
    layers.append(torch.nn.Linear(width, num_classes))
    return torch.nn.Sequential(*layers)


@dataclass(frozen=True)
class Plan:
    """How a budget is spent: SG steps per draw for SGLD/SGHMC, cycles for cyclical SGLD."""

    num_draws: int  # kept draws
    warmup_draws: int
    thin: int  # SG steps per draw (SGLD, SGHMC)
    num_cycles: int
    warmup_cycles: int
    cycle_length: int
    draws_per_cycle: int

    @property
    def steps(self) -> int:
        return self.thin * (self.num_draws + self.warmup_draws)


def make_plan(budget: Budget, exploration_fraction: float) -> Plan:
    """Spend ``budget.steps`` SG steps alike in every method (up to rounding down).

    Cycles of ``L`` steps, ``L`` a multiple of the draws per cycle, so that SGLD and SGHMC,
    thinned by ``L / draws_per_cycle``, take exactly the steps of cyclical SGLD. Short budgets
    keep fewer draws per cycle: at most the steps in the sampling stage of a cycle.
    """
    per_cycle = budget.draws_per_cycle
    while True:
        cycle_length = budget.steps // (budget.num_cycles * per_cycle) * per_cycle
        sampling = cycle_length - math.ceil(exploration_fraction * cycle_length)
        if cycle_length >= 2 and sampling >= per_cycle:
            break
        per_cycle -= 1
        if per_cycle == 0:
            raise ValueError(f"budget must be at least {MIN_STEPS} SG steps, got {budget.steps}")
    return Plan(
        num_draws=(budget.num_cycles - budget.warmup_cycles) * per_cycle,
        warmup_draws=budget.warmup_cycles * per_cycle,
        thin=cycle_length // per_cycle,
        num_cycles=budget.num_cycles,
        warmup_cycles=budget.warmup_cycles,
        cycle_length=cycle_length,
        draws_per_cycle=per_cycle,
    )


def _evaluate(probs_test: torch.Tensor, probs_ood: torch.Tensor, y: torch.Tensor) -> dict:
    from pyro_flat import metrics

    return {
        "accuracy": metrics.accuracy(probs_test, y),
        "nll": metrics.nll(probs_test, y),
        "ece": metrics.ece(probs_test, y),
        "brier": metrics.brier(probs_test, y),
        "ood_auroc": metrics.ood_auroc(
            metrics.predictive_entropy(probs_test, reduction="none"),
            metrics.predictive_entropy(probs_ood, reduction="none"),
        ),
    }


def _sharpness(net: torch.nn.Module, draws: dict, data: Any) -> float:
    """Mean sharpness (seed 003) of the draws on the first training points."""
    from pyro_flat.flatness import sharpness

    x, y = data.x_train[:SHARPNESS_POINTS], data.y_train[:SHARPNESS_POINTS]
    return float(sharpness(net, draws, x, y, rho=RHO).mean())


def run_mcmc(method: str, data: Any, settings: Settings, plan: Plan, seed: int) -> tuple:
    """One MCMC method: ``(row, InferenceData)``."""
    import pyro
    from pyro.infer import MCMC

    from pyro_flat import to_arviz
    from pyro_flat.infer import SASGLD, SGHMC, SGLD, CyclicalSGLD, EntropyMCMC
    from pyro_flat.infer.mcmc.entropy import select_draws
    from pyro_flat.nn import make_bayesian
    from pyro_flat.predictive import bma_probs

    start = time.perf_counter()
    pyro.clear_param_store()
    pyro.set_rng_seed(seed)
    device = data.x_train.device
    net = build_mlp(data.input_shape[0], data.num_classes, settings.hidden).to(device)
    net = make_bayesian(net, prior_scale=settings.prior_scale, scale_rule=settings.scale_rule)
    model = ClassifierModel(net, settings.batch_size)
    n, lr, t = data.num_train, settings.lr, settings.temperature
    if method == "sgld":
        kernel = SGLD(model, step_size=lr / n, num_steps_per_sample=plan.thin, temperature=t)
        num_samples, warmup = plan.num_draws, plan.warmup_draws
    elif method == "sghmc":
        kernel = SGHMC.from_sgd(
            model, lr * (1 - settings.momentum), settings.momentum, n,
            num_steps_per_sample=plan.thin, temperature=t,
        )
        num_samples, warmup = plan.num_draws, plan.warmup_draws
    elif method == "csgld":
        kernel = CyclicalSGLD(
            model, step_size=2 * lr / n, cycle_length=plan.cycle_length,
            exploration_fraction=settings.exploration_fraction,
            draws_per_cycle=plan.draws_per_cycle, temperature=t,
        )
        num_samples = (plan.num_cycles - plan.warmup_cycles) * plan.draws_per_cycle
        warmup = plan.warmup_cycles * plan.draws_per_cycle
    elif method == "entropy":
        kernel = EntropyMCMC(model, step_size=lr / n, eta=lr / n / ENTROPY_STEP_OVER_ETA,
                             num_steps_per_sample=plan.thin, temperature=t)
        num_samples, warmup = plan.num_draws, plan.warmup_draws
    elif method == "sasgld":  # two gradients per step: half the steps of SGLD
        kernel = SASGLD(model, step_size=lr / n, rho=RHO, temperature=t,
                        num_steps_per_sample=max(plan.thin // GRADS_PER_STEP[method], 1))
        num_samples, warmup = plan.num_draws, plan.warmup_draws
    else:  # pragma: no cover - guarded by the parser
        raise ValueError(f"unknown method {method!r}")
    mcmc = MCMC(kernel, num_samples=num_samples, warmup_steps=warmup, disable_progbar=True)
    mcmc.run(data.x_train, data.y_train)
    samples = mcmc.get_samples()
    if method == "entropy":  # the authors' model average: theta and theta_a draws
        samples = select_draws(samples, "both")
    net.eval()
    row = _evaluate(bma_probs(net, samples, data.x_test), bma_probs(net, samples, data.x_ood),
                    data.y_test)
    row["sharpness"] = _sharpness(net, samples, data)
    row.update(grad_evals=kernel.num_steps * GRADS_PER_STEP.get(method, 1),
               draws=len(next(iter(samples.values()))),
               wall_time_s=time.perf_counter() - start)
    return row, to_arviz(mcmc)


def run_sgd(data: Any, settings: Settings, steps: int, seed: int) -> dict:
    """The reference: SGD with momentum on the mean loss plus the prior's penalty (MAP)."""
    import pyro

    start = time.perf_counter()
    pyro.set_rng_seed(seed)
    device = data.x_train.device
    net = build_mlp(data.input_shape[0], data.num_classes, settings.hidden).to(device)
    n, b = data.num_train, min(settings.batch_size, data.num_train)
    # -log N(w; 0, s^2) per data point is w^2 / (2 s^2 N) + const, whose gradient is SGD's
    # weight decay 1 / (s^2 N); s as make_bayesian sets it: prior_scale, divided by
    # sqrt(fan_in) of the layer's weight under the "fan_in" rule (for the weight and the bias).
    groups = []
    for layer in net.modules():
        if isinstance(layer, torch.nn.Linear):
            fan_in = layer.weight.shape[1] if settings.scale_rule == "fan_in" else 1
            scale2 = settings.prior_scale**2 / fan_in
            groups.append({"params": list(layer.parameters()), "weight_decay": 1 / (scale2 * n)})
    opt = torch.optim.SGD(
        groups, lr=settings.lr * (1 - settings.momentum), momentum=settings.momentum
    )
    perm, pos = None, n
    for _ in range(steps):
        if pos + b > n:  # a new epoch: shuffle, drop the last partial batch (as the kernels do)
            perm, pos = torch.randperm(n, device=device), 0
        idx = perm[pos : pos + b]
        pos += b
        loss = torch.nn.functional.cross_entropy(net(data.x_train[idx]), data.y_train[idx])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    net.eval()
    with torch.no_grad():
        probs_test = torch.softmax(net(data.x_test), -1)
        probs_ood = torch.softmax(net(data.x_ood), -1)
    row = _evaluate(probs_test, probs_ood, data.y_test)
    # the same sharpness as for the draws, on the MAP point as a single "draw"
    from pyro_flat.nn import make_bayesian

    point = {name: p.detach()[None] for name, p in net.named_parameters()}
    row["sharpness"] = _sharpness(make_bayesian(copy.deepcopy(net)), point, data)
    row.update(grad_evals=steps, draws=1, wall_time_s=time.perf_counter() - start)
    return row


# ---------------------------------------------------------------------------------- reporting


def format_table(rows: Sequence[dict]) -> str:
    """A markdown table of the result rows."""
    header = ("method", "accuracy", "NLL", "ECE", "Brier", "OOD AUROC", "sharpness",
              "grad evals", "draws", "wall time (s)")

    def number(value: Any, spec: str) -> str:
        return "-" if value is None or value != value else format(value, spec)

    lines = []
    for r in rows:
        failed = r.get("status", "ok") != "ok"
        lines.append((
            r["method"] + (" (failed)" if failed else ""),
            *(number(r[k], ".4f") for k in METRICS),
            number(r["grad_evals"], "d"), number(r["draws"], "d"),
            number(r["wall_time_s"], ".1f"),
        ))
    widths = [max(len(h), *(len(line[i]) for line in lines)) for i, h in enumerate(header)]

    def fmt(cells: Sequence[str]) -> str:
        padded = [c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in
                  enumerate(zip(cells, widths, strict=True))]
        return "| " + " | ".join(padded) + " |"

    rule = "|" + "|".join(
        "-" * (w + 1) + ":" if i else ":" + "-" * (w + 1) for i, w in enumerate(widths)
    ) + "|"
    return "\n".join([fmt(header), rule, *(fmt(line) for line in lines)])


def _json_safe(value: Any) -> Any:
    """NaN (a failed method's metrics) as null: JSON has no NaN."""
    return None if isinstance(value, float) and not math.isfinite(value) else value


def _write_results(folder: Path, rows: list[dict], meta: dict, draws: dict[str, Any]) -> None:
    with open(folder / "results.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=COLUMNS)
        writer.writeheader()
        for row in rows:
            writer.writerow({k: row[k] for k in COLUMNS})
    with open(folder / "results.json", "w") as f:
        results = [{k: _json_safe(row[k]) for k in COLUMNS} for row in rows]
        json.dump({**meta, "results": results}, f, indent=2, allow_nan=False)
        f.write("\n")
    for method, idata in draws.items():
        idata.to_netcdf(str(folder / DRAWS_PATTERN.format(method)), engine="h5netcdf")


# -------------------------------------------------------------------------------------- main


def _progress(message: str, end: str = "\n") -> None:
    print(message, end=end, file=sys.stderr, flush=True)


def compare_command(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    """The ``compare`` subcommand: check every argument, then run."""
    methods = _methods(parser, args.methods)
    device = _device(parser, args.device)
    out = _check_output(parser, args.out)
    budget = BUDGETS[args.budget] if isinstance(args.budget, str) else Budget(steps=args.budget)
    settings = Settings()
    plan = make_plan(budget, settings.exploration_fraction)
    threads = torch.get_num_threads()
    torch.set_num_threads(args.threads)
    try:
        return _compare(args, methods, device, out, settings, plan)
    finally:
        torch.set_num_threads(threads)  # main() may run inside another program (tests)


def _compare(
    args: argparse.Namespace,
    methods: list[str],
    device: torch.device,
    out: Path,
    settings: Settings,
    plan: Plan,
) -> int:
    from pyro_flat import __version__
    from pyro_flat.datasets import load_dataset

    data = load_dataset(args.dataset, seed=args.seed).to(device)
    _progress(
        f"pyro-flat compare: {data.name} ({data.num_train} train, {data.num_test} test, "
        f"{data.x_ood.shape[0]} OOD), {args.model} {data.input_shape[0]}-"
        f"{'-'.join(map(str, settings.hidden))}-{data.num_classes}, {plan.steps} SG steps "
        f"per method, {plan.num_draws} kept draws, seed {args.seed}"
    )
    rows, draws = [], {}
    todo = [*methods, BASELINE]
    for i, method in enumerate(todo, 1):
        label = "sgd (MAP reference)" if method == BASELINE else method
        _progress(f"[{i}/{len(todo)}] {label} ...", end=" ")
        start = time.perf_counter()
        try:
            if method == BASELINE:
                row = run_sgd(data, settings, plan.steps, args.seed)
            else:
                row, draws[method] = run_mcmc(method, data, settings, plan, args.seed)
        except Exception as err:  # e.g. a chain that diverged: report it, keep the others
            message = " ".join(f"{type(err).__name__}: {err}".split())
            row = {**dict.fromkeys(METRICS, math.nan), "grad_evals": None, "draws": None,
                   "wall_time_s": time.perf_counter() - start, "status": f"failed: {message}"}
            _progress(f"failed after {row['wall_time_s']:.1f} s: {message}")
        else:
            row["status"] = "ok"
            _progress(f"{row['wall_time_s']:.1f} s, accuracy {row['accuracy']:.3f}")
        rows.append({"method": method, **row})

    meta = {
        "pyro_flat_version": __version__,
        "torch_version": torch.__version__,
        "command": ["pyro-flat", *args.argv],
        "dataset": data.name,
        "num_train": data.num_train,
        "num_test": data.num_test,
        "num_ood": int(data.x_ood.shape[0]),
        "ood": data.ood_description,
        "model": args.model,
        "architecture": [data.input_shape[0], *settings.hidden, data.num_classes],
        "budget": args.budget,
        "seed": args.seed,
        "device": str(device),
        "threads": args.threads,
        "settings": asdict(settings),
        "plan": asdict(plan),
        "draw_files": {m: DRAWS_PATTERN.format(m) for m in draws},
        "metrics": (
            "test-set accuracy, NLL (mean -log p(y|x), p clamped at 1e-12), ECE (15 equal-width "
            "bins), Brier (sum over classes), OOD AUROC (predictive entropy, test vs OOD)"
        ),
    }
    print(format_table(rows), flush=True)
    try:
        _write_atomically(out, lambda folder: _write_results(folder, rows, meta, draws))
    except OSError as err:
        _progress(f"pyro-flat: error: cannot write the results to {str(out)!r}: {err}")
        return 1
    files = ["results.json", *(DRAWS_PATTERN.format(m) for m in draws)]
    print(f"\nwrote {out / 'results.csv'}, {', '.join(files)}")
    failed = [r["method"] for r in rows if r["status"] != "ok"]
    if failed:
        _progress(f"pyro-flat: error: failed: {', '.join(failed)} (see results.json)")
        return 1
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``pyro-flat``; returns the exit status (usage errors exit with 2)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = _build_parser()
    args = parser.parse_args(argv)
    args.argv = argv
    return args.handler(args, args.subparser)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
