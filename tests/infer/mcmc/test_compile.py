"""The compiled fast path (``compile=``): the same potential and the same draws as the eager path,
compiled once per shape, refused or skipped with the reason for a model it cannot read.

Equality is checked in float64, where the compiled and the eager potential agree to ~1e-12
relative (the same operations, summed in another order), so a difference of 1e-9 in a short run's
draws is a different function or a different random stream, not rounding. (In float32 rounding
differences grow along a chain; the start-of-run check allows 1e-3 relative there.)
"""

from __future__ import annotations

import re

import pyro
import pytest
import torch
from harness import every_kernel
from pyro.infer import MCMC
from torch import nn

from pyro_flat.infer import SGLD
from pyro_flat.infer.mcmc import compilation
from pyro_flat.models.bnn import BNN
from pyro_flat.models.likelihoods import (
    Bernoulli,
    Categorical,
    HeteroskedasticGaussian,
    HomoskedasticGaussian,
    Likelihood,
)
from pyro_flat.models.nn import init_to_network, make_bayesian
from pyro_flat.target import ModelPotential, Target, trace_model
from pyro_flat.target.compiled import CompiledPotential
from pyro_flat.target.network_potential import read_network

N = 64
#: Largest difference between the compiled and the eager path, float64 (see the module docstring).
EXACT = 1e-9


@pytest.fixture(autouse=True)
def float64():
    before = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    yield
    torch.set_default_dtype(before)


def data(kind: str, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(N, 3, generator=g)
    if kind == "classes":
        return x, (x[:, 0] > 0).long() + (x[:, 1] > 0.5).long()
    if kind == "binary":
        return x, (x[:, 0] > 0).double()
    return x, x.sum(1) + 0.3 * torch.randn(N, generator=g)


def regression(subsample_size: int | None = None, likelihood: Likelihood | None = None,
               outputs: int = 1) -> BNN:
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(3, 8), nn.Tanh(), nn.Linear(8, outputs))
    return BNN(net, likelihood or HomoskedasticGaussian(), subsample_size=subsample_size)


def draws(model: BNN, make, compile, seed: int = 0, num_samples: int = 4, **kwargs):
    pyro.set_rng_seed(seed)
    kernel = make(model, compile=compile, **kwargs)
    mcmc = MCMC(kernel, num_samples=num_samples, warmup_steps=2, disable_progbar=True)
    mcmc.run(*data("regression"))
    return mcmc.get_samples(), kernel


def largest_difference(a: dict, b: dict) -> float:
    assert a.keys() == b.keys()
    return max(float((a[n] - b[n]).abs().max()) for n in a)


@pytest.mark.parametrize("name", list(every_kernel(1e-3)))
def test_every_kernel_draws_as_the_eager_path(name):
    """Minibatched by the kernel, noise on: the compiled run's draws are the eager run's. (The
    first run of the class compiles; compiling must leave the random stream as it was.)"""
    make = every_kernel(2e-4)[name]
    kwargs = {"subsample_size": 16} | ({} if name == "CyclicalSGLD" else
                                       {"num_steps_per_sample": 3})
    eager, _ = draws(regression(), make, False, **kwargs)
    compiled, kernel = draws(regression(), make, True, **kwargs)
    assert kernel.diagnostics()["compile"]["used"]
    assert largest_difference(eager, compiled) < EXACT


@pytest.mark.parametrize("chains", [None, 3])
@pytest.mark.parametrize("subsample", ["full", "kernel", "model"])
def test_draws_as_the_eager_path_full_batch_minibatched_and_vectorised(chains, subsample):
    model_b = 16 if subsample == "model" else None
    kernel_b = 16 if subsample == "kernel" else None
    make = every_kernel(2e-4)["SGHMC"]
    kw = {"subsample_size": kernel_b, "vectorized_chains": chains, "num_steps_per_sample": 2}
    eager, _ = draws(regression(model_b), make, False, **kw)
    compiled, kernel = draws(regression(model_b), make, True, **kw)
    assert kernel.diagnostics()["compile"]["used"]
    assert largest_difference(eager, compiled) < EXACT


LIKELIHOODS = {
    "Categorical": (Categorical(), 3, "classes"),
    "Bernoulli": (Bernoulli(), 1, "binary"),
    "Gaussian, fixed scale": (HomoskedasticGaussian(0.5), 1, "regression"),
    "Gaussian, learned scale": (HomoskedasticGaussian(prior_scale=2.0), 1, "regression"),
    "HeteroskedasticGaussian": (HeteroskedasticGaussian(), 2, "regression"),
}


@pytest.mark.parametrize("targets", ["(N,)", "(N, 1)"])
@pytest.mark.parametrize("name", list(LIKELIHOODS))
def test_the_potential_and_gradient_of_each_likelihood(name, targets):
    """At a random point away from the start, on a minibatch: U and its gradient equal the
    eager target's (the model run under Pyro plus the flat prior)."""
    likelihood, outputs, kind = LIKELIHOODS[name]
    model = regression(likelihood=likelihood, outputs=outputs)
    x, y = data(kind)
    if targets == "(N, 1)":
        y = y.unsqueeze(1)
    traced = trace_model(model, (x, y), {}, init_to_network, 16)
    eager = Target(ModelPotential(model, (x, y), {}, traced.layout, traced.plate,
                                  traced.flat_prior), traced.layout, traced.plate)
    z = traced.layout.flatten(traced.init)
    z = z + 0.5 * torch.randn(z.shape, generator=torch.Generator().manual_seed(1))
    eager.bind(z)
    batch = torch.arange(N).flip(0)[:16]
    u0, g0 = eager.value_and_grad(z, batch)
    network = read_network(model, (x, y), {}, traced.layout, traced.plate, traced.flat_prior)
    u1, g1 = CompiledPotential(network, None, True)(z, batch)
    assert abs(float(u1 - u0)) < EXACT * abs(float(u0))
    assert float((g1 - g0).abs().max()) < EXACT * float(g0.abs().max())


def conv_net() -> nn.Module:
    torch.manual_seed(0)
    net = nn.Sequential(nn.Unflatten(1, (1, 3)), nn.Conv1d(1, 4, 2), nn.BatchNorm1d(4),
                        nn.ReLU(), nn.Dropout(0.3), nn.Flatten(), nn.Linear(8, 3))
    with torch.no_grad():  # running statistics of its own, as after training
        net[2].running_mean.uniform_(-0.5, 0.5)
        net[2].running_var.uniform_(0.5, 2.0)
    return net.eval()


def test_batchnorm_and_dropout_in_evaluation_mode_read_their_buffers():
    make = every_kernel(2e-4)["SGLD"]

    def run(compile):
        pyro.set_rng_seed(0)
        kernel = make(BNN(conv_net(), Categorical()), compile=compile, num_steps_per_sample=3)
        mcmc = MCMC(kernel, num_samples=4, warmup_steps=1, disable_progbar=True)
        mcmc.run(*data("classes"))
        return mcmc.get_samples(), kernel

    eager, _ = run(False)
    compiled, kernel = run(True)
    assert kernel.diagnostics()["compile"]["used"]
    assert largest_difference(eager, compiled) < EXACT


def test_a_second_run_of_the_same_shapes_compiles_nothing():
    make = every_kernel(2e-4)["SGLD"]
    x, y = data("regression", seed=5)
    runs = []
    for seed in (0, 1):  # a new model object and new data values, the same shapes
        pyro.set_rng_seed(seed)
        kernel = make(regression(), compile=True, subsample_size=8)
        MCMC(kernel, num_samples=2, warmup_steps=0, disable_progbar=True).run(x + seed, y)
        runs.append(kernel.diagnostics()["compile"])
    assert runs[1]["cached"] and runs[1]["used"]
    other_batch = make(regression(), compile=True, subsample_size=9)
    MCMC(other_batch, num_samples=1, warmup_steps=0, disable_progbar=True).run(x, y)
    assert not other_batch.diagnostics()["compile"]["cached"]


class Shifted(HomoskedasticGaussian):
    """A user's likelihood: not one pyro_flat can read."""


def unreadable_models() -> dict:
    torch.manual_seed(0)

    def plain_function(x, y):
        w = pyro.sample("w", pyro.distributions.Normal(torch.zeros(3), 1.0).to_event(1))
        with pyro.plate("data", len(x)):
            pyro.sample("obs", pyro.distributions.Normal(x @ w, 1.0), obs=y)

    dropout = nn.Sequential(nn.Linear(3, 8), nn.Dropout(0.2), nn.Linear(8, 1))
    point = make_bayesian(nn.Sequential(nn.Linear(3, 8), nn.Tanh(), nn.Linear(8, 1)),
                          exclude="0.bias")
    return {
        "a plain function": (plain_function, "not a pyro_flat.models.BNN"),
        "a user's likelihood": (BNN(nn.Linear(3, 1), Shifted()), "not one of the built-in"),
        "Dropout in training mode": (BNN(dropout, HomoskedasticGaussian()),
                                     "module '1' (Dropout) is in training mode"),
        "a point-estimate parameter": (BNN(point, HomoskedasticGaussian()),
                                       "nn.Parameter ['bias']"),
    }


@pytest.mark.parametrize("case", list(unreadable_models()))
def test_a_model_it_cannot_read_is_an_error_or_runs_eagerly_with_the_reason(case):
    model, reason = unreadable_models()[case]
    x, y = data("regression")
    with pytest.raises(ValueError, match=re.escape(reason)):
        MCMC(SGLD(model, 1e-4, compile=True), num_samples=1, warmup_steps=0,
             disable_progbar=True).run(x, y)
    kernel = SGLD(model, 1e-4, compile="auto")
    MCMC(kernel, num_samples=1, warmup_steps=0, disable_progbar=True).run(x, y)
    report = kernel.diagnostics()["compile"]
    assert not report["used"] and reason in report["reason"]


@pytest.mark.parametrize("bad", ["yes", 1, None, "True"])
def test_compile_must_be_false_true_or_auto(bad):
    with pytest.raises(ValueError, match="compile must be one of"):
        SGLD(regression(), 1e-4, compile=bad)


@pytest.mark.parametrize(("eager_s", "compiled_s", "kept"), [(1.0, 0.5, True), (1.0, 0.97, False),
                                                             (1.0, 2.0, False)])
def test_auto_keeps_the_compiled_path_only_where_the_trial_finds_it_faster(
        monkeypatch, eager_s, compiled_s, kept):
    monkeypatch.setattr(compilation, "_trial", lambda eager, compiled: (eager_s, compiled_s))
    compilation.forget_trials()
    make = every_kernel(2e-4)["SGLD"]
    eager, _ = draws(regression(), make, False)
    auto, kernel = draws(regression(), make, "auto")
    report = kernel.diagnostics()["compile"]
    assert report["used"] is kept
    assert report["compiled_ms"] == pytest.approx(1e3 * compiled_s)
    assert (kernel.target.compiled is not None) is kept
    assert largest_difference(eager, auto) < EXACT


def test_auto_measures_once_per_compiled_function(monkeypatch):
    calls = []

    def trial(eager, compiled):
        calls.append(1)
        return 1.0, 0.5

    monkeypatch.setattr(compilation, "_trial", trial)
    compilation.forget_trials()
    make = every_kernel(2e-4)["SGLD"]
    reports = [draws(regression(), make, "auto", seed=s)[1].diagnostics()["compile"]
               for s in (0, 1)]
    assert len(calls) == 1
    assert reports[0] == reports[1] | {"compile_seconds": reports[0]["compile_seconds"],
                                       "cached": reports[0]["cached"]}
    compilation.forget_trials()


def test_the_trial_measures_both_sides():
    import time

    def slow():
        time.sleep(0.002)
        return None, torch.zeros(1)

    def fast():
        return None, torch.zeros(1)

    eager_s, compiled_s = compilation._trial(slow, fast)
    assert eager_s >= 0.002 > compiled_s


def test_a_compiled_potential_that_differs_is_caught_at_the_start(monkeypatch):
    """A wrong reading of the model (here the likelihood's N / B off by a factor 2) is found by
    the start-of-run check: an error under compile=True, a warning and the eager path under
    "auto"."""
    from pyro_flat.infer.mcmc import base

    def misread(*args):
        network = read_network(*args)
        network.function.scale *= 2.0
        network.function.key = (*network.function.key, "misread")
        return network

    monkeypatch.setattr(base, "read_network", misread)
    make = every_kernel(2e-4)["SGLD"]
    with pytest.raises(RuntimeError, match="differs from the eager one"):
        draws(regression(), make, True, subsample_size=16)
    with pytest.warns(RuntimeWarning, match="differs from the eager one"):
        _, kernel = draws(regression(), make, "auto", subsample_size=16)
    assert not kernel.diagnostics()["compile"]["used"]


def test_diagnostics_say_what_was_chosen_without_compiling():
    make = every_kernel(2e-4)["SGLD"]
    _, kernel = draws(regression(), make, False)
    assert kernel.diagnostics()["compile"] == {
        "requested": False, "used": False, "reason": "compile=False", "compile_seconds": None,
        "cached": None, "eager_ms": None, "compiled_ms": None}


def test_a_compiled_run_resumes_bitwise():
    from harness import assert_resume_continues

    make = every_kernel(2e-4)["SGHMC"]
    assert_resume_continues(lambda: make(regression(), compile=True, subsample_size=16),
                            *data("regression"))
