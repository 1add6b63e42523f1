"""Every method ``pyro-flat compare`` knows, in the order of the table.

Each family file (:mod:`~pyro_flat.compare.mcmc`, :mod:`~pyro_flat.compare.svi`,
the last-layer Laplace of :mod:`~pyro_flat.compare.laplace`,
:mod:`~pyro_flat.compare.swag`, :mod:`~pyro_flat.compare.ensemble`,
:mod:`~pyro_flat.compare.sgd`) lists its :class:`~pyro_flat.compare.common.Method` s, each
whole (runner, search grid, baselines); a new method is one entry there (a new family: a new
file added to ``FAMILIES``).
"""

from __future__ import annotations

from pyro_flat.compare import ensemble, laplace, mcmc, reference, sgd, svi, swag
from pyro_flat.compare.common import Method
from pyro_flat.compare.tuning import check_search

FAMILIES = (mcmc, svi, swag, ensemble, laplace)
#: The reference that every comparison includes, last in the table.
BASELINE = "sgd"
#: All methods by name, in table order (the reference last).
ALL: dict[str, Method] = {m.name: m for family in (*FAMILIES, sgd) for m in family.METHODS}
#: Runners that are not methods: the HMC reference of ``--reference hmc``.
REFERENCES: dict[str, Method] = {reference.METHOD.name: reference.METHOD}
ALIASES = {alias: m.name for m in ALL.values() for alias in m.aliases}
#: Each flat-seeking method and a baseline it is paired with (``Method.baselines``).
PAIRS: tuple[tuple[str, str], ...] = tuple((m.name, b) for m in ALL.values() for b in m.baselines)

for _method in ALL.values():
    check_search(_method.name, _method.search)
    for _baseline in _method.baselines:
        if _baseline not in ALL:
            raise ValueError(f"{_method.name!r} is paired with {_baseline!r}, not a method")


def implemented(task: str | None = None) -> list[str]:
    """The methods ``--methods`` can name (the reference, which always runs, excluded), of
    ``task`` if given."""
    return [n for n, m in ALL.items() if n != BASELINE and (task is None or task in m.tasks)]


def method(name: str) -> Method:
    """The method (or reference) called ``name``."""
    return ALL[name] if name in ALL else REFERENCES[name]


def canonical(name: str) -> str:
    name = name.strip().lower().replace("_", "-")
    return ALIASES.get(name, name)
