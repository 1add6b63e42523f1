"""Count the private names a tree's modules reach for, and its largest files (issue 33's figures).

Three counts, read from the source with :mod:`ast`:

* **private imports**: ``from module import _name``;
* **private attributes of other objects**: ``obj._name`` where ``obj`` is not ``self``/``cls``
  (another object's internals, e.g. ``mcmc._diagnostics`` or a PyroModule's ``_parameters``);
* **private names used on self but defined elsewhere**: ``self._name`` read in a file that
  neither assigns it nor defines it (a mixin reading its base's state, or the base reading a
  mixin's).

Run
---
    python benchmarks/private_reach_ins.py                     # this tree: pyro_flat and tests
    python benchmarks/private_reach_ins.py --root /tmp/old     # another checkout
    python benchmarks/private_reach_ins.py --list pyro_flat    # every occurrence

Results go to ``benchmarks/results/private_reach_ins.md`` (``--out``).
"""

from __future__ import annotations

import argparse
import ast
from collections import Counter
from pathlib import Path


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def count(folder: Path) -> dict[str, Counter]:
    """``{kind: Counter({(file, name): uses})}`` for the three kinds of the module docstring."""
    out = {"imports": Counter(), "attributes": Counter(), "self_elsewhere": Counter()}
    for path in sorted(folder.rglob("*.py")):
        if "__pycache__" in path.parts:
            continue
        tree = ast.parse(path.read_text(), filename=str(path))
        defined: set[str] = set()
        used: Counter = Counter()
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom):
                for alias in node.names:
                    if _private(alias.name):
                        out["imports"][(str(path), alias.name)] += 1
            elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                defined.add(node.name)
            elif isinstance(node, ast.Assign | ast.AnnAssign):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                defined.update(n.id for t in targets for n in ast.walk(t)
                               if isinstance(n, ast.Name))
            if isinstance(node, ast.Attribute) and _private(node.attr):
                if isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"):
                    if isinstance(node.ctx, ast.Store):
                        defined.add(node.attr)
                    else:
                        used[node.attr] += 1
                else:
                    out["attributes"][(str(path), node.attr)] += 1
        for name, uses in used.items():
            if name not in defined:
                out["self_elsewhere"][(str(path), name)] += uses
    return out


def largest(folder: Path, n: int = 8) -> list[tuple[str, int]]:
    sizes = [(str(p.relative_to(folder.parent)), len(p.read_text().splitlines()))
             for p in folder.rglob("*.py") if "__pycache__" not in p.parts]
    return sorted(sizes, key=lambda x: -x[1])[:n]


def _revision(root: Path) -> str:
    """The tree's git commit, if it is a checkout."""
    import subprocess

    try:
        out = subprocess.run(["git", "-C", str(root), "rev-parse", "--short", "HEAD"],
                             capture_output=True, text=True, check=True)
        return f"commit {out.stdout.strip()}"
    except (OSError, subprocess.CalledProcessError):
        return root.name


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--root", type=Path, default=Path(__file__).resolve().parents[1])
    parser.add_argument("--list", choices=("pyro_flat", "tests"), default=None,
                        help="print every occurrence in this folder")
    parser.add_argument("--out", type=Path, default=None,
                        help="results file (default benchmarks/results/private_reach_ins.md; "
                             "'-' prints only)")
    args = parser.parse_args(argv)
    lines = [f"# Private reach-ins and largest files ({_revision(args.root)})", "",
             "| folder | private imports | private attributes of other objects | "
             "self._name defined elsewhere |", "|---|---:|---:|---:|"]
    for folder in ("pyro_flat", "tests"):
        c = count(args.root / folder)
        lines.append(f"| {folder} | {sum(c['imports'].values())} | "
                     f"{sum(c['attributes'].values())} | {sum(c['self_elsewhere'].values())} |")
        if args.list == folder:
            for kind, found in c.items():
                for (path, name), uses in sorted(found.items()):
                    print(f"{kind}: {path}: {name} x{uses}")
    lines += ["", "| largest files of pyro_flat | lines |", "|---|---:|"]
    lines += [f"| {name} | {size} |" for name, size in largest(args.root / "pyro_flat")]
    text = "\n".join(lines) + "\n"
    print(text)
    if str(args.out) != "-":
        out = args.out or Path(__file__).parent / "results" / "private_reach_ins.md"
        out.write_text(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
