r"""The L2E meta-network, its features, and the update rule shared by kernel and meta-training.

Learning to Explore (Kim et al. 2024) learns the gradients of a kinetic energy
:math:`g(\theta, r)`: one small MLP, shared by every parameter element, maps 9 features of an
element to :math:`(\alpha, \beta) \approx (\nabla_\theta g, \nabla_r g)`. The features of an
element are, in this order,

``[grad, theta, r, m_0.1, m_0.5, m_0.9, m_0.99, m_0.999, m_0.9999]``

where ``grad`` is the gradient of the *mean* minibatch loss (``grad U / N``), ``r`` the momentum and
``m_d <- d m_d + (1 - d) grad`` exponential moving averages of the gradient (started at zero).
Each feature is normalised over its whole parameter tensor (one Pyro site):
:math:`x / \sqrt{10^{-5} + \mathrm{mean}(x^2)}`. The network is ``9 -> 32 -> 32 -> 2`` with ReLU
between layers, ``x @ w + b`` (the layout of the authors' haiku ``hk.nets.MLP([32, 32, 2])``), and
:math:`\alpha = 10^{-3} o_1`, :math:`\beta = 10^{-3} o_2`.

:func:`l2e_step_` is the update; :class:`pyro_flat.infer.L2E` and
:mod:`pyro_flat.infer.mcmc.l2e.training.meta` both call it, so the sampler that is meta-trained
is the sampler that ships.

References
----------
Kim, S., Kim, M. & Lee, J. (2024). Learning to explore for stochastic gradient MCMC.
arXiv:2408.09140. Code: github.com/ciao-seohyeon/l2e (``algorithms/l2e.py``).
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from importlib import resources
from typing import Any

import numpy as np
import torch

from pyro_flat.infer.mcmc.l2e.chunked import ChunkedMetaNet

#: Decays of the gradient moving averages fed to the network.
DECAYS: tuple[float, ...] = (0.1, 0.5, 0.9, 0.99, 0.999, 0.9999)
#: Feature names, in the order of the network's input.
FEATURES: tuple[str, ...] = ("grad", "theta", "r") + tuple(f"m_{d:g}" for d in DECAYS)
#: Layer widths of the meta-network.
LAYER_SIZES: tuple[int, ...] = (len(FEATURES), 32, 32, 2)
#: Output multipliers (the authors' ``exp_mult`` and ``precond_mult``).
OUTPUT_SCALE: float = 1e-3
#: Friction ``C`` of the authors' code.
FRICTION: float = 0.1
#: The ``eps`` of the feature normalisation ``x / sqrt(eps + mean(x^2))``.
NORM_EPS: float = 1e-5
#: File name of the shipped meta-parameters, beside this module.
SHIPPED_FILE = "l2e_meta_params.npz"

_INFO_KEY = "pyro_flat_info"


def _haiku_names() -> list[str]:
    return [f"linear_{i}.{p}" for i in range(len(LAYER_SIZES) - 1) for p in ("w", "b")]


class MetaNet:
    r"""The shared per-element MLP ``9 -> 32 -> 32 -> 2`` (ReLU), ``x @ w + b`` per layer.

    Parameters
    ----------
    weights : sequence of (w, b)
        One ``(w, b)`` pair per layer, ``w`` of shape ``(in, out)`` and ``b`` of shape ``(out,)``,
        with the sizes :data:`LAYER_SIZES`.
    info : dict, optional
        Free-form provenance (e.g. how the parameters were trained), saved with them.

    Examples
    --------
    >>> import torch
    >>> from pyro_flat.infer.mcmc.l2e.meta_net import MetaNet
    >>> net = MetaNet.init(torch.Generator().manual_seed(0))
    >>> net.num_params, tuple(net(torch.zeros(5, 9)).shape)
    (1442, (5, 2))
    >>> torch.equal(MetaNet.from_flat(net.to_flat())(torch.ones(1, 9)), net(torch.ones(1, 9)))
    True
    """

    def __init__(self, weights: Sequence[tuple[torch.Tensor, torch.Tensor]],
                 info: Mapping[str, Any] | None = None):
        if len(weights) != len(LAYER_SIZES) - 1:
            raise ValueError(f"weights must have {len(LAYER_SIZES) - 1} (w, b) pairs, "
                             f"got {len(weights)}")
        checked = []
        for i, (w, b) in enumerate(weights):
            w, b = torch.as_tensor(w), torch.as_tensor(b)
            shape_w, shape_b = (LAYER_SIZES[i], LAYER_SIZES[i + 1]), (LAYER_SIZES[i + 1],)
            if tuple(w.shape) != shape_w or tuple(b.shape) != shape_b:
                raise ValueError(
                    f"layer {i} of the meta-network must have w of shape {shape_w} and b of "
                    f"shape {shape_b}, got {tuple(w.shape)} and {tuple(b.shape)}"
                )
            if not (torch.isfinite(w).all() and torch.isfinite(b).all()):
                raise ValueError(f"layer {i} of the meta-network has non-finite values")
            checked.append((w, b))
        self.weights = checked
        self.info = dict(info or {})

    # ------------------------------------------------------------------ evaluation

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        """Raw outputs ``(n, 2)`` for features ``x`` of shape ``(n, 9)``."""
        h = x
        for i, (w, b) in enumerate(self.weights):
            h = torch.addmm(b.to(h.dtype), h, w.to(h.dtype))
            if i < len(self.weights) - 1:
                h = h.relu_()
        return h

    def to(self, dtype: torch.dtype | None = None, device: Any = None) -> MetaNet:
        """A copy with every tensor cast / moved."""
        return MetaNet([(w.to(device=device, dtype=dtype), b.to(device=device, dtype=dtype))
                        for w, b in self.weights], self.info)

    # ------------------------------------------------------------------ flat vector (for ES)

    @property
    def num_params(self) -> int:
        return sum(w.numel() + b.numel() for w, b in self.weights)

    def to_flat(self) -> torch.Tensor:
        """All parameters in one vector (layer by layer, ``w`` then ``b``)."""
        return torch.cat([t.reshape(-1) for wb in self.weights for t in wb])

    @classmethod
    def from_flat(cls, flat: torch.Tensor, info: Mapping[str, Any] | None = None) -> MetaNet:
        """Inverse of :meth:`to_flat`."""
        expected = sum(a * b + b for a, b in zip(LAYER_SIZES[:-1], LAYER_SIZES[1:], strict=True))
        if flat.ndim != 1 or flat.numel() != expected:
            raise ValueError(f"flat must be a vector of {expected} meta-parameters, "
                             f"got shape {tuple(flat.shape)}")
        weights, offset = [], 0
        for a, b in zip(LAYER_SIZES[:-1], LAYER_SIZES[1:], strict=True):
            w = flat[offset: offset + a * b].view(a, b)
            offset += a * b
            weights.append((w, flat[offset: offset + b]))
            offset += b
        return cls(weights, info)

    # ------------------------------------------------------------------ initialisation

    @classmethod
    def init(cls, generator: torch.Generator | None = None, *, planted: float = 0.0,
             descent: float = 0.0, scale: float = 1.0) -> MetaNet:
        r"""Haiku's default initialisation (truncated normal of standard deviation
        ``scale / sqrt(fan_in)``, zero biases), optionally with two planted paths.

        With ``planted = k > 0``, hidden units 0 and 1 of both layers carry ``relu(r)`` and
        ``relu(-r)`` of the normalised momentum feature and ``o_2 += k (h_0 - h_1)``: the part
        :math:`10^{-3} k\, r / \mathrm{rms}(r)` of :math:`\beta` is the gradient of the kinetic
        energy :math:`10^{-3} k \sqrt{n}\,\lVert r \rVert` per tensor, the closest to the
        standard :math:`\tfrac12 \lVert r \rVert^2` that scale-free features can express.
        With ``descent = k' > 0``, units 2 and 3 do the same with the gradient average
        :math:`m_{0.9}` and ``o_2 -= k' (h_2 - h_3)``: a normalised-momentum descent step
        :math:`-10^{-3} k' m_{0.9} / \mathrm{rms}(m_{0.9})`.
        """
        weights = []
        for a, b in zip(LAYER_SIZES[:-1], LAYER_SIZES[1:], strict=True):
            w = torch.empty(a, b)
            torch.nn.init.trunc_normal_(w, std=1.0, a=-2.0, b=2.0, generator=generator)
            weights.append([w * (scale / math.sqrt(a)), torch.zeros(b)])
        (w0, _), (w1, _), (w2, _) = weights
        for units, feature, gain in (((0, 1), "r", planted), ((2, 3), "m_0.9", -descent)):
            if not gain:
                continue
            i, j = units
            c = FEATURES.index(feature)
            w0[:, i], w0[:, j] = 0.0, 0.0
            w0[c, i], w0[c, j] = 1.0, -1.0
            w1[:, i], w1[:, j], w1[i, :], w1[j, :] = 0.0, 0.0, 0.0, 0.0
            w1[i, i], w1[j, j] = 1.0, 1.0
            w2[i, :], w2[j, :] = 0.0, 0.0
            w2[i, 1], w2[j, 1] = gain, -gain
        return cls([tuple(wb) for wb in weights], {"init": "haiku", "planted": planted,
                                                   "descent": descent, "scale": scale})

    # ------------------------------------------------------------------ files

    def to_arrays(self) -> dict[str, np.ndarray]:
        """The haiku layout ``{"linear_0.w": ..., "linear_0.b": ..., ...}`` as float32 arrays."""
        flat = [t.detach().cpu().to(torch.float32).numpy() for wb in self.weights for t in wb]
        return dict(zip(_haiku_names(), flat, strict=True))

    @classmethod
    def from_arrays(cls, arrays: Mapping[str, Any], info: Mapping[str, Any] | None = None
                    ) -> MetaNet:
        """From the haiku layout: keys ``linear_{i}.w`` ``(in, out)`` and ``linear_{i}.b``.

        This is the layout of the authors' published ``meta_params.pickle`` (converted to
        NumPy) as well as of the files :meth:`save` writes.
        """
        missing = [k for k in _haiku_names() if k not in arrays]
        if missing:
            raise ValueError(f"meta-parameters are missing the arrays {missing} (expected the "
                             f"haiku names {_haiku_names()})")
        t = [torch.as_tensor(np.asarray(arrays[k]), dtype=torch.float32) for k in _haiku_names()]
        return cls(list(zip(t[0::2], t[1::2], strict=True)), info)

    def save(self, path: str | os.PathLike[str]) -> None:
        """Write an ``.npz`` in the haiku layout plus a JSON ``pyro_flat_info`` entry."""
        arrays = self.to_arrays()
        arrays[_INFO_KEY] = np.array(json.dumps(self.info, sort_keys=True))
        with open(path, "wb") as f:
            np.savez(f, **arrays)

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> MetaNet:
        """Read a file written by :meth:`save`, or the authors' parameters as an ``.npz``."""
        with np.load(path, allow_pickle=False) as data:
            info = json.loads(str(data[_INFO_KEY])) if _INFO_KEY in data.files else {}
            return cls.from_arrays({k: data[k] for k in data.files if k != _INFO_KEY}, info)

    @classmethod
    def shipped(cls) -> MetaNet:
        """The meta-parameters trained by this project
        (``pyro_flat/infer/mcmc/l2e/l2e_meta_params.npz``)."""
        ref = resources.files("pyro_flat.infer.mcmc.l2e").joinpath(SHIPPED_FILE)
        with resources.as_file(ref) as path:
            return cls.load(path)


def as_meta_net(meta_params: Any) -> MetaNet:
    """Accept a :class:`MetaNet`, a path to an ``.npz``, a mapping in the haiku layout, or
    ``None`` (the shipped parameters)."""
    if meta_params is None:
        return MetaNet.shipped()
    if isinstance(meta_params, MetaNet):
        return meta_params
    if isinstance(meta_params, str | os.PathLike):
        return MetaNet.load(meta_params)
    if isinstance(meta_params, Mapping):
        return MetaNet.from_arrays(meta_params)
    raise ValueError("meta_params must be None, a MetaNet, a path to an .npz file or a mapping "
                     f"of haiku names to arrays, got {type(meta_params).__name__}")


# ---------------------------------------------------------------------- the sampler's state


@dataclass
class L2EState:
    """Per-element state of an L2E chain on one flat parameter vector.

    ``features`` is a ``(9, n)`` buffer, one contiguous row per feature: row 2 *is* the
    momentum ``r`` and rows 3..8 *are* the gradient moving averages (persistent state); rows 0
    and 1 are refilled with ``grad`` and ``theta`` at each step. ``raw`` is its ``(n, 9)``
    view, one row per element. ``segments`` are the ``(start, stop)`` slices over which
    features are normalised (one per parameter tensor); ``scales`` holds the normalisation's
    ``(9, segments)`` factors (:meth:`scales_`). Feature-major storage keeps every per-feature
    pass and the meta-network's matrix products on contiguous memory.
    """

    features: torch.Tensor
    segments: list[tuple[int, int]]
    r: torch.Tensor = field(init=False)
    scales: torch.Tensor = field(init=False)
    noise: torch.Tensor = field(init=False)
    decays: torch.Tensor = field(init=False)
    normed_features: torch.Tensor | None = field(init=False, default=None)
    _lengths: torch.Tensor = field(init=False, repr=False)

    def __post_init__(self) -> None:
        if self.features.ndim != 2 or self.features.shape[0] != len(FEATURES):
            raise ValueError(f"features must have shape ({len(FEATURES)}, n), got "
                             f"{tuple(self.features.shape)}")
        self.r = self.features[2]
        self.noise = torch.empty_like(self.r)
        self.decays = torch.tensor(DECAYS, dtype=self.features.dtype,
                                   device=self.features.device).unsqueeze(1)
        self.scales = self.features.new_empty(len(FEATURES), len(self.segments))
        self._lengths = torch.tensor([b - a for a, b in self.segments],
                                     dtype=self.features.dtype, device=self.features.device)

    @property
    def raw(self) -> torch.Tensor:
        """The features as ``(n, 9)``, one row per element (a view)."""
        return self.features.T

    @property
    def normed(self) -> torch.Tensor:
        """The normalised features as ``(n, 9)`` (a view), as of :meth:`normalise_`."""
        if self.normed_features is None:
            self.normed_features = torch.empty_like(self.features)
        return self.normed_features.T

    @classmethod
    def zeros(cls, theta: torch.Tensor, segments: Sequence[tuple[int, int]] | None = None
              ) -> L2EState:
        """Momentum and moving averages at zero for the flat parameters ``theta``."""
        n = theta.numel()
        segs = [(0, n)] if segments is None else [(int(a), int(b)) for a, b in segments]
        if not segs or segs[0][0] != 0 or segs[-1][1] != n or any(
            a >= b or b != c for (a, b), (c, _) in zip(segs, segs[1:] + [(n, n)], strict=True)
        ):
            raise ValueError(f"segments must tile [0, {n}) in order with non-empty slices, "
                             f"got {segs}")
        return cls(theta.new_zeros(len(FEATURES), n), segs)

    @property
    def moments(self) -> torch.Tensor:
        """The gradient moving averages, ``(n, 6)`` (a view)."""
        return self.features[3:].T

    def scales_(self, columns: slice = slice(None)) -> torch.Tensor:
        """Set rows ``columns`` of ``scales``, ``1 / sqrt(eps + mean(raw^2))`` per feature and
        segment, from the current features; returns ``scales``, ``(9, segments)``."""
        raw, scales = self.features[columns], self.scales[columns]
        for j, (a, b) in enumerate(self.segments):
            torch.linalg.vector_norm(raw[:, a:b], dim=1, keepdim=True, out=scales[:, j:j + 1])
        scales.square_().div_(self._lengths).add_(NORM_EPS).rsqrt_()
        return self.scales

    def normalise_(self, columns: slice = slice(None)) -> torch.Tensor:
        """Write ``raw / sqrt(eps + mean(raw^2))`` per segment and feature into ``normed``;
        returns ``normed``, ``(n, 9)``. (The sampler folds ``scales`` into the network's
        first layer instead.)"""
        normed = self.normed.T[columns]
        scales = self.scales_(columns)[columns]
        for j, (a, b) in enumerate(self.segments):
            torch.mul(self.features[columns, a:b], scales[:, j:j + 1], out=normed[:, a:b])
        return self.normed


class StandardKinetic:
    r"""The standard kinetic energy :math:`g(\theta, r) = \tfrac12 \lVert r \rVert^2`:
    :math:`\alpha = 0`, :math:`\beta = r`. With it :func:`l2e_step_` is the SGHMC step
    :func:`pyro_flat.infer.mcmc.integrators.underdamped_step_` with friction ``C`` and unit mass.
    """

    def momentum_drift(self, theta: torch.Tensor, state: L2EState, friction: float
                       ) -> tuple[torch.Tensor, float]:
        r"""``(d, c)`` with :math:`\alpha + C\beta = c\, d`: here ``(r, C)``."""
        return state.r, friction

    def velocity(self, theta: torch.Tensor, state: L2EState) -> torch.Tensor:
        r""":math:`\beta = r`."""
        return state.r


class LearnedKinetic:
    r"""The meta-network's kinetic-energy gradients :math:`(\alpha, \beta) = 10^{-3}\,
    \mathrm{MLP}(\text{normalised features})`.

    A step needs :math:`\alpha + C\beta` at the current momentum and :math:`\beta` at the new
    one, each a fixed combination of the network's two outputs: both are computed by
    :class:`~pyro_flat.infer.mcmc.l2e.chunked.ChunkedMetaNet` on the raw features, with the
    per-site normalisation (:attr:`L2EState.scales`) folded into the first layer and the
    combination into the last, in buffers kept from step to step. The returned tensor is such
    a buffer, valid until the next call.

    Parameters
    ----------
    net : MetaNet
        The meta-network.
    output_scale : float
        The multiplier of the outputs (:data:`OUTPUT_SCALE`).
    """

    def __init__(self, net: MetaNet, output_scale: float = OUTPUT_SCALE):
        self.net = net
        self.output_scale = output_scale
        self.rows = ChunkedMetaNet(net)

    def momentum_drift(self, theta: torch.Tensor, state: L2EState, friction: float
                       ) -> tuple[torch.Tensor, float]:
        r"""``(d, 1)`` with :math:`d = \alpha + C\beta` at the features of ``theta``, ``r``."""
        state.features[1].copy_(theta)
        return self.rows(state.raw, 1.0, friction, self.output_scale,
                         column_scales=state.scales_(), segments=state.segments), 1.0

    def velocity(self, theta: torch.Tensor, state: L2EState) -> torch.Tensor:
        r""":math:`\beta` after ``r`` changed, the only feature that changes within a step (the
        other features' scales are those :meth:`momentum_drift` computed)."""
        return self.rows(state.raw, 0.0, 1.0, self.output_scale,
                         column_scales=state.scales_(slice(2, 3)), segments=state.segments)


@torch.no_grad()
def l2e_step_(
    theta: torch.Tensor,
    state: L2EState,
    grad_u: torch.Tensor,
    num_data: float,
    step_size: float,
    temperature: float,
    kinetic: StandardKinetic | LearnedKinetic,
    friction: float = FRICTION,
    generator: torch.Generator | None = None,
) -> None:
    r"""One L2E step, in place on ``theta`` and ``state``:

    .. math::

        m_d &\leftarrow d\, m_d + (1 - d)\, \nabla U / N \\
        r &\leftarrow r - \epsilon\,\big(\nabla U + \alpha + C \beta\big)
             + \sqrt{2 C \epsilon T}\, \xi, \qquad (\alpha, \beta) = \mathrm{net}(\theta, r, m) \\
        \theta &\leftarrow \theta + \epsilon\, \beta', \qquad \beta' = \mathrm{net}(\theta, r', m)_2

    with :math:`\xi \sim \mathcal{N}(0, I)`. ``grad_u`` is :math:`\nabla U` (the gradient of
    ``N`` times the mean loss plus the prior); the features see :math:`\nabla U / N`.
    ``generator``: the stream of :math:`\xi` (default: torch's global one). The step is not
    differentiable (it runs under :func:`torch.no_grad`).
    """
    features = state.features
    grad_mean = features[0]
    torch.mul(grad_u, 1.0 / num_data, out=grad_mean)
    moments = features[3:]
    moments.lerp_(grad_mean.unsqueeze(0).expand_as(moments), 1.0 - state.decays)
    drift, multiplier = kinetic.momentum_drift(theta, state, friction)
    r = state.r
    r.add_(drift, alpha=-step_size * multiplier).add_(grad_u, alpha=-step_size)
    variance = 2.0 * friction * step_size * temperature
    if variance > 0:
        state.noise.normal_(generator=generator)
        r.add_(state.noise, alpha=math.sqrt(variance))
    theta.add_(kinetic.velocity(theta, state), alpha=step_size)
