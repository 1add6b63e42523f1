"""Draws on disk: the file layout that :class:`pyro_flat.DrawWriter` writes and
:func:`open_draws` reads.

A *draw store* is a directory of netCDF-4 files (HDF5, written through ``h5netcdf``), one per
*part*: the chains one process writes, e.g. one chain of ``pyro.infer.MCMC``, or the ``K``
chains of a kernel with ``vectorized_chains=K``. A part is named ``part-<first chain>.nc``
(five digits) and holds two groups, as ArviZ lays out an ``InferenceData`` file:

* ``posterior``: one variable per sample site, dims ``(chain, draw, <site>_dim_0, ...)``;
* ``sample_stats``: one variable per statistic, dims ``(chain, draw)`` (``diverging`` is
  ``int8`` with the attribute ``dtype = "bool"``, which xarray reads back as booleans).

``chain`` is a fixed dimension whose coordinate holds the *global* chain indices of the part's
chains (so parts written by different processes or ranks, each with its own ``chain_offset``,
open together as one data set); ``draw`` is unlimited, its coordinate the draw index, and grows
as draws are appended. The root attributes say how many draws the part holds (``num_draws``),
whether its run finished (``complete``) and the provenance of :func:`pyro_flat.to_arviz`.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from pyro_flat import validation

__all__ = ["Part", "open_draws", "part_name"]

#: Version of the layout above, in each part's root attribute ``pyro_flat_draws_format``.
FORMAT_VERSION = 1
#: The groups of a part, as ArviZ names them.
GROUPS = ("posterior", "sample_stats")
#: Largest HDF5 chunk a variable is split into along ``draw`` (bytes).
CHUNK_BYTES = 2**20
#: Most draws in a chunk: the HDF5 library keeps an index entry per chunk in memory, about
#: half a kilobyte each, which chunks of 1,024 draws made grow by 4 bytes per draw and chain.
CHUNK_DRAWS = 16_384


def part_name(first_chain: int) -> str:
    """The file name of the part whose first global chain is ``first_chain``."""
    return f"part-{first_chain:05d}.nc"


def _site_dims(name: str, shape: tuple[int, ...]) -> tuple[str, ...]:
    """ArviZ's default dimension names of a site: ``<name>_dim_0, ...``."""
    return tuple(f"{name}_dim_{i}" for i in range(len(shape)))


class Part:
    """One part file of a draw store, open for appending draws.

    Parameters
    ----------
    file : h5netcdf.File
        The open file.
    """

    def __init__(self, file: Any):
        self.file = file
        self.num_draws = int(file.attrs["num_draws"])
        self.chains = np.asarray(file["posterior"]["chain"][:])

    @classmethod
    def create(
        cls,
        path: Path,
        chains: np.ndarray,
        sites: Mapping[str, tuple[tuple[int, ...], np.dtype]],
        stats: Mapping[str, np.dtype],
        attrs: Mapping[str, Any],
    ) -> Part:
        """A new, empty part at ``path`` (which must not exist) for the global ``chains``,
        with a variable per site ``{name: (shape, dtype)}`` and per statistic."""
        import h5netcdf

        file = h5netcdf.File(path, "w-")
        try:
            file.attrs.update({**attrs, "pyro_flat_draws_format": FORMAT_VERSION,
                               "num_draws": 0, "complete": 0})
            for group_name, variables in (("posterior", dict(sites)),
                                          ("sample_stats", {k: ((), v) for k, v in stats.items()})):
                group = file.create_group(group_name)
                group.attrs.update(attrs)
                dims: dict[str, int | None] = {"chain": len(chains), "draw": None}
                for name, (shape, _) in variables.items():
                    dims.update(zip(_site_dims(name, shape), shape, strict=True))
                group.dimensions = dims
                group.create_variable("chain", ("chain",), "int64")[:] = chains
                for name, (shape, _) in variables.items():  # ArviZ's default coordinates
                    for dim, size in zip(_site_dims(name, shape), shape, strict=True):
                        group.create_variable(dim, (dim,), "int64")[:] = np.arange(size)
                group.create_variable("draw", ("draw",), "int64", chunks=(CHUNK_DRAWS,))
                for name, (shape, dtype) in variables.items():
                    dtype = np.dtype(dtype)
                    stored = np.int8 if dtype == np.bool_ else dtype
                    per_draw = max(1, int(np.prod(shape, dtype=np.int64)) * dtype.itemsize)
                    chunk = (1, max(1, min(CHUNK_DRAWS, CHUNK_BYTES // per_draw)), *shape)
                    var = group.create_variable(name, ("chain", "draw", *_site_dims(name, shape)),
                                                stored, chunks=chunk)
                    if dtype == np.bool_:
                        var.attrs["dtype"] = "bool"  # xarray's encoding of booleans
            part = cls(file)
            part.flush()  # a process killed before the first block leaves a part that opens
        except BaseException:
            file.close()
            path.unlink(missing_ok=True)
            raise
        return part

    @classmethod
    def open(
        cls,
        path: Path,
        sites: Mapping[str, tuple[tuple[int, ...], np.dtype]],
        stats: Mapping[str, np.dtype],
    ) -> Part:
        """The existing part at ``path``, to append to; its variables must be ``sites`` and
        ``stats``."""
        import h5netcdf

        file = h5netcdf.File(path, "a")
        try:
            for group_name, expected in (("posterior", {k: tuple(s) for k, (s, _) in
                                                         sites.items()}),
                                         ("sample_stats", {k: () for k in stats})):
                group = file[group_name]
                found = {k: tuple(v.shape[2:]) for k, v in group.variables.items()
                         if v.dimensions[:2] == ("chain", "draw")}
                if found != expected:
                    raise ValueError(
                        f"resume: {path} holds {group_name} variables {found}, the run draws "
                        f"{expected}; resume a run of the same model, sites and statistics")
        except BaseException:
            file.close()
            raise
        part = cls(file)
        part.file.attrs["complete"] = 0
        return part

    def append(
        self,
        draws: Mapping[str, np.ndarray],
        stats: Mapping[str, np.ndarray],
        draw_index: np.ndarray,
    ) -> None:
        """Append ``n`` draws: ``draws[site]`` of shape ``(chains, n, *site_shape)``,
        ``stats[name]`` of shape ``(chains, n)``, their draw indices ``(n,)``."""
        n = len(draw_index)
        if n == 0:
            return
        start, stop = self.num_draws, self.num_draws + n
        for group_name, values in (("posterior", draws), ("sample_stats", stats)):
            group = self.file[group_name]
            group.resize_dimension("draw", stop)
            group["draw"][start:stop] = draw_index
            for name, value in values.items():
                group[name][:, start:stop] = value
        self.num_draws = stop
        self.file.attrs["num_draws"] = stop

    def flush(self) -> None:
        """Write everything appended so far through to the operating system, HDF5's metadata
        included (h5netcdf's own ``flush`` writes netCDF attributes only): a process killed
        after it returns leaves a file that opens with these draws."""
        self.file.flush()
        self.file._h5file.flush()

    def truncate(self, num_draws: int) -> None:
        """Keep only the first ``num_draws`` draws (drop those a resumed run writes again)."""
        if num_draws >= self.num_draws:
            return
        for group_name in GROUPS:
            self.file[group_name].resize_dimension("draw", num_draws)
        self.num_draws = num_draws
        self.file.attrs["num_draws"] = num_draws

    def close(self, attrs: Mapping[str, Any] | None = None, *, complete: bool = False) -> None:
        """Write ``attrs`` (and whether the run finished) to the root and close the file."""
        if self.file is None:
            return
        self.file.attrs.update(dict(attrs or {}))
        self.file.attrs["complete"] = int(complete)
        self.file.close()
        self.file = None


def open_draws(path: str | Path) -> Any:
    """Open a draw store (see :class:`pyro_flat.DrawWriter`) as ArviZ data, without loading it.

    The parts of the store are joined along ``chain`` in the order of their global chain
    indices. ``posterior`` holds every written site in the constrained space, ``sample_stats``
    the kernels' per-draw statistics (``lp``, ``step_size``, ``grad_norm``, ``diverging`` and
    the kernel's own, e.g. ContourSGLD's ``log_weight``), as :func:`pyro_flat.to_arviz` gives
    them; the groups carry the same attributes (``inference_library``, ``pyro_flat_kernel``,
    ``num_sg_steps`` per chain). The variables are read from disk when used: a store of one
    part (one process wrote it, e.g. ``vectorized_chains=K``) opens lazily; several parts open
    lazily when ``dask`` is installed, else they are read into memory to be joined.

    Parameters
    ----------
    path : str or pathlib.Path
        The directory a :class:`pyro_flat.DrawWriter` wrote.

    Returns
    -------
    arviz.InferenceData or xarray.DataTree
        ``InferenceData`` on ArviZ 0.x, ``DataTree`` on ArviZ 1.x, with groups ``posterior``
        and ``sample_stats``.

    Raises
    ------
    ValueError
        If ``path`` holds no part file or none that can be read, parts whose chains overlap,
        or parts that do not belong together (other sites, shapes or dtypes: the part and the
        difference are named).

    Warns
    -----
    RuntimeWarning
        If a part's run did not finish (its draws so far are returned), a part cannot be read
        (it is named, and the store opens without its chains), or the parts hold different
        numbers of draws (all are cut to the shortest).

    Examples
    --------
    >>> import tempfile, torch, pyro, pyro.distributions as dist
    >>> from pyro.infer import MCMC
    >>> from pyro_flat import DrawWriter, open_draws
    >>> from pyro_flat.infer import SGLD
    >>> def model(y):
    ...     mu = pyro.sample("mu", dist.Normal(0.0, 1.0))
    ...     with pyro.plate("data", len(y)):
    ...         pyro.sample("y", dist.Normal(mu, 1.0), obs=y)
    >>> store = tempfile.mkdtemp() + "/draws"
    >>> writer = DrawWriter(store, num_samples=40)
    >>> mcmc = MCMC(SGLD(model, step_size=1e-2), num_samples=40, hook_fn=writer,
    ...             save_params=[], disable_progbar=True)
    >>> mcmc.run(torch.randn(20))
    >>> idata = open_draws(store)
    >>> idata.posterior["mu"].dims, sorted(idata.sample_stats.data_vars)
    (('chain', 'draw'), ['diverging', 'grad_norm', 'lp', 'step_size'])
    """
    import xarray as xr

    root = validation.directory_path("path", path)
    files = sorted(root.glob("part-*.nc"))
    if not files:
        raise ValueError(f"path {str(root)!r} holds no draws (no part-*.nc files): write them "
                         "with pyro_flat.DrawWriter")
    try:
        import dask  # noqa: F401

        chunks: dict | None = {}
    except ImportError:
        chunks = None
    groups: dict[str, list] = {group: [] for group in GROUPS}
    root_attrs: list[dict] = []
    readable, broken = [], []
    for file in files:
        try:
            opened = {group: xr.open_dataset(file, group=group, engine="h5netcdf",
                                             chunks=chunks) for group in GROUPS}
            attrs = _root_attrs(file)
        except Exception as error:
            broken.append(f"{str(file)!r} ({type(error).__name__}: {error})")
            continue
        readable.append(file)
        root_attrs.append(attrs)
        for group in GROUPS:
            groups[group].append(opened[group])
    if broken and not readable:
        raise ValueError(f"cannot read any part of the draw store {str(root)!r} (truncated, "
                         "corrupt, or not written by pyro_flat.DrawWriter): " + "; ".join(broken))
    if broken:
        warnings.warn(f"cannot read the parts {'; '.join(broken)} (truncated or corrupt, e.g. a "
                      "process killed before DrawWriter flushed them): opened without their "
                      "chains", RuntimeWarning, stacklevel=2)
    files = readable
    _check_parts_agree(files, groups)
    _warn_incomplete(files, root_attrs)
    order = np.argsort([int(ds["chain"][0]) for ds in groups["posterior"]])
    chains = np.concatenate([groups["posterior"][i]["chain"].values for i in order])
    if len(set(chains.tolist())) != len(chains):
        raise ValueError(f"the parts of {str(root)!r} hold overlapping chains {chains.tolist()}")
    num_draws = min(ds.sizes["draw"] for ds in groups["posterior"])
    if any(ds.sizes["draw"] != num_draws for ds in groups["posterior"]):
        warnings.warn(f"the parts of {str(root)!r} hold different numbers of draws; all chains "
                      f"are cut to the shortest, {num_draws}", RuntimeWarning, stacklevel=2)
    attrs = {k: v for k, v in root_attrs[0].items()
             if k in ("inference_library", "inference_library_version", "pyro_flat_kernel")}
    steps = [root_attrs[i].get("num_sg_steps") for i in order]
    if all(s is not None for s in steps):
        attrs["num_sg_steps"] = [int(s) for part in steps for s in np.atleast_1d(part)]
    data = {}
    for group, parts in groups.items():
        parts = [parts[i].isel(draw=slice(0, num_draws)) for i in order]
        ds = parts[0] if len(parts) == 1 else xr.concat(parts, dim="chain")
        if group == "sample_stats" and not ds.data_vars:
            continue
        ds.attrs = dict(attrs)
        data[group] = ds
    return _as_arviz(data, attrs)


def _layout(ds: Any) -> dict[str, tuple]:
    """Each variable's per-draw shape and dtype."""
    return {name: (tuple(v.shape[2:]), str(v.dtype)) for name, v in ds.data_vars.items()}


def _check_parts_agree(files: list[Path], groups: dict[str, list]) -> None:
    """Parts join only if they hold the same variables with the same shapes and dtypes."""
    for group, parts in groups.items():
        first = _layout(parts[0])
        for file, ds in zip(files[1:], parts[1:], strict=True):
            other = _layout(ds)
            if other == first:
                continue
            missing = sorted(set(first) - set(other))
            extra = sorted(set(other) - set(first))
            changed = {k: (first[k], other[k]) for k in set(first) & set(other)
                       if first[k] != other[k]}
            raise ValueError(
                f"the part {file.name} of {str(file.parent)!r} does not belong with "
                f"{files[0].name}: its {group} "
                + "; ".join(x for x in (
                    f"lacks {missing}" if missing else "",
                    f"has {extra} in addition" if extra else "",
                    "holds " + ", ".join(f"{k} of (shape, dtype) {b} instead of {a}"
                                         for k, (a, b) in sorted(changed.items()))
                    if changed else "") if x)
                + ". Open the runs separately, or write them with the same model and sites")


def _root_attrs(file: Path) -> dict[str, Any]:
    import h5netcdf

    with h5netcdf.File(file, "r") as f:
        return dict(f.attrs)


def _warn_incomplete(files: list[Path], root_attrs: list[dict]) -> None:
    unfinished = [f.name for f, a in zip(files, root_attrs, strict=True) if not a.get("complete")]
    if unfinished:
        warnings.warn(f"the runs of {unfinished} did not finish (interrupted, still running, "
                      "or DrawWriter's num_samples was not the run's): their draws so far are "
                      "returned", RuntimeWarning, stacklevel=3)


def _as_arviz(groups: dict[str, Any], attrs: dict[str, Any]) -> Any:
    """``InferenceData`` on ArviZ 0.x, ``DataTree`` on ArviZ 1.x, of datasets as they are."""
    import arviz as az
    import xarray as xr

    if int(az.__version__.split(".")[0]) >= 1:
        tree = xr.DataTree.from_dict(groups)
        tree.attrs = dict(attrs)
        return tree
    idata = az.InferenceData(**groups)
    idata.attrs = dict(attrs)
    return idata
