"""The SVI side of the export: draws of a fitted guide (HWA's averaged guide too) and of SWAG go
through ``guide_draws`` / ``SWAG.draws`` into ``to_arviz`` and ``bma_probs`` as MCMC draws do."""

from __future__ import annotations

import copy
import warnings

import arviz_compat
import harness
import numpy as np
import pyro
import pytest
import torch
from pyro.infer import SVI, Trace_ELBO
from pyro.infer.autoguide import AutoDiagonalNormal, AutoNormal

from pyro_flat import to_arviz
from pyro_flat.evaluation.predictive import bma_probs, guide_draws
from pyro_flat.infer import HWA, SWAG
from pyro_flat.models.nn import make_bayesian

with warnings.catch_warnings():  # ArviZ 0.23 announces its 1.x refactor on import
    warnings.simplefilter("ignore", FutureWarning)
    import arviz as az


def fitted(guide_class, steps=200):
    pyro.clear_param_store()
    pyro.set_rng_seed(0)
    x, y = harness.linear_regression_data()
    model = harness.BayesianLinearRegression(2, 2.0, 1.0, batch_size=64)
    guide = guide_class(model)
    svi = SVI(model, guide, pyro.optim.Adam({"lr": 0.02}), Trace_ELBO())
    for _ in range(steps):
        svi.step(x, y)
    return svi, model, guide, x, y


@pytest.mark.parametrize("guide_class", [AutoNormal, AutoDiagonalNormal])
def test_guide_draws_have_the_model_sites(guide_class):
    _, model, guide, x, y = fitted(guide_class, steps=5)
    draws = guide_draws(guide, 7, x, y)
    assert {k: tuple(v.shape) for k, v in draws.items()} == {
        "net.weight": (7, 1, 2), "net.bias": (7, 1)}
    assert not any(v.requires_grad for v in draws.values())


def test_guide_draws_have_the_guide_law():
    """AutoNormal: 4,000 draws; each mean within 4.5 standard errors (sd / sqrt(4000)) of the
    guide's loc, each sd within 4.5 standard errors (sd / sqrt(2 * 4000)) of its scale."""
    _, model, guide, x, y = fitted(AutoNormal)
    n = 4000
    draws = guide_draws(guide, n, x, y)
    loc, scale = (pyro.param(f"AutoNormal.{k}.net.weight").detach() for k in ("locs", "scales"))
    mean, sd = draws["net.weight"].mean(0), draws["net.weight"].std(0)
    assert torch.all((mean - loc).abs() < 4.5 * scale / n**0.5)
    assert torch.all((sd - scale).abs() < 4.5 * scale / (2 * n) ** 0.5)


@pytest.mark.filterwarnings("ignore:Estimated shape parameter of Pareto:UserWarning")
def test_to_arviz_from_guide_draws_with_log_likelihood():
    _, model, guide, x, y = fitted(AutoNormal)
    draws = guide_draws(guide, 90, x, y)
    idata = to_arviz(draws, model=model, model_args=(x, y), log_likelihood=True,
                     observed_data=True, thin=3)
    assert idata.posterior["net.weight"].shape == (1, 30, 1, 2)
    assert "sample_stats" not in arviz_compat.groups(idata)
    assert idata.posterior.attrs["pyro_flat_source"] == "draws"
    ll = idata.log_likelihood["obs"].values
    assert ll.shape == (1, 30, len(x))  # every data point, though the model subsamples 64
    w, b = draws["net.weight"][6], draws["net.bias"][6]  # draw 6 = exported draw 2 (thin 3)
    expected = torch.distributions.Normal((x @ w.T).squeeze(-1) + b, 1.0).log_prob(y)
    np.testing.assert_allclose(ll[0, 2], expected.numpy(), rtol=1e-5, atol=1e-5)
    assert np.isfinite(arviz_compat.elpd(az.loo(idata)))


def test_hwa_averaged_guide_draws_centre_on_the_averages():
    svi, model, guide, x, y = fitted(AutoNormal, steps=20)
    hwa = HWA(svi, (1e-3, 1e-2), cycle_length=5)
    for _ in range(20):
        hwa.step(x, y)
    draws = guide_draws(hwa.averaged_guide(), 2000, x, y)
    with hwa.swapped():
        loc, scale = (pyro.param(f"AutoNormal.{k}.net.bias").detach().clone()
                      for k in ("locs", "scales"))
    # 2,000 draws: the mean lies within 4.5 standard errors of the averaged loc
    assert torch.all((draws["net.bias"].mean(0) - loc).abs() < 4.5 * scale / 2000**0.5)
    live = pyro.param("AutoNormal.locs.net.bias").detach()
    assert not torch.equal(live, loc)  # the averages were swapped out again


def test_swag_draws_export_and_predict_like_mcmc_draws():
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(3, 8), torch.nn.ReLU(), torch.nn.Linear(8, 4))
    x, labels = torch.randn(64, 3), torch.randint(4, (64,))
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    swag = SWAG(net, max_rank=4)
    for step in range(60):
        opt.zero_grad()
        torch.nn.functional.cross_entropy(net(x), labels).backward()
        opt.step()
        if step >= 30 and step % 5 == 0:
            swag.collect()
    draws = swag.draws(12, scale=0.5, generator=torch.Generator().manual_seed(1))
    assert {k: tuple(v.shape) for k, v in draws.items()} == {
        "0.weight": (12, 8, 3), "0.bias": (12, 8), "2.weight": (12, 4, 8), "2.bias": (12, 4)}
    idata = to_arviz(draws)
    assert idata.posterior["2.bias"].shape == (1, 12, 4)
    bayes = make_bayesian(copy.deepcopy(net))  # same architecture with priors: same site names
    probs = bma_probs(bayes, draws, x)
    direct = torch.zeros(64, 4)
    with torch.no_grad():
        for s in range(12):
            with swag.swapped({k: v[s] for k, v in draws.items()}):
                direct += torch.softmax(net(x), -1) / 12
    torch.testing.assert_close(probs, direct)


@pytest.mark.parametrize("draws,match", [
    ({}, "no sample sites"),
    ({"a": torch.zeros(3), "b": torch.zeros(4)}, "same number of draws"),
    ({"a": torch.zeros(0, 2)}, "empty"),
    ({"a": torch.tensor(1.0)}, "leading draw dimension"),
])
def test_bad_draws(draws, match):
    with pytest.raises(ValueError, match=match):
        to_arviz(draws)


def test_replayed_groups_need_a_model():
    with pytest.raises(ValueError, match="need a model"):
        to_arviz({"a": torch.zeros(3)}, log_likelihood=True)


def test_guide_draws_bad_input():
    _, model, guide, x, y = fitted(AutoNormal, steps=1)
    with pytest.raises(ValueError, match="num_samples"):
        guide_draws(guide, 0, x, y)
    with pytest.raises(ValueError, match="no latent sample sites"):
        guide_draws(lambda *a: None, 3)
