"""``pyro-flat compare --tune``: each method's hyper-parameters chosen on a validation split.

The search is declared here and costs every method the same:

* **Data.** A validation split is held out of the training set (:data:`VALIDATION_FRACTION`
  of it, stratified by class for classification), drawn with the run's seed; each candidate
  trains on the rest. The test and OOD sets are never used for the choice.
* **Candidates.** Every method tries exactly :data:`CANDIDATES` settings, the grid of
  its method's ``search`` grid (each value a factor of the method's default in
  :class:`~pyro_flat.compare.config.Settings`, so the grid follows a task's defaults). A
  method with one hyper-parameter that matters (SGLD's step size) tries four values of it; a
  flat-seeking method with two (SASGLD's step size and radius) tries a 2 x 2 grid.
* **Budget.** Each candidate runs at a quarter of the budget, in the same layout of cycles
  and draws (:func:`tuning_plan`), so a method's search spends the SG steps of one run at the
  full budget.
* **Choice.** The candidate whose model average has the lowest validation NLL; a candidate
  that fails (a diverging chain) is skipped, and a method all of whose candidates fail keeps
  its defaults.

The final run then trains on the whole training set with the chosen values and is scored on
the test set. Temperature (1: the Bayesian posterior), prior, batch size, SWAG's scale and the
guides' initial scale are not searched.

Examples
--------
>>> from pyro_flat.compare.config import Settings
>>> [c["lr"] for c in candidates("sgld", Settings())]
[0.05, 0.1, 0.2, 0.4]
>>> sorted(candidates("sasgld", Settings())[0].items())
[('lr', 0.1), ('rho', 0.01)]
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch

from pyro_flat.compare.config import Budget, Plan, Settings, make_plan

#: The share of the training set held out for validation.
VALIDATION_FRACTION = 0.2
#: Settings every method tries.
CANDIDATES = 4
#: A candidate's share of the budget (``CANDIDATES * TUNING_SHARE = 1``: one run's cost).
TUNING_SHARE = 1 / CANDIDATES

#: The search in one sentence (``results.json``).
PROTOCOL = (
    f"per seed, {VALIDATION_FRACTION:.0%} of the training set held out (stratified by class "
    f"for classification); every method tries {CANDIDATES} settings (a grid of factors of its "
    f"defaults) on the rest at {TUNING_SHARE:.0%} of the budget each, keeps the one with the "
    "lowest validation NLL, then trains on the whole training set and is scored on the test "
    "set"
)

def check_search(method: str, grid: Mapping[str, tuple[float, ...]]) -> None:
    """A method's ``search`` must be :data:`CANDIDATES` candidates of ``Settings`` fields."""
    fields = {f.name for f in dataclasses.fields(Settings)}
    if math.prod(len(v) for v in grid.values()) != CANDIDATES or not set(grid) <= fields:
        raise ValueError(f"the search grid of {method!r} must be {CANDIDATES} candidates of "
                         f"Settings fields, got {dict(grid)}")


def candidates(method: str, settings: Settings) -> list[dict[str, float]]:
    """The :data:`CANDIDATES` settings ``method`` tries: the factors of its ``search`` grid
    (:class:`~pyro_flat.compare.common.Method`) times the defaults in ``settings`` (rounded to
    6 significant digits)."""
    from pyro_flat.compare import registry

    if method not in registry.ALL:
        raise ValueError(f"method must be one of {', '.join(registry.ALL)}, got {method!r}")
    grid = registry.ALL[method].search
    out = []
    for factors in itertools.product(*grid.values()):
        out.append({name: float(f"{getattr(settings, name) * f:.6g}")
                    for name, f in zip(grid, factors, strict=True)})
    return out


def tuning_plan(budget: Budget, exploration_fraction: float) -> Plan:
    """The plan of one candidate: :data:`TUNING_SHARE` of ``budget``'s steps, same layout."""
    from pyro_flat.compare.config import MIN_STEPS

    steps = max(int(budget.steps * TUNING_SHARE), MIN_STEPS)
    return make_plan(dataclasses.replace(budget, steps=steps), exploration_fraction)


def validation_split(data: Any, seed: int, fraction: float = VALIDATION_FRACTION) -> Any:
    """``data`` with a validation split in place of its test split.

    ``fraction`` of the training set, stratified by class for classification (scikit-learn's
    ``train_test_split``), drawn with ``seed``, becomes ``x_test``/``y_test``; the rest is the
    training set. The OOD split is kept (the search does not use it).
    """
    from sklearn.model_selection import train_test_split

    if not 0.0 < fraction < 1.0:
        raise ValueError(f"fraction must be in (0, 1), got {fraction!r}")
    n = data.num_train
    labels = data.y_train.cpu().numpy() if data.task == "classification" else None
    train, val = train_test_split(np.arange(n), test_size=fraction, random_state=seed % 2**32,
                                  stratify=labels)
    train_idx = torch.as_tensor(np.sort(train), device=data.x_train.device)
    val_idx = torch.as_tensor(np.sort(val), device=data.x_train.device)
    return dataclasses.replace(
        data, x_train=data.x_train[train_idx], y_train=data.y_train[train_idx],
        x_test=data.x_train[val_idx], y_test=data.y_train[val_idx])


def choose(method: str, trials: list[Mapping[str, Any]]) -> dict[str, Any]:
    """The choice among ``trials`` (``{"values": {...}, "status": ..., "nll": ...}``): the
    lowest validation NLL among those that succeeded with a finite NLL, the first on a tie;
    ``{}`` (keep the defaults) if none did."""
    ok = [t for t in trials if t["status"] == "ok" and math.isfinite(t["nll"])]
    if not ok:
        return {}
    return dict(min(ok, key=lambda t: t["nll"])["values"])


def format_choices(reports: Mapping[int, Mapping[str, Mapping[str, Any]]]) -> str:
    """A Markdown table of the chosen values: one row per method, one column per seed.

    ``reports`` is ``{seed: {method: {"chosen": {...}, "trials": [...]}}}``.

    Examples
    --------
    >>> print(format_choices({0: {"sgld": {"chosen": {"lr": 0.1}, "trials": []}}}))
    | method | seed 0 |
    |:-------|-------:|
    | sgld   | lr=0.1 |
    """
    from pyro_flat.compare.seeds import markdown_table

    seeds = list(reports)
    methods = list(dict.fromkeys(m for r in reports.values() for m in r))

    def cell(chosen: Any) -> str:
        if not isinstance(chosen, Mapping):
            return "defaults"
        return ", ".join(f"{k}={v:g}" for k, v in chosen.items())

    lines = [(m, *(cell(reports[s][m]["chosen"]) if m in reports[s] else "-" for s in seeds))
             for m in methods]
    return markdown_table(("method", *(f"seed {s}" for s in seeds)), lines)
