r"""Subnetwork Laplace approximation: any chosen parameters of a trained network (whole
tensors by name, or single entries), the rest fixed at their trained values.

The GGN of the chosen parameters :math:`\theta_S`, :math:`H = \sum_n J_n^\top \Lambda_n J_n`
with :math:`J_n = \partial f(x_n) / \partial \theta_S` (``C x P``, by ``torch.func``), kept
whole or by its diagonal; the rest as :mod:`pyro_flat.infer.laplace.base` (the marginal
likelihood, the prior precision, the linearised predictive :math:`J \Sigma J^\top`, the
draws). The cost is one
Jacobian per data point, ``C`` backward passes' worth each, and ``P^2`` numbers for the full
structure: for subnetworks of up to a few thousand parameters (the choice of Daxberger et al.,
2021), e.g. a low-rank adapter's factors.

References
----------
Daxberger, E., Nalisnick, E., Allingham, J. U., Antoran, J. and Hernandez-Lobato, J. M.
(2021). Bayesian deep learning via subnetwork inference. ICML.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable

import torch
from torch import nn
from torch.func import functional_call, jacrev, vmap

from pyro_flat import validation
from pyro_flat.infer.laplace.base import LaplaceApproximation, check_module
from pyro_flat.infer.laplace.curvature import DiagCurvature, FullCurvature

__all__ = ["SubnetworkLaplace", "subnetwork_indices"]


def subnetwork_indices(net: nn.Module, names: str | Iterable[str]) -> torch.Tensor:
    """The positions, in ``torch.nn.utils.parameters_to_vector(net.parameters())``, of the
    parameters named in ``names`` (as in ``named_parameters()``, or module prefixes: ``"fc"``
    selects ``fc.weight`` and ``fc.bias``)."""
    return _named_indices(net, names, "names")


def _named_indices(net: nn.Module, names: str | Iterable[str], argument: str) -> torch.Tensor:
    names = [names] if isinstance(names, str) else list(names)
    out, offset, found = [], 0, set()
    for name, p in net.named_parameters():
        hits = [n for n in names if name == n or name.startswith(n + ".")]
        if hits:
            out.append(torch.arange(offset, offset + p.numel()))
            found.update(hits)
        offset += p.numel()
    missing = [n for n in names if n not in found]
    if missing:
        raise ValueError(f"{argument} must name parameters or modules of the network; not "
                         f"found: {missing}")
    return torch.cat(out)


class SubnetworkLaplace(LaplaceApproximation):
    r"""A Laplace approximation of the parameters ``indices`` of a trained ``net``.

    Target: :math:`\mathcal N(\hat\theta_S, (H/T + \delta I)^{-1})` over the chosen
    parameters, every other one fixed.

    Parameters
    ----------
    net : nn.Module
        The trained network (copied, in evaluation mode).
    indices : torch.Tensor or str or iterable of str
        Positions in the flat vector of ``net.parameters()`` (laplace-torch's
        ``subnetwork_indices``), or parameter / module names (:func:`subnetwork_indices`).
    likelihood : {"classification", "regression"}
    structure : {"full", "diag"}
    sigma_noise, prior_precision, temperature : float
        As :class:`~.last_layer.LastLayerLaplace`'s.

    Examples
    --------
    >>> import torch
    >>> net = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 3))
    >>> x, y = torch.randn(64, 4), torch.randint(0, 3, (64,))
    >>> la = SubnetworkLaplace(net, "0.bias").fit(x, y)  # the first layer's biases
    >>> la.predictive(x[:2]).shape
    torch.Size([2, 3])
    """

    def __init__(self, net: nn.Module, indices: torch.Tensor | str | Iterable[str],
                 likelihood: str = "classification", structure: str = "full",
                 sigma_noise: float = 1.0, prior_precision: float = 1.0,
                 temperature: float = 1.0):
        super().__init__(likelihood, sigma_noise, prior_precision, temperature)
        if structure not in ("full", "diag"):
            raise ValueError(f"structure must be 'full' or 'diag', got {structure!r}")
        self.structure = structure
        self.net = copy.deepcopy(check_module("net", net)).eval()
        self._names = [n for n, _ in self.net.named_parameters()]
        self._shapes = [p.shape for _, p in self.net.named_parameters()]
        self._flat = torch.nn.utils.parameters_to_vector(self.net.parameters()).detach()
        if not torch.is_tensor(indices):
            indices = _named_indices(self.net, indices, "indices")
        indices = indices.long().flatten()
        if len(indices) == 0 or len(indices.unique()) != len(indices) or bool(
                (indices < 0).any() or (indices >= len(self._flat)).any()):
            raise ValueError(f"indices must be distinct positions in [0, {len(self._flat)}) "
                             f"(the network's parameters), got {len(indices)} of them")
        self.indices = indices.sort().values.to(self._flat.device)
        self._buffers = {n: b for n, b in self.net.named_buffers()}

    @property
    def map_parameters(self) -> torch.Tensor:
        return self._flat[self.indices].double()

    def _network_at(self, theta: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        """The outputs at ``x`` with the chosen parameters at ``theta`` (differentiable)."""
        flat = self._flat.to(theta.dtype).index_put((self.indices,), theta)
        params, offset = {}, 0
        for name, shape in zip(self._names, self._shapes, strict=True):
            size = shape.numel()
            params[name] = flat[offset:offset + size].view(shape)
            offset += size
        buffers = {n: b.to(theta.dtype) if b.is_floating_point() else b
                   for n, b in self._buffers.items()}
        return functional_call(self.net, (params, buffers), (x.to(theta.dtype),))

    def _jacobians(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Outputs ``(M, C)`` and Jacobians ``(M, C, P)`` at the trained values (float64)."""
        theta = self.map_parameters

        def one(t: torch.Tensor, xi: torch.Tensor) -> torch.Tensor:
            return self._network_at(t, xi.unsqueeze(0))[0]

        with torch.no_grad():
            outputs = self._network_at(theta, x)
        return outputs, vmap(jacrev(one), in_dims=(None, 0))(theta, x)

    def fit(self, x: torch.Tensor, y: torch.Tensor, batch_size: int = 256
            ) -> SubnetworkLaplace:
        """The GGN of the chosen parameters over ``(x, y)`` (``batch_size`` points' Jacobians
        at a time) and the log-likelihood at the trained network."""
        if len(x) != len(y):
            raise ValueError(f"x and y must hold the same number of points, got {len(x)} and "
                             f"{len(y)}")
        batch_size = validation.integer_at_least("batch_size", batch_size, 1)
        num = len(self.indices)
        full = torch.zeros(num, num, dtype=torch.float64, device=self._flat.device)
        diag = torch.zeros(num, dtype=torch.float64, device=self._flat.device)
        outputs = []
        for xb in x.split(batch_size):
            out, jac = self._jacobians(xb)
            lam = self.output_hessians(out)
            if self.structure == "full":
                full += torch.einsum("ncp,ncd,ndq->pq", jac, lam, jac)
            else:
                diag += torch.einsum("ncp,ncd,ndp->p", jac, lam, jac)
            outputs.append(out)
        c = outputs[0].shape[-1]
        self.curvature = (FullCurvature.from_matrix(full, c) if self.structure == "full"
                          else DiagCurvature.from_diagonal(diag, c))
        self.log_likelihood = self.log_likelihood_at(torch.cat(outputs), y)
        self.num_data = len(x)
        return self

    def functional(self, x: torch.Tensor, batch_size: int = 256
                   ) -> tuple[torch.Tensor, torch.Tensor]:
        curvature = self.fitted_curvature()
        means, covs = [], []
        for xb in x.split(batch_size):
            out, jac = self._jacobians(xb)
            means.append(out)
            covs.append(curvature.jacobian_covariance(jac, self.prior_precision))
        return torch.cat(means), torch.cat(covs)

    def sample_named(self, num_samples: int, generator: torch.Generator | None = None
                     ) -> dict[str, torch.Tensor]:
        """Draws of every parameter that holds a chosen entry, by name and in its shape
        (``(num_samples, *shape)``, its dtype; entries not chosen at their trained values)."""
        draws = self._flat.double().repeat(num_samples, 1)
        draws[:, self.indices] = self.sample(num_samples, generator)
        chosen = torch.zeros(len(self._flat), dtype=torch.bool, device=self._flat.device)
        chosen[self.indices] = True
        out, offset = {}, 0
        for name, shape in zip(self._names, self._shapes, strict=True):
            size = shape.numel()
            if bool(chosen[offset:offset + size].any()):
                out[name] = draws[:, offset:offset + size].reshape(num_samples, *shape).to(
                    self._flat.dtype)
            offset += size
        return out

    def _outputs_of(self, x: torch.Tensor, thetas: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            return torch.stack([self._network_at(theta, x) for theta in thetas])
