"""Shared statistical test harness for the samplers.

Every tolerance is derived from Monte Carlo error: the effective sample size (ESS) of the chain
gives the standard error of each estimated moment, and a check passes when the estimate lies
within ``Z`` standard errors (plus any known discretisation bias) of the truth. ``Z = 4.5``
makes a false failure of one check rarer than 1 in 100,000 for a Gaussian estimator. Each
helper also asserts that the chain is long enough for the check to be able to fail on a wrong
sampler: a fixed target tolerance (e.g. the issue's 0.1) must be at least ``Z`` standard errors.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import pyro
import pyro.distributions as dist
import torch
from pyro.infer import MCMC
from pyro.ops.stats import effective_sample_size
from torch import nn

from pyro_flat.models.bnn import BNN
from pyro_flat.models.likelihoods import HomoskedasticGaussian

Z = 4.5


@dataclass
class GaussianTarget:
    """``K`` independent copies of ``N(mean, cov)`` as one potential over the site ``"x"``.

    The site has shape ``(K, dim)``: every SG-MCMC update is elementwise, so one kernel run
    yields ``K`` independent chains, which makes Monte Carlo errors small at little cost.
    ``grad_noise`` adds ``grad_noise * sum(xi * x)`` to ``U`` (``xi ~ N(0, I)`` fresh per call):
    the gradient carries ``N(0, grad_noise^2 I)`` noise, the energy a zero-mean perturbation.
    """

    mean: torch.Tensor
    cov: torch.Tensor
    grad_noise: float = 0.0
    num_chains: int = 256

    def __post_init__(self) -> None:
        self.precision = torch.linalg.inv(self.cov)

    def __call__(self, params: dict[str, torch.Tensor]) -> torch.Tensor:
        x = params["x"]
        d = x - self.mean
        u = 0.5 * ((d @ self.precision) * d).sum()
        if self.grad_noise:
            u = u + self.grad_noise * (torch.randn_like(x) * x).sum()
        return u

    def initial_params(self) -> dict[str, torch.Tensor]:
        return {"x": torch.zeros(self.num_chains, len(self.mean))}


def correlated_2d(grad_noise: float = 0.0, num_chains: int = 256) -> GaussianTarget:
    return GaussianTarget(
        torch.tensor([1.0, -1.0]), torch.tensor([[1.0, 0.5], [0.5, 1.0]]), grad_noise, num_chains
    )


def run(kernel, num_samples: int, warmup_steps: int, seed: int = 0, *args, **kwargs) -> MCMC:
    pyro.set_rng_seed(seed)
    mcmc = MCMC(kernel, num_samples=num_samples, warmup_steps=warmup_steps,
                disable_progbar=True, **kwargs)
    mcmc.run(*args)
    return mcmc


def chains_of(mcmc: MCMC, site: str = "x") -> torch.Tensor:
    """Draws of a vectorised ``GaussianTarget`` as ``(chains, draws, dim)``."""
    return mcmc.get_samples()[site].transpose(0, 1)


def ess(x: torch.Tensor) -> torch.Tensor:
    """ESS of each coordinate of chains ``x`` of shape ``(chains, draws, dim)``."""
    return effective_sample_size(x.double(), chain_dim=0, sample_dim=1)


def stationary_covariance(transition: torch.Tensor, noise_cov: torch.Tensor) -> torch.Tensor:
    """The solution ``P = F P F^T + Q`` of the discrete Lyapunov equation (doubling algorithm).

    A linear update ``z' = F z + c + noise`` on a Gaussian target has this stationary
    covariance exactly, so samplers are checked against the law of their own discretisation.
    """
    f, p = transition.double(), noise_cov.double()
    for _ in range(64):
        p = p + f @ p @ f.T
        f = f @ f
        if float(f.abs().max()) < 1e-30:
            break
    return p


def gaussian_kl(m1, c1, m2, c2) -> float:
    """KL(N(m1, c1) || N(m2, c2))."""
    m1, c1, m2, c2 = (t.double() for t in (m1, c1, m2, c2))
    k = m1.numel()
    p2 = torch.linalg.inv(c2)
    d = m2 - m1
    return 0.5 * float(
        torch.trace(p2 @ c1) + d @ p2 @ d - k + torch.logdet(c2) - torch.logdet(c1)
    )


def moments_with_errors(chains: torch.Tensor):
    """Pooled mean and covariance of ``(chains, draws, dim)``, and their standard errors (ESS)."""
    x = chains.double()
    flat = x.reshape(-1, x.shape[-1])
    m = flat.mean(0)
    se_mean = (flat.var(0) / ess(x)).sqrt()
    d = x - m
    prods = (d.unsqueeze(-1) * d.unsqueeze(-2)).flatten(-2)
    c = prods.reshape(-1, prods.shape[-1]).mean(0)
    se_cov = (prods.reshape(-1, prods.shape[-1]).var(0) / ess(prods)).sqrt()
    dim = x.shape[-1]
    return m, c.reshape(dim, dim), se_mean, se_cov.reshape(dim, dim)


def check_gaussian(chains: torch.Tensor, mean, cov, *, exact_cov=None, target_tol: float = 0.1,
                   kl_max: float = 0.01) -> dict:
    """Check draws ``(chains, draws, dim)`` of a Gaussian target.

    1. Against the sampler's own exact stationary law (``exact_cov``, from
       :func:`stationary_covariance`; the mean is exact for these linear schemes): every moment
       within ``Z`` standard errors. This catches any error in an update rule.
    2. Against the target ``N(mean, cov)``: every moment within ``target_tol`` and
       KL(fitted || true) below ``kl_max`` (the issue's accuracy targets), after asserting that
       ``Z`` standard errors plus the discretisation bias fit inside ``target_tol``.
    """
    m, c, se_mean, se_cov = moments_with_errors(chains)
    mean, cov = mean.double(), cov.double()
    if exact_cov is not None:
        exact_cov = exact_cov.double()
        assert torch.all((m - mean).abs() <= Z * se_mean), f"mean {m} vs {mean} (se {se_mean})"
        assert torch.all((c - exact_cov).abs() <= Z * se_cov), (
            f"cov {c} vs the exact stationary {exact_cov} (se {se_cov})"
        )
        bias = float((exact_cov - cov).abs().max())
        assert float((Z * se_cov).max()) + bias <= target_tol, "chain too short for the target"
    assert float((Z * se_mean).max()) <= target_tol, "chain too short for the target"
    assert torch.all((m - mean).abs() <= target_tol), f"mean {m} vs {mean}"
    assert torch.all((c - cov).abs() <= target_tol), f"cov {c} vs {cov}"
    kl = gaussian_kl(m, c, mean, cov)
    assert kl < kl_max, f"KL(fitted || true) = {kl}"
    return {"mean": m, "cov": c, "se_mean": se_mean, "se_cov": se_cov, "kl": kl}


# ---------------------------------------------------------------- models (importable: spawn)


def BayesianLinearRegression(  # noqa: N802 (reads as the model class it builds)
    dim: int, prior_scale: float, sigma: float, batch_size: int | None
) -> BNN:
    """``y = x w + b + N(0, sigma^2)`` with ``w, b ~ N(0, prior_scale^2)`` (sites
    ``net.weight``, ``net.bias``), minibatched by ``batch_size`` (``None``: full batch)."""
    return BNN(nn.Linear(dim, 1), HomoskedasticGaussian(scale=sigma), prior_scale=prior_scale,
               subsample_size=batch_size)


def linear_regression_posterior(x, y, prior_scale: float, sigma: float):
    """Closed-form posterior of ``(w_1..w_d, b)``: mean and covariance."""
    design = torch.cat([x, torch.ones(len(x), 1)], dim=1).double()
    precision = design.T @ design / sigma**2 + torch.eye(design.shape[1]) / prior_scale**2
    cov = torch.linalg.inv(precision)
    mean = cov @ design.T @ y.double() / sigma**2
    return mean, cov


def linear_regression_data(n: int = 400, dim: int = 2, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, dim, generator=g)
    w = torch.tensor([1.5, -0.7])[:dim]
    y = x @ w + 0.3 + torch.randn(n, generator=g)
    return x, y


def regression_draws(mcmc: MCMC, site_prefix: str = "net") -> torch.Tensor:
    s = mcmc.get_samples()
    w = s[f"{site_prefix}.weight"].reshape(len(s[f"{site_prefix}.weight"]), -1)
    b = s[f"{site_prefix}.bias"].reshape(len(w), -1)
    return torch.cat([w, b], dim=1)


def logistic_model(x: torch.Tensor, y: torch.Tensor) -> None:
    """A small full-batch logistic regression (no subsampling), for SGLD-vs-NUTS checks."""
    w = pyro.sample("w", dist.Normal(0.0, 1.0).expand([x.shape[1]]).to_event(1))
    b = pyro.sample("b", dist.Normal(0.0, 1.0))
    with pyro.plate("data", x.shape[0]):
        pyro.sample("y", dist.Bernoulli(logits=x @ w + b), obs=y)


def mc_tolerance(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``Z`` standard errors of the difference of the means of two independent single chains
    ``(draws, dim)``."""
    a, b = a.double(), b.double()
    se2 = a.var(0) / ess(a.unsqueeze(0)) + b.var(0) / ess(b.unsqueeze(0))
    return Z * se2.sqrt()


def sqrt_ratio_tolerance(n_eff: torch.Tensor) -> float:
    """``Z`` relative standard errors of a sample standard deviation from ``n_eff`` draws."""
    return Z / math.sqrt(2 * float(n_eff.min()))


def langevin_exact_cov(hessian: torch.Tensor, step_size: float, temperature: float = 1.0,
                       grad_noise: float = 0.0) -> torch.Tensor:
    """Stationary covariance of Euler-Maruyama Langevin on a quadratic energy with ``hessian``
    (``x' = x - eps H x + N(0, 2 eps T + eps^2 s^2)``)."""
    h = hessian.double()
    i = torch.eye(len(h), dtype=torch.double)
    q = (2 * step_size * temperature + step_size**2 * grad_noise**2) * i
    return stationary_covariance(i - step_size * h, q)


def underdamped_exact_cov(hessian: torch.Tensor, step_size: float, friction: float, mass: float,
                          temperature: float = 1.0) -> torch.Tensor:
    """Stationary covariance of the positions under the SGHMC step of
    :func:`pyro_flat.infer.mcmc.integrators.underdamped_step_` on a quadratic energy:
    ``r' = (1 - eps C/M) r - eps H x + n``, ``x' = x + eps/M r'``, ``n ~ N(0, 2 C eps T)``."""
    h = hessian.double()
    d = len(h)
    i = torch.eye(d, dtype=torch.double)
    eps, decay = step_size, 1 - step_size * friction / mass
    f = torch.cat([
        torch.cat([i - eps**2 / mass * h, eps / mass * decay * i], dim=1),
        torch.cat([-eps * h, decay * i], dim=1),
    ])
    g = torch.cat([eps / mass * i, i])
    return stationary_covariance(f, 2 * friction * eps * temperature * g @ g.T)[:d, :d]


def assert_resume_continues(make_kernel, *args, seed: int = 3, through_file=None):
    """Run 4 + 20 draws at once, and 4 + 10 draws, a checkpoint, then 10 more draws in a new
    kernel (under another seed: the checkpoint's random state must win); the last 10 draws must
    be equal bit for bit. ``through_file``: a path the checkpoint is written to with
    ``torch.save`` and read back with ``torch.load``'s defaults (``weights_only=True``).
    Returns the two runs ``(whole, second)``."""
    whole = run(make_kernel(), 20, 4, seed, *args)
    first = run(make_kernel(), 10, 4, seed, *args)
    resumed = make_kernel()
    state = first.kernel.state_dict()
    if through_file is not None:
        torch.save(state, through_file)
        state = torch.load(through_file)
    resumed.load_state_dict(state)
    second = run(resumed, 10, 0, seed + 1000, *args)
    for site, values in whole.get_samples().items():
        assert torch.equal(values[10:], second.get_samples()[site]), site
    return whole, second


def every_kernel(step_size: float) -> dict:
    """Every pyro_flat kernel at a given step size with small-model settings, by name:
    ``make(model, **kwargs)``."""
    from pyro_flat.infer import L2E, SASGLD, SGHMC, SGLD, ContourSGLD, CyclicalSGLD, EntropyMCMC

    eps = step_size
    return {
        "SGLD": lambda m, **kw: SGLD(m, eps, **kw),
        "SGHMC": lambda m, **kw: SGHMC(m, eps, **kw),
        "CyclicalSGLD": lambda m, **kw: CyclicalSGLD(m, eps, cycle_length=5, **kw),
        "EntropyMCMC": lambda m, **kw: EntropyMCMC(m, eps, eta=0.01, **kw),
        "ContourSGLD": lambda m, **kw: ContourSGLD(m, eps, num_bins=10, auto_bins=True, **kw),
        "SASGLD": lambda m, **kw: SASGLD(m, eps, rho=0.01, **kw),
        "L2E": lambda m, **kw: L2E(m, eps, **kw),
    }


def unconstrained(name: str) -> torch.Tensor:
    """The unconstrained leaf tensor of Pyro's param ``name``, through the param store's public
    ``named_parameters`` (tests that move or inspect a guide's raw parameters)."""
    return dict(pyro.get_param_store().named_parameters())[name]
