"""What a CUDA device would wait on the host for, seen on the CPU.

``torch.cuda.set_sync_debug_mode("error")`` finds the operations that make a CUDA stream wait
for the host, but only on a GPU. On the CPU, :class:`HostSyncs` records the same operations as
they pass torch's dispatcher: reading a tensor's value into Python (``item``, ``float``,
``bool``, ``int``: ``aten::_local_scalar_dense``, ``aten::is_nonzero``), operations whose
output size depends on the values (``nonzero``, ``masked_select``, indexing by a boolean mask,
``unique``), and ``Tensor.tolist``/``numpy``/``cpu``, which copy to the host without passing
the dispatcher on the CPU.
"""

from __future__ import annotations

import traceback
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

VALUE_READS = {"aten::_local_scalar_dense", "aten::is_nonzero", "aten::item", "aten::nonzero",
               "aten::masked_select", "aten::masked_scatter", "aten::unique", "aten::_unique2",
               "aten::unique_consecutive", "aten::equal"}
HOST_COPIES = ("tolist", "numpy", "cpu")


def _where() -> str:
    frames = [f for f in traceback.extract_stack()[:-2] if "pyro_flat" in f.filename]
    return " < ".join(f"{f.filename.rsplit('pyro_flat/', 1)[-1]}:{f.lineno}"
                      for f in reversed(frames[-3:]))


def _boolean_index(name: str, args: tuple) -> bool:
    if name not in ("aten::index", "aten::index_put", "aten::index_put_", "aten::_index_put_impl_"):
        return False
    return any(i is not None and i.dtype == torch.bool for i in args[1])


class HostSyncs(TorchDispatchMode):
    """Records, in :attr:`found`, each operation in the block that a CUDA device would wait
    for the host on, with where in pyro_flat it was called from."""

    def __init__(self) -> None:
        super().__init__()
        self.found: list[str] = []
        self._saved: dict[str, Any] = {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func._schema.name
        if name in VALUE_READS or _boolean_index(name, args):
            self.found.append(f"{name} at {_where()}")
        return func(*args, **(kwargs or {}))

    def __enter__(self):
        for name in HOST_COPIES:
            original = self._saved[name] = getattr(torch.Tensor, name)
            setattr(torch.Tensor, name, self._recording(name, original))
        return super().__enter__()

    def __exit__(self, *exc):
        for name, original in self._saved.items():
            setattr(torch.Tensor, name, original)
        return super().__exit__(*exc)

    def _recording(self, name: str, original):
        def method(tensor, *args, **kwargs):
            self.found.append(f"Tensor.{name} at {_where()}")
            return original(tensor, *args, **kwargs)

        return method
