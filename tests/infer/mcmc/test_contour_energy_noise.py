"""ContourSGLD on minibatches whose energy noise is larger than the spread of the target's
energies (pyro_flat.infer.mcmc.energy_noise): warmup measures both from its energies, such a
chain does not flatten (it runs as SGLD, log_weight 0) and the run warns; a chain whose noise
is below the spread flattens as before."""

from __future__ import annotations

import math
import warnings

import pyro
import pyro.distributions as dist
import pytest
import torch
from pyro.infer import MCMC

from pyro_flat.infer import SGLD, ContourSGLD
from pyro_flat.infer.mcmc.energy_noise import energy_noise

NOISE = 0.5
N = 400
X = torch.randn(N, 2, generator=torch.Generator().manual_seed(11))
Y = X @ torch.tensor([1.0, -2.0]) + NOISE * torch.randn(N, generator=torch.Generator()
                                                        .manual_seed(12))
PRIOR_ONLY = 800  # latents the data do not see: 20 nats of energy spread, no minibatch noise
PRIOR_SCALE = 0.03  # their curvature (1,100) near the likelihood's (1,600): they mix in warmup


def model(x, y, subsample_size=None):
    """A Gaussian posterior: regression weights ``w`` and ``PRIOR_ONLY`` normal latents ``z``
    that the data do not see."""
    pyro.sample("z", dist.Normal(0.0, PRIOR_SCALE).expand([PRIOR_ONLY]).to_event(1))
    w = pyro.sample("w", dist.Normal(0.0, 1.0).expand([2]).to_event(1))
    with pyro.plate("data", len(x), subsample_size=subsample_size) as i:
        pyro.sample("y", dist.Normal(x[i] @ w, NOISE), obs=y[i])


def _posterior_of_w() -> tuple[torch.Tensor, torch.Tensor]:
    x, y = X.double(), Y.double()
    precision = torch.eye(2, dtype=torch.float64) + x.T @ x / NOISE**2
    covariance = torch.linalg.inv(precision)
    return covariance @ (x.T @ y) / NOISE**2, covariance.diagonal().sqrt()


def _run(subsample_size: int, chains: int | None, seed: int = 0):
    pyro.set_rng_seed(seed)
    kernel = ContourSGLD(model, step_size=1e-5, num_steps_per_sample=20, num_bins=20,
                         auto_bins=True, zeta=1.0, vectorized_chains=chains)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        mcmc = MCMC(kernel, num_samples=300, warmup_steps=100, disable_progbar=True)
        mcmc.run(X, Y, subsample_size)
    said = [str(w.message) for w in caught if "minibatch energies scatter" in str(w.message)]
    return kernel, mcmc, said


def test_the_estimate_separates_noise_and_spread_of_a_chain():
    """Energies with an epoch's structure (its batches' noise sums to zero over the epoch) and a
    level that drifts slowly: the noise sd and the level's sd are recovered within 10% (the
    level's sd from 100 epochs has a relative error of about 7%)."""
    g = torch.Generator().manual_seed(0)
    level = torch.cumsum(0.3 * torch.randn(100 * 8, generator=g), 0)  # a random walk
    level = (level - level.mean()) / level.std() * 4.0  # sd 4 over the run
    noise = 30.0 * torch.randn(100, 8, generator=g)
    noise -= noise.mean(1, keepdim=True)
    noise_sd, spread = energy_noise((level + noise.flatten()).tolist(), batches_per_epoch=8)
    assert noise_sd == pytest.approx(30.0 * math.sqrt(7 / 8), rel=0.1)
    assert spread == pytest.approx(4.0, rel=0.1)
    assert energy_noise([1.0] * 8 * 19, 8) is None  # fewer than MIN_EPOCHS epochs
    assert energy_noise([1.0] * 8 * 30, 1) is None  # one batch per epoch


@pytest.mark.slow
@pytest.mark.parametrize("chains", [None, 3])
def test_too_noisy_energies_do_not_flatten_and_warn(chains):
    """B = 50 of 400: the minibatch energy's noise (about 37 nats) is above the spread of the
    energies (about 20 nats), so no chain flattens, every log_weight is 0, the run warns naming
    the noise and the spread, and the draws of ``w`` are SGLD's: mean and sd within 4 Monte
    Carlo standard errors (ESS from ArviZ) of the exact posterior, the sd plus the bias of the
    minibatch noise, sqrt(1 + excess) - 1 with the excess temperature the kernel reports
    (about 6%), and of the step (eps h / 4 < 1%)."""
    import arviz as az

    kernel, mcmc, said = _run(50, chains)
    rows = chains or 1
    assert kernel.flattens() == [False] * rows
    noise = kernel.diagnostics()["energy_noise"]
    noise = [noise] if chains is None else noise
    assert all(m["noise"] > m["spread"] for m in noise), noise
    assert len(said) == 1 and "do not flatten" in said[0] and "subsample_size" in said[0]
    log_weight = kernel.diagnostics()["sample_stats"]["log_weight"]
    assert torch.equal(log_weight, torch.zeros_like(log_weight))
    excess = kernel.diagnostics()["gradient_noise"]["temperature_excess"]
    bias = math.sqrt(1 + excess) - 1 + 0.01
    w = mcmc.get_samples()["w"].double()  # (draws, [chains,] 2)
    w = w.reshape(w.shape[0], -1, 2).transpose(0, 1)  # (chains, draws, 2)
    mean, sd = _posterior_of_w()
    for i in range(2):
        ess = float(az.ess(w[..., i].numpy()))
        assert abs(float(w[..., i].mean()) - float(mean[i])) < 4 * float(sd[i]) / math.sqrt(ess)
        assert abs(float(w[..., i].std()) / float(sd[i]) - 1) < 4 / math.sqrt(2 * ess) + bias


@pytest.mark.slow
def test_energies_whose_noise_is_below_their_spread_still_flatten():
    """B = 200 of 400: the noise (about 14 nats) is below the spread (about 20), so the chains
    flatten as on a full batch (weights not all equal) and nothing warns."""
    kernel, _, said = _run(200, 2)
    noise = kernel.diagnostics()["energy_noise"]
    assert all(m["noise"] < m["spread"] for m in noise), noise
    assert kernel.flattens() == [True, True]
    assert not said
    log_weight = kernel.diagnostics()["sample_stats"]["log_weight"]
    assert float(log_weight.std()) > 0


def test_a_full_batch_run_measures_nothing_and_flattens():
    pyro.set_rng_seed(1)
    kernel = ContourSGLD(model, step_size=2e-4, num_steps_per_sample=2, num_bins=10,
                         auto_bins=True)
    MCMC(kernel, num_samples=5, warmup_steps=20, disable_progbar=True).run(X, Y)
    assert kernel.diagnostics()["energy_noise"] is None
    assert kernel.flattens() == [True]


def test_sgld_is_what_a_chain_that_does_not_flatten_runs():
    """The same seed: ContourSGLD's draws on too noisy energies are SGLD's to the bit (its
    warmup is SGLD, and the multiplier stays 1 after it)."""
    def draws(kernel_class, **kwargs):
        pyro.set_rng_seed(3)
        kernel = kernel_class(model, step_size=1e-5, num_steps_per_sample=20, **kwargs)
        mcmc = MCMC(kernel, num_samples=10, warmup_steps=100, disable_progbar=True)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            mcmc.run(X, Y, 50)
        return mcmc.get_samples()

    contour = draws(ContourSGLD, num_bins=20, auto_bins=True)
    sgld = draws(SGLD)
    for name in sgld:
        assert torch.equal(contour[name], sgld[name]), name
