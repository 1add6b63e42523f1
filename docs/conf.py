"""Sphinx configuration of the pyro_flat documentation site.

Build it with ``./dev docs`` (``sphinx-build -W --keep-going -b html docs docs/_build/html``):
every warning is an error. The tutorials under ``tutorials/`` are executed (by myst-nb, in
their quick mode) and shown with their output; the API reference comes from the docstrings
(numpydoc); MathJax is served from the site itself (sphinx-mathjax-offline) and intersphinx
reads the committed inventories in ``docs/_inventories`` (no network at build time).
"""

import importlib
import inspect
import os
import re
import types
from pathlib import Path

import jupytext
from sphinx.ext import intersphinx
from sphinx.util import logging

import pyro_flat

DOCS = Path(__file__).resolve().parent
logger = logging.getLogger(__name__)

# The tutorials run in their quick mode on the site; ./dev docs sets it too.
os.environ.setdefault("PYRO_FLAT_QUICK", "1")
# Figures of the executed tutorials appear inline: matplotlib-inline renders with Agg, no
# display is needed. (A plain MPLBACKEND=Agg would save figures but show none on the pages.)
os.environ["MPLBACKEND"] = "module://matplotlib_inline.backend_inline"

project = "pyro_flat"
author = "the pyro_flat authors"
copyright = "the pyro_flat authors"
version = release = pyro_flat.__version__

extensions = [
    "sphinx.ext.autodoc",
    "sphinx.ext.autosummary",
    "sphinx.ext.intersphinx",
    "sphinx.ext.mathjax",
    "numpydoc",
    "myst_nb",
    # MathJax 3 copied into _static/mathjax: math renders with no network
    "sphinx-mathjax-offline",
]

exclude_patterns = [
    "_build",
    "_inventories",
    "examples",  # included in pages, not pages of their own
    "conf.py",
    "**/.ipynb_checkpoints",
    "jupyter_execute",
]
source_suffix = {".rst": "restructuredtext", ".md": "myst-nb", ".py": "myst-nb"}
root_doc = "index"

# --- the site -------------------------------------------------------------------------------
html_theme = "pydata_sphinx_theme"
html_title = "pyro_flat"
html_theme_options = {
    "navigation_with_keys": False,
    "show_toc_level": 2,
    "header_links_before_dropdown": 6,
    "secondary_sidebar_items": ["page-toc"],
    "footer_start": ["copyright"],
    "footer_end": ["sphinx-version"],
}
html_static_path = []
html_show_sourcelink = False

# --- Markdown pages and the executed tutorials (myst-nb) ------------------------------------
myst_enable_extensions = ["dollarmath", "amsmath", "colon_fence", "deflist"]
myst_heading_anchors = 3
# the tutorials are jupytext percent scripts: tutorials/*.py, linked into docs/tutorials/
nb_custom_formats = {".py": ["jupytext.reads", {"fmt": "py:percent"}]}
# PYRO_FLAT_DOCS_EXECUTE=off skips the tutorials (a quick look at the other pages only)
nb_execution_mode = os.environ.get("PYRO_FLAT_DOCS_EXECUTE", "force")
nb_execution_raise_on_error = True  # a tutorial that fails fails the build
nb_execution_timeout = 900
nb_execution_in_temp = True  # the figures the scripts save land in a temporary directory
nb_merge_streams = True
# stderr (progress bars, library warnings such as tqdm's about notebook widgets) is left off
# the pages; an error still fails the build
nb_output_stderr = "remove"
nb_execution_show_tb = True

# --- the API reference (autodoc + numpydoc) -------------------------------------------------
# members are listed per page (``:members:``); every public object a module defines is
# documented, whether or not the module's ``__all__`` lists it, and once only (re-exports are
# not documented again: references to them are resolved by _resolve_pyro_flat_alias below)
autodoc_default_options = {"member-order": "bysource", "show-inheritance": True,
                           "ignore-module-all": True, "undoc-members": True}
autodoc_typehints = "signature"
autodoc_inherit_docstrings = False  # Pyro's reST docstrings are not numpydoc
autosummary_generate = False
numpydoc_show_class_members = False
numpydoc_xref_param_type = False
numpydoc_validation_checks = set()
# every cross-reference must resolve (torch, Pyro, ArviZ, NumPy through intersphinx below)
nitpicky = True
nitpick_ignore_regex = [
    # private helpers named in signatures are not part of the API
    ("py:class", r"pyro_flat\..*\._\w+"),
]

# --- intersphinx, from committed inventories (docs/_inventories/make_inventories.py) ---------
INV = DOCS / "_inventories"
intersphinx_mapping = {
    "torch": ("https://pytorch.org/docs/stable/", str(INV / "torch.inv")),
    "pyro": ("https://docs.pyro.ai/en/stable/", str(INV / "pyro.inv")),
    "arviz": ("https://python.arviz.org/en/stable/", str(INV / "arviz.inv")),
    "python": ("https://docs.python.org/3/", str(INV / "python.inv")),
    "numpy": ("https://numpy.org/doc/stable/", str(INV / "numpy.inv")),
}


# --- pages derived from sources --------------------------------------------------------------
QUICK_NOTE = """
:::{{note}}
The output and figures on this page come from the tutorial's **quick mode**
(`PYRO_FLAT_QUICK=1`), which the documentation build executes: short runs, so the numbers
are not the full tutorial's. For the full run: `python tutorials/{name}`.
:::
"""


def _tutorial_quick_note(app, docname, source):
    """Put the quick-mode note under the title of every executed tutorial."""
    if not docname.startswith("tutorials/") or docname == "tutorials/index":
        return
    name = Path(docname).name + ".py"
    note = QUICK_NOTE.format(name=name).strip("\n").splitlines()
    text = source[0]
    title = re.search(r"^# # .*$", text, flags=re.MULTILINE)
    if title is None:
        raise ValueError(f"tutorial {name} has no '# # Title' line")
    insert = "\n#\n" + "\n".join(f"# {line}" if line else "#" for line in note) + "\n#"
    source[0] = text[: title.end()] + insert + text[title.end():]


CODE = re.compile(r"^(```|~~~).*?^\1|``[^`]*``|`[^`\n]*`", re.MULTILINE | re.DOTALL)
BACKSLASH_MATH = re.compile(r"\\[(\[]")


def _no_backslash_math(app, docname, source):
    """Markdown reads ``\\(x\\)`` as an escaped parenthesis: it would print "(x)" with no
    warning. Math on the Markdown pages and in the tutorials is ``$x$`` and ``$$x$$``."""
    path = app.env.doc2path(docname)
    if path.suffix not in (".md", ".py"):
        return
    text = source[0]
    if path.suffix == ".py":  # the tutorials' Markdown cells, not their code
        text = "\n".join(cell.source for cell in jupytext.reads(text, fmt="py:percent").cells
                         if cell.cell_type == "markdown")
    for match in BACKSLASH_MATH.finditer(CODE.sub("", text)):
        logger.warning("%s: %r is not math in Markdown; write $...$ or $$...$$",
                       docname, match.group(), location=docname)


def _canonical(obj):
    """Where autodoc documents ``obj``: its defining module and qualified name."""
    if inspect.ismodule(obj):
        return obj.__name__
    obj = inspect.unwrap(obj) if callable(obj) else obj
    module, qualname = getattr(obj, "__module__", None), getattr(obj, "__qualname__", None)
    if module and qualname and "<" not in qualname:
        return f"{module}.{qualname}"
    return None


def _lookup(name):
    """The object at a dotted pyro_flat path (a package re-export or an attribute)."""
    parts = name.split(".")
    for i in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:i]))
        except ImportError:
            continue
        try:
            for part in parts[i:]:
                obj = getattr(obj, part)
        except AttributeError:
            return None
        return obj
    return None


def _resolve_pyro_flat_alias(app, env, node, contnode):
    """Resolve a reference to a re-exported pyro_flat name, e.g. ``pyro_flat.infer.SGLD``.

    Every object is documented once, in the module that defines it
    (``pyro_flat.infer.mcmc.sgld.SGLD``); the docstrings refer to it by its public path or,
    inside a package docstring, by its bare name. This looks the name up and points the
    reference at the documented object.
    """
    if node.get("refdomain") != "py":
        return None
    target = node["reftarget"].lstrip("~.")
    module, cls = node.get("py:module"), node.get("py:class")
    candidates = [target]
    if target in TYPE_CHECKING_NAMES:
        new = node.deepcopy()
        new["reftarget"] = TYPE_CHECKING_NAMES[target]
        return intersphinx.missing_reference(app, env, new, contnode)
    if module and not target.startswith("pyro_flat"):
        if cls:
            candidates.append(f"{module}.{cls}.{target}")
        candidates.append(f"{module}.{target}")
    domain = env.domains["py"]
    for name in candidates:
        if not name.startswith("pyro_flat."):
            continue
        obj = _lookup(name)
        if obj is None:
            continue
        canonical = _canonical(obj)
        if canonical is not None and not canonical.startswith("pyro_flat."):
            # inherited from Pyro or torch (LeanMCMC.get_samples is pyro.infer.MCMC's)
            new = node.deepcopy()
            new["reftarget"] = canonical
            found = intersphinx.missing_reference(app, env, new, contnode)
            if found is not None:
                return found
            continue
        if canonical is None:
            # an attribute: its owner's canonical path and its own name
            owner, _, attr = name.rpartition(".")
            owner_canonical = _canonical(_lookup(owner)) if _lookup(owner) else None
            canonical = f"{owner_canonical}.{attr}" if owner_canonical else None
        if canonical is None or canonical == node["reftarget"]:
            continue
        new = node.deepcopy()
        new["reftarget"] = canonical
        new["refspecific"] = False
        found = domain.resolve_xref(env, node["refdoc"], app.builder, node["reftype"],
                                    canonical, new, contnode)
        if found is None:
            found = domain.resolve_xref(env, node["refdoc"], app.builder, "obj",
                                        canonical, new, contnode)
        if found is not None:
            return found
    return None


SECTION = re.compile(r"^(Examples|References|Notes|See Also|Attributes)\n-+$", re.MULTILINE)


def _numpydoc_module_sections(app, what, name, obj, options, lines):
    """numpydoc leaves module docstrings alone: their "Examples" or "References" sections
    would become sections of the page (and clashing labels). Render them as numpydoc renders
    a function's, as rubrics."""
    if what != "module" or not SECTION.search("\n".join(lines)):
        return
    from numpydoc.docscrape_sphinx import SphinxDocString

    rendered = str(SphinxDocString("\n".join(lines), config={"show_class_members": False}))
    lines[:] = rendered.splitlines()


def _skip_type_aliases(app, what, name, obj, skip, options):
    """Type aliases (``Outcome = tuple[...]``) are not API: autodoc cannot sign them."""
    if isinstance(obj, types.GenericAlias):
        return True
    return None


UNPARSABLE_DEFAULT = re.compile(r"<factory>|<function [^<>]*<lambda>>")


def _factory_defaults(app, what, name, obj, options, signature, return_annotation):
    """A default that is a dataclass field's ``default_factory`` (``<factory>``) or a lambda
    (``<function <lambda>>``) makes a signature Sphinx cannot parse; show ``...`` instead."""
    if signature and UNPARSABLE_DEFAULT.search(signature):
        return UNPARSABLE_DEFAULT.sub("...", signature), return_annotation
    return None


#: names our annotations import under ``TYPE_CHECKING`` only (autodoc sees a bare string)
TYPE_CHECKING_NAMES = {"MCMC": "pyro.infer.MCMC"}


def setup(app):
    app.connect("source-read", _no_backslash_math)
    app.connect("source-read", _tutorial_quick_note)
    app.connect("autodoc-process-signature", _factory_defaults)
    app.connect("autodoc-process-docstring", _numpydoc_module_sections)
    app.connect("autodoc-skip-member", _skip_type_aliases)
    app.connect("missing-reference", _resolve_pyro_flat_alias)
