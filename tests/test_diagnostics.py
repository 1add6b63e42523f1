"""R-hat and bulk ESS of torch draws shaped as Pyro's ``group_by_chain=True`` gives them."""

import math

import numpy as np
import pytest
import torch

from pyro_flat.diagnostics import bulk_ess, split_rhat


def _ar1(rng, chains, draws, phi, k, shift=0.0):
    x = np.zeros((chains, draws, k))
    e = rng.standard_normal((chains, draws, k))
    for t in range(1, draws):
        x[:, t] = phi * x[:, t - 1] + e[:, t]
    return x + shift * np.arange(chains)[:, None, None]


def test_they_are_arvizs_on_the_chain_draw_layout():
    """Element by element, ArviZ's rank R-hat and bulk ESS of the (chain, draw) slice: the
    chain and draw dimensions come first, the site's shape after them."""
    import arviz as az

    rng = np.random.default_rng(0)
    x = _ar1(rng, 3, 200, 0.7, 6, shift=0.3).reshape(3, 200, 2, 3)
    rhat, ess = split_rhat(torch.from_numpy(x)), bulk_ess(torch.from_numpy(x))
    assert rhat.shape == ess.shape == (2, 3) and rhat.dtype == torch.float64
    for i in range(2):
        for j in range(3):
            one = az.convert_to_dataset({"a": x[:, :, i, j]})
            assert float(rhat[i, j]) == pytest.approx(
                float(az.rhat(one, method="rank")["a"]), rel=1e-12)
            assert float(ess[i, j]) == pytest.approx(
                float(az.ess(one, method="bulk")["a"]), rel=1e-12)


def test_rhat_tells_agreeing_chains_from_shifted_ones():
    """4 x 2,000 iid draws: R-hat - 1 is of order 1/sqrt(draws) (< 0.01 with a wide margin);
    chains shifted by one sd from each other: R-hat far above 1.01."""
    rng = np.random.default_rng(1)
    agree = split_rhat(torch.from_numpy(rng.standard_normal((4, 2000, 3))))
    shifted = split_rhat(torch.from_numpy(_ar1(rng, 4, 2000, 0.0, 3, shift=1.0)))
    assert bool((agree < 1.01).all()) and bool((shifted > 1.2).all())


def test_bulk_ess_of_an_ar1_is_draws_over_its_autocorrelation_time():
    """AR(1) with phi = 0.5: tau = (1 + phi) / (1 - phi) = 3, so ESS = S / 3 for S = 4 x 5,000
    draws. The estimate's relative sd is about sqrt(2 * (2 * M) / N) ~ 5% here (its window
    M ~ 10 lags); the tolerance is 20%."""
    x = _ar1(np.random.default_rng(2), 4, 5000, 0.5, 4)
    ess = bulk_ess(torch.from_numpy(x))
    assert torch.allclose(ess, torch.full_like(ess, 20000 / 3), rtol=0.2)


def test_degenerate_chains_and_bad_input():
    constant = torch.ones(2, 10, 1)
    stuck = torch.stack([torch.zeros(10, 1), torch.ones(10, 1)])
    assert math.isnan(float(split_rhat(constant)))
    assert math.isinf(float(split_rhat(stuck)))
    with pytest.raises(ValueError, match=r"num_draws >= 4"):
        split_rhat(torch.zeros(2, 3))
    with pytest.raises(ValueError, match=r"draws must be a tensor"):
        bulk_ess(np.zeros((2, 10)))
