"""The share of the minibatch noise's heat that epoch-wise batches let reach the position
(:func:`~pyro_flat.infer.mcmc.epoch_noise.epoch_share`), against the stationary law of the linear
chain summed lag by lag in ``test_gradient_noise.chain_variance`` (a second implementation: a
loop over the impulse response and the epochs, where ``epoch_share`` filters and indexes), and
against the chain itself run with epoch-wise noise.

Both laws are sums of the same finite series, so they agree to float rounding (1e-9 relative);
the simulated chain agrees within ``Z`` Monte Carlo standard errors.
"""

import numpy as np
import pytest
import test_gradient_noise as exact
import torch
from harness import Z

from pyro_flat.infer.mcmc.adaptation import langevin_limit, underdamped_limit
from pyro_flat.infer.mcmc.epoch_noise import epoch_share
from pyro_flat.target.minibatch import MinibatchStream

CASES = [  # (N, B, curvature, friction; None: Langevin), at a fifth of the stability limit
    (500, 100, 2000.0, 52.0), (500, 10, 2000.0, 186.0), (256, 32, 1000.0, 3.0),
    (256, 32, 1000.0, None), (500, 10, 500.0, None), (64, 8, 50.0, 1.0), (300, 100, 10.0, 0.1),
]


def step_for(curvature: float, friction: float | None, fraction: float = 0.2) -> float:
    if friction is None:
        return fraction * langevin_limit(curvature)
    return fraction * underdamped_limit(curvature, friction, 1.0)


@pytest.mark.parametrize("case", CASES, ids=str)
def test_share_is_the_exact_laws_ratio(case, monkeypatch):
    n, b, curvature, friction = case
    monkeypatch.setattr(exact, "N", n)
    monkeypatch.setattr(exact, "B", b)
    eps = step_for(curvature, friction)
    epoch = exact.chain_variance(curvature, eps, 0.0, 1.0, friction, lags=20_000)
    a, g, _ = exact.transition(curvature, eps, friction)
    h, response = np.empty(20_000), g
    for j in range(len(h)):
        h[j], response = response[0], a @ response
    share = epoch_share(curvature, eps, friction, batches_per_epoch=n // b)
    assert share == pytest.approx(epoch / np.sum(h * h), rel=1e-9)


def test_one_batch_an_epoch_is_independent_noise():
    assert epoch_share(100.0, 0.01, 1.0, batches_per_epoch=1) == 1.0


def test_a_slow_chain_feels_little_and_a_fast_one_all():
    """The two regimes of the module's text: at a raised friction the chain moves slowly
    against an epoch; at friction 1 and 0.4 of the stability limit it turns within a few
    steps."""
    assert epoch_share(2000.0, step_for(2000.0, 300.0), 300.0, batches_per_epoch=5) < 0.05
    assert epoch_share(2000.0, step_for(2000.0, 1.0, 0.4), 1.0, batches_per_epoch=5) > 0.9


def test_an_unstable_step_is_an_error():
    with pytest.raises(ValueError, match="not stable"):
        epoch_share(1000.0, 0.02, None, batches_per_epoch=4)


def test_the_chain_with_epoch_wise_noise_has_that_share():
    """The linear SGHMC chain of one coordinate, driven only by the noise of epoch-wise batches
    of a fixed data set (each batch's mean gradient minus the full one), run as 400 independent
    chains: its position variance over the independent-noise law's is the share, within ``Z``
    standard errors of the chains' spread."""
    n, b, curvature, friction = 400, 50, 500.0, 20.0
    eps = step_for(curvature, friction)
    g = torch.Generator().manual_seed(0)
    data = torch.randn(n, dtype=torch.float64, generator=g)
    data = (data - data.mean()) * 30.0  # per-datum gradient noise around the full gradient
    chains, steps, burn = 400, 6_000, 1_000
    streams = [MinibatchStream(n, b, generator=torch.Generator().manual_seed(c + 1))
               for c in range(chains)]
    theta = torch.zeros(chains, dtype=torch.float64)
    r = torch.zeros(chains, dtype=torch.float64)
    d = 1 - eps * friction
    total = torch.zeros(chains, dtype=torch.float64)
    for t in range(steps):
        noise = torch.stack([data[s.next()].mean() for s in streams])
        r = d * r - eps * curvature * theta - eps * noise
        theta = theta + eps * r
        if t >= burn:
            total += theta * theta
    per_chain = (total / (steps - burn)).numpy()
    batch_variance = float(data.var(unbiased=False)) * (1 - b / n) / b * n / (n - 1)
    a, gn, _ = exact.transition(curvature, eps, friction)
    h, response = np.empty(20_000), gn
    for j in range(len(h)):
        h[j], response = response[0], a @ response
    independent = batch_variance * np.sum(h * h)
    share = epoch_share(curvature, eps, friction, batches_per_epoch=n // b)
    estimate, se = per_chain.mean() / independent, per_chain.std() / np.sqrt(chains) / independent
    assert abs(estimate - share) <= Z * se, (estimate, share, se)
    assert share < 0.5  # the check can tell the share from independent noise
