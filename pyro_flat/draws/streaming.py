"""Stream the draws of a ``pyro.infer.MCMC`` run to disk while the chain runs."""

from __future__ import annotations

import multiprocessing
import re
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from pyro_flat import validation
from pyro_flat.draws.files import Part, open_for_reading, part_name

__all__ = ["DrawWriter"]

#: Default size of the block of draws held in memory between two writes (bytes).
BLOCK_BYTES = 2**24
#: Most draws in a default block: a draw also costs its row index and, until written, its
#: statistics in the kernel (about 0.1-0.2 kB together), which the byte budget does not see.
MAX_BLOCK_DRAWS = 4096


class DrawWriter:
    """A ``hook_fn`` for :class:`pyro.infer.MCMC` that appends every draw to a draw store on disk.

    Pass it as ``MCMC(..., hook_fn=writer)``: after each post-warmup draw, the writer keeps the
    draw's sites (all, or ``sites``) in the constrained space, as ``mcmc.get_samples()`` gives
    them, and its per-draw statistics (``lp``, ``step_size``, ``grad_norm``, ``diverging`` and
    the kernel's own, as :func:`pyro_flat.to_arviz` puts them in ``sample_stats``), and writes
    them to netCDF-4 files in blocks of ``block_size`` draws. Together with
    ``MCMC(..., save_params=[...])``, which tells Pyro's driver which sites to keep in memory
    (``[]``: none), the draws need not fit in memory: the writer holds one block. Open the
    result with :func:`pyro_flat.open_draws` (the layout is in :mod:`pyro_flat.draws.files`).
    Each block is committed to disk once written: a process killed at any moment, even with
    ``SIGKILL``, leaves a store that opens with every draw but those of the block in progress,
    and ``open_draws`` also opens a store while its run writes it, from any process.

    Constant memory: with ``save_params=[]``, every statistic written (``stats=True``) and
    ``thin=1``, the writer also *releases* the statistics it has written from the kernel's
    memory; the kernel reads them back from the store for its end-of-run checks, and
    :func:`pyro_flat.sample_stats` on the driver then says to open the store. A run under
    :class:`pyro_flat.LeanMCMC` then grows by no more than a few bytes per draw; Pyro's own
    ``MCMC`` keeps an empty tensor per draw in its loop, which no hook can avoid, so use
    ``LeanMCMC`` for long streamed runs.

    Chains: each chain of ``MCMC(num_chains=C)`` (run one after another or in worker
    processes) writes a part file of its own; a kernel with ``vectorized_chains=K`` writes its
    ``K`` chains into one part; global chain ``chain_offset + c * K + k`` is the ``k``-th row of
    Pyro's chain ``c``, the order of :func:`pyro_flat.to_arviz`.

    A statistic that needs the potential at the draw (``lp``, ``grad_norm``, ContourSGLD's
    ``log_weight``) is known only after the next SG step, so a draw is written one draw late;
    the last one is completed (as ``mcmc.diagnostics()`` would, without touching the random
    stream) when the ``num_samples``-th draw arrives, which is why the writer needs
    ``num_samples``.

    Parameters
    ----------
    path : str or pathlib.Path
        A directory for the draw store; it must not exist unless ``resume=True``.
    num_samples : int
        Post-warmup draws of each chain in this run: ``MCMC``'s ``num_samples``, ``>= 1``.
        With a pyro_flat kernel, a run that draws fewer is an error at its end (after its
        draws are written, the part marked unfinished) and one that draws more an error at
        the first draw beyond ``num_samples``.
    sites : sequence of str, optional
        The sites to write (a kernel's extra sites included, e.g. EntropyMCMC's
        ``"<site>__guide"``); all by default.
    stats : bool or sequence of str
        Write the per-draw statistics (``True``, default), none (``False``), or those named.
    thin : int
        Write every ``thin``-th draw, ``>= 1`` (the draws whose index is a multiple of
        ``thin``); the ``draw`` coordinate keeps the draw index, as ``to_arviz(thin=...)``.
    block_size : int, optional
        Draws held in memory between two writes, ``>= 1``; by default as many as fit in
        16 MiB, at least one and at most 4,096.
    resume : bool
        Append to the existing store at ``path``, continuing its draw index: for a run that
        continues a kernel from its checkpoint (``kernel.load_state_dict``), with
        ``warmup_steps=0``. The store must hold a part for every chain of the run, and the
        kernel must continue the checkpoint of the run that finished last (its SG step count
        and the fingerprint of its position are checked; a fresh kernel or another checkpoint
        is an error). Draws that an unfinished run wrote after the last finished one are
        replaced.
    chain_offset : int, optional
        Global index of this writer's first chain, ``>= 0``: a process or rank that runs
        chains ``chain_offset, ...`` of a larger run writes its parts into the same store.
        Given, ``path`` may exist (writers of other chains share it) and only this writer's
        own part files must not; omitted, it is 0 and ``path`` must not exist.
    hook_fn : callable, optional
        A hook of your own, ``hook_fn(kernel, params, stage, i)``, called after the writer.

    Raises
    ------
    ValueError
        If ``path`` exists and ``resume`` is False (or does not hold a store and ``resume`` is
        True), an argument is out of range, or, at the first draw, ``sites`` or ``stats`` name
        something the run does not draw (the message lists what it does).

    Examples
    --------
    >>> import tempfile, torch, pyro, pyro.distributions as dist
    >>> from pyro.infer import MCMC
    >>> from pyro_flat import DrawWriter, open_draws
    >>> from pyro_flat.infer import EntropyMCMC
    >>> def model(y):
    ...     mu = pyro.sample("mu", dist.Normal(0.0, 1.0))
    ...     s = pyro.sample("s", dist.HalfNormal(1.0))
    ...     with pyro.plate("data", len(y)):
    ...         pyro.sample("y", dist.Normal(mu, s), obs=y)
    >>> store = tempfile.mkdtemp() + "/draws"
    >>> writer = DrawWriter(store, num_samples=50, sites=["mu", "mu__guide", "s"])
    >>> kernel = EntropyMCMC(model, step_size=1e-3, eta=1.0, vectorized_chains=2)
    >>> mcmc = MCMC(kernel, num_samples=50, warmup_steps=10, hook_fn=writer,
    ...             save_params=["s"], disable_progbar=True)  # keeps only s in memory
    >>> mcmc.run(torch.randn(30))
    >>> idata = open_draws(store)
    >>> dict(idata.posterior.sizes)
    {'chain': 2, 'draw': 50}
    >>> "coupling_distance" in idata.sample_stats
    True
    """

    def __init__(
        self,
        path: str | Path,
        num_samples: int,
        *,
        sites: Sequence[str] | None = None,
        stats: bool | Sequence[str] = True,
        thin: int = 1,
        block_size: int | None = None,
        resume: bool = False,
        chain_offset: int | None = None,
        hook_fn: Callable[[Any, dict, str, int], Any] | None = None,
    ):
        self.path = validation.directory_path("path", path)
        self.num_samples = validation.integer_at_least("num_samples", num_samples, 1)
        self.sites = None if sites is None else validation.names("sites", sites)
        self.stats = stats if isinstance(stats, bool) else validation.names(
            "stats", stats, "statistic names (or True or False)")
        self.thin = validation.integer_at_least("thin", thin, 1)
        self.block_size = None if block_size is None else validation.integer_at_least(
            "block_size", block_size, 1)
        self.resume = validation.flag("resume", resume)
        shared = chain_offset is not None
        self.chain_offset = 0 if not shared else validation.integer_at_least(
            "chain_offset", chain_offset, 0)
        validation.optional_callable("hook_fn", hook_fn, "hook_fn(kernel, params, stage, i)")
        self.hook_fn = hook_fn
        if self.resume:
            if not self.path.is_dir() or not any(self.path.glob("part-*.nc")):
                raise ValueError(f"resume=True, but path {str(self.path)!r} holds no draw store "
                                 "to append to")
        else:
            if self.path.exists() and not shared:
                raise ValueError(f"path {str(self.path)!r} exists: choose a new directory, or "
                                 "pass resume=True to append to the draws it holds")
            self.path.mkdir(parents=True, exist_ok=shared)
        self._chain: _ChainWriter | None = None

    def __call__(self, kernel: Any, params: dict[str, torch.Tensor], stage: str, i: int) -> None:
        if stage.startswith("Sample"):
            if i >= self.num_samples:
                raise ValueError(
                    f"DrawWriter(num_samples={self.num_samples}) got draw {i} of the run: give "
                    "it MCMC's num_samples (the draws before it are written)")
            chain = _pyro_chain(stage)
            if i == 0 or self._chain is None or self._chain.pyro_chain != chain:
                self.close()
                self._chain = _ChainWriter(self, kernel, params, chain)
                if hasattr(kernel, "at_end_of_run"):  # a pyro_flat kernel
                    kernel.at_end_of_run(self._run_ended)
            self._chain.add(kernel, params, i)
            if i == self.num_samples - 1:
                self._chain.finish(kernel)
                self._chain = None
        if self.hook_fn is not None:
            self.hook_fn(kernel, params, stage, i)

    def _run_ended(self, kernel: Any) -> None:
        """Called by the kernel at the end of ``MCMC.run``: a chain that drew fewer than
        ``num_samples`` draws has them written and is an error (its part is left marked
        unfinished, as an interrupted run's)."""
        if self._chain is None:
            return
        chain, self._chain = self._chain, None
        chain.flush()
        received = chain.received
        chain.part.close(chain.end_attrs(kernel, received))
        raise ValueError(
            f"DrawWriter(num_samples={self.num_samples}), but the run drew {received} draws "
            f"per chain: give it MCMC's num_samples. The {received} draws are written to "
            f"{str(self.path)!r} (the part is marked unfinished)")

    def close(self) -> None:
        """Close a part left open by a run that stopped early (an exception, ``Ctrl-C``),
        after writing the buffered draws whose statistics are complete: every draw but the
        one that waits for its statistics stays. A run that reaches ``num_samples`` closes its
        parts itself."""
        if self._chain is not None:
            chain, self._chain = self._chain, None
            try:
                chain.flush()
            finally:
                chain.part.close()

    def __getstate__(self) -> dict[str, Any]:
        # Worker processes get the settings, never an open file.
        return {**self.__dict__, "_chain": None}


def _pyro_chain(stage: str) -> int:
    """Pyro's chain index: in the stage (``"Sample [c]"``) when chains run one after another,
    in the worker process's name (Pyro names worker ``c`` ``"c"``) when they run in parallel."""
    found = re.search(r"\[(\d+)\]", stage)
    if found:
        return int(found.group(1))
    process = multiprocessing.current_process()
    if multiprocessing.parent_process() is not None and process.name.isdigit():
        return int(process.name)
    return 0


class _ChainWriter:
    """The draws of one of Pyro's chains (``K`` rows with ``vectorized_chains=K``) on their way
    to the part file: a block of draws in memory, written once their statistics are known."""

    def __init__(self, writer: DrawWriter, kernel: Any, params: dict[str, torch.Tensor],
                 pyro_chain: int):
        self.pyro_chain = pyro_chain
        self.thin = writer.thin
        k = getattr(kernel, "vectorized_chains", None)
        self.vectorized = k is not None
        self.num_rows = k or 1
        self.names = _chosen("sites", writer.sites, sorted(params), "sites the run draws")
        self.recorder = getattr(kernel, "recorder", None)
        available = list(self.recorder.names) if self.recorder is not None else []
        self.stat_names = ([] if writer.stats is False else available if writer.stats is True
                           else _chosen("stats", writer.stats, available,
                                        "per-draw statistics of " + type(kernel).__name__))
        self.transforms = getattr(kernel, "transforms", None) or {}
        shapes, dtypes = {}, {}
        for name in self.names:
            value = params[name].detach()
            if name in self.transforms:  # the constrained shape (LKJ: 1 -> 2 x 2, simplex ...)
                value = self.transforms[name].inv(value)
            shapes[name] = tuple(value.shape[1:] if self.vectorized else value.shape)
            dtypes[name] = _numpy_dtype(value.dtype)
        default = torch.get_default_dtype()
        stat_dtypes = {name: _numpy_dtype(self.recorder.dtypes.get(name, default))
                       for name in self.stat_names}
        first = writer.chain_offset + pyro_chain * self.num_rows
        chains = np.arange(first, first + self.num_rows)
        path = writer.path / part_name(first)
        sites = {name: (shapes[name], dtypes[name]) for name in self.names}
        if writer.resume:
            if not path.exists():
                raise ValueError(f"resume=True: {str(writer.path)!r} holds no part for chains "
                                 f"{chains.tolist()} ({path.name})")
            self.part = Part.open(path, sites, stat_dtypes)
            if self.part.chains.tolist() != chains.tolist():
                self.part.close()
                raise ValueError(f"resume: {path.name} holds chains {self.part.chains.tolist()}, "
                                 f"the run's are {chains.tolist()}")
            self._check_continues(kernel, path)
            self.first_draw = int(self.part.attrs().get("next_draw", 0))
            # draws after next_draw were written by a run that did not finish (its chains
            # continue from the checkpoint before it): this run writes them again
            written = self.part.file["posterior"]["draw"][:self.part.num_draws]
            self.part.truncate(int(np.searchsorted(written, self.first_draw)))
        else:
            if path.exists():
                raise ValueError(f"{str(path)!r} exists: the store already holds chains "
                                 f"{chains.tolist()}; give each writer its own chain_offset, "
                                 "or resume=True to append")
            self.part = Part.create(path, chains, sites, stat_dtypes, _provenance(kernel))
            self.first_draw = 0
        per_draw = sum(int(np.prod(s, dtype=np.int64)) * dtypes[n].itemsize
                       for n, s in shapes.items()) * self.num_rows
        self.block_size = writer.block_size or max(
            1, min(MAX_BLOCK_DRAWS, BLOCK_BYTES // max(per_draw, 1)))
        self.num_samples = writer.num_samples
        # one slot more than a block: the last draw waits there for its statistics
        try:
            self.buffers = {name: np.empty((self.num_rows, self.block_size + 1, *shapes[name]),
                                           dtypes[name]) for name in self.names}
        except (MemoryError, ValueError) as error:
            self.part.close()
            raise ValueError(
                f"DrawWriter(block_size={self.block_size}) needs a block of "
                f"{self.block_size * per_draw:,} bytes in memory ({per_draw:,} per draw), more "
                "than can be allocated: give a smaller block_size (by default as many draws "
                "as fit in 16 MiB)") from error
        self.rows: list[int] = []  # the run's draw index of each buffered draw
        self.received = 0  # draws of this run the writer was given
        # nothing of the run stays in memory but what the writer holds: the statistics it
        # wrote can leave the kernel's memory too (read back from the part when needed)
        self.releases = (self.recorder is not None and self.thin == 1
                         and set(self.stat_names) == set(self.recorder.names)
                         and getattr(kernel, "save_params", None) == [])
        self.path, self.store = path, writer.path
        self.start_position = self.part.num_draws  # this run's first draw in the part

    def _check_continues(self, kernel: Any, path: Path) -> None:
        """``resume=True``: the kernel must continue from the checkpoint of the run that wrote
        the part (its SG step count and the fingerprint of its position)."""
        attrs = self.part.attrs()
        if "state_fingerprint" not in attrs:  # written before fingerprints, or by hand
            return
        stored = (int(np.atleast_1d(attrs["num_sg_steps"])[0]), str(attrs["state_fingerprint"]))
        resumed = getattr(kernel, "resumed_from", None)
        problem = None
        if resumed is None:
            problem = ("the kernel starts afresh: load the checkpoint saved at the end of that "
                       "run (kernel.load_state_dict) before MCMC.run")
        elif resumed[0] != stored[0]:
            problem = (f"the kernel continues a checkpoint taken after {resumed[0]} SG steps, "
                       f"the part ends after {stored[0]}: load the checkpoint of the run that "
                       "wrote it")
        elif resumed[1] != stored[1]:
            problem = ("the kernel's checkpoint holds another position than the one the part "
                       "ends with: load the checkpoint of the run that wrote it")
        if problem is not None:
            self.part.close()
            raise ValueError(f"resume=True: {path.name} does not continue with this kernel: "
                             f"{problem}")

    def add(self, kernel: Any, params: dict[str, torch.Tensor], i: int) -> None:
        self.received = i + 1
        if (self.first_draw + i) % self.thin == 0:
            slot = len(self.rows)
            for name in self.names:
                value = params[name].detach()
                if name in self.transforms:
                    value = self.transforms[name].inv(value)
                value = value.cpu()
                if value.dtype == torch.bfloat16:
                    value = value.float()
                self.buffers[name][:, slot] = value.numpy().reshape(self.buffers[name][:, slot]
                                                                    .shape)
            self.rows.append(i)
        if len(self.rows) == self.block_size + 1:
            self.flush()

    def flush(self) -> None:
        """Write the buffered draws whose statistics are complete; keep the others."""
        done = len(self.rows)
        if self.recorder is not None and self.stat_names and self.recorder.pending:
            waiting = self.recorder.num_draws - 1  # the draws before it are complete
            done = sum(1 for r in self.rows if r < waiting)
        if done == 0:
            return
        rows = self.rows[:done]
        draws = {name: buf[:, :done] for name, buf in self.buffers.items()}
        stats = {name: self._stat(name, rows) for name in self.stat_names}
        self.part.append(draws, stats, np.asarray(rows) + self.first_draw)
        self.part.flush()
        if self.releases:
            self.recorder.release(rows[-1] + 1, _StatisticsReader(self), str(self.store))
        left = len(self.rows) - done
        for buf in self.buffers.values():
            buf[:, :left] = buf[:, done:done + left]
        self.rows = self.rows[done:]

    def _stat(self, name: str, rows: list[int]) -> np.ndarray:
        dtype = self.recorder.dtypes.get(name, torch.get_default_dtype())
        values = torch.tensor([self.recorder.value(name, r) for r in rows], dtype=dtype).numpy()
        values = values.T if self.vectorized else values[None]
        return values.astype(np.int8) if values.dtype == np.bool_ else values

    def finish(self, kernel: Any) -> None:
        """After the run's last draw: complete its statistics, write everything, close."""
        if self.recorder is not None:
            kernel.complete_last_draw()  # as MCMC's diagnostics() will, random stream intact
        self.flush()
        self.part.close(self.end_attrs(kernel, self.num_samples), complete=True)

    def end_attrs(self, kernel: Any, received: int) -> dict[str, Any]:
        """What a resumed run checks: where the draws end, the SG steps and the position."""
        steps = getattr(kernel, "num_steps", None)
        attrs: dict[str, Any] = {"next_draw": self.first_draw + received}
        if isinstance(steps, int):
            attrs["num_sg_steps"] = [steps] * self.num_rows
        if hasattr(kernel, "position_fingerprint"):
            attrs["state_fingerprint"] = kernel.position_fingerprint()
        return attrs


def _chosen(argument: str, asked: Sequence[str] | None, available: Sequence[str],
            what: str) -> list[str]:
    if asked is None:
        return list(available)
    unknown = [name for name in asked if name not in available]
    if unknown:
        raise ValueError(f"DrawWriter({argument}=...) names {unknown}, which the run does not "
                         f"draw; the {what}: {sorted(available)}")
    return list(dict.fromkeys(asked))


def _numpy_dtype(dtype: torch.dtype) -> np.dtype:
    if dtype == torch.bfloat16:
        return np.dtype(np.float32)
    return torch.empty((), dtype=dtype).numpy().dtype


def _provenance(kernel: Any) -> dict[str, Any]:
    """The attributes :func:`pyro_flat.to_arviz` gives its groups."""
    import pyro

    return {"inference_library": "pyro", "inference_library_version": pyro.__version__,
            "pyro_flat_kernel": type(kernel).__name__}


class _StatisticsReader:
    """The statistics a chain writer released from the kernel's memory, read back from its
    part: ``reader(n, names)`` gives those of the run's first ``n`` draws, shaped as the
    kernel's recorder holds them (``(n,)``, or ``(n, K)`` for vectorised chains)."""

    def __init__(self, chain: _ChainWriter):
        self.part, self.path = chain.part, chain.path
        self.start, self.vectorized = chain.start_position, chain.vectorized

    def __call__(self, n: int, names: Sequence[str]) -> dict[str, np.ndarray]:
        stop = self.start + n
        if self.part.file is not None:  # still being written
            return self._read(self.part.file, stop, names)
        with open_for_reading(self.path) as file:
            return self._read(file, stop, names)

    def _read(self, file: Any, stop: int, names: Sequence[str]) -> dict[str, np.ndarray]:
        group = file["sample_stats"]
        out = {}
        for name in names:
            values = group[name][:, self.start:stop]
            out[name] = values.T if self.vectorized else values[0]
        return out
