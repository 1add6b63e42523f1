"""The ``pyro-flat`` command: compare the inference methods on a built-in data set.

``pyro-flat compare`` trains one Bayesian network with each requested method at an equal budget
of SG steps (or of gradient evaluations), plus a plain SGD/MAP network for reference, and
reports the Bayesian model average's accuracy, NLL, ECE, Brier score and OOD AUROC (RMSE, NLL,
CRPS, calibration error and OOD AUROC on a regression set), the draws' sharpness, the gradient
evaluations and the wall time; it writes a table, the figures and each method's draws into the
output folder. Every setting, output and exit status is described in ``docs/compare.md`` (the
documentation site's "Comparing the methods" page); the pieces live in
:mod:`pyro_flat.compare`, and this module is the command line.
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
    Options,
    Plan,
    Settings,
    make_plan,
)
from pyro_flat.compare.evaluation import METRICS
from pyro_flat.compare.models import MODELS, build_cnn, build_mlp
from pyro_flat.compare.output import COLUMNS, format_table, output_problem
from pyro_flat.compare.reference import REFERENCES
from pyro_flat.compare.run import compare
from pyro_flat.compare.task import (
    MODELS_FOR_TASK,
    dataset_task,
    task_settings,
)
from pyro_flat.compare.tuning import tuning_plan
from pyro_flat.datasets import DATASETS

__all__ = [
    "BUDGETS", "COLUMNS", "METRICS", "Budget", "Plan", "Settings",
    "build_cnn", "build_mlp", "format_table", "main", "make_plan",
]

#: The data sets that torchvision reads from files (and downloads with ``--download``).
DOWNLOADED = ("mnist", "fashion_mnist", "cifar10")
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
            f"default: all those of the data set's task ({', '.join(registry.implemented())}; "
            "laplace on classification only)"
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
              "T = 1e-4, its 2 last draws of each cycle kept); finetune: --model is trained "
              "by SGD first, then every method runs on a part of it (--finetune-part) "
              "(default: %(default)s)"),
    )
    compare_parser.add_argument(
        "--finetune-part", default="head", choices=("head", "adapters"),
        help=("with --protocol finetune: head, the last linear layer on the frozen "
              "backbone's features; adapters, rank-4 low-rank adapters on every linear layer, "
              "the rest frozen (default: %(default)s)"),
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
    task = dataset_task(args.dataset)
    methods_text = (args.methods if args.methods is not None
                    else ",".join(registry.implemented(task)))
    if args.model not in MODELS_FOR_TASK[task]:
        parser.error(f"argument --model: {args.model!r} does not fit the {task} data set "
                     f"{args.dataset!r}; choose from {', '.join(MODELS_FOR_TASK[task])}")
    if args.download and args.dataset not in DOWNLOADED:
        parser.error(f"argument --download: only {', '.join(DOWNLOADED)} are downloaded; "
                     f"{args.dataset!r} is generated or shipped with a package (leave "
                     "--download out)")
    methods = _methods(parser, methods_text)
    other_task = [n for n in methods if task not in registry.ALL[n].tasks]
    if other_task:
        parser.error(f"argument --methods: {', '.join(other_task)} do(es) not run on the {task} "
                     f"data set {args.dataset!r}; the methods for it: "
                     f"{', '.join(registry.implemented(task))}")
    opts = Options(
        methods=methods,
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
    if args.finetune_part != "head" and args.protocol != "finetune":
        parser.error("argument --finetune-part: only with --protocol finetune")
    settings = task_settings(task, protocol=args.protocol, hidden=args.hidden,
                             finetune_part=args.finetune_part)
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
