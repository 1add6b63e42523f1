"""The built documentation site (``./dev docs``, which ``./dev test`` runs first) reads well.

Reads ``docs/_build/html``: no reST or LaTeX source left in the visible text (a role that was
not rendered, a ``.. math::`` block, a ``\\(`` outside a math container), every internal link
and anchor resolves, MathJax comes from the site itself, every public name has its entry in the
API reference and every tutorial page its output and figures. Skipped when the site has not
been built, except under ``CI=true``, where a missing site is a failure.
"""

import importlib
import inspect
import os
import pkgutil
import re
import warnings
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import unquote, urlsplit

import pytest

import pyro_flat

ROOT = Path(__file__).resolve().parents[1]
SITE = Path(os.environ.get("PYRO_FLAT_DOCS_SITE", ROOT / "docs" / "_build" / "html"))
TUTORIALS = sorted(p.stem for p in (ROOT / "tutorials").glob("[0-9]*.py"))

#: text that must never reach a reader: reST roles and directives, and LaTeX delimiters that
#: MathJax did not get to see (it typesets only inside Sphinx's ``math`` containers). A role
#: that Markdown left alone shows as ``:class:`` followed by its target as code.
LITERAL = re.compile(r":(?:math|class|func|meth|mod|attr|data|obj|exc|ref|doc):\s*`"
                     r"|\.\. (?:math|automodule|autoclass|autofunction)::|\\\(|\\\[")
#: elements whose text is code or is typeset: not checked for literal markup
OPAQUE = {"script", "style", "pre", "code", "kbd", "samp", "math"}
VOID = {"area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "source",
        "track", "wbr"}


class Page(HTMLParser):
    """Visible text (outside code and math), ids, links and images of one page."""

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.text, self.ids, self.links, self.sources = [], set(), [], []
        self.math = 0
        self._stack = []  # (tag, opaque) of the open elements

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        for key in ("id", "name"):
            if attrs.get(key) and (key == "id" or tag == "a"):
                self.ids.add(attrs[key])
        if tag == "a" and attrs.get("href") is not None:
            self.links.append(attrs["href"])
        if tag in ("img", "script") and attrs.get("src"):
            self.sources.append(attrs["src"])
        classes = (attrs.get("class") or "").split()
        is_math = "math" in classes
        self.math += is_math
        if tag in VOID:
            return
        outer = bool(self._stack and self._stack[-1][1])
        opaque = tag in OPAQUE or is_math or outer
        if opaque and not outer:
            self.text.append("`")  # stands for the code or math left out: ``:class:<code>``
        self._stack.append((tag, opaque))

    def handle_startendtag(self, tag, attrs):
        self.handle_starttag(tag, attrs)

    def handle_endtag(self, tag):
        if tag in VOID:
            return
        for i in range(len(self._stack) - 1, -1, -1):  # tolerate unclosed elements
            if self._stack[i][0] == tag:
                del self._stack[i:]
                break

    def handle_data(self, data):
        if not (self._stack and self._stack[-1][1]):
            self.text.append(data)


def parse(path):
    page = Page()
    page.feed(path.read_text(encoding="utf-8"))
    page.close()
    return page


@pytest.fixture(scope="module")
def site():
    if not (SITE / "index.html").exists():
        if os.environ.get("CI") == "true":
            pytest.fail(f"{SITE} was not built: ./dev test builds it with ./dev docs first")
        pytest.skip(f"the site is not built (run ./dev docs): {SITE}")
    pages = {}
    for path in sorted(SITE.rglob("*.html")):
        rel = path.relative_to(SITE)
        if rel.parts[0] in ("_static", "_sources", "_modules"):
            continue
        pages[rel.as_posix()] = parse(path)
    return pages


def test_no_literal_markup(site):
    found = []
    for name, page in site.items():
        text = "".join(page.text)
        for match in LITERAL.finditer(text):
            found.append(f"{name}: ...{text[max(0, match.start() - 60):match.end() + 40]}...")
    assert not found, "unrendered markup:\n" + "\n".join(found[:40])


def test_math_is_rendered_from_the_site(site):
    # the check above is not vacuous: the API pages and the method pages carry math, in the
    # containers MathJax typesets, and MathJax itself is served locally
    api_math = sum(page.math for name, page in site.items() if name.startswith("api/"))
    assert api_math > 200, api_math
    assert any(page.math for name, page in site.items() if name.startswith("methods/"))
    index = (SITE / "api" / "infer.html").read_text(encoding="utf-8")
    assert 'class="math notranslate nohighlight">\\(' in index  # inline math, as MathJax wants
    assert '<div class="math notranslate nohighlight">' in index  # a displayed equation
    scripts = {src for page in site.values() for src in page.sources if "mathjax" in src}
    assert scripts and all(not urlsplit(src).scheme for src in scripts), scripts
    assert (SITE / "_static" / "mathjax" / "tex-chtml.js").exists()
    every_page = "".join(p.read_text(encoding="utf-8") for p in SITE.rglob("*.html"))
    assert "cdn.jsdelivr" not in every_page and "mathjax@3" not in every_page


def test_internal_links_resolve(site):
    ids = {name: page.ids for name, page in site.items()}
    broken = []
    for name, page in site.items():
        base = Path(name).parent
        for href in page.links + page.sources:
            parts = urlsplit(href)
            if parts.scheme or parts.netloc or href.startswith(("mailto:", "javascript:")):
                continue
            target = name if not parts.path else (base / unquote(parts.path)).as_posix()
            target = os.path.normpath(target)
            if parts.path.endswith("/") or (SITE / target).is_dir():
                target = f"{target}/index.html"
            if not (SITE / target).exists():
                broken.append(f"{name}: {href} (no file {target})")
                continue
            anchor = unquote(parts.fragment)
            if anchor and target.endswith(".html"):
                target_ids = ids.get(target)
                if target_ids is None:
                    target_ids = parse(SITE / target).ids
                if anchor not in target_ids:
                    broken.append(f"{name}: {href} (no id {anchor!r} in {target})")
    assert not broken, "broken links:\n" + "\n".join(broken[:40])
    assert sum(len(page.links) for page in site.values()) > 1000  # the check saw the site


def public_modules():
    """Every module of pyro_flat but the private ones."""
    names = ["pyro_flat"]
    for info in pkgutil.walk_packages(pyro_flat.__path__, "pyro_flat."):
        if not any(part.startswith("_") for part in info.name.split(".")):
            names.append(info.name)
    return names


def documented_names(module_name, modules):
    """``(public name, ids that would document it)`` for the names of ``module_name.__all__``:
    a class or function is documented once, under the module that defines it; data (which
    does not know its module) under any module that holds it by that name."""
    module = modules[module_name]
    for name in getattr(module, "__all__", ()):
        if name.startswith("__"):
            continue
        obj = getattr(module, name)
        if inspect.ismodule(obj):
            yield obj.__name__, {f"module-{obj.__name__}"}
        elif inspect.isclass(obj) or inspect.isfunction(obj):
            yield f"{module_name}.{name}", {f"{obj.__module__}.{obj.__qualname__}"}
        else:
            yield f"{module_name}.{name}", {f"{other}.{name}" for other, m in modules.items()
                                            if getattr(m, name, None) is obj}


def test_every_public_name_is_in_the_api_reference(site):
    ids = set().union(*(page.ids for name, page in site.items() if name.startswith("api/")))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        modules = {name: importlib.import_module(name) for name in public_modules()}
    missing_modules = [m for m in modules if f"module-{m}" not in ids]
    assert not missing_modules, f"modules without an API entry: {missing_modules}"
    missing, count = [], 0
    for module_name in modules:
        for public, anchors in documented_names(module_name, modules):
            count += 1
            if not anchors & ids:
                missing.append(f"{public} (expected one of the ids {sorted(anchors)})")
    assert not missing, "public names without an API entry:\n" + "\n".join(missing)
    assert count > 100, count


def test_tutorials_are_executed_with_their_figures(site):
    assert TUTORIALS
    for stem in TUTORIALS:
        name = f"tutorials/{stem}.html"
        assert name in site, f"no page for tutorial {stem}"
        html = (SITE / name).read_text(encoding="utf-8")
        text = " ".join(site[name].text)
        assert "quick mode" in text and "PYRO_FLAT_QUICK=1" in html, f"{name}: no quick-mode note"
        assert "cell_output" in html, f"{name}: no output (was it executed?)"
        images = [src for src in site[name].sources if src.endswith((".png", ".svg", ".jpg"))]
        assert images, f"{name}: no figure"
        for src in images:
            assert (SITE / os.path.normpath(Path(name).parent / src)).exists(), src
