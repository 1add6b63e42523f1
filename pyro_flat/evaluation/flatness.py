r"""Flatness of a BNN posterior, measured on its draws.

Nguyen et al. (2023) define the sharpness at a parameter :math:`\theta` as the largest rise
of the training loss within a ball of radius :math:`\rho`,
:math:`S^{\max}_\rho(\theta) = \max_{\|\epsilon\|_2 \le \rho} L(\theta + \epsilon) -
L(\theta)` (:func:`max_sharpness`, by gradient ascent on the sphere). :func:`sharpness` is its
first-order estimate, the rise after one normalised ascent step of length :math:`\rho`,

.. math:: S_\rho(\theta) = L\big(\theta + \rho\, g / \|g\|_2\big) - L(\theta),
    \qquad g = \nabla L(\theta),

with :math:`L` the mean negative log-likelihood over the data (the cross-entropy of logits or
half the squared error, by ``task``, or any loss of the network's output given as ``loss``,
e.g. the Gaussian NLL of a mean-and-scale head) and the norm taken over all parameters
together (:func:`pyro_flat.optim.ascent.ascent_perturbation`: a zero or non-finite gradient gives no
step, so :math:`S_\rho = 0`); the paper reports the mean of :math:`S^{\max}_\rho` over
posterior draws. Besides it: the largest Hessian eigenvalue (:func:`hessian_top_eigenvalue`,
power iteration on Hessian-vector products) and one-dimensional slices of the loss landscape,
along a (filter-normalised) random direction (:func:`loss_along_direction`) or along the
segment between two parameter sets, e.g. :math:`\theta` and :math:`\theta_a` of Entropy-MCMC
(:func:`loss_along_segment`). The last three take a loss function of a ``{site: tensor}`` dict,
such as :func:`mean_loss` of a network.
Every function here works on copies of the draws and never changes the network or the draws it
is given.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

import pyro.poutine as poutine
import torch
import torch.nn.functional as F

from pyro_flat import validation
from pyro_flat.optim.ascent import ascent_perturbation
from pyro_flat.target.sites import latent_sites

#: A loss of the network's output: ``(output, y) -> per-point losses (B,) or their mean``.
Loss = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def _task_loss(task: str, loss: Loss | None) -> Loss:
    """``loss`` averaged over the points, or the loss of ``task`` (checked) if it is None."""
    if loss is not None:
        if not callable(loss):
            raise ValueError(f"loss must be a callable (output, y) -> loss, got {loss!r}")

        def mean(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
            value = loss(out, y)
            return value.mean() if value.dim() else value

        return mean
    if task == "classification":
        return F.cross_entropy
    return lambda out, y: 0.5 * (out.squeeze(-1) - y).square().mean()


def _mean_nll(net: Callable, params: Mapping[str, torch.Tensor], x, y, loss: Loss
              ) -> torch.Tensor:
    return loss(poutine.condition(net, data=dict(params))(x), y)


def sharpness(
    net: Callable,
    draws: Mapping[str, torch.Tensor],
    x: torch.Tensor,
    y: torch.Tensor,
    *,
    rho: float = 0.05,
    task: str = "classification",
    loss: Loss | None = None,
) -> torch.Tensor:
    r"""First-order sharpness :math:`S_\rho` of every draw, on the data ``(x, y)``: the rise
    of the loss after one normalised ascent step, the first iterate of :func:`max_sharpness`
    and a lower bound on the paper's :math:`S^{\max}_\rho` (exact to first order in
    :math:`\rho`). ``pyro-flat compare`` reports this one.

    Parameters
    ----------
    net : callable
        The Bayesian network (e.g. from :func:`pyro_flat.models.nn.make_bayesian`): ``net(x)``
        returns logits (classification) or predictions (regression, squared-error loss).
    draws : dict
        ``{site: tensor(num_draws, *shape)}``, e.g. ``mcmc.get_samples()``; sites the network
        does not sample are ignored.
    x, y : torch.Tensor
        The data the loss is measured on (the paper uses the training set).
    rho : float
        The radius of the ascent step, ``> 0``.
    task : {"classification", "regression"}
        Cross-entropy of logits, or half the squared error.
    loss : callable, optional
        ``loss(output, y)``: the loss of the network's output on ``y``, per point (``(B,)``,
        averaged here) or already averaged (a scalar), e.g. the Gaussian negative
        log-likelihood of a network that predicts a mean and a scale. It replaces the loss of
        ``task`` (which is then only checked).

    Returns
    -------
    torch.Tensor
        ``(num_draws,)`` first-order sharpness values.

    Examples
    --------
    >>> import torch
    >>> from pyro_flat.models.nn import make_bayesian
    >>> net = make_bayesian(torch.nn.Linear(3, 2))
    >>> draws = {"weight": torch.randn(4, 2, 3), "bias": torch.randn(4, 2)}
    >>> sharpness(net, draws, torch.randn(10, 3), torch.randint(0, 2, (10,))).shape
    torch.Size([4])

    References
    ----------
    Nguyen, V.-A. et al. (2023). Flat seeking Bayesian neural networks. NeurIPS.
    """
    rho = validation.positive("rho", rho)
    sites = _draw_sites(net, draws, x, y, task)
    loss_fn = _task_loss(task, loss)
    out = []
    for i in range(len(draws[sites[0]])):
        theta = {s: draws[s][i].detach().clone() for s in sites}
        value, step = _ascent_step(net, theta, x, y, loss_fn, rho)
        with torch.no_grad():  # no step for a zero or non-finite gradient
            moved = theta if step is None else _moved(theta, step)
            out.append(_mean_nll(net, moved, x, y, loss_fn) - value)
    return torch.stack(out)


def _draw_sites(net: Callable, draws: Mapping[str, torch.Tensor], x: torch.Tensor,
                y: torch.Tensor, task: str) -> list[str]:
    """The network's sampled sites, after checking the task, the data and that the draws hold
    every site."""
    _check_task_and_data(task, x, y)
    sites = _sampled_sites(net, x[:1])
    missing = [s for s in sites if s not in draws]
    if missing:
        raise ValueError(f"draws lack the network's sites {missing}")
    return sites


def _ascent_step(net: Callable, at: Params, x: torch.Tensor, y: torch.Tensor, loss_fn: Loss,
                 rho: float) -> tuple[torch.Tensor, dict[str, torch.Tensor | None] | None]:
    """The mean loss at ``at`` and the normalised ascent step ``rho g / |g|`` there, per site
    (``None`` for a site without gradient; ``None`` for a zero or non-finite gradient)."""
    params = {s: t.detach().requires_grad_() for s, t in at.items()}
    with torch.enable_grad():
        loss = _mean_nll(net, params, x, y, loss_fn)
        grads = torch.autograd.grad(loss, list(params.values()), allow_unused=True)
    step = ascent_perturbation(grads, rho)
    return loss.detach(), None if step is None else dict(zip(at, step, strict=True))


def _moved(theta: Params, step: Mapping[str, torch.Tensor | None]) -> dict[str, torch.Tensor]:
    """``theta + step`` site by site (a site without a step stays)."""
    return {s: t if step[s] is None else t + step[s] for s, t in theta.items()}


def max_sharpness(
    net: Callable,
    draws: Mapping[str, torch.Tensor],
    x: torch.Tensor,
    y: torch.Tensor,
    *,
    rho: float = 0.05,
    task: str = "classification",
    loss: Loss | None = None,
    steps: int = 10,
    restarts: int = 0,
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    r"""The sharpness as Nguyen et al. (2023) define it, the largest rise of the loss in the ball
    of radius :math:`\rho`, for every draw:

    .. math:: S^{\max}_\rho(\theta) = \max_{\|\epsilon\|_2 \le \rho}
        L(\theta + \epsilon) - L(\theta).

    :func:`sharpness` is its first-order estimate, the rise after one normalised gradient step;
    this function keeps ascending. From :math:`\epsilon_0 = 0` it iterates
    :math:`\epsilon_{k+1} = \rho\, g_k / \|g_k\|_2`, :math:`g_k = \nabla L(\theta +
    \epsilon_k)` (the generalised power method on the sphere, whose first iterate is
    :func:`sharpness`'s step and which increases :math:`L` at every iterate where :math:`L` is
    convex), and returns the largest rise seen over the ``steps`` iterates; ``restarts`` more
    runs start from points drawn uniformly on the sphere. The result is a lower bound on
    :math:`S^{\max}_\rho` that is at least :func:`sharpness` and grows with ``steps`` and
    ``restarts``. It costs ``steps * (restarts + 1)`` gradients per draw.

    Parameters
    ----------
    net, draws, x, y, rho, task, loss
        As for :func:`sharpness`.
    steps : int
        Ascent iterates per start, ``>= 1`` (``1``: :func:`sharpness`, or 0 where that is
        negative: the ball holds :math:`\epsilon = 0`).
    restarts : int
        Further starts from random points on the sphere, ``>= 0``.
    generator : torch.Generator, optional
        The random starts' stream (default: torch's global one).

    Returns
    -------
    torch.Tensor
        ``(num_draws,)`` values of :math:`S^{\max}_\rho`; their mean is the paper's measure.

    Examples
    --------
    >>> import torch
    >>> from pyro_flat.models.nn import make_bayesian
    >>> net = make_bayesian(torch.nn.Linear(3, 2))
    >>> draws = {"weight": torch.randn(4, 2, 3), "bias": torch.randn(4, 2)}
    >>> x, y = torch.randn(10, 3), torch.randint(0, 2, (10,))
    >>> bool((max_sharpness(net, draws, x, y) >= sharpness(net, draws, x, y) - 1e-6).all())
    True

    References
    ----------
    Nguyen, V.-A. et al. (2023). Flat seeking Bayesian neural networks. NeurIPS.
    Journée, M. et al. (2010). Generalized power method for sparse principal component
    analysis. JMLR (the ascent on the sphere).
    """
    rho = validation.positive("rho", rho)
    steps = validation.integer_at_least("steps", steps, 1)
    restarts = validation.integer_at_least("restarts", restarts, 0)
    sites = _draw_sites(net, draws, x, y, task)
    loss_fn = _task_loss(task, loss)
    out = []
    for i in range(len(draws[sites[0]])):
        theta = {s: draws[s][i].detach().clone() for s in sites}
        with torch.no_grad():
            base = _mean_nll(net, theta, x, y, loss_fn)
        best = torch.zeros((), dtype=base.dtype)
        for start in range(restarts + 1):
            # theta + eps_k (None: theta itself, which is not scored: its rise is 0)
            point = None if start == 0 else _moved(
                theta, _random_on_sphere(theta, rho, generator))
            for _ in range(steps):
                value, step = _ascent_step(net, theta if point is None else point, x, y,
                                           loss_fn, rho)
                if point is not None:
                    best = torch.maximum(best, value - base)
                if step is None:  # a zero or non-finite gradient: a stationary point
                    break
                point = _moved(theta, step)  # eps_{k+1} = rho g_k / |g_k|, from theta
            if point is not None:
                with torch.no_grad():
                    best = torch.maximum(best, _mean_nll(net, point, x, y, loss_fn) - base)
        out.append(best)
    return torch.stack(out)


def _random_on_sphere(theta: Mapping[str, torch.Tensor], rho: float,
                      generator: torch.Generator | None) -> dict[str, torch.Tensor]:
    """A point drawn uniformly on the sphere of radius ``rho`` over all the tensors."""
    z = {s: torch.randn(t.shape, dtype=t.dtype, generator=generator).to(t.device)
         for s, t in theta.items()}
    norm = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(v)
                                                 for v in z.values()]))
    return {s: v * (rho / norm) for s, v in z.items()}


def _sampled_sites(net: Callable, x: torch.Tensor) -> list[str]:
    with torch.no_grad():
        trace = poutine.trace(net).get_trace(x)
    return list(latent_sites(trace))


Params = Mapping[str, torch.Tensor]


def mean_loss(
    net: Callable, x: torch.Tensor, y: torch.Tensor, task: str = "classification", *,
    loss: Loss | None = None,
) -> Callable[[Params], torch.Tensor]:
    """The mean negative log-likelihood of ``net`` on ``(x, y)`` as a function of its sites.

    ``mean_loss(net, x, y)(params)`` runs ``net(x)`` with its sampled sites set to ``params``
    (cross-entropy of logits, or half the squared error for ``task="regression"``; or
    ``loss(output, y)``, per point or averaged, when given, as in :func:`sharpness`), the loss
    :func:`sharpness` measures.

    Examples
    --------
    >>> import torch
    >>> from pyro_flat.models.nn import make_bayesian
    >>> net = make_bayesian(torch.nn.Linear(1, 1, bias=False))
    >>> x, y = torch.ones(3, 1), torch.zeros(3)
    >>> abs_error = lambda out, y: (out.squeeze(-1) - y).abs()  # per point, averaged
    >>> float(mean_loss(net, x, y, loss=abs_error)({"weight": torch.tensor([[-2.0]])}))
    2.0
    """
    _check_task_and_data(task, x, y)
    loss_fn = _task_loss(task, loss)
    return lambda params: _mean_nll(net, params, x, y, loss_fn)


def _check_task_and_data(task: str, x: torch.Tensor, y: torch.Tensor) -> None:
    if task not in ("classification", "regression"):
        raise ValueError(f"task must be 'classification' or 'regression', got {task!r}")
    if not (torch.is_tensor(x) and torch.is_tensor(y)) or x.dim() < 1 or y.dim() < 1:
        raise ValueError("x and y must be tensors with one row per data point")
    if len(x) != len(y) or len(x) == 0:
        raise ValueError(
            f"y must hold one target per row of x, and x at least one row: len(x) = {len(x)}, "
            f"len(y) = {len(y)}"
        )


def _leaves(params: Params) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone().requires_grad_() for k, v in params.items()}


def hessian_top_eigenvalue(
    loss_fn: Callable[[Params], torch.Tensor],
    params: Params,
    *,
    num_iters: int = 100,
    tol: float = 1e-6,
    generator: torch.Generator | None = None,
) -> tuple[float, dict[str, torch.Tensor]]:
    r"""The eigenvalue of largest magnitude of the Hessian of ``loss_fn`` at ``params``.

    Power iteration :math:`v \leftarrow Hv / \|Hv\|` on Hessian-vector products (double
    backward, never forming :math:`H`), from a random unit vector, until the Rayleigh quotient
    :math:`\lambda = v^\top H v` changes by less than ``tol`` relative to
    :math:`|\lambda|`, or after ``num_iters`` products. At a minimum the Hessian is positive
    semi-definite and this is the largest eigenvalue, the usual measure of sharpness
    (Keskar et al. 2017); elsewhere it may be a negative one. Convergence is geometric in the
    ratio of the two largest eigenvalue magnitudes.

    Returns
    -------
    (float, dict)
        :math:`\lambda` and the unit eigenvector, shaped like ``params``.

    Examples
    --------
    >>> a = torch.tensor([[3.0, 1.0], [1.0, 2.0]], dtype=torch.float64)
    >>> lam, _ = hessian_top_eigenvalue(lambda p: p["w"] @ a @ p["w"] / 2,
    ...                                 {"w": torch.ones(2, dtype=torch.float64)})
    >>> round(lam, 5), round(float(torch.linalg.eigvalsh(a)[-1]), 5)
    (3.61803, 3.61803)
    """
    num_iters = validation.integer_at_least("num_iters", num_iters, 1)
    tol = validation.positive("tol", tol)
    leaves = _leaves(params)
    with torch.enable_grad():
        loss = loss_fn(leaves)
        grads = torch.autograd.grad(loss, list(leaves.values()), create_graph=True,
                                    allow_unused=True) if loss.requires_grad else []
    v = [torch.randn(p.shape, dtype=p.dtype, generator=generator).to(p.device)
         for p in leaves.values()]
    norm = torch.sqrt(sum(t.square().sum() for t in v))
    v = [t / norm for t in v]
    # the parts of the gradient that still depend on the parameters (none: a linear loss)
    curved = [i for i, g in enumerate(grads) if g is not None and g.requires_grad]
    if not curved:
        return 0.0, dict(zip(leaves, v, strict=True))
    lam = None
    for _ in range(num_iters):
        hv = torch.autograd.grad([grads[i] for i in curved], list(leaves.values()),
                                 grad_outputs=[v[i] for i in curved], retain_graph=True,
                                 allow_unused=True)
        hv = [torch.zeros_like(t) if h is None else h.detach() for h, t in zip(hv, v, strict=True)]
        new = float(sum((a * b).sum() for a, b in zip(v, hv, strict=True)))
        norm = torch.sqrt(sum(t.square().sum() for t in hv))
        if float(norm) == 0.0:
            return 0.0, dict(zip(leaves, v, strict=True))
        v = [t / norm for t in hv]
        converged = lam is not None and abs(new - lam) <= tol * max(abs(new), 1e-30)
        lam = new
        if converged:
            break
    return lam, dict(zip(leaves, [t.detach() for t in v], strict=True))


def random_direction(
    params: Params, *, filter_normalize: bool = True, generator: torch.Generator | None = None
) -> dict[str, torch.Tensor]:
    """A Gaussian random direction shaped like ``params``.

    With ``filter_normalize`` (Li et al. 2018, "Visualizing the loss landscape of neural
    nets"), each filter (a slice along the first dimension of a weight of two or more
    dimensions) is rescaled to the norm of the same filter of ``params``, and one-dimensional
    sites (biases) get no direction, so slices of networks of different scale compare.
    """
    out = {}
    for name, p in params.items():
        d = torch.randn(p.shape, dtype=p.dtype, generator=generator).to(p.device)
        if filter_normalize:
            if p.dim() <= 1:
                d = torch.zeros_like(d)
            else:
                dims = tuple(range(1, p.dim()))
                # vector norms over each filter, whatever its rank (Tensor.norm takes a
                # 2-tuple of dims for a matrix norm and refuses three)
                norm = torch.linalg.vector_norm
                d = d * (norm(p.detach(), dim=dims, keepdim=True)
                         / norm(d, dim=dims, keepdim=True).clamp_min(1e-12))
        out[name] = d
    return out


def loss_along_direction(
    loss_fn: Callable[[Params], torch.Tensor],
    params: Params,
    direction: Params | None = None,
    alphas: Sequence[float] | torch.Tensor = tuple(i / 10 for i in range(-10, 11)),
    *,
    generator: torch.Generator | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    r"""The loss :math:`L(\theta + \alpha d)` on a grid of :math:`\alpha`.

    ``direction`` defaults to a filter-normalised :func:`random_direction`.

    Returns
    -------
    (torch.Tensor, torch.Tensor)
        The ``alphas`` and the losses, float64.
    """
    if direction is None:
        direction = random_direction(params, generator=generator)
    missing = set(params) - set(direction)
    if missing:
        raise ValueError(f"direction lacks the sites {sorted(missing)}")
    alphas = torch.as_tensor(alphas, dtype=torch.float64)
    losses = []
    with torch.no_grad():
        for a in alphas.tolist():
            moved = {k: p.detach() + a * direction[k] for k, p in params.items()}
            losses.append(float(loss_fn(moved)))
    return alphas, torch.tensor(losses, dtype=torch.float64)


def loss_along_segment(
    loss_fn: Callable[[Params], torch.Tensor],
    start: Params,
    end: Params,
    num_points: int = 21,
    *,
    extend: float = 0.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    r"""The loss along the line through ``start`` (:math:`\alpha = 0`) and ``end`` (1).

    Evaluates :math:`L((1 - \alpha)\,\theta_0 + \alpha\,\theta_1)` at ``num_points``
    evenly spaced :math:`\alpha \in [-\text{extend}, 1 + \text{extend}]`: a barrier between two
    draws shows as a bump, a flat basin as a flat profile (e.g. :math:`\theta` and
    :math:`\theta_a` of one Entropy-MCMC draw; see
    :func:`pyro_flat.infer.mcmc.entropy.select_draws`).
    """
    num_points = validation.integer_at_least("num_points", num_points, 2)
    extend = validation.nonnegative("extend", extend)
    if set(start) != set(end):
        raise ValueError(f"start and end must have the same sites, got {sorted(start)} and "
                         f"{sorted(end)}")
    alphas = torch.linspace(-extend, 1 + extend, num_points, dtype=torch.float64)
    direction = {k: end[k].detach() - start[k].detach() for k in start}
    return loss_along_direction(loss_fn, start, direction, alphas)
