"""Checkpoints of a ``torch.distributed`` job: one file per rank, with the world size recorded.

Rank ``r`` writes its kernel's :meth:`~pyro_flat.infer.mcmc.base.SGMCMCKernel.state_dict`
to ``<directory>/ckpt.rank<r>.pt`` (written to a temporary file and renamed, so a job killed
while saving leaves the previous checkpoint whole). A job resumes only on the world size that
wrote the files: each rank then continues its chains bit for bit. Any other world size is a
clear error (the chains of a rank, and the data shards of a data-parallel chain, belong to
that rank).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch

#: Format of the per-rank checkpoint files.
FORMAT = 1


def checkpoint_path(directory: str | os.PathLike, rank: int) -> Path:
    """The file of rank ``rank``'s checkpoint in ``directory``."""
    return Path(directory) / f"ckpt.rank{rank}.pt"


def save_rank_checkpoint(directory: str | os.PathLike, kernel_state: dict[str, Any], *,
                         rank: int, world_size: int, **meta: Any) -> Path:
    """Write one rank's checkpoint (its kernel state, the world size and ``meta``)."""
    path = checkpoint_path(directory, rank)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".tmp{os.getpid()}")
    torch.save({"format": FORMAT, "rank": rank, "world_size": world_size, **meta,
                "kernel": kernel_state}, tmp)
    os.replace(tmp, path)
    return path


def load_rank_checkpoint(directory: str | os.PathLike, *, rank: int, world_size: int
                         ) -> dict[str, Any]:
    """Read rank ``rank``'s checkpoint; a clear ``ValueError`` if it was written by a job of
    another world size (or is missing)."""
    path = checkpoint_path(directory, rank)
    if not path.exists():
        first = checkpoint_path(directory, 0)
        if rank > 0 and first.exists():
            saved = _read(first).get("world_size")
            raise ValueError(_mismatch(directory, saved, world_size))
        raise FileNotFoundError(f"no checkpoint for rank {rank} in {directory} ({path.name} "
                                "is missing)")
    state = _read(path)
    if not isinstance(state, dict) or state.get("format") != FORMAT:
        raise ValueError(f"{path} is not a pyro_flat.distributed checkpoint of format {FORMAT}")
    if state["world_size"] != world_size:
        raise ValueError(_mismatch(directory, state["world_size"], world_size))
    return state


def _read(path: Path) -> Any:
    """``torch.load`` with its defaults (tensors and plain Python values only); a file that
    cannot be read is an error naming it."""
    try:
        return torch.load(path)
    except Exception as error:
        raise ValueError(f"cannot read the checkpoint {path} (truncated, corrupt, or not a "
                         f"pyro_flat.distributed checkpoint): {type(error).__name__}: "
                         f"{str(error).splitlines()[0] if str(error) else ''}") from error


def _mismatch(directory: str | os.PathLike, saved: int, world_size: int) -> str:
    return (f"world size mismatch: the checkpoint in {directory} was written by a job of "
            f"world size {saved}, this job has world size {world_size}. Resume it with "
            f"{saved} processes in all (torchrun --nnodes * --nproc_per_node = {saved}), or "
            "start a new run: each rank's chains (or data shard) belong to that rank")
