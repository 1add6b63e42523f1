"""Write the intersphinx inventories the docs build reads (it has no network).

    .venv/bin/python docs/_inventories/make_inventories.py
    .venv/bin/python docs/_inventories/make_inventories.py --pyro-docs PATH/TO/pyro/docs/source

writes ``torch.inv``, ``pyro.inv``, ``arviz.inv``, ``numpy.inv`` and ``python.inv`` next to
this script, in Sphinx's inventory format (version 2, read back by
``sphinx.util.inventory.InventoryFile``). Each entry maps a Python name to the page of the
project's real documentation that documents it, worked out by introspecting the installed
package and the URL layout of that project's docs:

- torch (https://pytorch.org/docs/stable/): functions and classes of ``torch``, ``torch.nn``,
  ``torch.nn.functional``, ``torch.func`` and ``torch.optim`` have a page
  ``generated/<full name>.html``; ``torch.Tensor`` is on ``tensors.html``; the packages that are
  documented on one page (``torch.distributions``, ``torch.distributed``, ``torch.utils.data``,
  ...) have anchors ``<page>.html#<name>``.
- Pyro (https://docs.pyro.ai/en/stable/): the page of each object is the page whose
  ``automodule``/``autoclass``/``autofunction`` directive documents it in Pyro's
  ``docs/source/*.rst``. Those directives are stored in ``pyro_pages.json`` (extracted with
  ``--pyro-docs`` from a checkout of github.com/pyro-ppl/pyro), so a rerun needs no checkout.
- ArviZ 0.x (https://python.arviz.org/en/v<version>/): ``api/generated/arviz.<name>.html``
  for the names of ``arviz.__all__`` (``stable`` is ArviZ 1.x, whose pages differ).
- NumPy and the standard library: ``<page>.html#<name>`` for the few modules our signatures use.

Besides the public name (``torch.nn.Module``), every object is also listed under the path of
its defining module (``torch.nn.modules.module.Module``), which is what autodoc writes in
signatures. Run this after upgrading torch, Pyro or ArviZ, and commit the ``.inv`` files.
"""

import argparse
import importlib
import inspect
import json
import pkgutil
import re
import sys
import warnings
import zlib
from pathlib import Path

HERE = Path(__file__).resolve().parent
PYRO_PAGES = HERE / "pyro_pages.json"


class Inventory:
    """Name -> (role, uri) for one project, written in Sphinx's inventory format."""

    def __init__(self, project, version):
        self.project, self.version, self.entries, self.extra = project, version, {}, {}

    def add(self, name, role, uri, *, replace=False):
        if name and (replace or name not in self.entries):
            self.entries[name] = (role, uri)

    def add_role(self, name, role, uri):
        """A second role for a name (a class that is used as a function, ``torch.no_grad``)."""
        self.extra[name, role] = uri

    def write(self, path):
        lines = []
        rows = {(name, role): uri for name, (role, uri) in self.entries.items()}
        for name, role in sorted({**rows, **self.extra}):
            uri = {**rows, **self.extra}[name, role]
            if uri.endswith("#" + name):
                uri = uri[: -len(name)] + "$"  # Sphinx's shorthand for "the name itself"
            lines.append(f"{name} py:{role} 1 {uri} -\n")
        header = (f"# Sphinx inventory version 2\n# Project: {self.project}\n"
                  f"# Version: {self.version}\n"
                  "# The remainder of this file is compressed using zlib.\n")
        path.write_bytes(header.encode() + zlib.compress("".join(lines).encode(), 9))
        return len(lines)


def role_of(obj):
    if inspect.isclass(obj):
        return "exception" if issubclass(obj, BaseException) else "class"
    if inspect.ismodule(obj):
        return "module"
    if callable(obj):
        return "function"
    return "data"


def canonical_name(obj):
    module, qualname = getattr(obj, "__module__", None), getattr(obj, "__qualname__", None)
    if isinstance(module, str) and isinstance(qualname, str) and "<" not in qualname:
        return f"{module}.{qualname}"
    return None


def public_members(module):
    names = getattr(module, "__all__", None)
    if names is None:
        names = [n for n in vars(module) if not n.startswith("_")]
    for name in names:
        try:
            yield name, getattr(module, name)
        except AttributeError:
            continue


def import_quietly(name):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            return importlib.import_module(name)
        except Exception:  # noqa: BLE001 -- optional submodules (CUDA, extras) may not import
            return None


def add_with_aliases(inv, public, obj, role, uri, *, methods_uri=None):
    """``public`` and the defining path of ``obj``; with ``methods_uri(owner, name)``, the
    public methods and properties a class defines itself."""
    inv.add(public, role, uri)
    canonical = canonical_name(obj) if role != "data" else None
    if canonical and canonical != public:
        inv.add(canonical, role, uri)
    if methods_uri is None or not inspect.isclass(obj):
        return
    for name, member in vars(obj).items():
        if name.startswith("_"):
            continue
        kind = "property" if isinstance(member, property) else (
            "method" if callable(member) or isinstance(member, (classmethod, staticmethod))
            else None)
        if kind is None:
            continue
        target = methods_uri(public, name)
        inv.add(f"{public}.{name}", kind, target)
        if canonical and canonical != public:
            inv.add(f"{canonical}.{name}", kind, target)


# --- torch ----------------------------------------------------------------------------------

def torch_inventory():
    import torch

    inv = Inventory("PyTorch", torch.__version__.split("+")[0])

    def generated(name):
        return f"generated/{name}.html"

    def own_page_method(owner, name):
        return f"generated/{owner}.html#{owner}.{name}"

    # functions and classes with a generated page of their own
    for package in ["torch", "torch.nn", "torch.nn.functional", "torch.func", "torch.optim",
                    "torch.autograd", "torch.nn.utils", "torch.linalg", "torch.fft",
                    "torch.special"]:
        module = import_quietly(package)
        if module is None:
            continue
        inv.add(package, "module", f"{package.replace('torch.', '', 1) or 'torch'}.html"
                if package != "torch" else "torch.html#module-torch")
        for name, obj in public_members(module):
            if inspect.ismodule(obj) or not (inspect.isclass(obj) or callable(obj)):
                continue
            if package == "torch.optim" and name == "Optimizer":
                add_with_aliases(inv, "torch.optim.Optimizer", obj, "class",
                                 "optim.html#torch.optim.Optimizer",
                                 methods_uri=lambda o, n: f"generated/{o}.{n}.html")
                continue
            add_with_aliases(inv, f"{package}.{name}", obj, role_of(obj),
                             generated(f"{package}.{name}"), methods_uri=own_page_method)
    # the tensor, its methods, and the tensor attributes
    inv.add("torch.Tensor", "class", "tensors.html#torch.Tensor", replace=True)
    for name, member in vars(torch.Tensor).items():
        if not name.startswith("_") and callable(member):
            inv.add(f"torch.Tensor.{name}", "method", generated(f"torch.Tensor.{name}"),
                    replace=True)
    for name in ["dtype", "device", "layout", "memory_format"]:
        inv.add(f"torch.{name}", "class", f"tensor_attributes.html#torch.{name}", replace=True)
    inv.add("torch.Size", "class", "size.html#torch.Size", replace=True)
    inv.add("torch.Generator", "class", generated("torch.Generator"), replace=True)
    inv.add("torch._C.Generator", "class", generated("torch.Generator"), replace=True)
    for name in ["no_grad", "enable_grad", "inference_mode"]:  # classes, used as functions
        inv.add(f"torch.{name}", "class", generated(f"torch.{name}"), replace=True)
        inv.add_role(f"torch.{name}", "function", generated(f"torch.{name}"))
    # packages documented on one page, each object at an anchor of its defining path
    one_page = {
        "torch.distributions": "distributions.html",
        "torch.distributed": "distributed.html",
        "torch.utils.data": "data.html",
        "torch.optim.lr_scheduler": None,  # generated pages, below
        "torch.optim.swa_utils": "optim.html",
        "torch.multiprocessing": "multiprocessing.html",
    }
    for package, page in one_page.items():
        module = import_quietly(package)
        if module is None:
            continue
        for name, obj in public_members(module):
            if inspect.ismodule(obj) or not (inspect.isclass(obj) or callable(obj)):
                continue
            if page is None:
                uri = generated(f"{package}.{name}")
            elif package == "torch.distributions":
                uri = f"{page}#{canonical_name(obj) or package + '.' + name}"
            else:
                uri = f"{page}#{package}.{name}"
            add_with_aliases(inv, f"{package}.{name}", obj, role_of(obj), uri,
                             methods_uri=lambda o, n, uri=uri: f"{uri.split('#')[0]}#{o}.{n}")
    return inv


# --- Pyro -----------------------------------------------------------------------------------

DIRECTIVE = re.compile(r"^\s*\.\.\s+(automodule|autoclass|autofunction|include)::\s*(\S+)",
                       re.MULTILINE)


def extract_pyro_pages(docs_source):
    """``{page: [[directive, target], ...]}`` from Pyro's docs/source (includes followed)."""
    docs_source = Path(docs_source)
    pages = {}
    for rst in sorted(docs_source.glob("*.rst")):
        directives, queue = [], [rst]
        while queue:
            text = queue.pop(0).read_text()
            for kind, target in DIRECTIVE.findall(text):
                if kind == "include":
                    queue.append(docs_source / target)
                else:
                    directives.append([kind, target])
        if directives:
            pages[rst.stem] = directives
    return pages


def pyro_inventory(pages):
    import pyro

    inv = Inventory("Pyro", pyro.__version__)
    documented = {}  # id(object) -> (page, documented name)

    def record(page, name, obj):
        documented.setdefault(id(obj), (page, name, obj))

    for page, directives in pages.items():
        for kind, target in directives:
            if kind == "automodule":
                module = import_quietly(target)
                if module is None:
                    continue
                inv.add(target, "module", f"{page}.html#module-{target}")
                for name, obj in public_members(module):
                    defined_here = getattr(obj, "__module__", None) == target
                    if (inspect.isclass(obj) or inspect.isfunction(obj)) and (
                            defined_here or name in getattr(module, "__all__", ())):
                        record(page, f"{target}.{name}", obj)
            else:
                module_name, _, attr = target.rpartition(".")
                module = import_quietly(module_name)
                obj = getattr(module, attr, None) if module is not None else None
                if obj is not None:
                    record(page, target, obj)
    for page, name, obj in documented.values():
        add_with_aliases(inv, name, obj, role_of(obj), f"{page}.html#{name}",
                         methods_uri=lambda o, n, page=page, name=name:
                         f"{page}.html#{name}.{n}")
    # the public re-exports (pyro.infer.MCMC is documented as pyro.infer.mcmc.api.MCMC)
    for info in pkgutil.walk_packages(pyro.__path__, "pyro."):
        if "._" in info.name or ".contrib." in info.name or "test" in info.name:
            continue
        module = import_quietly(info.name)
        if module is None:
            continue
        for name, obj in public_members(module):
            found = documented.get(id(obj))
            if found is None or inspect.ismodule(obj):
                continue
            page, doc_name, _ = found
            public = f"{info.name}.{name}"
            add_with_aliases(inv, public, obj, role_of(obj), f"{page}.html#{doc_name}",
                             methods_uri=lambda o, n, page=page, doc_name=doc_name:
                             f"{page}.html#{doc_name}.{n}")
    for top in ["pyro"]:
        module = importlib.import_module(top)
        for name, obj in public_members(module):
            found = documented.get(id(obj))
            if found is not None:
                inv.add(f"{top}.{name}", role_of(obj), f"{found[0]}.html#{found[1]}")
    return inv


# --- ArviZ, NumPy, the standard library -----------------------------------------------------

def arviz_inventory():
    import arviz

    inv = Inventory("ArviZ", arviz.__version__)
    for name, obj in public_members(arviz):
        if inspect.ismodule(obj) or not (inspect.isclass(obj) or callable(obj)):
            continue
        add_with_aliases(inv, f"arviz.{name}", obj, role_of(obj),
                         f"api/generated/arviz.{name}.html",
                         methods_uri=lambda o, n: f"api/generated/{o}.{n}.html")
    return inv


def numpy_inventory():
    import numpy

    inv = Inventory("NumPy", numpy.__version__)
    inv.add("numpy.ndarray", "class", "reference/generated/numpy.ndarray.html")
    inv.add("numpy.dtype", "class", "reference/generated/numpy.dtype.html")
    inv.add("numpy.random.Generator", "class",
            "reference/random/generator.html#numpy.random.Generator")
    for name, obj in public_members(numpy):
        if inspect.isfunction(obj) or type(obj).__name__ in ("ufunc", "_ArrayFunctionDispatcher"):
            inv.add(f"numpy.{name}", "function", f"reference/generated/numpy.{name}.html")
    return inv


STDLIB = ["abc", "argparse", "collections", "collections.abc", "concurrent.futures",
          "contextlib", "ctypes", "dataclasses", "datetime", "enum", "functools", "hashlib",
          "inspect", "io", "itertools", "json", "logging", "math", "multiprocessing", "os",
          "pathlib", "pickle", "platform", "random", "shutil", "signal", "socket",
          "subprocess", "tempfile", "threading", "time", "types", "typing", "warnings"]


def python_inventory():
    inv = Inventory("Python", f"{sys.version_info.major}.{sys.version_info.minor}")
    for package in STDLIB:
        module = importlib.import_module(package)
        page = f"library/{package}.html"
        inv.add(package, "module", f"{page}#module-{package}")
        for name, obj in public_members(module):
            if inspect.ismodule(obj) or not (inspect.isclass(obj) or callable(obj)):
                continue
            inv.add(f"{package}.{name}", role_of(obj), f"{page}#{package}.{name}")
    inv.add("os.PathLike", "class", "library/os.html#os.PathLike")
    return inv


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pyro-docs", type=Path,
                        help="Pyro's docs/source directory: re-extract pyro_pages.json")
    args = parser.parse_args(argv)
    if args.pyro_docs is not None:
        PYRO_PAGES.write_text(json.dumps(extract_pyro_pages(args.pyro_docs), indent=1) + "\n")
    pages = json.loads(PYRO_PAGES.read_text())
    for stem, build in [("torch", torch_inventory), ("pyro", lambda: pyro_inventory(pages)),
                        ("arviz", arviz_inventory), ("numpy", numpy_inventory),
                        ("python", python_inventory)]:
        count = build().write(HERE / f"{stem}.inv")
        print(f"{stem}.inv: {count} names")


if __name__ == "__main__":
    main()
