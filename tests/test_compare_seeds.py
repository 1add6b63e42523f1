"""The statistics of ``compare --seeds``: means and standard errors over the seeds where a
method succeeded, paired differences over the seeds where both did, Student t intervals."""

import math

import numpy as np
import pytest
from scipy import stats

from pyro_flat.compare import seeds
from pyro_flat.compare.evaluation import METRICS


def row(method, value, status="ok"):
    return {"method": method, "status": status, "grad_evals": 100, "wall_time_s": 1.0,
            **{m: value for m in METRICS}}


def test_summary_leaves_out_failed_seeds():
    by_seed = {0: [row("sgld", 1.0)], 1: [row("sgld", 3.0)],
               2: [row("sgld", math.nan, "failed: diverged")]}
    (summary,) = seeds.summarise(by_seed)
    assert summary["seeds"] == 2
    assert summary["nll"] == 2.0 and summary["nll_se"] == pytest.approx(1.0)


def test_failed_runs_are_listed_with_their_seed_and_reason():
    by_seed = {0: [row("sgld", 1.0), row("sasgld", 0.9)],
               3: [row("sgld", math.nan, "failed: RuntimeError: the chain diverged"),
                   row("sasgld", 0.8)],
               1: [row("sgld", 2.0), row("sasgld", math.nan, "failed: x")]}
    assert seeds.format_failures(by_seed).splitlines() == [
        "- sasgld, seed 1: failed: x",
        "- sgld, seed 3: failed: RuntimeError: the chain diverged"]
    assert seeds.format_failures({0: [row("sgld", 1.0)]}) == ""


def test_paired_differences_and_their_t_interval():
    rng = np.random.default_rng(0)
    base = rng.normal(1.0, 0.2, size=5)
    diff = np.array([-0.03, -0.01, -0.02, 0.0, -0.04])
    by_seed = {s: [row("sgld", base[s]), row("sasgld", base[s] + diff[s]),
                   row("entropy", base[s] + 0.01 * (-1) ** s)] for s in range(5)}
    pairs = {(p["method"], p["baseline"]): p for p in seeds.paired_differences(by_seed)}
    assert set(pairs) == {("sasgld", "sgld"), ("entropy", "sgld")}  # csgld did not run
    p = pairs[("sasgld", "sgld")]
    se = diff.std(ddof=1) / math.sqrt(5)
    half = stats.t.ppf(0.975, 4) * se
    assert p["nll"] == pytest.approx(diff.mean()) and p["nll_se"] == pytest.approx(se)
    assert p["nll_low"] == pytest.approx(diff.mean() - half)
    assert p["nll_high"] == pytest.approx(diff.mean() + half)
    assert p["nll_significant"]  # -0.02 ± 2.78 * 0.0071: the interval excludes zero
    assert not pairs[("entropy", "sgld")]["nll_significant"]  # +-0.01 alternating


def test_a_pair_uses_only_seeds_where_both_succeeded():
    by_seed = {0: [row("sgld", 1.0), row("sasgld", 0.5)],
               1: [row("sgld", 1.0), row("sasgld", math.nan, "failed: x")],
               2: [row("sgld", 2.0), row("sasgld", 1.0)]}
    (p,) = seeds.paired_differences(by_seed)
    assert p["seeds"] == 2 and p["nll"] == pytest.approx(-0.75)


def test_tables_and_figure(tmp_path):
    by_seed = {s: [row("sgld", 1.0 + s), row("sasgld", 0.9 + 1.1 * s)] for s in range(3)}
    text = seeds.format_summary(seeds.summarise(by_seed))
    assert "| sgld" in text and "2.0000 ± 0.5774" in text
    pairs = seeds.paired_differences(by_seed)
    assert "sasgld - sgld" in seeds.format_paired(pairs)
    assert seeds.write_figure(tmp_path, pairs) == [seeds.FIGURE]
    assert (tmp_path / seeds.FIGURE).stat().st_size > 0
    assert seeds.write_figure(tmp_path, []) == []


def test_no_significance_from_two_seeds_or_no_spread():
    """Two seeds with equal differences (accuracy moved by the same 3 test points) have a zero
    standard error: no interval to speak of, so no mark; three seeds with equal differences
    neither."""
    for k in (2, 3):
        by_seed = {s: [row("sgld", 0.9 + 0.01 * s), row("sasgld", 0.9067 + 0.01 * s)]
                   for s in range(k)}
        (p,) = seeds.paired_differences(by_seed)
        assert p["accuracy"] == pytest.approx(0.0067) and not p["accuracy_significant"]
    by_seed = {s: [row("sgld", 1.0), row("sasgld", 1.0 - 0.1 - 0.001 * s)] for s in range(2)}
    assert not seeds.paired_differences(by_seed)[0]["nll_significant"]  # two seeds only


def test_compare_lists_a_failed_seed_under_its_tables(tmp_path, monkeypatch):
    from test_cli import replace_runner, run

    from pyro_flat.compare import registry

    original = registry.ALL["sghmc"]

    def diverges_on_seed_1(method, ctx):
        if ctx.seed == 1:
            raise RuntimeError("the chain diverged")
        return original.run(method, ctx)

    replace_runner(monkeypatch, "sghmc", diverges_on_seed_1)
    code, text, _ = run(["compare", "--dataset", "regression_gap", "--budget", "20", "--seeds",
                         "2", "--methods", "sghmc", "--jobs", "1", "--out", str(tmp_path / "out")])
    assert code == 1
    assert "failed runs (left out of the means and of the pairs they belong to)" in text
    assert "- sghmc, seed 1: failed: RuntimeError: the chain diverged" in text
    assert "seed 0: failed" not in text
    assert "- sghmc, seed 1" in (tmp_path / "out" / "results.md").read_text()
