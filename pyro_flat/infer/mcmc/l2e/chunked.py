r"""The L2E meta-network evaluated over many rows at once: chunked, into kept buffers.

:class:`ChunkedMetaNet` computes one fixed combination of the meta-network's two outputs,
:math:`s\,(a\, o_1 + b\, o_2)` with :math:`o = \mathrm{net}(x \odot c)`, for every row
:math:`x` of an ``(n, 9)`` input, where :math:`c` is a vector of column scales per segment of
rows. Two foldings keep the work to the three matrix products:

* the sampler needs two such rows per step, :math:`\alpha + C\beta` and :math:`\beta`
  (:class:`~pyro_flat.infer.mcmc.l2e.meta_net.LearnedKinetic`), so the combination and the output
  scale are folded into the last layer: one weight vector of 32 and one bias, a
  matrix-vector product per chunk;
* the features are normalised per segment (one per Pyro site), a scale per column and
  segment, so the scales are folded into the first layer's weights,
  :math:`(x \odot c)\,W_0 = x\,(\mathrm{diag}(c)\,W_0)`: one ``(9, 32)`` matrix per segment
  and no normalised copy of the features.

The rows go through all three layers in chunks of at most :data:`CHUNK` rows within a
segment, so that the ``(m, 32)`` hidden activations of a chunk are reused from cache by the
next layer, in two buffers allocated once per input tensor and kept from call to call (with
the chunks' views), as is the output row: nothing is allocated per call. On a CPU with AVX2
(float32, the features' own layout) the compiled kernel of :mod:`pyro_flat.infer.mcmc.l2e.native`
computes the three layers instead, about twice as fast.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

from pyro_flat.infer.mcmc.l2e import native as native_kernel

if TYPE_CHECKING:
    from pyro_flat.infer.mcmc.l2e.meta_net import MetaNet

#: Rows of the meta-network's input per chunk.
CHUNK = 8192


@dataclass
class _Plan:
    """Buffers and per-chunk views for one input tensor and segmentation."""

    key: tuple
    layers: tuple[torch.Tensor, ...]
    first: torch.Tensor  # (segments, 9, 32): the first layer's weights, scaled per segment
    chunks: list[tuple[torch.Tensor, ...]]
    out: torch.Tensor
    segments: tuple[tuple[int, int], ...] = ()
    native: bool = False
    rows: dict[tuple[float, float, float], tuple[torch.Tensor, torch.Tensor]] = field(
        default_factory=dict)


class ChunkedMetaNet:
    r"""Evaluate :math:`s\,(a\,o_1 + b\,o_2)`, :math:`o = \mathrm{net}(x \odot c)`, for all
    rows of ``x``.

    Parameters
    ----------
    net : MetaNet
        The meta-network (its weights are read once, detached: the pass is not
        differentiable).
    chunk : int
        Rows per chunk (default :data:`CHUNK`); positive.
    native : bool or None
        Use the compiled kernel (:mod:`pyro_flat.infer.mcmc.l2e.native`): where it applies
        (``None``, default), always (``True``: an input it does not apply to is an error), or
        never (``False``: torch's kernels).

    Examples
    --------
    >>> import torch
    >>> from pyro_flat.infer.mcmc.l2e.meta_net import MetaNet
    >>> net = MetaNet.init(torch.Generator().manual_seed(0))
    >>> x = torch.randn(10, 9)
    >>> row = ChunkedMetaNet(net, chunk=4)(x, 1.0, 0.1, 1e-3)  # 1e-3 (o_1 + 0.1 o_2)
    >>> torch.allclose(row, 1e-3 * (net(x) @ torch.tensor([1.0, 0.1])), atol=1e-7)
    True
    >>> c = torch.rand(9, 2)  # rows 0..3 scaled by c[:, 0], rows 4..9 by c[:, 1]
    >>> row = ChunkedMetaNet(net)(x, 0.0, 1.0, column_scales=c, segments=[(0, 4), (4, 10)])
    >>> scaled = torch.cat([x[:4] * c[:, 0], x[4:] * c[:, 1]])
    >>> torch.allclose(row, net(scaled)[:, 1], atol=1e-6)
    True
    """

    def __init__(self, net: MetaNet, chunk: int = CHUNK, native: bool | None = None):
        if isinstance(chunk, bool) or not isinstance(chunk, int) or chunk < 1:
            raise ValueError(f"chunk must be an integer >= 1, got {chunk!r}")
        if native not in (None, True, False):
            raise ValueError(f"native must be None, True or False, got {native!r}")
        self.native = native
        self.weights = [(w.detach(), b.detach()) for w, b in net.weights]
        self.chunk = chunk
        self._plan: _Plan | None = None

    def __call__(self, x: torch.Tensor, a: float, b: float, scale: float = 1.0, *,
                 column_scales: torch.Tensor | None = None,
                 segments: Sequence[tuple[int, int]] | None = None) -> torch.Tensor:
        r"""The ``(n,)`` row :math:`s\,(a\,o_1 + b\,o_2)` for the ``(n, 9)`` input ``x``.

        ``segments`` are ``k`` ``(start, stop)`` slices that tile the rows in order (default:
        one); ``column_scales``, ``(9, k)``, multiplies the columns of the rows of segment
        ``j`` by ``column_scales[:, j]`` before the network (default: ones). The result is a
        buffer that the next call overwrites.
        """
        features = self.weights[0][0].shape[0]
        if x.ndim != 2 or x.shape[1] != features:
            raise ValueError(f"x must have shape (n, {features}), got {tuple(x.shape)}")
        segments = [(0, x.shape[0])] if segments is None else segments
        plan = self._plan_for(x, segments)
        w0 = plan.layers[0]
        if column_scales is None:
            plan.first.copy_(w0.expand_as(plan.first))
        else:
            if column_scales.shape != (features, len(segments)):
                raise ValueError(f"column_scales must have shape ({features}, "
                                 f"{len(segments)}) (features, segments), got "
                                 f"{tuple(column_scales.shape)}")
            torch.mul(column_scales.T.unsqueeze(2), w0, out=plan.first)
        w_out, b_out = self._output_row(plan, a, b, scale)
        _, b0, w1, b1 = plan.layers
        if plan.native:
            return native_kernel.meta_rows(x, plan.segments, plan.first, b0, w1, b1, w_out,
                                           float(b_out), plan.out)
        for rows, first, h0, h1, out in plan.chunks:
            torch.addmm(b0, rows, first, out=h0).relu_()
            torch.addmm(b1, h0, w1, out=h1).relu_()
            torch.mv(h1, w_out, out=out)
        return plan.out.add_(b_out)

    def _plan_for(self, x: torch.Tensor, segments: Sequence[tuple[int, int]]) -> _Plan:
        # The plan's views keep x's storage alive, so no other tensor can take its address:
        # the key identifies this very buffer (a new state, model or size builds a new plan).
        segments = tuple((int(a), int(b)) for a, b in segments)
        key = (x.data_ptr(), tuple(x.shape), x.stride(), x.dtype, x.device, segments)
        if self._plan is not None and self._plan.key == key:
            return self._plan
        n = x.shape[0]
        if not segments or segments[0][0] != 0 or segments[-1][1] != n or any(
                a >= b or b != c for (a, b), (c, _) in zip(segments, segments[1:] + ((n, n),),
                                                           strict=True)):
            raise ValueError(f"segments must tile the {n} rows of x in order with non-empty "
                             f"slices, got {list(segments)}")
        layers = tuple(t.to(device=x.device, dtype=x.dtype).contiguous() for t in
                       (*self.weights[0], *self.weights[1]))
        use_native = self.native is not False and native_kernel.applies(x, layers[0].shape[1])
        if self.native is True and not use_native:
            raise ValueError("native=True, but the compiled kernel does not apply to this input "
                             f"({x.dtype} on {x.device}, strides {x.stride()}; kernel: "
                             f"{native_kernel.status()})")
        first = x.new_empty(len(segments), *layers[0].shape)
        out = x.new_empty(n)
        chunks = []
        # the compiled kernel keeps its activations in its own (stack) buffers
        size = 0 if use_native else min(self.chunk, max(b - a for a, b in segments))
        h0, h1 = (x.new_empty(size, w.shape[1]) for w, _ in self.weights[:2])
        for j, (a, b) in enumerate(segments if size else ()):
            for start in range(a, b, size):
                stop = min(b, start + size)
                chunks.append((x[start:stop], first[j], h0[:stop - start], h1[:stop - start],
                               out[start:stop]))
        self._plan = _Plan(key, layers, first, chunks, out, segments, use_native)
        return self._plan

    def _output_row(self, plan: _Plan, a: float, b: float, scale: float
                    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The last layer folded with the combination: ``(32,)`` weights and a 0-d bias."""
        key = (float(a), float(b), float(scale))
        if key not in plan.rows:
            w, bias = (t.to(device=plan.out.device, dtype=plan.out.dtype)
                       for t in self.weights[2])
            w_row = (scale * (a * w[:, 0] + b * w[:, 1])).contiguous()
            b_row = scale * (a * bias[0] + b * bias[1])
            plan.rows[key] = (w_row, b_row)
        return plan.rows[key]
