"""The package's layering, read from its source: which module may use which private name.

A name with a leading underscore belongs to its module (or its class). These tests read every
module of ``pyro_flat`` with :mod:`ast` and fail on a private import from another pyro_flat
package, or from Pyro or torch unless the table below says why no public route exists.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "pyro_flat"

#: Private names of Pyro and torch that pyro_flat imports, each with why no public route
#: exists. A new one fails :func:`test_private_imports_of_pyro_and_torch_are_the_listed_ones`.
LIBRARY_PRIVATES: dict[tuple[str, str], str] = {
    ("pyro.nn.module", "_Context"): "PyroModule's per-call cache context (make_bayesian)",
    ("pyro.nn.module", "_PyroModuleMeta"): "PyroModule's metaclass (make_bayesian builds classes)",
    ("pyro.nn.module", "_is_module_local_param_enabled"):
        "whether PyroParams are module-local, which decides the lean guide's parameter names",
    ("pyro.infer.mcmc.api", "_UnarySampler"):
        "Pyro's sampler of chains in turn, which LeanMCMC replaces when no progress bar is shown",
    ("pyro.poutine.messenger", "_bound_partial"): "Pyro's messenger decorator protocol",
    ("pyro.poutine.messenger", "_context_wrap"): "Pyro's messenger decorator protocol",
    ("torch.distributions.utils", "_standard_normal"):
        "the standard-normal draw torch's rsample uses (same random stream as Normal.rsample)",
}


def _modules() -> list[Path]:
    return sorted(p for p in PACKAGE.rglob("*.py") if "__pycache__" not in p.parts)


def _private_imports(path: Path) -> list[tuple[str, str, int]]:
    """``(module, name, line)`` of every ``from module import _name`` in ``path``."""
    out = []
    tree = ast.parse(path.read_text(), filename=str(path))
    package = ".".join(path.relative_to(PACKAGE.parent).with_suffix("").parts[:-1])
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            module = node.module or ""
            if node.level:  # relative: resolve against this module's package
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                module = ".".join([*base, module] if module else base)
            for alias in node.names:
                if alias.name.startswith("_") and not alias.name.startswith("__"):
                    out.append((module, alias.name, node.lineno))
    return out


def _package_of(module: str) -> str:
    """``pyro_flat.infer.mcmc.base`` -> ``pyro_flat.infer.mcmc``."""
    return module.rsplit(".", 1)[0]


def test_no_module_imports_a_private_name_from_another_pyro_flat_package():
    """The target layer, MCMC, SVI and the tools meet through public names only (a private
    name shared inside one package, such as SVI's guide recorder, stays inside it)."""
    bad = []
    for path in _modules():
        here = ".".join(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        for module, name, line in _private_imports(path):
            if module.startswith("pyro_flat") and _package_of(module) != _package_of(here):
                bad.append(f"{path.relative_to(PACKAGE.parent)}:{line}: {name} from {module}")
    assert not bad, "private names imported across packages:\n" + "\n".join(bad)


def test_private_imports_of_pyro_and_torch_are_the_listed_ones():
    found = {}
    for path in _modules():
        for module, name, line in _private_imports(path):
            if not module.startswith("pyro_flat"):
                found.setdefault((module, name), f"{path.relative_to(PACKAGE.parent)}:{line}")
    unlisted = {k: v for k, v in found.items() if k not in LIBRARY_PRIVATES}
    assert not unlisted, f"private imports of Pyro/torch with no reason given: {unlisted}"
    stale = set(LIBRARY_PRIVATES) - set(found)
    assert not stale, f"listed but no longer imported (remove them from the table): {stale}"


@pytest.mark.parametrize("module", ["pyro_flat.infer.svi.lean_elbo",
                                    "pyro_flat.infer.svi.lean_guides"])
def test_svi_reaches_the_target_layer_through_its_public_names(module):
    """SVI's lean loss and guides use the shared target layer (``pyro_flat.target``), not the
    MCMC package."""
    path = PACKAGE.parent / Path(*module.split(".")).with_suffix(".py")
    tree = ast.parse(path.read_text())
    sources = {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
    assert not {s for s in sources if s and s.startswith("pyro_flat.infer.mcmc")}
    assert "pyro_flat.target" in sources
