"""SWAG: running moments against a direct computation, chi-square coverage of its sampler,
save/restore, swapping values into a network, Pyro parameters, bad input."""

import math

import pyro
import pyro.distributions as dist
import pytest
import torch
from pyro.infer import SVI, Trace_ELBO
from pyro.infer.autoguide import AutoDelta
from scipy.stats import chi2

from pyro_flat.infer.svi.swag import SWAG


def snapshots_into(swag, params, snapshots):
    for snap in snapshots:
        with torch.no_grad():
            for name, p in params.items():
                p.copy_(snap[name])
        swag.collect()


def random_snapshots(n, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [{"a": torch.randn(2, 2, generator=g, dtype=torch.float64),
             "b": 3 + 0.5 * torch.randn(1, generator=g, dtype=torch.float64)} for _ in range(n)]


def test_running_moments_equal_a_direct_computation():
    params = {"a": torch.zeros(2, 2, dtype=torch.float64), "b": torch.zeros(1, dtype=torch.float64)}
    swag = SWAG(params, max_rank=3)
    snaps = random_snapshots(7)
    snapshots_into(swag, params, snaps)
    flat = torch.stack([torch.cat([s["a"].flatten(), s["b"]]) for s in snaps])
    assert torch.allclose(swag.mean, flat.mean(0), atol=1e-12)
    assert torch.allclose(swag.variance, flat.var(0, unbiased=False), atol=1e-12)
    # the last 3 deviations, each from the running mean at its own collection
    running = torch.cumsum(flat, 0) / torch.arange(1, 8, dtype=torch.float64).unsqueeze(1)
    for dev, i in zip(swag.deviations, (4, 5, 6), strict=True):
        assert torch.allclose(dev, flat[i] - running[i], atol=1e-12)
    assert swag.num_snapshots == 7 and len(swag.deviations) == 3
    average = swag.average()
    assert torch.allclose(average["a"], flat.mean(0)[:4].reshape(2, 2))


def test_one_snapshot_averages_to_itself():
    params = {"a": torch.randn(3)}
    swag = SWAG(params)
    swag.collect()
    assert torch.equal(swag.average()["a"], params["a"])
    assert torch.equal(swag.sample(scale=1.0)["a"], params["a"])  # zero variance


def test_sampler_covariance_passes_chi_square_coverage():
    """2,000 draws; the fraction inside the 95% ellipsoid of SWAG's covariance
    (diag/2 + D D^T / (2(K-1)), computed directly here) must lie in [0.94, 0.96]: the binomial
    standard error at 2,000 draws is sqrt(0.95 * 0.05 / 2000) = 0.0049, so the band is
    +-2 SE (a correct sampler fails it with probability about 0.05 at a given seed)."""
    params = {"a": torch.zeros(2, 2, dtype=torch.float64), "b": torch.zeros(1, dtype=torch.float64)}
    swag = SWAG(params, max_rank=4)
    snapshots_into(swag, params, random_snapshots(12, seed=1))
    d = torch.stack(swag.deviations, 1)
    cov = torch.diag(swag.variance) / 2 + d @ d.T / (2 * (d.shape[1] - 1))
    assert torch.allclose(swag.covariance(), cov)
    precision = torch.linalg.inv(cov)
    g = torch.Generator().manual_seed(0)
    inside = 0
    for _ in range(2000):
        draw = swag.sample(generator=g)
        x = torch.cat([draw["a"].flatten(), draw["b"]]) - swag.mean
        inside += int(x @ precision @ x <= chi2.ppf(0.95, df=5))
    assert 0.94 <= inside / 2000 <= 0.96
    # scale multiplies the covariance
    g = torch.Generator().manual_seed(0)
    a = swag.sample(scale=4.0, generator=g)
    g = torch.Generator().manual_seed(0)
    b = swag.sample(scale=1.0, generator=g)
    assert torch.allclose(a["b"] - swag.mean[4:], 2 * (b["b"] - swag.mean[4:]))


def test_state_round_trip_and_swapping_into_a_network():
    net = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.BatchNorm1d(4), torch.nn.Linear(4, 1))
    swag = SWAG(net, max_rank=2)
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    x, y = torch.randn(32, 3), torch.randn(32, 1)
    for _ in range(6):
        opt.zero_grad()
        ((net(x) - y) ** 2).mean().backward()
        opt.step()
        swag.collect()
    other = SWAG(net, max_rank=2)
    other.load_state_dict(swag.state_dict())
    g1, g2 = torch.Generator().manual_seed(3), torch.Generator().manual_seed(3)
    s1, s2 = swag.sample(generator=g1), other.sample(generator=g2)
    assert all(torch.equal(s1[k], s2[k]) for k in s1)
    before = {k: v.detach().clone() for k, v in net.named_parameters()}
    with swag.swapped(s1):
        assert torch.equal(net[0].weight, s1["0.weight"])
    assert all(torch.equal(before[k], v) for k, v in net.named_parameters())
    with pytest.raises(ValueError, match="other parameters"):
        SWAG({"w": torch.zeros(2)}).load_state_dict(swag.state_dict())


def test_autodelta_map_in_the_param_store():
    pyro.clear_param_store()

    def model(x, y):
        w = pyro.sample("w", dist.Normal(0.0, 1.0).expand([2]).to_event(1))
        with pyro.plate("data", len(x)):
            pyro.sample("y", dist.Normal(x @ w, 1.0), obs=y)

    x = torch.randn(50, 2)
    y = x @ torch.tensor([1.0, -2.0]) + torch.randn(50)
    guide = AutoDelta(model)
    svi = SVI(model, guide, pyro.optim.SGD({"lr": 0.002}), Trace_ELBO())
    svi.step(x, y)
    store = pyro.get_param_store()
    swag = SWAG({n: store.get_param(n).unconstrained() for n in store.keys()}, max_rank=5)
    for step in range(200):
        svi.step(x, y)
        if step >= 100 and step % 10 == 0:
            swag.collect()
    # the SWA mean is near the MAP, and a swapped draw changes what the guide returns
    w_map = guide.median()["w"].detach().clone()
    assert torch.allclose(swag.average()["AutoDelta.w"], w_map, atol=0.1)
    draw = swag.sample(scale=100.0, generator=torch.Generator().manual_seed(0))
    with swag.swapped(draw):
        assert torch.allclose(guide.median()["w"], draw["AutoDelta.w"])
    assert torch.equal(guide.median()["w"], w_map)


@pytest.mark.parametrize("kwargs, match", [
    (dict(max_rank=-1), "max_rank"),
    (dict(params={}), "non-empty"),
    (dict(params={"x": torch.zeros(2, dtype=torch.long)}), "floating-point"),
])
def test_bad_input(kwargs, match):
    args = dict(params={"x": torch.zeros(2)}, max_rank=2)
    args.update(kwargs)
    with pytest.raises(ValueError, match=match):
        SWAG(**args)
    swag = SWAG({"x": torch.zeros(2)})
    with pytest.raises(RuntimeError, match="at least one collect"):
        swag.sample()
    swag.collect()
    with pytest.raises(ValueError, match="scale"):
        swag.sample(scale=-1.0)
    assert math.isfinite(float(swag.sample()["x"].sum()))


def test_swapped_recomputes_batchnorm_statistics_for_the_draw_and_restores_them():
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.BatchNorm1d(4), torch.nn.Linear(4, 1))
    x = torch.randn(50, 3)
    swag = SWAG(net, max_rank=2)
    for _ in range(3):
        with torch.no_grad():
            net[0].weight.add_(0.1 * torch.randn(4, 3))
        swag.collect()
    draw = swag.sample(generator=torch.Generator().manual_seed(1))
    before = {n: b.clone() for n, b in net.named_buffers()}
    with swag.swapped(draw, batchnorm_inputs=x, batch_size=50):
        h = x @ draw["0.weight"].T + draw["0.bias"]  # one batch: the statistics are its moments
        torch.testing.assert_close(net[1].running_mean, h.mean(0))
        torch.testing.assert_close(net[1].running_var, h.var(0))
    assert all(torch.equal(before[n], b) for n, b in net.named_buffers())
    with pytest.raises(ValueError, match="torch.nn.Module"):
        with SWAG({"w": torch.zeros(2)}).swapped({"w": torch.ones(2)}, batchnorm_inputs=x):
            pass
