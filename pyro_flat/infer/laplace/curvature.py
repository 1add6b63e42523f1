r"""The generalised Gauss-Newton curvature of a linear last layer, in three structures.

For a last layer :math:`f = W\phi + b` (``W`` of shape ``(C, H)``) and the likelihood's Hessian
in the outputs :math:`\Lambda_n = -\nabla_f^2 \log p(y_n \mid f_n)` (``(C, C)``: for a softmax,
:math:`\mathrm{diag}(p_n) - p_n p_n^\top`; for a Gaussian of scale :math:`\sigma`,
:math:`I/\sigma^2`), the GGN of the parameters :math:`\theta = (\mathrm{vec}(W), b)` (``W`` row
by row, then ``b``) is

.. math:: H = \sum_n J_n^\top \Lambda_n J_n, \qquad J_n = [\,I_C \otimes \phi_n^\top,\; I_C\,],

kept whole (:class:`FullCurvature`), by its diagonal (:class:`DiagCurvature`), or Kronecker
factored (:class:`KronCurvature`: :math:`H_W \approx G \otimes A`, :math:`G = \sum_n
\Lambda_n`, :math:`A = \frac1N \sum_n \phi_n\phi_n^\top`, and :math:`H_b = G` exactly, the
two blocks independent; Martens & Grosse, 2015). The posterior precision is
:math:`P = H + \delta I` for a prior precision :math:`\delta`. Each structure gives
:math:`\log\det P`, the covariance of the outputs at new features :math:`J \Sigma J^\top`
(:math:`\Sigma = P^{-1}`) and draws :math:`\Sigma^{1/2}\varepsilon`.

References
----------
Martens, J. and Grosse, R. (2015). Optimizing neural networks with Kronecker-factored
approximate curvature. ICML.
Daxberger, E. et al. (2021). Laplace Redux: effortless Bayesian deep learning. NeurIPS.
"""

from __future__ import annotations

import torch

__all__ = ["Curvature", "DiagCurvature", "FullCurvature", "KronCurvature", "STRUCTURES"]


class Curvature:
    """The GGN of a last layer with ``C`` outputs and ``H`` features (and a bias)."""

    def __init__(self, num_outputs: int, num_features: int):
        self.num_outputs, self.num_features = num_outputs, num_features

    @property
    def num_parameters(self) -> int:
        return self.num_outputs * (self.num_features + 1)

    def log_det(self, prior_precision: float) -> torch.Tensor:
        r""":math:`\log\det(H + \delta I)`."""
        raise NotImplementedError

    def output_covariance(self, features: torch.Tensor, prior_precision: float) -> torch.Tensor:
        r""":math:`J \Sigma J^\top` at features ``(M, H)``: ``(M, C, C)``."""
        return self.jacobian_covariance(_jacobian_rows(features, self.num_outputs),
                                        prior_precision)

    def jacobian_covariance(self, jacobian: torch.Tensor, prior_precision: float
                            ) -> torch.Tensor:
        r""":math:`J \Sigma J^\top` for Jacobians ``(M, C, P)``: ``(M, C, C)``."""
        raise NotImplementedError

    def scale_noise(self, noise: torch.Tensor, prior_precision: float) -> torch.Tensor:
        r""":math:`\Sigma^{1/2}\varepsilon` for standard normal ``noise`` ``(S, P)``: draws of
        :math:`\theta - \theta_{MAP}`."""
        raise NotImplementedError


def _jacobian_rows(features: torch.Tensor, num_outputs: int) -> torch.Tensor:
    """``J`` at each row of ``features`` ``(M, H)``: ``(M, C, C (H + 1))``."""
    m, h = features.shape
    eye = torch.eye(num_outputs, dtype=features.dtype, device=features.device)
    weight = torch.einsum("cd,mh->mcdh", eye, features).reshape(m, num_outputs,
                                                                 num_outputs * h)
    return torch.cat([weight, eye.expand(m, -1, -1)], dim=-1)


class FullCurvature(Curvature):
    """The whole GGN, ``(P, P)`` with ``P = C (H + 1)``."""

    def __init__(self, features: torch.Tensor, output_hessians: torch.Tensor):
        super().__init__(output_hessians.shape[-1], features.shape[-1])
        c, h = self.num_outputs, self.num_features
        lam, phi = output_hessians, features
        ww = torch.einsum("ncd,nh,nk->chdk", lam, phi, phi).reshape(c * h, c * h)
        wb = torch.einsum("ncd,nh->chd", lam, phi).reshape(c * h, c)
        bb = lam.sum(0)
        self.matrix = torch.cat([torch.cat([ww, wb], 1), torch.cat([wb.T, bb], 1)], 0)

    @classmethod
    def from_matrix(cls, matrix: torch.Tensor, num_outputs: int) -> FullCurvature:
        """The GGN given whole, of any parameters (a subnetwork's)."""
        self = cls.__new__(cls)
        self.num_outputs, self.num_features, self.matrix = num_outputs, None, matrix
        return self

    @property
    def num_parameters(self) -> int:
        return len(self.matrix)

    def _cholesky(self, prior_precision: float) -> torch.Tensor:
        eye = torch.eye(len(self.matrix), dtype=self.matrix.dtype, device=self.matrix.device)
        return torch.linalg.cholesky(self.matrix + prior_precision * eye)

    def log_det(self, prior_precision: float) -> torch.Tensor:
        return 2.0 * self._cholesky(prior_precision).diagonal().log().sum()

    def jacobian_covariance(self, jacobian: torch.Tensor, prior_precision: float
                            ) -> torch.Tensor:
        jac = jacobian  # (M, C, P)
        chol = self._cholesky(prior_precision)
        # J L^-T: solve L X^T = J^T
        half = torch.linalg.solve_triangular(chol, jac.transpose(1, 2), upper=False)
        return half.transpose(1, 2) @ half

    def scale_noise(self, noise: torch.Tensor, prior_precision: float) -> torch.Tensor:
        chol = self._cholesky(prior_precision)  # P = L L^T, Sigma^(1/2) = L^-T
        return torch.linalg.solve_triangular(chol.T, noise.T, upper=True).T


class DiagCurvature(Curvature):
    """The GGN's diagonal, ``(P,)``."""

    def __init__(self, features: torch.Tensor, output_hessians: torch.Tensor):
        super().__init__(output_hessians.shape[-1], features.shape[-1])
        lam = output_hessians.diagonal(dim1=-2, dim2=-1)  # (N, C)
        weight = torch.einsum("nc,nh->ch", lam, features.square()).reshape(-1)
        self.diagonal = torch.cat([weight, lam.sum(0)])

    @classmethod
    def from_diagonal(cls, diagonal: torch.Tensor, num_outputs: int) -> DiagCurvature:
        """The GGN's diagonal given, of any parameters (a subnetwork's)."""
        self = cls.__new__(cls)
        self.num_outputs, self.num_features, self.diagonal = num_outputs, None, diagonal
        return self

    @property
    def num_parameters(self) -> int:
        return len(self.diagonal)

    def jacobian_covariance(self, jacobian: torch.Tensor, prior_precision: float
                            ) -> torch.Tensor:
        return (jacobian / (self.diagonal + prior_precision)) @ jacobian.transpose(1, 2)

    def log_det(self, prior_precision: float) -> torch.Tensor:
        return (self.diagonal + prior_precision).log().sum()

    def output_covariance(self, features: torch.Tensor, prior_precision: float) -> torch.Tensor:
        c, h = self.num_outputs, self.num_features
        variance = 1.0 / (self.diagonal + prior_precision)
        weight, bias = variance[: c * h].reshape(c, h), variance[c * h:]
        return torch.diag_embed(features.square() @ weight.T + bias)

    def scale_noise(self, noise: torch.Tensor, prior_precision: float) -> torch.Tensor:
        return noise / (self.diagonal + prior_precision).sqrt()


class KronCurvature(Curvature):
    r"""Kronecker factors: :math:`H_W \approx G \otimes A`, :math:`H_b = G`, held by their
    eigendecompositions (the eigenvalues of :math:`G \otimes A + \delta I` are
    :math:`g_i a_j + \delta`)."""

    def __init__(self, features: torch.Tensor, output_hessians: torch.Tensor):
        super().__init__(output_hessians.shape[-1], features.shape[-1])
        n = len(features)
        g = output_hessians.sum(0)
        a = features.T @ features / n
        self.g_values, self.g_vectors = torch.linalg.eigh(g)
        self.a_values, self.a_vectors = torch.linalg.eigh(a)
        self.g_values.clamp_(min=0.0)
        self.a_values.clamp_(min=0.0)

    def _weight_values(self) -> torch.Tensor:
        return torch.outer(self.g_values, self.a_values)  # (C, H)

    def log_det(self, prior_precision: float) -> torch.Tensor:
        return ((self._weight_values() + prior_precision).log().sum()
                + (self.g_values + prior_precision).log().sum())

    def output_covariance(self, features: torch.Tensor, prior_precision: float) -> torch.Tensor:
        u2 = (features @ self.a_vectors).square()  # (M, H), features in A's eigenbasis
        weight = u2 @ (1.0 / (self._weight_values() + prior_precision)).T  # (M, C)
        inner = weight + 1.0 / (self.g_values + prior_precision)  # + the bias block
        q = self.g_vectors
        return torch.einsum("ci,mi,di->mcd", q, inner, q)

    def scale_noise(self, noise: torch.Tensor, prior_precision: float) -> torch.Tensor:
        c, h = self.num_outputs, self.num_features
        weight = noise[:, : c * h].reshape(-1, c, h)
        weight = weight / (self._weight_values() + prior_precision).sqrt()
        weight = self.g_vectors @ weight @ self.a_vectors.T  # (Q_G kron Q_A) eps
        bias = (noise[:, c * h:] / (self.g_values + prior_precision).sqrt()) @ self.g_vectors.T
        return torch.cat([weight.reshape(len(noise), -1), bias], dim=-1)


#: The structures by name (``LastLayerLaplace(structure=...)``).
STRUCTURES: dict[str, type[Curvature]] = {"full": FullCurvature, "diag": DiagCurvature,
                                          "kron": KronCurvature}
