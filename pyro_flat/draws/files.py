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
as draws are appended. The root attributes say how many draws the part holds for certain
(``num_draws``: a reader takes the first ``num_draws`` draws), whether its run finished
(``complete``), where it ended (``next_draw``, ``num_sg_steps`` per chain and
``state_fingerprint``; -1, -1s and an empty string until written) and the provenance of
:func:`pyro_flat.to_arviz`.

Format 2 (``pyro_flat_draws_format``) writes the parts in HDF5's single-writer mode so that a
killed writer leaves them readable (see :class:`Part`); read such a part while it is written,
or after its writer was killed, in SWMR mode (``h5py.File(path, "r", swmr=True)``, or
``engine="h5netcdf", driver_kwds={"swmr": True}`` in xarray), as :func:`open_draws` does.
Format 1 parts open as before.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from pyro_flat import validation

__all__ = ["Part", "open_draws", "open_for_reading", "part_attrs", "part_name"]

#: Version of the layout above, in each part's root attribute ``pyro_flat_draws_format``.
FORMAT_VERSION = 2
#: Characters of the root attribute ``state_fingerprint`` (a checkpoint's position hash).
FINGERPRINT_LENGTH = 16
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


#: The root attributes that say where a run ended, written when its part is closed.
RUN_END = ("next_draw", "num_sg_steps", "state_fingerprint")


def _run_attrs(num_chains: int) -> dict[str, Any]:
    """The root attributes a run updates, at their "not yet written" values. They are created
    with the part, so that writing them later changes values in place, never the file's
    structure (a fixed-length fingerprint, an array of one step count per chain)."""
    return {"num_draws": np.int64(0), "complete": np.int64(0), "next_draw": np.int64(-1),
            "num_sg_steps": np.full(num_chains, -1, np.int64),
            "state_fingerprint": np.array(b"", dtype=f"S{FINGERPRINT_LENGTH}")}


def _h5py_file(path: Path, mode: str, **kwargs: Any) -> Any:
    """Open ``path`` with h5py: the one place where the draw store opens HDF5 files."""
    import h5py

    return h5py.File(path, mode, **kwargs)


def _write_layout(
    path: Path,
    chains: np.ndarray,
    sites: Mapping[str, tuple[tuple[int, ...], np.dtype]],
    stats: Mapping[str, np.dtype],
    attrs: Mapping[str, Any],
) -> None:
    """Write an empty part (no draws) at ``path``, in the HDF5 format that single-writer mode
    needs (``libver="latest"``)."""
    import h5netcdf

    with _h5py_file(path, "w", libver="latest") as h5, h5netcdf.File(h5, "w") as file:
        file.attrs.update({**attrs, "pyro_flat_draws_format": FORMAT_VERSION})
        for key, value in _run_attrs(len(chains)).items():  # h5netcdf would make them 1-D
            h5.attrs.create(key, value)
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


def _integer(attrs: Any, key: str, default: int) -> int:
    """An integer attribute (netCDF writes scalars as arrays of one element)."""
    return int(np.ravel(attrs.get(key, default))[0])


def _set_in_place(attrs: Any, key: str, value: Any) -> None:
    """Overwrite the value of the existing attribute ``key``, keeping its dtype and shape."""
    if key == "state_fingerprint":
        value = str(value).encode()
        if len(value) > FINGERPRINT_LENGTH:
            raise ValueError(f"state_fingerprint {value!r} is longer than a part holds "
                             f"({FINGERPRINT_LENGTH} characters)")
    stored = attrs.get_id(key)
    attrs.modify(key, np.asarray(value, dtype=stored.dtype).reshape(stored.shape))


def _variables(group: Any) -> dict[str, Any]:
    """A part group's per-draw variables (its datasets that are not dimension coordinates)."""
    return {name: ds for name, ds in group.items() if not ds.is_scale}


def _layout_of(file: Any) -> tuple[dict[str, tuple[tuple[int, ...], np.dtype]],
                                   dict[str, np.dtype]]:
    """The sites ``{name: (shape, dtype)}`` and statistics ``{name: dtype}`` a part holds."""
    def dtype(ds: Any) -> np.dtype:
        return np.dtype(np.bool_) if ds.attrs.get("dtype") in ("bool", b"bool") else ds.dtype

    sites = {name: (tuple(ds.shape[2:]), dtype(ds))
             for name, ds in _variables(file["posterior"]).items()}
    stats = {name: dtype(ds) for name, ds in _variables(file["sample_stats"]).items()}
    return sites, stats


def _committed(file: Any) -> int:
    """The draws a part holds for certain: its ``num_draws``, and no more than every variable
    holds (a part written before format 2 updated ``num_draws`` before its data)."""
    extents = [len(group["draw"]) for group in (file[g] for g in GROUPS)]
    extents += [ds.shape[1] for g in GROUPS for ds in _variables(file[g]).values()]
    return min([_integer(file.attrs, "num_draws", 0), *extents])


class Part:
    """One part file of a draw store, open for appending draws.

    The part is written in HDF5's single-writer/multiple-reader (SWMR) mode, which writes the
    file's metadata in an order that keeps it valid at every moment (Introduction to SWMR,
    The HDF Group), so a process killed at any point leaves a file that opens. A block is
    committed in two steps: its draws are appended and flushed, then the root attribute
    ``num_draws`` is set to the new count and flushed; readers take the first ``num_draws``
    draws, so a kill during the first step loses that block only. Nothing a run writes after
    the part is created changes the file's structure: attributes are updated in place.

    A part whose writer was killed is still marked as open for writing in its superblock:
    HDF5 then opens it only for SWMR reading (what :func:`open_draws` does), and
    :meth:`open` rewrites its committed draws into a fresh file before appending.

    Parameters
    ----------
    file : h5py.File
        The part, open for writing.
    """

    def __init__(self, file: Any):
        self.file = file
        self.num_draws = _committed(file)
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
        with a variable per site ``{name: (shape, dtype)}`` and per statistic. It is written
        beside ``path`` and renamed to it when complete, so ``path`` is never a partial file."""
        if path.exists():
            raise FileExistsError(f"{str(path)!r} exists")
        _replace_atomically(path, lambda tmp: _write_layout(tmp, chains, sites, stats, attrs))
        return cls._for_writing(path)

    @classmethod
    def open(
        cls,
        path: Path,
        sites: Mapping[str, tuple[tuple[int, ...], np.dtype]],
        stats: Mapping[str, np.dtype],
    ) -> Part:
        """The existing part at ``path``, to append to; its variables must be ``sites`` and
        ``stats``. A part whose writer was killed, or written before format 2, is first
        rewritten with the draws it committed."""
        with open_for_reading(path) as file:
            found_sites, found_stats = _layout_of(file)
            expected = ({k: tuple(s) for k, (s, _) in sites.items()}, {k: () for k in stats})
            for group_name, want, found in (
                    ("posterior", expected[0], {k: s for k, (s, _) in found_sites.items()}),
                    ("sample_stats", expected[1], {k: () for k in found_stats})):
                if found != want:
                    raise ValueError(
                        f"resume: {path} holds {group_name} variables {found}, the run draws "
                        f"{want}; resume a run of the same model, sites and statistics")
            version = _integer(file.attrs, "pyro_flat_draws_format", 1)
        try:
            part = cls._for_writing(path) if version >= FORMAT_VERSION else None
        except OSError:  # marked as still open by a writer that was killed
            part = None
        if part is None:
            _rewrite(path)
            part = cls._for_writing(path)
        _set_in_place(part.file.attrs, "complete", 0)
        return part

    @classmethod
    def _for_writing(cls, path: Path) -> Part:
        return cls(_open_swmr_writer(path))

    def append(
        self,
        draws: Mapping[str, np.ndarray],
        stats: Mapping[str, np.ndarray],
        draw_index: np.ndarray,
    ) -> None:
        """Append ``n`` draws: ``draws[site]`` of shape ``(chains, n, *site_shape)``,
        ``stats[name]`` of shape ``(chains, n)``, their draw indices ``(n,)``. They count once
        :meth:`flush` commits them."""
        n = len(draw_index)
        if n == 0:
            return
        start, stop = self.num_draws, self.num_draws + n
        for group_name, values in (("posterior", draws), ("sample_stats", stats)):
            group = self.file[group_name]
            group["draw"].resize((stop,))
            group["draw"][start:stop] = draw_index
            for name, value in values.items():
                group[name].resize(stop, axis=1)
                group[name][:, start:stop] = value
        self.num_draws = stop

    def flush(self) -> None:
        """Commit the draws appended so far: write them through to the operating system, then
        the new ``num_draws``. A process killed after it returns leaves a file that opens with
        these draws; killed during it, the file opens with the draws of the commit before."""
        self.file.flush()
        _set_in_place(self.file.attrs, "num_draws", self.num_draws)
        self.file.flush()

    def truncate(self, num_draws: int) -> None:
        """Keep only the first ``num_draws`` draws (drop those a resumed run writes again)."""
        if num_draws >= self.num_draws:
            return
        self.num_draws = num_draws
        self.flush()  # the commit goes down first, then the variables shrink
        for group_name in GROUPS:
            group = self.file[group_name]
            group["draw"].resize((num_draws,))
            for ds in _variables(group).values():
                ds.resize(num_draws, axis=1)
        self.file.flush()

    def close(self, attrs: Mapping[str, Any] | None = None, *, complete: bool = False) -> None:
        """Write the run's end (``next_draw``, ``num_sg_steps``, ``state_fingerprint``) and
        whether it finished to the root, and close the file."""
        if self.file is None:
            return
        try:
            stored = self.file.attrs
            for key, value in dict(attrs or {}).items():
                if key not in RUN_END:
                    raise ValueError(f"a part's end-of-run attributes are {list(RUN_END)}, "
                                     f"not {key!r}")
                _set_in_place(stored, key, value)
            _set_in_place(stored, "complete", int(complete))
            self.file.flush()
        finally:
            self.file.close()
            self.file = None

    def attrs(self) -> dict[str, Any]:
        """The root attributes, as :func:`part_attrs` reads them."""
        return _readable_attrs(self.file.attrs)


def _open_swmr_writer(path: Path) -> Any:
    """``path`` open for writing in SWMR mode from its first write on (opening it for writing
    and then switching would leave a moment in which a killed writer leaves the file marked as
    open by a plain writer, which no reader opens)."""
    import os

    import h5py
    from h5py import h5f, h5p

    access = h5p.create(h5p.FILE_ACCESS)
    access.set_libver_bounds(h5f.LIBVER_LATEST, h5f.LIBVER_LATEST)
    return h5py.File(h5f.open(os.fsencode(path), h5f.ACC_RDWR | h5f.ACC_SWMR_WRITE,
                              fapl=access))


def _replace_atomically(path: Path, write: Any) -> None:
    """Run ``write(temporary)`` for a file beside ``path``, then rename it to ``path``."""
    temporary = path.with_name(path.name + ".partial")
    temporary.unlink(missing_ok=True)
    try:
        write(temporary)
        temporary.replace(path)
    except BaseException:
        temporary.unlink(missing_ok=True)
        raise


def _rewrite(path: Path) -> None:
    """Replace the part at ``path`` with a fresh file holding its committed draws and its
    attributes, copied a chunk of draws at a time (the draws need not fit in memory)."""
    with open_for_reading(path) as old:
        sites, stats = _layout_of(old)
        keep = _committed(old)
        attrs = {k: v for k, v in old.attrs.items()
                 if k not in _run_attrs(0) and k not in ("pyro_flat_draws_format",
                                                         "_NCProperties")}
        run = {k: v for k, v in _readable_attrs(old.attrs).items() if k in RUN_END}
        chains = np.asarray(old["posterior"]["chain"][:])

        def write(temporary: Path) -> None:
            _write_layout(temporary, chains, sites, stats, attrs)
            with _h5py_file(temporary, "r+", libver="latest") as new:
                for group_name in GROUPS:
                    source, target = old[group_name], new[group_name]
                    target["draw"].resize((keep,))
                    target["draw"][:] = source["draw"][:keep]
                    for name, ds in _variables(source).items():
                        target[name].resize(keep, axis=1)
                        per_draw = int(np.prod((ds.shape[0], *ds.shape[2:]))) * ds.dtype.itemsize
                        step = max(1, CHUNK_BYTES // max(1, per_draw))
                        for start in range(0, keep, step):
                            stop = min(keep, start + step)
                            target[name][:, start:stop] = ds[:, start:stop]
                _set_in_place(new.attrs, "num_draws", keep)
                for key, value in run.items():
                    _set_in_place(new.attrs, key, value)

        _replace_atomically(path, write)


def open_for_reading(path: Path) -> Any:
    """The part at ``path`` open for reading (an ``h5py.File``): in SWMR mode if its writer is
    running or was killed, since HDF5 refuses other readers while the superblock marks the file
    as open. (Only then: a SWMR reader retries a read that fails its checksum, for a long time
    on a file that is corrupt.)"""
    try:
        return _h5py_file(path, "r")
    except OSError as error:
        if "already open for write" not in str(error):
            raise
    return _h5py_file(path, "r", swmr=True)


def _readable_attrs(attrs: Any) -> dict[str, Any]:
    """Root attributes with the run's "not yet written" values left out and text as ``str``."""
    out = {}
    for key, value in attrs.items():
        if isinstance(value, bytes | np.bytes_):
            value = value.decode()
        if key in RUN_END[:2] and np.any(np.asarray(value) < 0):
            continue
        if key == "state_fingerprint" and not value:
            continue
        out[key] = value
    return out


def part_attrs(path: str | Path) -> dict[str, Any]:
    """The root attributes of the part at ``path`` (also of one whose writer is running or was
    killed): ``num_draws`` (the draws it holds for certain), ``complete``, the provenance,
    where its run ended (``next_draw``, ``num_sg_steps``, ``state_fingerprint``) once written,
    and ``swmr``: whether HDF5 marks it as still open by its writer (then read it in SWMR
    mode)."""
    with open_for_reading(Path(path)) as file:
        attrs = _readable_attrs(file.attrs)
        attrs["num_draws"] = _committed(file)
        attrs["swmr"] = file.swmr_mode
    return attrs


def open_draws(path: str | Path) -> Any:
    """Open a draw store (see :class:`pyro_flat.DrawWriter`) as ArviZ data, without loading it.

    The parts of the store are joined along ``chain`` in the order of their global chain
    indices. ``posterior`` holds every written site in the constrained space, ``sample_stats``
    the kernels' per-draw statistics (``lp``, ``step_size``, ``grad_norm``, ``diverging`` and
    the kernel's own, e.g. ContourSGLD's ``log_weight``), as :func:`pyro_flat.to_arviz` gives
    them; the groups carry the same attributes (``inference_library``, ``pyro_flat_kernel``,
    ``num_sg_steps`` per chain). A part whose run is still writing it, or whose writer was
    killed, opens too, with the draws committed so far. The variables are read from disk when
    used: a store of one part (one process wrote it, e.g. ``vectorized_chains=K``) opens
    lazily; several parts open lazily when ``dask`` is installed, else they are read into
    memory to be joined.

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
            attrs = part_attrs(file)
            swmr = {"swmr": True} if attrs["swmr"] else None
            opened = {group: xr.open_dataset(file, group=group, engine="h5netcdf",
                                             chunks=chunks, driver_kwds=swmr)
                      .isel(draw=slice(0, attrs["num_draws"])) for group in GROUPS}
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
