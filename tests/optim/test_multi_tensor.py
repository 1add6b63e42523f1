"""MultiTensorOptim is pyro.optim's per-parameter optimiser with one multi-tensor update: the
same parameters after SVI steps, the same state (interchangeable both ways), parameters not
touched by a step left alone, per-parameter arguments, and HWA's learning-rate control.

By default it runs torch's fused kernel (one per optimiser and device), whose rounding differs
from the single-tensor loop's, so the reference is ``pyro.optim`` with ``fused=True``; with
``foreach=True`` the reference is plain ``pyro.optim`` (the same operations in the same order)."""

import pyro
import pyro.distributions as dist
import pytest
import torch
from pyro.infer import SVI, Trace_ELBO
from pyro.infer.autoguide import AutoNormal

from pyro_flat.infer import HWA
from pyro_flat.optim import MultiTensorAdam, MultiTensorOptim


def model(x, y, use_offset=True):
    """A regression whose ``offset`` parameter takes part only when ``use_offset``."""
    w = pyro.sample("w", dist.Normal(0.0, 1.0).expand([x.shape[1]]).to_event(1))
    b = pyro.sample("b", dist.Normal(0.0, 1.0))
    mean = x @ w + b
    if use_offset:
        mean = mean + pyro.param("offset", torch.tensor(0.5))
    with pyro.plate("data", x.shape[0]):
        pyro.sample("y", dist.Normal(mean, 0.5), obs=y)


def data():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(30, 3, generator=g)
    return x, x @ torch.tensor([1.0, -1.0, 0.5]) + 0.2 * torch.randn(30, generator=g)


def run(optim, steps, pattern=lambda i: True, seed=0, state=None):
    """SVI steps from a fresh start; returns the parameters and the optimiser."""
    pyro.clear_param_store()
    pyro.set_rng_seed(seed)
    guide = AutoNormal(model)
    svi = SVI(model, guide, optim, Trace_ELBO())
    x, y = data()
    for i in range(steps):
        svi.step(x, y, pattern(i))
    return {k: p.detach().clone() for k, p in pyro.get_param_store().named_parameters()}, optim


def assert_params_equal(a, b):
    assert a.keys() == b.keys()
    for k in a:
        # the same floating-point operations in the same order: equal to the last bit on the
        # CPU; a tolerance of one float32 ulp keeps the test meaningful elsewhere
        torch.testing.assert_close(a[k], b[k], rtol=1.2e-7, atol=1e-8, msg=k)


#: The implementation asked of MultiTensorAdam -> the same implementation in pyro.optim.
IMPLEMENTATIONS = {"default": {"fused": True}, "foreach": {"foreach": True}}
REFERENCE = {"default": {"fused": True}, "foreach": {}}


@pytest.mark.parametrize("impl", IMPLEMENTATIONS)
def test_same_parameters_as_pyro_adam(impl):
    ref, _ = run(pyro.optim.Adam({"lr": 0.05, **REFERENCE[impl]}), 25)
    args = {"lr": 0.05} if impl == "default" else {"lr": 0.05, **IMPLEMENTATIONS[impl]}
    got, optim = run(MultiTensorAdam(args), 25)
    assert_params_equal(got, ref)
    shared = next(iter(optim.optim_objs.values()))
    assert shared.defaults.get("fused") is IMPLEMENTATIONS[impl].get("fused")


def test_gradients_are_released_after_the_step():
    """Like ``zero_grad(set_to_none=True)``: the next backward pass writes the gradients."""
    run(MultiTensorAdam({"lr": 0.05}), 3)
    assert all(p.grad is None for _, p in pyro.get_param_store().named_parameters())


def test_parameters_not_in_a_step_are_left_alone():
    """``offset`` is used on even steps only: pyro.optim updates it only then (its Adam step
    count and moments advance only then); a shared optimiser stepping it with a zero
    gradient would move it through its momentum."""
    pattern = lambda i: i % 2 == 0  # noqa: E731
    ref, ref_opt = run(pyro.optim.Adam({"lr": 0.05, "fused": True}), 12, pattern)
    ref_steps = ref_opt.get_state()["offset"]["state"][0]["step"]
    got, got_opt = run(MultiTensorAdam({"lr": 0.05}), 12, pattern)
    assert_params_equal(got, ref)
    assert got_opt.get_state()["offset"]["state"][0]["step"] == ref_steps == 6


@pytest.mark.parametrize("first,second", [("multi", "pyro"), ("pyro", "multi")])
def test_state_is_interchangeable_with_pyro_optim(first, second):
    make = {"multi": lambda: MultiTensorAdam({"lr": 0.05}),
            "pyro": lambda: pyro.optim.Adam({"lr": 0.05, "fused": True})}
    ref, _ = run(pyro.optim.Adam({"lr": 0.05, "fused": True}), 20)
    _, optim = run(make[first](), 10)
    state = optim.get_state()
    # continue from the saved parameters and optimiser state with the other optimiser
    params = {k: p.detach().clone() for k, p in pyro.get_param_store().named_parameters()}
    rng = pyro.util.get_rng_state()
    other = make[second]()
    other.set_state(state)
    guide = AutoNormal(model)
    svi = SVI(model, guide, other, Trace_ELBO())
    x, y = data()
    guide(x, y)
    with torch.no_grad():
        for k, p in pyro.get_param_store().named_parameters():
            p.copy_(params[k])
    pyro.util.set_rng_state(rng)
    for _ in range(10):
        svi.step(x, y)
    got = {k: p.detach().clone() for k, p in pyro.get_param_store().named_parameters()}
    assert_params_equal(got, ref)


def test_per_parameter_arguments():
    args = lambda name: {"lr": 0.1 if "loc" in name else 0.01}  # noqa: E731
    ref, _ = run(pyro.optim.Adam(lambda name: {**args(name), "fused": True}), 15)
    got, optim = run(MultiTensorAdam(args), 15)
    assert_params_equal(got, ref)
    shared = next(iter(optim.optim_objs.values()))
    assert sorted(g["lr"] for g in shared.param_groups) == [0.01, 0.1]


def test_hwa_sets_the_learning_rate():
    results = []
    for optim in (pyro.optim.Adam({"lr": 0.05, "fused": True}), MultiTensorAdam({"lr": 0.05})):
        pyro.clear_param_store()
        pyro.set_rng_seed(1)
        guide = AutoNormal(model)
        svi = SVI(model, guide, optim, Trace_ELBO())
        hwa = HWA(svi, lr_bounds=(0.001, 0.05), cycle_length=4)
        x, y = data()
        for _ in range(10):
            hwa.step(x, y)
        lrs = {g["lr"] for opt in optim.optim_objs.values() for g in opt.param_groups}
        results.append(({k: p.detach().clone()
                          for k, p in pyro.get_param_store().named_parameters()}, lrs))
    assert_params_equal(results[1][0], results[0][0])
    assert results[1][1] == results[0][1] and len(results[0][1]) == 1


def test_other_torch_optimisers():
    ref, _ = run(pyro.optim.SGD({"lr": 0.01, "momentum": 0.9, "fused": True}), 10)
    got, _ = run(MultiTensorOptim(torch.optim.SGD, {"lr": 0.01, "momentum": 0.9}), 10)
    assert_params_equal(got, ref)


def test_an_optimiser_without_a_fused_kernel_runs_foreach():
    ref, _ = run(pyro.optim.RMSprop({"lr": 0.01}), 10)
    got, optim = run(MultiTensorOptim(torch.optim.RMSprop, {"lr": 0.01}), 10)
    assert_params_equal(got, ref)
    assert next(iter(optim.optim_objs.values())).defaults["foreach"] is True
