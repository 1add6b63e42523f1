r"""A compiled CPU kernel for L2E's meta-network pass, built from C on first use.

:class:`~pyro_flat.infer.mcmc.l2e.chunked.ChunkedMetaNet` evaluates the 9-32-32-1 network of
L2E on every parameter twice per step. With torch's kernels that is six matrix-library calls
and three elementwise passes per chunk of rows; ``meta_rows.c`` computes the network row by row
(sixteen rows per SIMD pass, AVX2 and FMA) with its weights and activations in the first-level
cache, which is faster (docs/methods/l2e.md, "Cost", compares the two). It is used when

* the input is float32 on the CPU, in the feature-major layout of
  :class:`~pyro_flat.infer.mcmc.l2e.meta_net.L2EState`, and the network is 9-32-32;
* the CPU has AVX2 and FMA, and a C compiler (``$CC``, else ``cc``) built the kernel: on first
  use it is compiled with ``-O3 -mavx2 -mfma -fopenmp`` into ``$PYRO_FLAT_CACHE_DIR`` (default
  ``~/.cache/pyro_flat``) and loaded with :mod:`ctypes`; later processes load the built file;
* ``PYRO_FLAT_NATIVE`` is not ``0``.

Otherwise torch's kernels run (:func:`status` says why). Both compute the same network in
float32; their sums are rounded in different orders, so their outputs differ by a few ulps.
The rows are spread over OpenMP threads: the kernel links the OpenMP runtime that torch
already loaded, so it runs on torch's :func:`torch.get_num_threads` threads, and each row is
computed alone, so the result does not depend on them.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import platform
import shutil
import subprocess
import sysconfig
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

SOURCE = Path(__file__).with_name("meta_rows.c")
FLAGS = ("-O3", "-mavx2", "-mfma", "-fopenmp", "-shared", "-fPIC")
#: The network shape the kernel computes: features, hidden units.
FEATURES, HIDDEN = 9, 32

_float_p = ctypes.POINTER(ctypes.c_float)
_int64_p = ctypes.POINTER(ctypes.c_int64)


def cache_dir() -> Path:
    """Where the built kernel is kept: ``$PYRO_FLAT_CACHE_DIR``, else
    ``$XDG_CACHE_HOME/pyro_flat``, else ``~/.cache/pyro_flat``."""
    if os.environ.get("PYRO_FLAT_CACHE_DIR"):
        return Path(os.environ["PYRO_FLAT_CACHE_DIR"])
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "pyro_flat"


def _compiler() -> str | None:
    for name in (os.environ.get("CC"), (sysconfig.get_config_var("CC") or "").split(" ")[0],
                 "cc", "gcc"):
        if name and shutil.which(name):
            return name
    return None


def _build(compiler: str) -> Path:
    """The kernel's shared library, compiled into the cache unless it is there already (named
    by a hash of the source, the flags and the compiler; written atomically)."""
    key = hashlib.sha256(SOURCE.read_bytes() + " ".join((compiler, *FLAGS)).encode())
    target = cache_dir() / f"meta_rows-{key.hexdigest()[:16]}.so"
    if target.exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
        built = Path(tmp) / target.name
        subprocess.run([compiler, *FLAGS, str(SOURCE), "-o", str(built)], check=True,
                       capture_output=True, timeout=120)
        os.replace(built, target)
    return target


@functools.cache
def _load() -> tuple[ctypes.CDLL | None, str]:
    """``(library, "")``, or ``(None, why not)``."""
    if os.environ.get("PYRO_FLAT_NATIVE", "1") == "0":
        return None, "PYRO_FLAT_NATIVE=0"
    if platform.machine().lower() not in ("x86_64", "amd64"):
        return None, f"the kernel is for x86-64 CPUs, this is {platform.machine()}"
    compiler = _compiler()
    if compiler is None:
        return None, "no C compiler found ($CC, cc, gcc)"
    try:
        lib = ctypes.CDLL(str(_build(compiler)))
    except (OSError, subprocess.SubprocessError) as error:
        detail = getattr(error, "stderr", b"") or b""
        return None, f"building the kernel failed: {error} {detail.decode(errors='replace')}"
    if not lib.meta_rows_supported():
        return None, "the CPU lacks AVX2 or FMA"
    lib.meta_rows_segments.restype = None
    lib.meta_rows_segments.argtypes = [
        _float_p, ctypes.c_int64, ctypes.c_int64, _int64_p, _int64_p, _float_p, _float_p,
        _float_p, _float_p, _float_p, ctypes.c_float, _float_p]
    return lib, ""


def status() -> str:
    """``"available"``, or why the torch path runs instead."""
    lib, why = _load()
    return "available" if lib is not None else why


def applies(x: torch.Tensor, hidden: int) -> bool:
    """Whether the kernel computes the pass for the ``(n, 9)`` input ``x`` (a transposed view
    of a contiguous ``(9, n)`` float32 CPU tensor) of a network with ``hidden`` units."""
    return (x.device.type == "cpu" and x.dtype == torch.float32 and x.ndim == 2
            and x.shape[1] == FEATURES and hidden == HIDDEN and x.T.is_contiguous()
            and _load()[0] is not None)


def _ptr(t: torch.Tensor, kind: Any = _float_p) -> Any:
    return ctypes.cast(t.data_ptr(), kind)


@functools.lru_cache(maxsize=64)
def _bounds(segments: tuple[tuple[int, int], ...]) -> torch.Tensor:
    """The segments' starts and stops as a ``(2, k)`` int64 tensor, made once per segmentation
    (the pass runs twice per SG step)."""
    return torch.tensor(segments, dtype=torch.int64).T.contiguous()


def meta_rows(x: torch.Tensor, segments: Sequence[tuple[int, int]], first: torch.Tensor,
              b0: torch.Tensor, w1: torch.Tensor, b1: torch.Tensor, w_out: torch.Tensor,
              b_out: float, out: torch.Tensor) -> torch.Tensor:
    """``out[i] = b_out + w_out . relu(relu(x_i first[s] + b0) w1 + b1)`` for the rows ``i`` of
    each segment ``s``; all tensors contiguous float32 on the CPU (``x`` as in :func:`applies`,
    ``first`` of shape ``(segments, 9, 32)``, ``w1`` ``(32, 32)`` as ``(in, out)``). Returns
    ``out``."""
    lib = _load()[0]
    if lib is None:  # pragma: no cover - callers check applies() first
        raise RuntimeError(f"the native kernel is not available: {status()}")
    starts, stops = _bounds(tuple(map(tuple, segments)))
    lib.meta_rows_segments(_ptr(x.T), x.shape[0], len(segments), _ptr(starts, _int64_p),
                           _ptr(stops, _int64_p), _ptr(first), _ptr(b0), _ptr(w1), _ptr(b1),
                           _ptr(w_out), b_out, _ptr(out))
    return out


__all__ = ["applies", "cache_dir", "meta_rows", "status"]
