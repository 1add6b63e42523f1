"""The README's and the documentation's code runs as written.

Every ```` ```python ```` block of ``README.md`` and ``docs/**/*.md`` runs in a fresh process, in
an empty working folder, as a reader would paste it. A block that continues another (the page's
prose says "with the model above") says so on the line before its fence, in a comment the page
does not show::

    <!-- snippet: after README.md#0 -->                 runs after README.md's first block
    <!-- snippet: after $ pyro-flat compare ... -->     runs after that shell command

Blocks are numbered from 0 in each page. The blocks that continue one another run together in
one process, in order (the first block's cost is paid once), and a failure names its block.
The example scripts the pages include or point to run too.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[1]
PAGES = [ROOT / "README.md", *sorted(p for p in (ROOT / "docs").rglob("*.md")
                                     if "_build" not in p.parts)]
#: Scripts the pages include (``literalinclude``) or tell the reader to run, with their
#: arguments; ``docs/examples/sgnht_kernel.py`` is imported by its own test.
SCRIPTS = {
    "docs/examples/draws_on_disk.py": [],
    "examples/distributed_chains.py": ["--out", "run"],
}
BLOCK = re.compile(r"^(?:<!-- snippet: after (?P<after>.+?) -->\n)?```python\n(?P<code>.*?)^```",
                   re.S | re.M)
#: Runs the blocks of one group, in order, in one namespace, as ``python -`` would.
RUNNER = r"""
import json, subprocess, sys, traceback
namespace = {"__name__": "__main__"}
for block in json.load(open(sys.argv[1])):
    for command in block["shell"]:
        subprocess.run(command, shell=True, check=True)
    try:
        exec(compile(block["code"], block["id"], "exec"), namespace)
    except BaseException:
        traceback.print_exc()
        print(f"snippet {block['id']} failed", file=sys.stderr)
        sys.exit(1)
"""


@dataclass
class Block:
    id: str
    code: str
    after: list[str] = field(default_factory=list)  # blocks this one continues
    shell: list[str] = field(default_factory=list)  # commands to run before it


def blocks() -> dict[str, Block]:
    out: dict[str, Block] = {}
    for page in PAGES:
        name = page.relative_to(ROOT).as_posix()
        for i, match in enumerate(BLOCK.finditer(page.read_text())):
            block = Block(f"{name}#{i}", match["code"])
            after = match["after"]
            if after is not None and after.startswith("$ "):
                block.shell.append(after[2:])
            elif after is not None:
                block.after.append(after)
            out[block.id] = block
    return out


def groups() -> dict[str, list[Block]]:
    """The blocks that run together, each group in order, named by its first block."""
    found = blocks()
    for block in found.values():
        for other in block.after:
            if other not in found:
                raise ValueError(f"{block.id} runs after {other!r}, which is no python block "
                                 f"(blocks: {sorted(found)})")
    root = {}

    def first(block: Block) -> str:
        return block.id if not block.after else first(found[block.after[0]])

    for block in found.values():
        root.setdefault(first(block), []).append(block)
    return root


GROUPS = groups()


def environment() -> dict[str, str]:
    """No plot windows; one thread per process, as the suite's own (tests/conftest.py): two
    test workers each running a snippet with torch's default threads on two cores made a
    20-second snippet take 200."""
    return {**os.environ, "MPLBACKEND": "Agg", "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}


@pytest.mark.parametrize("group", sorted(GROUPS))
def test_snippets_run_as_written(group, tmp_path):
    members = GROUPS[group]
    script = tmp_path / "blocks.json"
    script.write_text(json.dumps([{"id": b.id, "code": b.code, "shell": b.shell}
                                  for b in members]))
    work = tmp_path / "work"
    work.mkdir()
    env = environment()
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    result = subprocess.run([sys.executable, "-c", RUNNER, str(script)], cwd=work, env=env,
                            capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stderr[-4000:]


@pytest.mark.parametrize("script", sorted(SCRIPTS))
def test_example_scripts_run(script, tmp_path):
    env = environment()
    result = subprocess.run([sys.executable, str(ROOT / script), *SCRIPTS[script]],
                            cwd=tmp_path, env=env, capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stderr[-4000:]


def test_markers_are_well_formed():
    """A marker must name a block that exists (an error at collection) or a shell command;
    a stray marker (not right before a fence) would be silently ignored, so none may exist.
    The pages hold at least the 22 blocks counted when this test was written."""
    assert len(blocks()) >= 22
    for page in PAGES:
        text = page.read_text()
        markers = len(re.findall(r"<!-- snippet:", text))
        attached = sum(1 for m in BLOCK.finditer(text) if m["after"] is not None)
        assert markers == attached, f"{page}: a snippet marker not right before a python fence"
