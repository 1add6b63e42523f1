r"""Chains across the ranks of a ``torch.distributed`` job, gathered into one run on rank 0.

Each rank runs :class:`pyro.infer.MCMC` with its kernel: one chain, or a block of
``vectorized_chains=C`` chains. Rank :math:`r` is seeded ``seed + r * C``, so its chains are
the chains a single process runs after ``pyro.set_rng_seed(seed + r * C)`` (with ``C = 1``:
the chain of ``seed + r``, as Pyro's ``MCMC(num_chains=W)`` seeds chain ``r`` of its worker
processes; vectorised chain ``k`` of rank ``r`` draws its initial values and minibatches from
the stream seeded ``seed + r * C + k``). Rank 0 then gathers the draws and the per-draw
statistics of every rank: :func:`pyro_flat.to_arviz`, :func:`pyro_flat.get_samples` and
:func:`pyro_flat.sample_stats` read the result as a run of ``W * C`` chains, rank ``r``'s chains
at ``r * C, ..., r * C + C - 1``.

A data-parallel kernel (:func:`~pyro_flat.distributed.data_parallel`) is one chain of all
ranks instead: every rank is seeded ``seed`` and holds the same draws; the result is that one
chain, on every rank.

With ``draws_path=...`` each rank streams its chains' draws to disk instead (a
:class:`~pyro_flat.DrawWriter` per rank, with the chain offset ``r * C`` computed here): rank
``r`` writes ``part-<r * C>.nc`` into the shared directory, rank 0 gathers no draws (only the
sites in ``save_params``), and :func:`pyro_flat.open_draws` opens the parts as the run of
``W * C`` chains that the gather would have given.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import pyro
import torch
import torch.distributed as dist
from pyro.infer import MCMC

from pyro_flat import validation
from pyro_flat.distributed import checkpoints
from pyro_flat.distributed.faults import collective, exchange_status, reported
from pyro_flat.distributed.group import check_group, is_distributed, rank, world_size
from pyro_flat.draws.files import part_name
from pyro_flat.draws.streaming import DrawWriter


class _ShardArguments(tuple):
    """The model arguments of a data-parallel run: each rank holds only its rows, so replaying
    the model for ``to_arviz``'s log-likelihood needs all the data, given explicitly."""

    def __iter__(self):
        raise ValueError(
            "a data-parallel run holds only this rank's rows of the data: export the "
            "log-likelihood with all the data, to_arviz(mcmc, model=model, model_args=(x, y)), "
            "or leave it out: to_arviz(mcmc, log_likelihood=False, posterior_predictive=False, "
            "observed_data=False)")


class DistributedMCMC:
    """:class:`pyro.infer.MCMC` on every rank of a ``torchrun`` job, one result on rank 0.

    Every rank builds the same kernel and calls :meth:`run` with the model's arguments (all of
    them for chains across ranks; its :func:`~pyro_flat.distributed.shard_rows` for a
    data-parallel kernel). Ranks exchange a status vector every ``check_every`` draws (every
    SG step when data-parallel) and at the end of a run, so a rank that fails, or whose chain
    diverges, stops every rank with :class:`~pyro_flat.distributed.RankFailure`, which names
    the rank and carries its error (the site and the SG step of a divergence). Without
    ``torchrun`` the job has one rank and the result is that rank's chains.

    Parameters
    ----------
    kernel : MCMCKernel
        This rank's kernel (a block of ``C`` chains with ``vectorized_chains=C``).
    num_samples : int
        Draws per chain after warmup.
    warmup_steps : int, optional
        Warmup draws (Pyro's default: ``num_samples``).
    seed : int
        The job's seed; rank ``r`` is seeded ``seed + r * C`` (``seed`` when data-parallel).
    group : torch.distributed.ProcessGroup, optional
        The ranks of the job (default: all).
    check_every : int
        Draws between status exchanges of chains across ranks, ``>= 1``. Each is one small
        ``all_reduce`` (and keeps the ranks in step at those draws); a failure stops the
        other ranks at the next one.
    hook_fn : callable, optional
        Pyro's ``hook_fn(kernel, params, stage, i)``, called after every draw on every rank.
    draws_path : str or os.PathLike, optional
        A directory that every rank can write (a shared file system across nodes): stream
        the draws there, each rank its own part, instead of gathering them on rank 0. Rank
        ``r`` writes its ``C`` chains as the global chains ``r * C, ..., r * C + C - 1``
        (``part-<r * C>.nc``; a data-parallel chain: rank 0 alone, ``part-00000.nc``);
        :func:`pyro_flat.open_draws` opens the parts as one run of ``W * C`` chains, the
        ``posterior`` and ``sample_stats`` the gather gives (:func:`pyro_flat.to_arviz`). The
        first run creates the parts (the directory may exist, this rank's part must not); each
        later run, and a run after :meth:`load_checkpoint`, appends to them, continuing the
        draw index. After a restart, draws that a run which did not finish wrote past the
        checkpoint are replaced; a part holding finished draws past the checkpoint is an
        error (load the checkpoint of the last run that finished).
    draw_options : mapping, optional
        More arguments of :class:`~pyro_flat.DrawWriter` for ``draws_path``: ``sites``,
        ``stats``, ``thin``, ``block_size``. ``num_samples``, ``resume`` and ``chain_offset``
        are set here, from the run.
    save_params : sequence of str, optional
        The sites each rank keeps in memory and rank 0 gathers (Pyro's ``save_params``).
        Default: every site, or none (``[]``) with ``draws_path``, so that no draw is held in
        memory beyond the writer's block.
    disable_progbar : bool, optional
        Default: a progress bar on rank 0 only.

    Attributes
    ----------
    local_mcmc : pyro.infer.MCMC
        This rank's own run (its draws: ``local_mcmc.get_samples()``).
    chain_offset : int
        The global index of this rank's first chain, ``rank * chains_per_rank`` (0 when
        data-parallel).

    Examples
    --------
    >>> import torch, pyro, pyro.distributions as dist
    >>> import pyro_flat
    >>> from pyro_flat.distributed import DistributedMCMC
    >>> from pyro_flat.infer import SGLD
    >>> def model(x, y):
    ...     w = pyro.sample("w", dist.Normal(0.0, 1.0))
    ...     with pyro.plate("data", len(x)):
    ...         pyro.sample("y", dist.Normal(w * x, 1.0), obs=y)
    >>> x = torch.randn(100); y = 2 * x + torch.randn(100)
    >>> kernel = SGLD(model, step_size=1e-3, subsample_size=20, vectorized_chains=2)
    >>> mcmc = DistributedMCMC(kernel, num_samples=50, warmup_steps=10, seed=0)
    >>> mcmc.run(x, y)  # under torchrun --nproc_per_node=W: 2 * W chains on rank 0
    >>> pyro_flat.get_samples(mcmc, group_by_chain=True)["w"].shape
    torch.Size([2, 50])
    >>> pyro_flat.to_arviz(mcmc).posterior.sizes["chain"]
    2

    Streaming the draws to disk, each rank its own part, none of them kept in memory:

    >>> import tempfile
    >>> store = tempfile.mkdtemp() + "/draws"  # a shared directory under torchrun
    >>> kernel = SGLD(model, step_size=1e-3, subsample_size=20, vectorized_chains=2)
    >>> mcmc = DistributedMCMC(kernel, num_samples=50, warmup_steps=10, seed=0,
    ...                        draws_path=store)
    >>> mcmc.run(x, y)
    >>> mcmc.get_samples()  # save_params=[]: the draws are on disk only
    {}
    >>> dict(pyro_flat.open_draws(store).posterior.sizes)  # on any rank, after run
    {'chain': 2, 'draw': 50}
    """

    def __init__(
        self,
        kernel: Any,
        num_samples: int,
        warmup_steps: int | None = None,
        *,
        seed: int = 0,
        group: dist.ProcessGroup | None = None,
        check_every: int = 1,
        hook_fn: Callable | None = None,
        draws_path: str | os.PathLike | None = None,
        draw_options: Mapping[str, Any] | None = None,
        save_params: Sequence[str] | None = None,
        disable_progbar: bool | None = None,
    ):
        self.kernel = validation.mcmc_kernel("kernel", kernel)
        self.num_samples = validation.integer_at_least("num_samples", num_samples, 1)
        self.warmup_steps = None if warmup_steps is None else validation.integer_at_least(
            "warmup_steps", warmup_steps, 0)
        self.seed = validation.integer_at_least("seed", seed, 0)
        self.group = check_group(group)
        self.check_every = validation.integer_at_least("check_every", check_every, 1)
        self.hook_fn = validation.optional_callable("hook_fn", hook_fn,
                                                    "hook_fn(kernel, params, stage, i)")
        self.rank, self.world_size = rank(group), world_size(group)
        self.disable_progbar = self.rank != 0 if disable_progbar is None else validation.flag(
            "disable_progbar", disable_progbar)
        self.data_parallel = getattr(kernel, "data_shard", None) is not None
        self.chains_per_rank = 1 if self.data_parallel else (
            getattr(kernel, "vectorized_chains", None) or 1)
        self.draws_path = None if draws_path is None else validation.directory_path(
            "draws_path", draws_path)
        self.draw_options = _draw_options(draw_options, self.draws_path)
        if save_params is None and self.draws_path is not None:
            save_params = []
        self.save_params = None if save_params is None else validation.names(
            "save_params", save_params)
        self.local_mcmc: MCMC | None = None
        self._writer: DrawWriter | None = None
        self._samples: dict[str, torch.Tensor] | None = None
        self._diagnostics: list[Any] | None = None
        self._args: tuple = ()
        self._kwargs: dict[str, Any] = {}
        self._draws = 0
        self._continues: dict[str, Any] | None = None  # the kernel state the next run resumes
        # post-warmup draws of the chains so far (None: continued from a checkpoint that
        # does not say)
        self._draws_done: int | None = 0

    @property
    def rank_seed(self) -> int:
        """This rank's seed: ``seed + rank * chains_per_rank`` (``seed`` when data-parallel)."""
        return self.seed if self.data_parallel else self.seed + self.rank * self.chains_per_rank

    @property
    def chain_offset(self) -> int:
        """The global index of this rank's first chain: ``rank * chains_per_rank`` (0 when
        data-parallel)."""
        return 0 if self.data_parallel else self.rank * self.chains_per_rank

    @property
    def num_chains(self) -> int:
        """Chains in the gathered result: ``world_size * chains_per_rank`` (one chain when
        data-parallel)."""
        return 1 if self.data_parallel else self.world_size * self.chains_per_rank

    def run(self, *args: Any, **kwargs: Any) -> None:
        """Run this rank's chains (collective: every rank calls it), then gather on rank 0.

        The first run starts the chains (``warmup_steps`` of warmup, then ``num_samples``
        draws); each later run, and a run after :meth:`load_checkpoint`, continues them with
        ``num_samples`` more draws and no warmup: a long run in segments, each with its draws
        and a checkpoint. With ``draws_path``, the first run creates each rank's part and the
        later ones append to it.
        """
        pyro.set_rng_seed(self.rank_seed)
        self._draws = 0
        if self._continues is None and self.local_mcmc is not None:
            self._continues = self.kernel.state_dict()
        if self._continues is not None:
            self.kernel.load_state_dict(self._continues)
        continuing = self._continues is not None
        if not continuing:
            self._draws_done = 0
        warmup = self.warmup_steps if not continuing else 0
        self._continues = None
        mcmc = MCMC(self.kernel, num_samples=self.num_samples, warmup_steps=warmup,
                    hook_fn=self._hook, disable_progbar=self.disable_progbar,
                    save_params=self.save_params)
        self.local_mcmc = mcmc
        with reported(self.group, self._where):
            self._writer = self._draw_writer(resume=continuing)
            try:
                mcmc.run(*args, **kwargs)
            finally:
                if self._writer is not None:
                    self._writer.close()  # a part left open by a failed run (its draws stay)
                    self._writer = None
            samples = {k: v.cpu() for k, v in mcmc.get_samples(group_by_chain=True).items()}
            diagnostics = [_to_cpu(d) for d in mcmc._diagnostics]
        exchange_status(group=self.group)  # every rank finished its chains (and its part)
        if self._draws_done is not None:
            self._draws_done += self.num_samples
        if self.data_parallel or self.world_size == 1:
            self._samples, self._diagnostics = samples, diagnostics
        else:
            parts = _gather_to_first((samples, diagnostics), self.group)
            if parts is None:
                self._samples = self._diagnostics = None
            else:
                self._samples = {k: torch.cat([p[0][k] for p in parts]) for k in samples}
                self._diagnostics = [d for p in parts for d in p[1]]
        self._args = _ShardArguments(args) if self.data_parallel else args
        self._kwargs = kwargs

    def _draw_writer(self, *, resume: bool) -> DrawWriter | None:
        """This rank's writer of ``draws_path`` for the next run (``None``: nothing to write,
        e.g. a data-parallel chain on a rank other than 0)."""
        # A data-parallel chain is the same on every rank: rank 0 writes it. Its writer
        # completes the last draw's statistics (kernel.diagnostics(), a collective there) at
        # the last draw, where the other ranks' MCMC does the same right after it.
        if self.draws_path is None or (self.data_parallel and self.rank != 0):
            return None
        part = self.draws_path / part_name(self.chain_offset)
        chains = list(range(self.chain_offset, self.chain_offset + self.chains_per_rank))
        if resume and not part.exists():
            raise ValueError(
                f"draws_path={str(self.draws_path)!r} holds no part of rank {self.rank}'s "
                f"chains {chains} ({part.name}) to append to: a run that continues the chains "
                "(a second run, or one after load_checkpoint) appends to the draws_path of "
                "the run it continues")
        if resume and self._draws_done is not None:
            written = _next_draw(part)
            if written != self._draws_done:
                raise ValueError(
                    f"draws_path={str(self.draws_path)!r}: {part.name} holds the draws of "
                    f"rank {self.rank}'s chains up to draw {written}, but the chains continue "
                    f"after draw {self._draws_done}: load the checkpoint saved after the last "
                    "run that finished writing to draws_path")
        if not resume and part.exists():
            raise ValueError(
                f"draws_path={str(self.draws_path)!r} already holds rank {self.rank}'s chains "
                f"{chains} ({part.name}): choose a new directory for a new run, or "
                "load_checkpoint(...) to continue that run and append to its draws")
        return DrawWriter(self.draws_path, self.num_samples, resume=resume,
                          chain_offset=self.chain_offset, **self.draw_options)

    def _hook(self, kernel: Any, params: Any, stage: str, i: int) -> None:
        if self._writer is not None:
            self._writer(kernel, params, stage, i)
        if self.hook_fn is not None:
            self.hook_fn(kernel, params, stage, i)
        self._draws += 1
        if not self.data_parallel and self._draws % self.check_every == 0:
            exchange_status(group=self.group)

    def _where(self) -> str:
        steps = getattr(self.kernel, "num_steps", None)
        return "" if steps is None else f" (this rank's kernel had taken {steps} SG steps)"

    def get_samples(self, num_samples: int | None = None, group_by_chain: bool = False
                    ) -> dict[str, torch.Tensor]:
        """The draws of every rank's chains (on rank 0; every rank when data-parallel), as
        :meth:`pyro.infer.MCMC.get_samples`, rank ``r``'s chain at index ``r``."""
        if self._samples is None:
            if self.local_mcmc is None:
                raise ValueError("call run(...) before get_samples")
            raise RuntimeError(f"the draws of all ranks are gathered on rank 0; this is rank "
                               f"{self.rank}: local_mcmc.get_samples() has this rank's draws")
        samples = self._samples
        if num_samples is not None:
            samples = {k: v[:, :num_samples] for k, v in samples.items()}
        if not group_by_chain:
            samples = {k: v.reshape(-1, *v.shape[2:]) for k, v in samples.items()}
        return samples

    def save_checkpoint(self, directory: str | os.PathLike) -> None:
        """Save every rank's chains (collective): rank ``r`` writes
        ``<directory>/ckpt.rank<r>.pt`` (see :mod:`~pyro_flat.distributed.checkpoints`)."""
        with reported(self.group):
            checkpoints.save_rank_checkpoint(
                directory, self.kernel.state_dict(), rank=self.rank, world_size=self.world_size,
                chains_per_rank=self.chains_per_rank, data_parallel=self.data_parallel,
                seed=self.seed, draws_done=self._draws_done)
        exchange_status(group=self.group)

    def load_checkpoint(self, directory: str | os.PathLike) -> None:
        """Continue every rank's chains from ``directory`` at the next :meth:`run`
        (collective); a job of another world size raises ``ValueError``."""
        with reported(self.group):
            state = checkpoints.load_rank_checkpoint(directory, rank=self.rank,
                                                     world_size=self.world_size)
            if state["data_parallel"] != self.data_parallel:
                kind = "a data-parallel chain" if state["data_parallel"] else "chains"
                raise ValueError(f"the checkpoint in {directory} holds {kind}; this job's "
                                 f"kernel is {'' if self.data_parallel else 'not '}data-parallel")
            self._continues = state["kernel"]
            self._draws_done = state.get("draws_done")
        steps = state["kernel"]["num_sg_steps"]
        if is_distributed() and self.world_size > 1:
            all_steps: list[Any] = [None] * self.world_size
            collective(lambda: dist.all_gather_object(all_steps, steps, group=self.group),
                       self.group, "the check of the checkpoints' SG steps")
            if len(set(all_steps)) > 1:
                raise ValueError(f"the per-rank checkpoints in {directory} were saved at "
                                 f"different points (SG steps by rank: {all_steps}); resume from "
                                 "a checkpoint that every rank completed")


def _next_draw(part: Path) -> int:
    """The draw index after the last draw of a finished run in a part file."""
    from pyro_flat.draws.files import part_attrs

    return int(part_attrs(part).get("next_draw", 0))


#: The arguments of DrawWriter a user may set through ``draw_options``.
DRAW_OPTIONS = ("sites", "stats", "thin", "block_size")


def _draw_options(options: Mapping[str, Any] | None, path: Path | None) -> dict[str, Any]:
    if options is None:
        return {}
    if not isinstance(options, Mapping):
        raise ValueError(f"draw_options must be a mapping of DrawWriter arguments "
                         f"{list(DRAW_OPTIONS)}, got {options!r}")
    if path is None:
        raise ValueError("draw_options is given but draws_path is not: pass draws_path=... to "
                         "stream the draws")
    unknown = [k for k in options if k not in DRAW_OPTIONS]
    if unknown:
        raise ValueError(f"draw_options may set {list(DRAW_OPTIONS)}, got {unknown}: "
                         "num_samples, resume and chain_offset follow from the run, and "
                         "hook_fn is DistributedMCMC's own")
    return dict(options)


def _gather_to_first(obj: Any, group: dist.ProcessGroup | None) -> list[Any] | None:
    """``obj`` of every rank, in rank order, on the group's first rank (``None`` elsewhere)."""
    dst = 0 if group is None else dist.get_global_rank(group, 0)
    parts = [None] * world_size(group) if rank(group) == 0 else None
    collective(lambda: dist.gather_object(obj, parts, dst=dst, group=group), group,
               "the gathering of the draws on rank 0")
    return parts


def _to_cpu(value: Any) -> Any:
    if torch.is_tensor(value):
        return value.cpu()
    if isinstance(value, dict):
        return {k: _to_cpu(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return type(value)(_to_cpu(v) for v in value)
    return value
