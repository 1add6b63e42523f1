"""What the export tests read from ArviZ, written once for ArviZ 0.x and 1.x.

``to_arviz`` returns an ``InferenceData`` on ArviZ 0.x and an ``xarray.DataTree`` on ArviZ 1.x
(Python >= 3.12); the tests run on both, so the few calls whose names differ go through here.
"""

from __future__ import annotations

from typing import Any

import arviz as az

ARVIZ_1 = int(az.__version__.split(".")[0]) >= 1


def groups(data: Any) -> set[str]:
    """The group names of an ``InferenceData`` or of a ``DataTree``'s children."""
    return set(data.children) if ARVIZ_1 else set(data.groups())


def elpd(loo: Any) -> float:
    """The expected log predictive density of ``az.loo``'s result."""
    return float(loo.elpd if ARVIZ_1 else loo.elpd_loo)


def plot_ppc(data: Any) -> Any:
    """The posterior predictive check plot (``plot_ppc_dist`` on ArviZ 1.x)."""
    return az.plot_ppc_dist(data) if ARVIZ_1 else az.plot_ppc(data)
