"""The conformance matrix as tests (see ``matrix.py`` for the cells, settings and checks).

The fast cells (:func:`~conformance.matrix.fast_cells`) run in CI with the fast budget. Every
cell of the matrix also runs as a ``slow`` test with the slow budget, skipped unless
``PYRO_FLAT_CONFORMANCE=all`` (``tests/conformance/conftest.py``); the usual way to run them
all is ``python benchmarks/conformance.py``, which writes the table of results.

A cell in ``KNOWN_BROKEN`` is an ``xfail`` while it fails as recorded, and fails (strictly)
once it meets its check or raises the error its fix promises: move it out then.
"""

from __future__ import annotations

import pytest

from .matrix import (
    EXPECTED,
    KNOWN_BROKEN,
    LIMITATIONS,
    Cell,
    all_cells,
    budget_in_ci,
    expectation,
    fast_cells,
    run_and_classify,
)
from .models import PROBLEMS


def _assert_cell(cell: Cell, budget: str) -> None:
    result = run_and_classify(cell, budget)
    table = "\n".join(
        f"  {r.statistic} {r.quantity}: {r.value:.4g} vs {r.reference:.4g}, tolerance "
        f"{r.tolerance:.3g} (Monte Carlo {r.mc_tolerance:.3g} + bias {r.bias:.3g}), ESS "
        f"{r.ess:.0f} {'ok' if r.ok else 'FAILED'} {r.note}" for r in result.rows)
    if result.outcome == "known-broken":
        pytest.xfail(result.reason)
    assert result.outcome in ("pass", "expected-error", "known-limitation"), (
        f"{cell}: {result.outcome}: {result.reason}\n{table}")


@pytest.mark.parametrize("cell", fast_cells(), ids=str)
def test_fast_cell(cell: Cell) -> None:
    _assert_cell(cell, budget_in_ci(cell))


@pytest.mark.slow
@pytest.mark.conformance_slow
@pytest.mark.parametrize("cell", all_cells(), ids=str)
def test_slow_cell(cell: Cell) -> None:
    _assert_cell(cell, "slow")


def test_matrix_covers_the_issue() -> None:
    """At least 8 models, every kernel, and every pattern of EXPECTED and KNOWN_BROKEN
    matches some cell (a stale entry fails here)."""
    assert len(PROBLEMS) >= 8
    ids = [c.id for c in all_cells()]
    import fnmatch

    for pattern in [*EXPECTED, *KNOWN_BROKEN, *LIMITATIONS]:
        assert fnmatch.filter(ids, pattern), f"{pattern!r} matches no cell of the matrix"
    assert len(ids) == len(PROBLEMS) * 7 * 3 * 2 * 2


def test_an_expected_error_that_does_not_come_fails() -> None:
    """The classification cannot pass a cell that should have raised and ran instead."""
    from .matrix import CellResult, Row, classify

    cell = Cell("linreg_col", "SGLD", "full", "given", "single")
    assert expectation(cell)[0] is not None
    ran = CellResult(cell.id, "fast", rows=[Row("b", "mean", 0.0, 0.0, 1.0, 1.0, 0.0, 100.0,
                                                True)])
    assert classify(cell, ran).outcome == "fail"


def test_a_known_limitation_needs_its_warning() -> None:
    """A cell of ``LIMITATIONS`` that fails its check is a known limitation only if the kernel
    warned; silent, it fails."""
    from .matrix import CellResult, Row, classify

    cell = Cell("linreg", "L2E", "full", "given", "single")
    bad = Row("b", "sd", 0.002, 0.036, 0.02, 0.02, 0.0, 500.0, False)
    warned = CellResult(cell.id, "slow", rows=[bad],
                        warnings=["RuntimeWarning: L2E on a full batch: ..."])
    assert classify(cell, warned).outcome == "known-limitation"
    assert classify(cell, CellResult(cell.id, "slow", rows=[bad])).outcome == "fail"


def test_weighted_moments_of_equal_weights_are_the_plain_ones() -> None:
    """ContourSGLD's reweighted estimator with equal weights gives the plain mean and sd, and
    standard errors within 20% of the unweighted ones (independent draws)."""
    import numpy as np

    from .matrix import moments

    x = np.random.default_rng(0).normal(1.0, 2.0, size=(4, 500))
    plain, weighted = moments(x), moments(x, np.zeros_like(x))
    assert abs(weighted.mean - plain.mean) < 1e-12
    assert abs(weighted.sd - plain.sd) / plain.sd < 1e-3
    assert abs(weighted.se / plain.se - 1) < 0.2
    assert abs(weighted.sd_se / plain.sd_se - 1) < 0.2


def test_a_known_broken_cell_that_meets_its_check_is_flagged(monkeypatch) -> None:
    """A KNOWN_BROKEN cell that passes, or raises the error its fix promises, is ``fixed`` (a
    failing test: move it out); one that still fails is ``known-broken``."""
    from . import matrix
    from .matrix import Broken, CellResult, Row, classify

    cell = Cell("linreg", "SGLD", "full", "given", "single")
    monkeypatch.setattr(matrix, "KNOWN_BROKEN",
                        {cell.id: Broken(4, "test", resolution=(ValueError, "shape"))})
    row = Row("b", "mean", 0.0, 0.0, 1.0, 1.0, 0.0, 100.0, True)
    assert classify(cell, CellResult(cell.id, "fast", rows=[row])).outcome == "fixed"
    raised = CellResult(cell.id, "fast", error="both shape", error_type="ValueError",
                        _exception=ValueError("both shape"))
    assert classify(cell, raised).outcome == "fixed"
    bad = Row("b", "mean", 5.0, 0.0, 1.0, 1.0, 0.0, 100.0, False)
    assert classify(cell, CellResult(cell.id, "fast", rows=[bad])).outcome == "known-broken"


@pytest.mark.parametrize("kernel", ["SGLD", "ContourSGLD"])
def test_a_continued_run_is_the_longer_run(kernel: str) -> None:
    """``continue_run`` (how an inconclusive cell gets more draws) gives, bitwise, the draws
    (and ContourSGLD's weights) of one run that asked for all of them from the start."""
    import pyro
    import torch
    from pyro.infer import MCMC

    from .matrix import _run_draws, continue_run, make_kernel
    from .reference import load_reference

    cell = Cell("linreg", kernel, "plate", "adapted", "vectorized")
    problem, data = PROBLEMS["linreg"], PROBLEMS["linreg"].data()
    curvature = load_reference()["problems"][problem.reference_name]["curvature"]

    def run(num_draws: int) -> tuple:
        pyro.set_rng_seed(5)
        kernel = make_kernel(cell, problem.build(25), curvature, data.num_data, "fast")
        mcmc = MCMC(kernel, num_samples=num_draws, warmup_steps=10, disable_progbar=True)
        mcmc.run(*data.args)
        return kernel, _run_draws(cell, mcmc)

    _, (whole, whole_weight) = run(12)
    kernel_, (draws, log_weight) = run(4)
    draws, log_weight = continue_run(cell, kernel_, data.args, 8, draws, log_weight)
    assert set(draws) == set(whole)
    for name, value in whole.items():
        assert torch.equal(draws[name], value), name
    if kernel == "ContourSGLD":
        assert (log_weight == whole_weight).all()


def test_an_inconclusive_cell_continues_its_chains(monkeypatch) -> None:
    """A cell whose first run leaves a check inconclusive (here: 4 draws a chain, 16 in all,
    against a conclusive Monte Carlo part of at most 0.75 posterior sds, which needs an ESS
    of about 30) doubles its draws until every check is conclusive or it holds
    ``MAX_DRAWS_FACTOR`` times the budget's draws; a conclusive cell does not continue."""
    import dataclasses

    from . import matrix

    setting = dataclasses.replace(matrix.SETTINGS["linreg"], fast_draws=4)
    monkeypatch.setitem(matrix.SETTINGS, "linreg", setting)
    monkeypatch.setitem(matrix.MAX_MC_TOLERANCE, "fast", 0.75)
    cell = Cell("linreg", "SGLD", "full", "given", "vectorized")
    result = matrix.run_cell(cell, "fast")
    held = result.settings["draws_per_chain"]
    assert held > 4
    assert held <= matrix.MAX_DRAWS_FACTOR * 4
    inconclusive = any(r.note.startswith("inconclusive") for r in result.rows)
    assert not inconclusive or held == matrix.MAX_DRAWS_FACTOR * 4

    monkeypatch.setitem(matrix.SETTINGS, "linreg", dataclasses.replace(setting, fast_draws=100))
    result = matrix.run_cell(cell, "fast")
    assert not any(r.note.startswith("inconclusive") for r in result.rows)
    assert result.settings["draws_per_chain"] == 100


def test_the_compile_setting_reaches_every_kernel(monkeypatch) -> None:
    """``PYRO_FLAT_CONFORMANCE_COMPILE``: off gives the kernels' default ``compile=False``,
    auto gives ``compile="auto"`` to every kernel, anything else is an error naming it."""
    from .matrix import COMPILE_VARIABLE, KERNELS, make_kernel

    problem = PROBLEMS["linreg"]
    model = problem.build(None)
    for value, expected in (("off", False), ("auto", "auto")):
        monkeypatch.setenv(COMPILE_VARIABLE, value)
        for kernel in KERNELS:
            built = make_kernel(Cell("linreg", kernel, "full", "given", "single"), model, 10.0,
                                200)
            assert built.compile == expected, (kernel, value)
    monkeypatch.setenv(COMPILE_VARIABLE, "yes")
    with pytest.raises(ValueError, match=COMPILE_VARIABLE):
        make_kernel(Cell("linreg", "SGLD", "full", "given", "single"), model, 10.0, 200)
