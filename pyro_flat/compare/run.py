"""Run ``pyro-flat compare``: every requested method, the shared evaluation, the output folder."""

from __future__ import annotations

import math
import os
import pickle
import sys
import time
from dataclasses import dataclass, replace
from typing import Any

import torch

from pyro_flat.compare import output, registry
from pyro_flat.compare.common import Context
from pyro_flat.compare.config import Options, Plan, Settings
from pyro_flat.compare.evaluation import Evaluation, evaluate, task_metrics
from pyro_flat.compare.models import describe
from pyro_flat.compare.report import SeedRun, build_report
from pyro_flat.compare.task import num_outputs, task_of


def _say(message: str, end: str = "\n") -> None:
    print(message, end=end, file=sys.stderr, flush=True)


def _failed_row(start: float, cpu: float, err: BaseException, metrics: tuple[str, ...]) -> dict:
    message = " ".join(f"{type(err).__name__}: {err}".split())
    return {**dict.fromkeys(metrics, math.nan), "grad_evals": None, "draws": None,
            "wall_time_s": time.perf_counter() - start, "cpu_time_s": time.process_time() - cpu,
            "status": f"failed: {message}"}


#: What running one method gives: its row, its evaluation, its ArviZ draws and its notes (the
#: last three ``None`` / empty if it failed).
Outcome = tuple[dict, Evaluation | None, Any, dict]


def run_method(name: str, ctx: Context, export: bool = True) -> Outcome:
    """Run, evaluate and (with ``export``) export one method; a failure becomes a ``failed``
    row."""
    from pyro_flat import to_arviz

    start, cpu = time.perf_counter(), time.process_time()
    try:
        fit = registry.method(name).run(name, ctx)
        ev = evaluate(fit, ctx.data, ctx.seed, full=export)
        idata = None
        if export:
            idata = fit.idata if fit.idata is not None else to_arviz(
                # a fresh model with the same sites (net.*): the draws replace all its weights
                fit.samples, model=ctx.bnn(), model_args=(ctx.data.x_test, ctx.data.y_test))
    except Exception as err:  # e.g. a chain that diverged: report it, keep the others
        return _failed_row(start, cpu, err, task_metrics(ctx.task)[0]), None, None, {}
    row = {**ev.metrics, "grad_evals": fit.grad_evals,
           "draws": len(next(iter(fit.samples.values()))),
           "wall_time_s": time.perf_counter() - start,
           "cpu_time_s": time.process_time() - cpu, "status": "ok"}
    return row, ev, idata, fit.notes


@dataclass(frozen=True)
class Job:
    """One run of one method: ``label`` names it in the progress lines, ``ctx`` holds its
    data, settings and plan; ``export`` asks for its ArviZ draws."""

    label: str
    method: str
    ctx: Context
    export: bool = True


def warm_up(threads: int | None = None) -> None:
    """Import what the runners import, so that no method's wall time includes it."""
    import arviz  # noqa: F401
    import pyro.infer  # noqa: F401
    import pyro.infer.autoguide  # noqa: F401

    import pyro_flat.draws.export  # noqa: F401
    import pyro_flat.evaluation.flatness  # noqa: F401
    import pyro_flat.evaluation.predictive  # noqa: F401
    import pyro_flat.infer  # noqa: F401
    import pyro_flat.optim  # noqa: F401

    if threads is not None:
        torch.set_num_threads(threads)


def _init_worker(threads: int, parent: int, counter: Any) -> None:
    """A worker process: ends with its parent (Linux), imports warmed up, ``threads`` threads,
    progress reported to ``counter`` (or ``None``)."""
    from pyro_flat.compare import common

    common.SHARED_COUNTER = counter
    if sys.platform.startswith("linux"):
        import ctypes
        import signal

        try:  # PR_SET_PDEATHSIG = 1: a killed parent takes its workers along
            ctypes.CDLL(None).prctl(1, signal.SIGTERM)
        except (OSError, AttributeError):
            pass
        if os.getppid() != parent:  # it died before the line above
            os._exit(1)
    warm_up(threads)


def _worker(job: bytes, threads: int) -> bytes:
    """:func:`run_method` in a worker process (one per CPU core, ``--jobs``), the job and its
    outcome as pickled bytes.

    Sent as they are, their tensors would go through torch's shared-memory hand-off, whose
    file descriptors ``multiprocessing`` passes over a socket in a ``pymp-*`` folder of
    ``$TMPDIR``: a run killed with ``SIGKILL`` leaves that folder behind (in the parent and in
    every worker). Plain bytes take the pipe and leave nothing.
    """
    torch.set_num_threads(threads)
    task: Job = pickle.loads(job)
    return pickle.dumps(run_method(task.method, task.ctx, task.export))


def _summary(row: dict) -> str:
    if row["status"] != "ok":
        return f"failed after {row['wall_time_s']:.1f} s: {row['status'][8:]}"
    if "accuracy" in row:
        return f"{row['wall_time_s']:.1f} s, accuracy {row['accuracy']:.3f}"
    return f"{row['wall_time_s']:.1f} s, RMSE {row['rmse']:.3f}, NLL {row['nll']:.3f}"


def _label(name: str) -> str:
    return "sgd (MAP reference)" if name == registry.BASELINE else name


def _grads(job: Job) -> int:
    """The gradient evaluations ``job`` will report to the progress bar."""
    plan = job.ctx.plan
    return plan.steps * (registry.method(job.method).grads_per_step if plan.unit == "steps" else 1)


def run_jobs(jobs: list[Job], workers: int, threads: int,
             progress: bool | None) -> dict[str, Outcome]:
    """Every job, in order in this process (``workers == 1``) or in ``workers`` worker
    processes; the outcomes by label."""
    if workers > 1 and len(jobs) > 1:
        return _run_in_parallel(jobs, workers, threads, progress)
    warm_up()
    outcomes = {}
    for i, job in enumerate(jobs, 1):
        _say(f"[{i}/{len(jobs)}] {_label(job.label)} ...", end="\n" if progress else " ")
        outcomes[job.label] = run_method(job.method, job.ctx, job.export)
        _say(_summary(outcomes[job.label][0]))
    return outcomes


def _run_in_parallel(jobs: list[Job], workers: int, threads: int,
                     progress: bool | None) -> dict[str, Outcome]:
    """Each job in one of ``workers`` worker processes, the costliest first.

    Every method seeds itself, so its numbers do not depend on the process it runs in. The
    progress bar counts the gradient evaluations of all workers together.
    """
    import multiprocessing
    from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait

    mp = multiprocessing.get_context("spawn")
    show = sys.stderr.isatty() if progress is None else progress
    counter = mp.Value("q", 0) if show else None
    bar = None
    if show:
        from tqdm.auto import tqdm

        what = "methods" if all(j.label == j.method for j in jobs) else "runs"
        bar = tqdm(total=sum(map(_grads, jobs)), desc=f"{len(jobs)} {what}", unit="grad",
                   file=sys.stderr, dynamic_ncols=True, mininterval=0.5)
    say = bar.write if bar is not None else _say
    jobs = [replace(job, ctx=replace(job.ctx, show_progress=False)) for job in jobs]
    order = sorted(jobs, key=lambda j: -registry.method(j.method).cost * _grads(j))
    outcomes: dict[str, Outcome] = {}
    start = time.perf_counter()
    try:
        with ProcessPoolExecutor(max_workers=min(workers, len(jobs)), mp_context=mp,
                                 initializer=_init_worker,
                                 initargs=(threads, os.getpid(), counter)) as pool:
            futures = {pool.submit(_worker, pickle.dumps(job), threads): job for job in order}
            pending = set(futures)
            while pending:
                done, pending = wait(pending, timeout=0.5, return_when=FIRST_COMPLETED)
                if bar is not None:
                    bar.n = min(counter.value, bar.total)
                    bar.refresh()
                for future in done:
                    job = futures[future]
                    label = job.label
                    try:
                        outcomes[label] = pickle.loads(future.result())
                    except Exception as err:  # the worker process died
                        metrics = task_metrics(job.ctx.task)[0]
                        outcomes[label] = (_failed_row(start, time.process_time(), err, metrics),
                                           None, None, {})
                    say(f"[{len(outcomes)}/{len(jobs)}] {_label(label)}: "
                        f"{_summary(outcomes[label][0])}")
    finally:
        if bar is not None:
            bar.close()
    return outcomes


def tune(opts: Options, data: Any, settings: Settings, seed: int, todo: list[str],
         workers: int, model: str | None = None,
         trained: torch.nn.Module | None = None
         ) -> tuple[dict[str, Settings], dict[str, dict]]:
    """``--tune``: every candidate of every method of ``todo`` on the validation split of
    ``data`` (:mod:`pyro_flat.compare.tuning`); each method's chosen settings and its trials.
    ``model`` and ``trained``: as the final runs' (default ``opts.model``, none)."""
    model = opts.model if model is None else model
    from pyro_flat.compare import tuning

    val = tuning.validation_split(data, seed)
    plan = opts.tune_plan
    _say(f"tuning on a validation split ({val.num_train} train, {val.num_test} validation), "
         f"{tuning.CANDIDATES} candidates per method at {plan.steps} SG steps each")
    jobs, values = [], {}
    for name in todo:
        for i, candidate in enumerate(tuning.candidates(name, settings), 1):
            label = f"{name} [tune {i}/{tuning.CANDIDATES}]"
            values[label] = candidate
            ctx = Context(val, replace(settings, **candidate), plan, seed, model,
                          opts.progress, trained)
            jobs.append(Job(label, name, ctx, export=False))
    outcomes = run_jobs(jobs, workers, opts.threads, opts.progress)
    chosen, report = {}, {}
    for name in todo:
        trials = [{"values": values[job.label], "status": outcomes[job.label][0]["status"],
                   "nll": outcomes[job.label][0]["nll"]} for job in jobs if job.method == name]
        best = tuning.choose(name, trials)
        chosen[name] = replace(settings, **best)
        report[name] = {"chosen": best or "defaults (every candidate failed)",
                        "trials": trials}
    return chosen, report


def _score_against_reference(outcomes: dict[str, Outcome], name: str, task: str,
                             seed: int) -> None:
    """Add each run's distance to the reference ``name`` to its row (``nan`` when either
    failed)."""
    from pyro_flat.compare import reference

    ref = outcomes[name][1]
    for row, ev, *_ in outcomes.values():
        found = (reference.scores(ev, ref, task, seed) if ev is not None and ref is not None
                 else dict.fromkeys(reference.score_names(task), math.nan))
        row.update(found)


def run_seed(opts: Options, settings: Settings, plan: Plan, seed: int) -> SeedRun | None:
    """Run every method of ``opts`` and the reference with ``seed``; ``None`` (after saying
    why) when the data set cannot be loaded."""
    from pyro_flat.datasets import load_dataset

    try:
        data = load_dataset(opts.dataset, seed=seed, download=opts.download)
    except (OSError, ImportError) as err:  # e.g. torchvision files missing: nothing written
        message = " ".join(str(err).split())
        _say(f"pyro-flat: error: cannot load the data set {opts.dataset!r}: {message}")
        return None
    data = data.to(opts.device)
    arch = describe(opts.model, data.input_shape, num_outputs(data), settings)
    model, trained = opts.model, None
    if settings.protocol == "finetune":  # the methods see the trained network's last layer
        from pyro_flat.compare.finetune import pretrain

        _say(f"pyro-flat compare: training {arch} by {settings.finetune_steps} SGD steps")
        data, trained, arch = pretrain(data, settings, opts.model, seed)
        model = "finetune"
        if settings.finetune_part == "adapters":
            settings = replace(settings, lr=settings.lr * settings.adapter_lr_factor)
    jobs = opts.jobs if opts.device.type == "cpu" else 1
    _say(
        f"pyro-flat compare: {data.name} ({data.num_train} train, {data.num_test} test, "
        f"{data.x_ood.shape[0]} OOD), {arch}, {plan.steps} "
        f"{'SG steps' if plan.unit == 'steps' else 'gradient evaluations'} per method, "
        f"{plan.num_draws} kept draws, seed {seed}"
        + (f", {jobs} methods at a time" if jobs > 1 else "")
    )
    todo = [*opts.methods, registry.BASELINE]
    chosen, tuning_report = dict.fromkeys(todo, settings), {}
    if opts.tune_plan is not None:
        chosen, tuning_report = tune(opts, data, settings, seed, todo, jobs, model, trained)
    final = [Job(name, name, Context(data, chosen[name], plan, seed, model, opts.progress,
                                     trained)) for name in todo]
    if opts.reference != "none":  # at the defaults, never tuned; the last row
        todo.append(opts.reference)
        final.append(Job(opts.reference, opts.reference,
                         Context(data, settings, plan, seed, model, opts.progress,
                                 trained)))
    outcomes = run_jobs(final, jobs, opts.threads, opts.progress)
    if opts.reference != "none":
        _score_against_reference(outcomes, opts.reference, task_of(data), seed)
    rows, draws, evaluations, notes = [], {}, {}, {}
    for name in todo:  # the table keeps the order of the methods
        row, ev, idata, note = outcomes[name]
        rows.append({"method": name, **row})
        if ev is not None:
            evaluations[name], draws[name] = ev, idata
        if note:
            notes[name] = note
    return SeedRun(seed, data, arch, jobs, rows, draws, evaluations, notes, tuning_report)


def compare(opts: Options, settings: Settings, plan: Plan) -> int:
    """Run every method of ``opts`` and the reference for each seed, print the report's table
    (with several seeds: means ± standard errors and the paired differences) and write the
    output folder (:mod:`pyro_flat.compare.report`)."""
    runs: list[SeedRun] = []
    for seed in range(opts.seed, opts.seed + opts.seeds):
        run = run_seed(opts, settings, plan, seed)
        if run is None:
            return 1
        runs.append(run)
    report = build_report(opts, settings, plan, runs)
    print(report.text, flush=True)
    try:
        output.write_atomically(opts.out, report.write)
    except Exception as err:
        message = " ".join(str(err).split())
        _say(f"pyro-flat: error: cannot write the results to {str(opts.out)!r}: {message}")
        return 1
    print(f"\nwrote {opts.out / 'results.csv'}, {', '.join(report.files)}")
    if report.failed_methods:
        _say(f"pyro-flat: error: failed: {', '.join(report.failed_methods)} (see results.json)")
        return 1
    return 0
