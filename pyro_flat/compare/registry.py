"""Every method ``pyro-flat compare`` knows, in the order of the table.

Each family file (:mod:`~pyro_flat.compare.mcmc`, :mod:`~pyro_flat.compare.svi`,
:mod:`~pyro_flat.compare.swag`, :mod:`~pyro_flat.compare.ensemble`,
:mod:`~pyro_flat.compare.sgd`) lists its :class:`~pyro_flat.compare.common.Method` s; a new
method is a runner and one entry there (a new family: a new file added to ``FAMILIES``).
"""

from __future__ import annotations

from pyro_flat.compare import ensemble, mcmc, reference, sgd, svi, swag
from pyro_flat.compare.common import Method

FAMILIES = (mcmc, svi, swag, ensemble)
#: The reference that every comparison includes, last in the table.
BASELINE = "sgd"
#: All methods by name, in table order (the reference last).
ALL: dict[str, Method] = {m.name: m for family in (*FAMILIES, sgd) for m in family.METHODS}
#: Runners that are not methods: the HMC reference of ``--reference hmc``.
REFERENCES: dict[str, Method] = {reference.METHOD.name: reference.METHOD}
ALIASES = {alias: m.name for m in ALL.values() for alias in m.aliases}


def implemented() -> list[str]:
    """The methods ``--methods`` can name (the reference, which always runs, excluded)."""
    return [n for n in ALL if n != BASELINE]


def method(name: str) -> Method:
    """The method (or reference) called ``name``."""
    return ALL[name] if name in ALL else REFERENCES[name]


def canonical(name: str) -> str:
    name = name.strip().lower().replace("_", "-")
    return ALIASES.get(name, name)
