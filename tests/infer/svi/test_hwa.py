"""HWA: schedule, moments against a direct computation, one snapshot = the base guide, the
Auto guides, Predictive, state, bad input."""

import pyro
import pyro.distributions as dist
import pytest
import torch
from harness import unconstrained
from pyro.infer import SVI, Predictive, Trace_ELBO
from pyro.infer.autoguide import (
    AutoDelta,
    AutoDiagonalNormal,
    AutoLowRankMultivariateNormal,
    AutoNormal,
)

from pyro_flat.infer import HWA


def model(x, y):
    w = pyro.sample("w", dist.Normal(0.0, 1.0).expand([3]).to_event(1))
    s = pyro.sample("s", dist.HalfNormal(1.0))
    with pyro.plate("data", len(x)):
        pyro.sample("y", dist.Normal(x @ w, s), obs=y)


def data():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(80, 3, generator=g)
    return x, x @ torch.tensor([1.0, -1.0, 0.5]) + 0.3 * torch.randn(80, generator=g)


def fitted(guide_class, steps=50):
    pyro.clear_param_store()
    pyro.set_rng_seed(0)
    guide = guide_class(model)
    svi = SVI(model, guide, pyro.optim.Adam({"lr": 0.05}), Trace_ELBO())
    x, y = data()
    for _ in range(steps):
        svi.step(x, y)
    return svi, guide


def test_learning_rate_schedule_reaches_the_torch_optimisers():
    svi, _ = fitted(AutoNormal, steps=2)
    hwa = HWA(svi, lr_bounds=(0.001, 0.01), cycle_length=4)
    expected = [0.01, 0.007, 0.004, 0.001, 0.01]
    assert [hwa.learning_rate(t) for t in range(5)] == pytest.approx(expected)
    x, y = data()
    for t in range(5):
        hwa.step(x, y)
        for opt in svi.optim.optim_objs.values():
            assert opt.param_groups[0]["lr"] == pytest.approx(expected[t])
    assert HWA(svi, (0.002, 0.002), 1).learning_rate(7) == 0.002


def test_per_parameter_optimiser_arguments_get_the_scheduled_rate_once_wrapped():
    """With ``pt_optim_args`` a callable (per-parameter arguments), the parameters an SVI step
    creates get the scheduled learning rate and keep their other arguments; the callable is
    wrapped once, however many steps run."""
    pyro.clear_param_store()
    pyro.set_rng_seed(0)
    optim = pyro.optim.Adam(lambda name, param: {"lr": 0.05, "betas": (0.8, 0.9)})
    svi = SVI(model, AutoNormal(model), optim, Trace_ELBO())
    hwa = HWA(svi, lr_bounds=(0.001, 0.01), cycle_length=4)
    x, y = data()
    hwa.step(x, y)  # the guide's parameters are created in this step, at the first rate
    wrapped = svi.optim.pt_optim_args
    assert wrapped("any", None) == {"lr": 0.01, "betas": (0.8, 0.9)}
    for opt in svi.optim.optim_objs.values():
        assert opt.param_groups[0]["lr"] == pytest.approx(0.01)
        assert opt.param_groups[0]["betas"] == (0.8, 0.9)
    for _ in range(5):
        hwa.step(x, y)
    assert svi.optim.pt_optim_args is wrapped
    assert wrapped("any", None)["lr"] == pytest.approx(hwa.learning_rate(5))


def test_running_moments_equal_a_direct_computation():
    svi, _ = fitted(AutoNormal)
    hwa = HWA(svi, lr_bounds=(0.001, 0.02), cycle_length=3)
    x, y = data()
    store = pyro.get_param_store()
    snapshots = []
    for t in range(12):
        hwa.step(x, y)
        if (t + 1) % 3 == 0:
            snapshots.append({k: store.get_param(k).unconstrained().detach().clone()
                              for k in store.keys()})
    assert hwa.num_snapshots == 4
    for name in snapshots[0]:
        stacked = torch.stack([s[name] for s in snapshots])
        assert torch.allclose(hwa.mean[name], stacked.mean(0), atol=1e-6)
        assert torch.allclose(hwa.variance()[name], stacked.var(0, unbiased=False), atol=1e-6)


@pytest.mark.parametrize("guide_class", [AutoNormal, AutoDiagonalNormal,
                                         AutoLowRankMultivariateNormal, AutoDelta])
def test_one_snapshot_averaged_guide_equals_the_base_guide(guide_class):
    svi, guide = fitted(guide_class)
    hwa = HWA(svi, lr_bounds=(0.001, 0.01), cycle_length=5)
    x, y = data()
    for _ in range(5):
        hwa.step(x, y)
    assert hwa.num_snapshots == 1
    base = {k: v.detach().clone() for k, v in guide.median().items()}
    with hwa.swapped():
        averaged = guide.median()
    assert all(torch.allclose(base[k], averaged[k]) for k in base)
    # more cycles: the averages differ from the live values, and Predictive runs on them
    for _ in range(10):
        hwa.step(x, y)
    draws = Predictive(model, guide=hwa.averaged_guide(), num_samples=20)(x, y)
    assert draws["w"].shape[0] == 20 and draws["w"].shape[-1] == 3
    with hwa.swapped():
        average = guide.median()["w"].detach().clone()
    if guide_class is AutoDelta:  # a point mass: every draw is the averaged point
        assert torch.allclose(draws["w"].reshape(20, 3), average.expand(20, 3))
    after = {k: v.detach() for k, v in guide.median().items()}  # live values restored
    with hwa.swapped():
        assert not all(torch.allclose(after[k], v) for k, v in guide.median().items())


@pytest.mark.parametrize("guide_class", [AutoNormal, AutoDiagonalNormal])
def test_snapshot_scales_are_the_spread_of_the_mean_snapshots(guide_class):
    """scale='snapshots': the paper's sigma^HWA, the standard deviation of each mean's
    snapshots, computed here directly from the snapshots; the means are the averages."""
    svi, guide = fitted(guide_class)
    hwa = HWA(svi, lr_bounds=(0.001, 0.02), cycle_length=3, scale="snapshots")
    x, y = data()
    store = pyro.get_param_store()
    loc, scale = {AutoNormal: ("AutoNormal.locs.w", "AutoNormal.scales.w"),
                  AutoDiagonalNormal: ("AutoDiagonalNormal.loc",
                                       "AutoDiagonalNormal.scale")}[guide_class]
    snapshots = []
    for t in range(12):
        hwa.step(x, y)
        if (t + 1) % 3 == 0:
            snapshots.append(store[loc].detach().clone())
    stacked = torch.stack(snapshots)
    fitted_scale = store[scale].detach().clone()
    with hwa.swapped():
        assert torch.allclose(store[loc], stacked.mean(0), atol=1e-6)
        expected = stacked.std(0, unbiased=False)
        assert torch.allclose(store[scale], expected, rtol=1e-3, atol=1e-7)
        assert not torch.allclose(store[scale], fitted_scale, rtol=0.1)
    assert torch.equal(store[scale].detach(), fitted_scale)  # the live scales are restored
    average = HWA(svi, (0.001, 0.02), 3)
    average.load_state_dict({**hwa.state_dict(), "scale": "average"})
    with average.swapped():  # the default averages the scales' unconstrained values
        assert torch.allclose(unconstrained(scale), hwa.mean[scale])


def test_snapshot_scales_need_two_snapshots_and_a_scale():
    svi, _ = fitted(AutoNormal)
    hwa = HWA(svi, lr_bounds=(0.001, 0.01), cycle_length=2, scale="snapshots")
    x, y = data()
    for _ in range(2):
        hwa.step(x, y)
    with pytest.raises(RuntimeError, match="needs two snapshots"):
        with hwa.swapped():
            pass
    svi, _ = fitted(AutoDelta)
    hwa = HWA(svi, lr_bounds=(0.001, 0.01), cycle_length=1, scale="snapshots")
    for _ in range(2):
        hwa.step(x, y)
    with pytest.raises(RuntimeError, match="no mean parameter with a scale"):
        with hwa.swapped():
            pass


def test_state_round_trip():
    svi, _ = fitted(AutoNormal)
    hwa = HWA(svi, lr_bounds=(0.001, 0.01), cycle_length=2)
    x, y = data()
    for _ in range(6):
        hwa.step(x, y)
    other = HWA(svi, lr_bounds=(0.5, 0.5), cycle_length=9)
    other.load_state_dict(hwa.state_dict())
    assert other.num_snapshots == 3 and other.cycle_length == 2
    assert all(torch.equal(other.mean[k], hwa.mean[k]) for k in hwa.mean)


@pytest.mark.parametrize("kwargs, match", [
    (dict(cycle_length=0), "cycle_length"),
    (dict(lr_bounds=(0.0, 0.1)), r"lr_bounds\[0\]"),
    (dict(lr_bounds=(0.1, -1.0)), r"lr_bounds\[1\]"),
    (dict(lr_bounds=(0.1, 0.01)), "gamma1 <= gamma2"),
    (dict(lr_bounds=0.1), "pair"),
    (dict(scale="fitted"), "scale must be 'average' or 'snapshots'"),
])
def test_bad_input(kwargs, match):
    svi, _ = fitted(AutoNormal, steps=1)
    args = dict(lr_bounds=(0.001, 0.01), cycle_length=3)
    args.update(kwargs)
    with pytest.raises(ValueError, match=match):
        HWA(svi, **args)
    with pytest.raises(RuntimeError, match="no snapshot"):
        with HWA(svi, (0.001, 0.01), 3).swapped():
            pass
