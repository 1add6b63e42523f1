r"""Several seeds of ``pyro-flat compare``: means with standard errors, and paired differences.

With ``--seeds K`` every method runs once per seed (the seed sets the data split or generation,
the initialisation, the minibatches and the noise), so seed ``s`` gives one row per method.
Over the seeds where a method succeeded, each metric is reported as its mean
:math:`\bar x` and standard error :math:`s/\sqrt{K}` (:math:`s` the sample standard deviation).

A flat-seeking method is compared with its baselines (``Method.baselines``) by the *paired*
differences :math:`d_s = x_s^{\text{method}} - x_s^{\text{baseline}}` over the seeds where both
succeeded: both runs of a seed share the data and the seed, so the seed-to-seed variation that
both share cancels and :math:`\bar d \pm s_d/\sqrt{K}` is sharper than the difference of the two
means. The 95% interval is :math:`\bar d \pm t_{0.975, K-1}\, s_d/\sqrt{K}` (Student's
:math:`t`): a difference is called significant when the interval excludes zero, over at least
:data:`MIN_SEEDS_FOR_SIGNIFICANCE` seeds with differences that vary (two seeds whose differences
happen to be equal, as a discrete metric like accuracy often gives, have a zero standard error
and an interval that says nothing).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path

from pyro_flat.compare.evaluation import HEADERS, HIGHER_IS_BETTER, METRICS

#: The figure of the paired differences.
FIGURE = "paired_differences.png"
#: Seeds needed before a paired difference is called significant.
MIN_SEEDS_FOR_SIGNIFICANCE = 3


def _ok(rows: Sequence[Mapping]) -> dict[str, Mapping]:
    return {r["method"]: r for r in rows if r.get("status", "ok") == "ok"}


def mean_and_se(values: Sequence[float]) -> tuple[float, float]:
    """The mean and its standard error (``nan`` for no value; ``nan`` error for one)."""
    values = [float(v) for v in values if v is not None and not math.isnan(float(v))]
    n = len(values)
    if n == 0:
        return math.nan, math.nan
    mean = math.fsum(values) / n
    if n == 1:
        return mean, math.nan
    variance = math.fsum((v - mean) ** 2 for v in values) / (n - 1)
    return mean, math.sqrt(variance / n)


def t_quantile(level: float, dof: int) -> float:
    """The ``level`` quantile of Student's t with ``dof`` degrees of freedom (SciPy)."""
    from scipy import stats

    return float(stats.t.ppf(level, dof))


def summarise(rows_by_seed: Mapping[int, Sequence[Mapping]],
              metrics: Sequence[str] = METRICS) -> list[dict]:
    """One row per method (in the order of the first seed's rows): for every one of the task's
    ``metrics`` its mean and standard error over the seeds where the method succeeded, and how
    many seeds that is.

    Examples
    --------
    >>> rows = {0: [{"method": "sgld", "nll": 1.0}], 1: [{"method": "sgld", "nll": 1.2}]}
    >>> row = summarise(rows)[0]
    >>> row["method"], row["seeds"], round(row["nll"], 6), round(row["nll_se"], 6)
    ('sgld', 2, 1.1, 0.1)
    """
    order = [r["method"] for r in next(iter(rows_by_seed.values()))]
    out = []
    for method in order:
        ok = [rows[method] for rows in map(_ok, rows_by_seed.values()) if method in rows]
        row: dict = {"method": method, "seeds": len(ok)}
        for metric in metrics:
            if all(metric not in r for r in ok):
                continue
            row[metric], row[f"{metric}_se"] = mean_and_se([r.get(metric) for r in ok])
        for column in ("grad_evals", "wall_time_s"):
            row[column] = mean_and_se([r.get(column) for r in ok])[0]
        out.append(row)
    return out


def paired_differences(rows_by_seed: Mapping[int, Sequence[Mapping]],
                       pairs: Sequence[tuple[str, str]] | None = None,
                       metrics: Sequence[str] = METRICS) -> list[dict]:
    """For every pair ``(method, baseline)`` (default: every method's ``baselines``,
    :data:`pyro_flat.compare.registry.PAIRS`) that both ran: per metric (of ``metrics``, the
    task's) the mean paired
    difference method - baseline over the seeds where both succeeded, its standard error, the
    95% t interval and whether it excludes zero.

    Examples
    --------
    >>> rows = {s: [{"method": "sgld", "nll": 1.0 + s},
    ...             {"method": "sasgld", "nll": 0.9 + s - 0.01 * (s == 2)}] for s in range(3)}
    >>> d = paired_differences(rows)[0]
    >>> d["method"], d["baseline"], round(d["nll"], 4), round(d["nll_se"], 4)
    ('sasgld', 'sgld', -0.1033, 0.0033)
    >>> d["nll_significant"]  # -0.1033 ± 4.30 * 0.0033 excludes zero
    True
    """
    if pairs is None:
        from pyro_flat.compare.registry import PAIRS as pairs
    ran = {r["method"] for rows in rows_by_seed.values() for r in rows}
    out = []
    for method, baseline in pairs:
        if method not in ran or baseline not in ran:
            continue
        both = [(rows[method], rows[baseline]) for rows in map(_ok, rows_by_seed.values())
                if method in rows and baseline in rows]
        row: dict = {"method": method, "baseline": baseline, "seeds": len(both)}
        for metric in metrics:
            diffs = [a[metric] - b[metric] for a, b in both
                     if a.get(metric) is not None and b.get(metric) is not None]
            mean, se = mean_and_se(diffs)
            n = sum(not math.isnan(d) for d in diffs)
            half = t_quantile(0.975, n - 1) * se if n > 1 else math.nan
            row[metric], row[f"{metric}_se"] = mean, se
            row[f"{metric}_low"], row[f"{metric}_high"] = mean - half, mean + half
            # differences equal up to float rounding (a discrete metric) have no spread to test
            spread = se > 1e-9 * abs(mean)
            row[f"{metric}_significant"] = bool(
                n >= MIN_SEEDS_FOR_SIGNIFICANCE and spread and (mean - half > 0 or mean + half < 0))
        out.append(row)
    return out


def _cell(mean: float, se: float) -> str:
    if math.isnan(mean):
        return "-"
    return f"{mean:.4f}" if math.isnan(se) else f"{mean:.4f} ± {se:.4f}"


def markdown_table(header: Sequence[str], lines: Sequence[Sequence[str]]) -> str:
    widths = [max(len(h), *(len(line[i]) for line in lines)) for i, h in enumerate(header)]

    def fmt(cells: Sequence[str]) -> str:
        padded = [c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in
                  enumerate(zip(cells, widths, strict=True))]
        return "| " + " | ".join(padded) + " |"

    rule = "|" + "|".join("-" * (w + 1) + ":" if i else ":" + "-" * (w + 1)
                          for i, w in enumerate(widths)) + "|"
    return "\n".join([fmt(header), rule, *(fmt(line) for line in lines)])


def format_summary(summary: Sequence[Mapping], metrics: Sequence[str] = METRICS) -> str:
    """The mean ± standard error table (one row per method, a column per metric)."""
    header = ("method", *(HEADERS[m] for m in metrics), "grad evals", "wall time (s)", "seeds")
    lines = [(r["method"], *(_cell(r.get(m, math.nan), r.get(f"{m}_se", math.nan))
                             for m in metrics),
              "-" if math.isnan(r["grad_evals"]) else f"{r['grad_evals']:.0f}",
              "-" if math.isnan(r["wall_time_s"]) else f"{r['wall_time_s']:.1f}",
              str(r["seeds"])) for r in summary]
    return markdown_table(header, lines)


def format_paired(pairs: Sequence[Mapping], metrics: Sequence[str] = METRICS) -> str:
    """The paired-difference table; ``*`` marks a 95% interval that excludes zero."""
    header = ("method - baseline", *(HEADERS[m] for m in metrics), "seeds")
    lines = []
    for r in pairs:
        cells = [_cell(r[m], r[f"{m}_se"]) + (" *" if r[f"{m}_significant"] else "")
                 for m in metrics]
        lines.append((f"{r['method']} - {r['baseline']}", *cells, str(r["seeds"])))
    return markdown_table(header, lines)


def format_failures(rows_by_seed: Mapping[int, Sequence[Mapping]]) -> str:
    """One line per failed run, ``- method, seed s: status``, in seed order; ``""`` if none.

    >>> print(format_failures({0: [{"method": "sgld", "status": "ok"}],
    ...                        1: [{"method": "sgld", "status": "failed: diverged"}]}))
    - sgld, seed 1: failed: diverged
    """
    return "\n".join(f"- {r['method']}, seed {seed}: {r['status']}"
                     for seed, rows in sorted(rows_by_seed.items()) for r in rows
                     if r.get("status", "ok") != "ok")


def write_figure(folder: Path, pairs: Sequence[Mapping], dpi: int = 80,
                 metrics: Sequence[str] = METRICS) -> list[str]:
    """One panel per metric (up to three panels a row): each pair's mean difference with its
    95% interval, zero marked; returns the file name (none without pairs)."""
    from matplotlib.figure import Figure

    if not pairs:
        return []
    cols = min(3, len(metrics))
    rows = math.ceil(len(metrics) / cols)
    fig = Figure(figsize=(3.2 * cols, 0.45 * len(pairs) * rows + 1.6), layout="constrained")
    axes = fig.subplots(rows, cols, sharey=True, squeeze=False).ravel()
    for ax in axes[len(metrics):]:
        ax.set_axis_off()
    labels = [f"{r['method']} - {r['baseline']}" for r in pairs]
    ys = list(range(len(pairs)))
    for ax, metric in zip(axes, metrics, strict=False):
        means = [r[metric] for r in pairs]
        low = [r[metric] - r[f"{metric}_low"] if r["seeds"] > 1 else 0.0 for r in pairs]
        high = [r[f"{metric}_high"] - r[metric] if r["seeds"] > 1 else 0.0 for r in pairs]
        ax.errorbar(means, ys, xerr=[low, high], fmt="o", capsize=3)
        ax.axvline(0.0, color="grey", linewidth=0.8)
        better = "higher" if metric in HIGHER_IS_BETTER else "lower"
        ax.set_title(f"{HEADERS[metric]} ({better} is better)", fontsize="small")
        ax.set_yticks(ys, labels, fontsize="small")
    axes[0].set_ylim(len(pairs) - 0.5, -0.5)  # shared: the first pair on top
    fig.suptitle("paired differences, method - baseline (mean, 95% t interval over seeds)",
                 fontsize="small")
    fig.savefig(folder / FIGURE, dpi=dpi)
    return [FIGURE]
