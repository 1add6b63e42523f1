"""The output folder of ``pyro-flat compare``: checked before the run, written all at once after.

Everything is written into a temporary folder next to the target, which is then renamed, so an
interrupted or failed run leaves no half-written output behind; an existing folder is replaced
only if it is empty or holds nothing but files ``compare`` writes.
"""

from __future__ import annotations

import csv
import json
import math
import os
import re
import shutil
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from pyro_flat.compare.evaluation import HEADERS, METRICS, task_metrics


def columns(metrics: Sequence[str] = METRICS) -> tuple[str, ...]:
    """Columns of ``results.csv`` and ``results.json`` for the task's ``metrics`` (the printed
    table leaves out the CPU time)."""
    return ("method", *metrics, "grad_evals", "draws", "wall_time_s", "cpu_time_s", "status")


#: The columns of a classification (:func:`columns` of the classification metrics).
COLUMNS = columns(METRICS)
#: Files ``compare`` writes (besides the draws); an output folder holding only these (and draws)
#: may be replaced.
RESULT_FILES = ("results.csv", "results.json", "results.md", "reliability.png",
                "uncertainty.png", "loss_slices.png", "paired_differences.png", "predictive.png")
DRAWS_PATTERN = "draws_{}.nc"


def is_previous_output(path: Path) -> bool:
    """Whether ``path`` is an empty folder or holds only files that ``compare`` writes."""
    try:
        entries = list(path.iterdir())
    except OSError:
        return False
    prefix, suffix = DRAWS_PATTERN.split("{}")
    for entry in entries:
        name = entry.name
        ours = name in RESULT_FILES or (name.startswith(prefix) and name.endswith(suffix))
        if not (ours and entry.is_file() and not entry.is_symlink()):
            return False
    return True


def output_problem(out: Path) -> str | None:
    """Why ``out`` cannot be (re)written, or ``None`` if it can."""
    if out.exists() or out.is_symlink():
        if not out.is_dir() or out.is_symlink():
            return f"{str(out)!r} exists and is not a folder"
        if not is_previous_output(out):
            return (f"{str(out)!r} exists and holds files pyro-flat did not write; choose a new "
                    "or empty folder")
    ancestor = out.parent
    while not ancestor.exists():
        ancestor = ancestor.parent
    if not ancestor.is_dir():
        return f"cannot create {str(out)!r}: {str(ancestor)!r} is a file"
    # Write there for real: permission bits say nothing of a read-only file system, and root
    # passes os.access everywhere.
    try:
        os.rmdir(tempfile.mkdtemp(prefix=f".{out.name}.probe-", dir=ancestor))
    except OSError as e:
        return f"cannot write into {str(ancestor)!r} ({e.strerror or e})"
    return None


def _temp_prefix(out: Path, kind: str) -> str:
    """Name prefix of this process's temporary folders next to ``out``."""
    return f".{out.name}.{kind}-{os.getpid()}-"


def remove_stale_temporaries(out: Path) -> None:
    """Remove temporary folders next to ``out`` left by runs that were killed while writing.

    They are named ``.<out>.tmp-<pid>-*`` / ``.<out>.old-<pid>-*``; one whose process is gone
    (or that has no process id: an older pyro-flat's) is removed, one of a live run is kept.
    """
    pattern = re.compile(rf"^\.{re.escape(out.name)}\.(tmp|old|probe)-(?:(\d+)-)?")
    for entry in out.parent.iterdir() if out.parent.is_dir() else ():
        match = pattern.match(entry.name)
        if not match or not entry.is_dir() or entry.is_symlink():
            continue
        pid = match.group(2)
        if pid is not None and int(pid) != os.getpid() and _alive(int(pid)):
            continue
        shutil.rmtree(entry, ignore_errors=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's live process
        return True
    return True


def write_atomically(out: Path, write: Callable[[Path], Any]) -> None:
    """Call ``write(folder)`` on a fresh folder next to ``out``, then move it to ``out``.

    On any failure nothing is left behind: neither the temporary folder, nor parent folders
    created for it, and a previous output at ``out`` is restored. On success, temporary folders
    of earlier runs that were killed while writing are removed
    (:func:`remove_stale_temporaries`).
    """
    missing = []
    parent = out.parent
    while not parent.exists():
        missing.append(parent)
        parent = parent.parent
    tmp = old = None
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=_temp_prefix(out, "tmp"), dir=out.parent))
        umask = os.umask(0)
        os.umask(umask)
        tmp.chmod(0o777 & ~umask)  # mkdtemp makes it private
        write(tmp)
        if out.exists():
            old = Path(tempfile.mkdtemp(prefix=_temp_prefix(out, "old"), dir=out.parent))
            old.rmdir()
            out.rename(old)
        tmp.rename(out)
        tmp = None
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
            old = None
        remove_stale_temporaries(out)
    except BaseException:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
        if old is not None and not out.exists():
            old.rename(out)
        for folder in missing:  # deepest first
            try:
                folder.rmdir()
            except OSError:
                break
        raise


def format_table(rows: Sequence[dict], metrics: Sequence[str] = METRICS) -> str:
    """A markdown table of the result rows, with the columns of the task's ``metrics``."""
    header = ("method", *(HEADERS[m] for m in metrics), "grad evals", "draws", "wall time (s)")

    def number(value: Any, spec: str) -> str:
        return "-" if value is None or value != value else format(value, spec)

    lines = []
    for r in rows:
        failed = r.get("status", "ok") != "ok"
        lines.append((
            r["method"] + (" (failed)" if failed else ""),
            *(number(r[k], ".4f") for k in metrics),
            number(r["grad_evals"], "d"), number(r["draws"], "d"),
            number(r["wall_time_s"], ".1f"),
        ))
    widths = [max(len(h), *(len(line[i]) for line in lines)) for i, h in enumerate(header)]

    def fmt(cells: Sequence[str]) -> str:
        padded = [c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in
                  enumerate(zip(cells, widths, strict=True))]
        return "| " + " | ".join(padded) + " |"

    rule = "|" + "|".join(
        "-" * (w + 1) + ":" if i else ":" + "-" * (w + 1) for i, w in enumerate(widths)
    ) + "|"
    return "\n".join([fmt(header), rule, *(fmt(line) for line in lines)])


def _json_safe(value: Any) -> Any:
    """NaN (a failed method's metrics) as null: JSON has no NaN."""
    return None if isinstance(value, float) and not math.isfinite(value) else value


def _json_safe_tree(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _json_safe_tree(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_json_safe_tree(v) for v in value]
    return _json_safe(value)


def write_results(folder: Path, rows: list[dict], meta: dict, draws: dict[str, Any], *,
                  markdown: str | None = None, by_seed: bool = False) -> None:
    """``results.csv``, ``results.json``, ``results.md`` and the draws' netCDF files.

    The metric columns are ``meta["metric_columns"]``, else those of ``meta["task"]``
    (classification when it is absent, :func:`pyro_flat.compare.evaluation.task_metrics`).
    ``by_seed``: the rows carry a ``seed`` column (``compare --seeds``); ``markdown``: the text
    of ``results.md`` (default: the table of the rows).
    """
    metrics = meta.get("metric_columns") or task_metrics(meta.get("task", "classification"))[0]
    names = columns(metrics)
    names = ("seed", *names) if by_seed else names
    with open(folder / "results.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=names)
        writer.writeheader()
        for row in rows:
            writer.writerow({k: row[k] for k in names})
    with open(folder / "results.json", "w") as f:
        results = [{k: _json_safe(row[k]) for k in names} for row in rows]
        json.dump(_json_safe_tree({**meta, "results": results}), f, indent=2, allow_nan=False)
        f.write("\n")
    (folder / "results.md").write_text((markdown or format_table(rows, metrics)) + "\n")
    write_draws(folder, draws)


def write_draws(folder: Path, draws: dict[str, Any]) -> None:
    """Each ArviZ data set of ``draws`` as ``draws_<name>.nc``."""
    for name, idata in draws.items():
        idata.to_netcdf(str(folder / DRAWS_PATTERN.format(name)), engine="h5netcdf")
