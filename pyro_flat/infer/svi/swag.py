r"""SWAG: a Gaussian over the iterates of SGD (Maddox et al. 2019), over any parameters.

Collect the parameters every so often along an SGD (or SAM: F-SWAG) run; SWAG fits the Gaussian

.. math:: \mathcal{N}\Big(\bar\theta,\ \tfrac12 \Sigma_{\mathrm{diag}}
    + \tfrac{1}{2(K-1)} \hat D \hat D^\top\Big),

with :math:`\bar\theta` the running mean of the :math:`n` snapshots,
:math:`\Sigma_{\mathrm{diag}} = \mathrm{diag}(\overline{\theta^2} - \bar\theta^2)` and
:math:`\hat D` the last :math:`K` deviations :math:`\theta_i - \bar\theta_i` (each taken from the
running mean at its own collection, as the authors do). A draw is

.. math:: \tilde\theta = \bar\theta + \sqrt{s}\Big(\tfrac{1}{\sqrt2}\,
    \Sigma_{\mathrm{diag}}^{1/2} z_1 + \tfrac{1}{\sqrt{2(K-1)}}\,\hat D z_2\Big),
    \qquad z_1 \sim \mathcal{N}(0, I_d),\ z_2 \sim \mathcal{N}(0, I_K),

where the scale :math:`s` multiplies the covariance (the authors sample with :math:`s = 0.5`).
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator, Mapping
from typing import Any

import torch

from pyro_flat import validation


class SWAG:
    """SWA-Gaussian over named tensors: module parameters, an ``AutoDelta`` MAP, guide parameters.

    Parameters
    ----------
    params : dict of str to torch.Tensor, or torch.nn.Module
        The live tensors to follow (read at each :meth:`collect`, written by :meth:`swapped`):
        e.g. ``dict(net.named_parameters())``, or for Pyro parameters
        ``{n: pyro.param(n).unconstrained() for n in pyro.get_param_store()}`` (SWAG then
        lives in the unconstrained space, where the parameters are optimised).
    max_rank : int
        :math:`K \\ge 0`, the number of deviations kept for the low-rank part; ``0`` is
        SWAG-diagonal.

    Examples
    --------
    >>> net = torch.nn.Linear(3, 1)
    >>> swag = SWAG(net, max_rank=5)
    >>> opt = torch.optim.SGD(net.parameters(), lr=0.1)
    >>> x, y = torch.randn(64, 3), torch.randn(64, 1)
    >>> for step in range(100):
    ...     opt.zero_grad(); ((net(x) - y) ** 2).mean().backward(); opt.step()
    ...     if step >= 50 and step % 5 == 0:
    ...         swag.collect()
    >>> draw = swag.sample(scale=0.5)
    >>> with swag.swapped(draw):
    ...     prediction = net(x)
    >>> swag.num_snapshots, sorted(draw)
    (10, ['bias', 'weight'])

    References
    ----------
    Maddox, W. J., Izmailov, P., Garipov, T., Vetrov, D. P. & Wilson, A. G. (2019). A simple
    baseline for Bayesian uncertainty in deep learning. NeurIPS.
    """

    def __init__(self, params: Mapping[str, torch.Tensor] | torch.nn.Module, max_rank: int = 20):
        self.module = params if isinstance(params, torch.nn.Module) else None
        if isinstance(params, torch.nn.Module):
            params = dict(params.named_parameters())
        if not isinstance(params, Mapping) or not params:
            raise ValueError("params must be a non-empty dict of tensors or a torch.nn.Module")
        for name, p in params.items():
            if not torch.is_tensor(p) or not p.is_floating_point():
                raise ValueError(f"params[{name!r}] must be a floating-point tensor")
        self.params = dict(params)
        self.max_rank = validation.integer_at_least("max_rank", max_rank, 0)
        self._sizes = [p.numel() for p in self.params.values()]
        p0 = next(iter(self.params.values()))
        dim = sum(self._sizes)
        self.mean = torch.zeros(dim, dtype=p0.dtype, device=p0.device)
        self.sq_mean = torch.zeros_like(self.mean)
        self.deviations: list[torch.Tensor] = []
        self.num_snapshots = 0

    def _flat(self) -> torch.Tensor:
        return torch.cat([p.detach().reshape(-1) for p in self.params.values()]).to(self.mean)

    def _unflat(self, flat: torch.Tensor) -> dict[str, torch.Tensor]:
        parts = torch.split(flat, self._sizes)
        return {n: part.reshape(p.shape).to(p.dtype) for (n, p), part in
                zip(self.params.items(), parts, strict=True)}

    def collect(self) -> None:
        """Fold the current values into the running moments and the deviation matrix."""
        theta = self._flat()
        n = self.num_snapshots
        self.mean.mul_(n / (n + 1)).add_(theta, alpha=1 / (n + 1))
        self.sq_mean.mul_(n / (n + 1)).add_(theta.square(), alpha=1 / (n + 1))
        self.num_snapshots = n + 1
        if self.max_rank > 0:
            self.deviations.append(theta - self.mean)
            del self.deviations[:-self.max_rank]

    @property
    def variance(self) -> torch.Tensor:
        """:math:`\\overline{\\theta^2} - \\bar\\theta^2`, clamped at 0 (rounding), flat."""
        return (self.sq_mean - self.mean.square()).clamp_min(0.0)

    def covariance(self, scale: float = 1.0, *, diagonal: bool = False) -> torch.Tensor:
        """The dense covariance of :meth:`sample` (small problems and tests only)."""
        if diagonal:
            return scale * torch.diag(self.variance)
        cov = torch.diag(self.variance) / 2
        k = len(self.deviations)
        if k >= 2:
            d = torch.stack(self.deviations, 1)
            cov = cov + d @ d.T / (2 * (k - 1))
        return scale * cov

    def sample(
        self,
        scale: float = 1.0,
        *,
        diagonal: bool = False,
        generator: torch.Generator | None = None,
    ) -> dict[str, torch.Tensor]:
        """One draw, as ``{name: tensor}`` shaped like ``params``, from :meth:`covariance`.

        ``scale`` multiplies the covariance; ``diagonal=True`` is SWAG-diagonal,
        :math:`\\mathcal{N}(\\bar\\theta, s\\,\\Sigma_{\\mathrm{diag}})` (not halved). The
        low-rank part enters once at least two deviations are stored.
        """
        scale = validation.nonnegative("scale", scale)
        if self.num_snapshots == 0:
            raise RuntimeError("SWAG.sample needs at least one collect()")
        z1 = torch.randn(self.mean.shape, dtype=self.mean.dtype, generator=generator)
        noise = self.variance.sqrt() * z1.to(self.mean)
        k = len(self.deviations)
        if not diagonal:
            noise = noise / math.sqrt(2)
            if k >= 2:
                z2 = torch.randn(k, dtype=self.mean.dtype, generator=generator).to(self.mean)
                noise = noise + torch.stack(self.deviations, 1) @ z2 / math.sqrt(2 * (k - 1))
        return self._unflat(self.mean + math.sqrt(scale) * noise)

    def draws(
        self,
        num_samples: int,
        scale: float = 1.0,
        *,
        diagonal: bool = False,
        generator: torch.Generator | None = None,
    ) -> dict[str, torch.Tensor]:
        """``num_samples`` draws of :meth:`sample`, stacked: ``{name: (num_samples, *shape)}``.

        With the names of a network's parameters these are the sites of the same network made
        Bayesian (:func:`pyro_flat.models.nn.make_bayesian`), so the result goes to
        :func:`pyro_flat.evaluation.predictive.bma_probs` and :func:`pyro_flat.to_arviz` as MCMC
        draws do.
        """
        num_samples = validation.integer_at_least("num_samples", num_samples, 1)
        samples = [self.sample(scale, diagonal=diagonal, generator=generator)
                   for _ in range(num_samples)]
        return {n: torch.stack([s[n] for s in samples]) for n in self.params}

    def average(self) -> dict[str, torch.Tensor]:
        """The SWA solution :math:`\\bar\\theta`."""
        return self._unflat(self.mean.clone())

    @contextlib.contextmanager
    def swapped(
        self,
        values: Mapping[str, torch.Tensor],
        *,
        batchnorm_inputs: torch.Tensor | None = None,
        batch_size: int = 256,
    ) -> Iterator[None]:
        """Write ``values`` into the live tensors for the duration of the block, then restore.

        A sampled network has no BatchNorm statistics of its own: with ``batchnorm_inputs``
        (usually the training inputs) the running statistics of the module's BatchNorm layers
        are recomputed for ``values`` on entry
        (:func:`pyro_flat.models.batchnorm.recompute_batchnorm`, in minibatches of ``batch_size``),
        as SWAG requires for each draw, and put back as they were on exit. Needs SWAG built over a
        ``torch.nn.Module``.
        """
        missing = set(self.params) - set(values)
        if missing:
            raise ValueError(f"values lack {sorted(missing)}")
        if batchnorm_inputs is not None and self.module is None:
            raise ValueError("batchnorm_inputs needs SWAG built over a torch.nn.Module")
        saved = {n: p.detach().clone() for n, p in self.params.items()}
        buffers = ({} if batchnorm_inputs is None else
                   {n: b.clone() for n, b in self.module.named_buffers()})
        try:
            with torch.no_grad():
                for n, p in self.params.items():
                    p.copy_(values[n])
            if batchnorm_inputs is not None:
                from pyro_flat.models.batchnorm import recompute_batchnorm

                recompute_batchnorm(self.module, None, batchnorm_inputs, batch_size=batch_size)
            yield
        finally:
            with torch.no_grad():
                for n, p in self.params.items():
                    p.copy_(saved[n])
                if buffers:
                    for n, b in self.module.named_buffers():
                        b.copy_(buffers[n])

    def state_dict(self) -> dict[str, Any]:
        return {"mean": self.mean.clone(), "sq_mean": self.sq_mean.clone(),
                "deviations": [d.clone() for d in self.deviations],
                "num_snapshots": self.num_snapshots, "max_rank": self.max_rank,
                "names": list(self.params), "sizes": list(self._sizes)}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        if list(state["names"]) != list(self.params) or list(state["sizes"]) != self._sizes:
            raise ValueError("the state was saved for other parameters "
                             f"({state['names']}, sizes {state['sizes']})")
        self.mean.copy_(state["mean"])
        self.sq_mean.copy_(state["sq_mean"])
        self.deviations = [d.clone() for d in state["deviations"]]
        self.num_snapshots = int(state["num_snapshots"])
        self.max_rank = int(state["max_rank"])
