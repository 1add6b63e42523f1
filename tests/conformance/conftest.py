"""The slow cells of the conformance matrix (hours on one core) are skipped unless
``PYRO_FLAT_CONFORMANCE=all``: the suite's ``slow`` marker does not deselect anything in CI
(``./dev test`` runs every test), so these cells carry a marker of their own,
``conformance_slow``, which this file registers and skips."""

from __future__ import annotations

import os

import pytest

ENV = "PYRO_FLAT_CONFORMANCE"


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", f"conformance_slow: a slow conformance cell, run only with {ENV}=all")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if os.environ.get(ENV) == "all":
        return
    skip = pytest.mark.skip(reason=f"slow conformance cell: set {ENV}=all, or run "
                                   "python benchmarks/conformance.py")
    for item in items:
        if item.get_closest_marker("conformance_slow") is not None:
            item.add_marker(skip)
