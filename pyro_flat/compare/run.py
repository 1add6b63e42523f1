"""Run ``pyro-flat compare``: every requested method, the shared evaluation, the output folder."""

from __future__ import annotations

import math
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from pyro_flat.compare import figures, output, registry
from pyro_flat.compare.common import Context
from pyro_flat.compare.config import Plan, Settings
from pyro_flat.compare.evaluation import METRICS, Evaluation, evaluate
from pyro_flat.compare.models import describe


@dataclass
class Options:
    """The checked command-line options of ``compare``."""

    methods: list[str]
    dataset: str
    model: str
    budget: str | int
    seed: int
    device: torch.device
    out: Path
    argv: list[str]
    threads: int = 1
    progress: bool | None = None  # None: bars when stderr is a terminal


def _say(message: str, end: str = "\n") -> None:
    print(message, end=end, file=sys.stderr, flush=True)


def _failed_row(start: float, err: BaseException) -> dict:
    message = " ".join(f"{type(err).__name__}: {err}".split())
    return {**dict.fromkeys(METRICS, math.nan), "grad_evals": None, "draws": None,
            "wall_time_s": time.perf_counter() - start, "status": f"failed: {message}"}


def compare(opts: Options, settings: Settings, plan: Plan) -> int:
    """Run every method of ``opts`` and the reference; print the table; write the folder."""
    from pyro_flat import __version__, to_arviz
    from pyro_flat.datasets import load_dataset

    data = load_dataset(opts.dataset, seed=opts.seed).to(opts.device)
    arch = describe(opts.model, data.input_shape[0], data.num_classes, settings)
    _say(
        f"pyro-flat compare: {data.name} ({data.num_train} train, {data.num_test} test, "
        f"{data.x_ood.shape[0]} OOD), {arch}, {plan.steps} gradient evaluations per method, "
        f"{plan.num_draws} kept draws, seed {opts.seed}"
    )
    ctx = Context(data, settings, plan, opts.seed, opts.model, opts.progress)
    rows, draws, evaluations, notes = [], {}, {}, {}
    todo = [*opts.methods, registry.BASELINE]
    for i, name in enumerate(todo, 1):
        label = "sgd (MAP reference)" if name == registry.BASELINE else name
        _say(f"[{i}/{len(todo)}] {label} ...", end="\n" if opts.progress else " ")
        start = time.perf_counter()
        try:
            fit = registry.ALL[name].run(name, ctx)
            ev: Evaluation = evaluate(fit, data, opts.seed)
            idata = fit.idata if fit.idata is not None else to_arviz(fit.samples)
        except Exception as err:  # e.g. a chain that diverged: report it, keep the others
            row = _failed_row(start, err)
            _say(f"failed after {row['wall_time_s']:.1f} s: {row['status'][8:]}")
        else:
            row = {**ev.metrics, "grad_evals": fit.grad_evals,
                   "draws": len(next(iter(fit.samples.values()))),
                   "wall_time_s": time.perf_counter() - start, "status": "ok"}
            evaluations[name] = ev
            draws[name] = idata
            if fit.notes:
                notes[name] = fit.notes
            _say(f"{row['wall_time_s']:.1f} s, accuracy {row['accuracy']:.3f}")
        rows.append({"method": name, **row})

    meta = {
        "pyro_flat_version": __version__,
        "torch_version": torch.__version__,
        "command": ["pyro-flat", *opts.argv],
        "dataset": data.name,
        "num_train": data.num_train,
        "num_test": data.num_test,
        "num_ood": int(data.x_ood.shape[0]),
        "ood": data.ood_description,
        "model": opts.model,
        "architecture": arch,
        "budget": opts.budget,
        "seed": opts.seed,
        "device": str(opts.device),
        "threads": opts.threads,
        "settings": asdict(settings),
        "plan": asdict(plan),
        "method_notes": notes,
        "draw_files": {m: output.DRAWS_PATTERN.format(m) for m in draws},
        "figures": list(figures.FIGURES) if evaluations else [],
        "metrics": (
            "test-set accuracy, NLL (mean -log p(y|x), p clamped at 1e-12), ECE (15 equal-width "
            "bins), Brier (sum over classes), OOD AUROC (predictive entropy, test vs OOD), "
            "sharpness (mean over draws of L(theta + 0.05 g/|g|) - L(theta), mean training "
            "loss on the first 1000 training points)"
        ),
    }
    print(output.format_table(rows), flush=True)

    def write(folder: Path) -> None:
        output.write_results(folder, rows, meta, draws)
        figures.write_figures(folder, evaluations, data.y_test.cpu())

    try:
        output.write_atomically(opts.out, write)
    except Exception as err:
        message = " ".join(str(err).split())
        _say(f"pyro-flat: error: cannot write the results to {str(opts.out)!r}: {message}")
        return 1
    written = ["results.json", "results.md", *meta["figures"], *meta["draw_files"].values()]
    print(f"\nwrote {opts.out / 'results.csv'}, {', '.join(written)}")
    failed = [r["method"] for r in rows if r["status"] != "ok"]
    if failed:
        _say(f"pyro-flat: error: failed: {', '.join(failed)} (see results.json)")
        return 1
    return 0


