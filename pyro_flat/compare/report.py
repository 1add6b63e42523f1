"""The report of a ``pyro-flat compare`` run: from the per-seed runs to the printed table, the
metadata and the files of the output folder.

:func:`build_report` takes every seed's :class:`SeedRun` (what
:func:`pyro_flat.compare.run.run_seed` returns) and builds the one :class:`Report` the command
prints and writes: the table of one seed, or with several seeds the means ± standard errors and the
paired differences against the baseline (:mod:`pyro_flat.compare.seeds`); the scores against the HMC
reference and its convergence warnings (:mod:`pyro_flat.compare.reference`); the hyper-parameters
``--tune`` chose (:mod:`pyro_flat.compare.tuning`); and ``results.json``'s metadata.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

from pyro_flat.compare import figures, output, registry, seeds
from pyro_flat.compare.config import Options, Plan, Settings
from pyro_flat.compare.evaluation import DESCRIPTIONS, Evaluation, task_metrics
from pyro_flat.compare.task import likelihood, task_of

#: How the summary over several seeds is computed (``results.json``'s ``protocol``).
PROTOCOL = ("every method once per seed (data split or generation, initialisation, minibatches, "
            "noise); mean ± standard error over the seeds where it succeeded; paired differences "
            "method - baseline over the seeds where both succeeded, with a 95% Student t "
            "interval (* when it excludes zero); the per-method figures are of the first seed")


@dataclass
class SeedRun:
    """Every method of one seed: the table's rows and what the output files need."""

    seed: int
    data: Any
    arch: str
    jobs: int
    rows: list[dict]
    draws: dict[str, Any]
    evaluations: dict[str, Evaluation]
    notes: dict[str, dict]
    tuning: dict[str, dict] = field(default_factory=dict)


@dataclass
class Report:
    """What a run prints (``text``) and writes (:meth:`write`): the rows of every seed, the
    metric columns, ``results.json``'s metadata and, with several seeds, the paired
    differences."""

    runs: list[SeedRun]
    rows: list[dict]
    metrics: tuple[str, ...]
    meta: dict[str, Any]
    text: str
    pairs: dict[str, Any] | None = None

    @property
    def several_seeds(self) -> bool:
        return len(self.runs) > 1

    @property
    def files(self) -> list[str]:
        """The files :meth:`write` writes beside ``results.csv``."""
        return ["results.json", "results.md", *self.meta["figures"],
                *self.meta["draw_files"].values()]

    @property
    def failed_methods(self) -> list[str]:
        """The methods with a failed run (on any seed)."""
        return sorted({r["method"] for r in self.rows if r["status"] != "ok"})

    def write(self, folder: Path) -> None:
        """Write the results, draws and figures into ``folder`` (see
        :func:`pyro_flat.compare.output.write_atomically`, which gives a fresh folder)."""
        first = self.runs[0]
        if self.several_seeds:
            output.write_results(folder, self.rows, self.meta, {}, markdown=self.text,
                                 by_seed=True)
            for run in self.runs:
                output.write_draws(folder, {f"{m}_seed{run.seed}": d
                                            for m, d in run.draws.items()})
            seeds.write_figure(folder, self.pairs, metrics=self.metrics)
        else:
            output.write_results(folder, self.rows, self.meta, first.draws, markdown=self.text)
        figures.write_figures(folder, first.evaluations, first.data)


def build_report(opts: Options, settings: Settings, plan: Plan, runs: list[SeedRun]) -> Report:
    """The report of ``runs`` (one :class:`SeedRun` per seed, in order) of a run with ``opts``,
    ``settings`` and ``plan``. The table's columns are the metrics of the data set's task
    (:func:`pyro_flat.compare.evaluation.task_metrics`), then the scores against the
    reference when there is one."""
    task = task_of(runs[0].data)
    metrics = task_metrics(task)[0]
    if opts.reference != "none":
        from pyro_flat.compare.reference import score_names

        metrics = (*metrics, *score_names(task))
    meta = _metadata(opts, settings, plan, runs)
    if len(runs) > 1:
        report = _over_seeds(runs, metrics, meta)
    else:
        report = Report(runs, runs[0].rows, metrics, meta,
                        output.format_table(runs[0].rows, metrics))
    if opts.reference != "none":
        _add_reference(report, opts.reference)
    if opts.tune_plan is not None:
        _add_tuning(report, opts)
    if opts.reference != "none":
        report.text += _reference_warnings(meta["reference"])
    return report


def _metadata(opts: Options, settings: Settings, plan: Plan, runs: list[SeedRun]
              ) -> dict[str, Any]:
    from pyro_flat import __version__

    first = runs[0]
    data = first.data
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
        "architecture": first.arch,
        "budget": opts.budget,
        "seed": opts.seed,
        "device": str(opts.device),
        "threads": opts.threads,
        "jobs": first.jobs,
        "settings": asdict(settings),
        "plan": asdict(plan),
        "method_notes": first.notes,
        "draw_files": {m: output.DRAWS_PATTERN.format(m) for m in first.draws},
        "figures": figures.names(data) if first.evaluations else [],
        "metrics": DESCRIPTIONS[task_of(data)],
    }
    if task_of(data) == "regression":  # (a classification's meta is as it was before)
        meta.update({"task": "regression", "likelihood": repr(likelihood("regression")),
                     "y_mean": data.y_mean, "y_std": data.y_std})
    return meta


def _over_seeds(runs: list[SeedRun], metrics: tuple[str, ...], meta: dict[str, Any]) -> Report:
    """Several seeds: every seed's rows, the summary, the paired differences, the failures."""
    by_seed = {run.seed: run.rows for run in runs}
    summary = seeds.summarise(by_seed, metrics)
    pairs = seeds.paired_differences(by_seed, metrics=metrics)
    rows = [{"seed": run.seed, **row} for run in runs for row in run.rows]
    meta.update({
        "seeds": list(by_seed),
        "method_notes": {run.seed: run.notes for run in runs},
        "draw_files": {f"{m}_seed{run.seed}": output.DRAWS_PATTERN.format(f"{m}_seed{run.seed}")
                       for run in runs for m in run.draws},
        "figures_seed": runs[0].seed,
        "summary": summary,
        "paired_differences": pairs,
        "protocol": PROTOCOL,
    })
    if pairs:
        meta["figures"] = [*meta["figures"], seeds.FIGURE]
    text = (f"mean ± standard error over {len(runs)} seeds\n\n"
            + seeds.format_summary(summary, metrics))
    if pairs:
        text += ("\n\npaired differences, method - baseline (mean ± standard error; * the "
                 "95% t interval excludes 0)\n\n" + seeds.format_paired(pairs, metrics))
    failures = seeds.format_failures(by_seed)
    if failures:
        text += ("\n\nfailed runs (left out of the means and of the pairs they belong to)"
                 "\n\n" + failures)
    return Report(runs, rows, metrics, meta, text, pairs)


def _add_reference(report: Report, name: str) -> None:
    """The reference's notes (by seed) and the descriptions of the scores against it."""
    from pyro_flat.compare import reference

    report.meta["reference"] = {run.seed: run.notes.get(name) for run in report.runs}
    report.meta["reference_scores"] = reference.SCORES
    report.meta["metric_columns"] = list(report.metrics)


def _reference_warnings(notes_by_seed: dict[int, Any]) -> str:
    """Lines under the table for every seed whose reference failed its convergence checks."""
    lines = [f"seed {seed}: {'; '.join(notes['problems'])}"
             for seed, notes in notes_by_seed.items()
             if notes is not None and not notes.get("converged", True)]
    if not lines:
        return ""
    return ("\n\nwarning: the HMC reference failed its convergence checks (scores against it "
            "are not distances to the posterior):\n" + "\n".join(lines))


def _add_tuning(report: Report, opts: Options) -> None:
    """What ``--tune`` tried and chose, per seed."""
    from pyro_flat.compare import tuning

    reports = {run.seed: run.tuning for run in report.runs}
    report.meta["tuning"] = {
        "protocol": tuning.PROTOCOL,
        "validation_fraction": tuning.VALIDATION_FRACTION,
        "candidates_per_method": tuning.CANDIDATES,
        "plan_per_candidate": asdict(opts.tune_plan),
        "search_factors": {m: dict(registry.method(m).search)
                           for m in [*opts.methods, registry.BASELINE]},
        "by_seed": reports,
    }
    report.text += ("\n\nhyper-parameters chosen on the validation split (lowest validation NLL "
                    f"of {tuning.CANDIDATES} candidates per method)\n\n"
                    + tuning.format_choices(reports))
