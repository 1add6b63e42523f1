"""SG steps per draw chosen in warmup (``num_steps_per_sample="auto"``) and the warning when a
given thinning is far too small.

The target of the kernel tests is ``N(0, 1)`` in one coordinate, sampled full-batch by SGLD at a
given step ``eps``: the chain is the AR(1) ``x <- (1 - eps) x + sqrt(2 eps) xi``, so the
coordinate's integrated autocorrelation time is ``(1 + a) / (1 - a)`` with ``a = 1 - eps``
(39 SG steps at ``eps = 0.05``), and the energy ``x^2 / 2`` has the shorter
``(1 + a^2) / (1 - a^2)``.
"""

import math
import warnings

import harness
import pytest
import torch
from harness import Z

from pyro_flat.infer import SGHMC, SGLD
from pyro_flat.infer.mcmc.thinning import integrated_autocorrelation_time

EPS = 0.05
TAU = (2 - EPS) / EPS  # 39


def ar1(a: float, n: int, series: int, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    e = torch.randn(series, n, dtype=torch.float64, generator=g)
    x = torch.empty_like(e)
    x[:, 0] = e[:, 0] / math.sqrt(1 - a * a)  # start in the stationary law
    for t in range(1, n):
        x[:, t] = a * x[:, t - 1] + e[:, t]
    return x


@pytest.mark.parametrize("a", [0.0, 0.5, 0.9])
def test_integrated_autocorrelation_time_of_an_ar1(a):
    """The mean over 64 series of 4,000 steps is within Z standard errors (from the spread of
    the 64 estimates) of ``(1 + a) / (1 - a)``, plus 5% for the estimator's own bias at
    n / tau >= 200 (Geyer's truncated sum, the drift removed)."""
    tau = integrated_autocorrelation_time(ar1(a, 4000, 64), detrend=True)
    exact = (1 + a) / (1 - a)
    se = float(tau.std()) / math.sqrt(len(tau))
    assert abs(float(tau.mean()) - exact) <= Z * se + 0.05 * exact


def test_a_drift_is_not_an_autocorrelation():
    x = ar1(0.5, 2000, 16) + torch.linspace(0, 50, 2000, dtype=torch.float64)
    assert float(integrated_autocorrelation_time(x, detrend=True).mean()) < 4
    assert float(integrated_autocorrelation_time(x).mean()) > 100


def gaussian_kernel(thin, k=64):
    return SGLD(potential_fn=lambda p: 0.5 * p["x"].square().sum(-1),
                initial_params={"x": torch.zeros(k, 1)}, step_size=EPS,
                num_steps_per_sample=thin, vectorized_chains=k)


def test_auto_keeps_five_draws_per_autocorrelation_time():
    """64 chains, a last window of 100 draws: the mean of 64 estimates of tau = 39 has a
    relative standard error of about 0.03, so ceil(tau / 5) is 8 within 4.5 standard errors
    and the drift removal's downward bias of a few percent: 7 to 9."""
    kernel = gaussian_kernel("auto")
    mcmc = harness.run(kernel, 50, 400, 0)
    diag = kernel.diagnostics()
    assert 7 <= diag["num_steps_per_sample"] <= 9
    assert abs(diag["autocorrelation_time"] / TAU - 1) < 0.15
    draws = harness.chains_of(mcmc).squeeze(-1)  # (chains, draws)
    # the kept draws are an AR(1) with coefficient a^k: lag-1 autocorrelation below 0.7
    a_k = (1 - EPS) ** diag["num_steps_per_sample"]
    assert a_k < 0.7
    lag1 = float((draws[:, 1:] * draws[:, :-1]).mean() / draws.square().mean())
    assert abs(lag1 - a_k) <= Z * math.sqrt((1 - a_k**2) / draws.numel()) * 2


def test_a_given_thinning_far_below_the_autocorrelation_time_warns():
    with pytest.warns(RuntimeWarning, match="autocorrelation time of about .* SG steps"):
        harness.run(gaussian_kernel(1), 20, 2000, 0)  # a last window of 500 steps
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        harness.run(gaussian_kernel(8), 20, 200, 0)
    assert gaussian_kernel(8).auto_thinning is False


def test_auto_resumes_bitwise():
    harness.assert_resume_continues(lambda: SGHMC(
        potential_fn=lambda p: 0.5 * p["x"].square().sum(), initial_params={"x": torch.ones(2)},
        step_size=0.1, num_steps_per_sample="auto"))


def test_bad_thinning_is_named():
    with pytest.raises(ValueError, match="num_steps_per_sample must be an integer >= 1 or 'auto'"):
        gaussian_kernel("often")
    with pytest.raises(ValueError, match="warmup_steps=2: give"):
        harness.run(gaussian_kernel("auto"), 5, 2, 0)


def test_network_weights_are_not_monitored():
    """A torch layer's weights made random by PyroSample (a PyroModule[nn.Linear], a network
    in BNN) are left out; a user's own PyroSample scale and pyro.sample sites are not."""
    import pyro.distributions as dist
    from pyro.nn import PyroModule, PyroSample

    from pyro_flat.infer.mcmc.thinning import network_weight_sites
    from pyro_flat.models.bnn import BNN
    from pyro_flat.models.likelihoods import HomoskedasticGaussian

    class Net(PyroModule):
        def __init__(self):
            super().__init__()
            self.scale = PyroSample(dist.HalfNormal(1.0))
            self.fc = PyroModule[torch.nn.Linear](2, 3)
            self.fc.weight = PyroSample(dist.Normal(0.0, 1.0).expand([3, 2]).to_event(2))
            self.fc.bias = PyroSample(dist.Normal(0.0, 1.0).expand([3]).to_event(1))

    assert network_weight_sites(Net()) == {"fc.weight", "fc.bias"}
    bnn = BNN(torch.nn.Sequential(torch.nn.Linear(2, 3), torch.nn.Tanh(),
                                  torch.nn.Linear(3, 1)), HomoskedasticGaussian())
    assert network_weight_sites(bnn) == {"net.0.weight", "net.0.bias", "net.2.weight",
                                         "net.2.bias"}
    assert network_weight_sites(lambda x: x) == set()


def test_warmup_windows_grow_at_least_twofold():
    """Each warmup window runs at least MIN_GROWTH times the previous one's steps per draw,
    also when its estimate says fewer would do: no estimate sees a component slower than
    its window, so a chain with a slow mode a short window misses is not trusted to be fast.
    A window too short for its own estimate grows by MAX_GROWTH."""
    from pyro_flat.infer.mcmc import thinning

    auto = thinning.AutoThinning([(0, 1)])
    white = torch.randn(4, 1, 400, generator=torch.Generator().manual_seed(0))
    for step in range(400):  # tau = 1: by itself one step per draw would do
        auto._trace.append(white[..., step])
    auto.window_end(1.0, 1.0, next_window_draws=75)
    assert auto.steps_per_sample == thinning.MIN_GROWTH * thinning.INITIAL_STEPS_PER_SAMPLE
    # 64 chains of an AR(1) with tau = 1.97 / 0.03 = 66 in a window of 400 steps: about 6 tau,
    # fewer than WINDOW_TAUS, so the estimate is a lower bound. By itself it would ask for
    # ceil(tau / 5) = 14 steps per draw, and the next window, of 1,000 draws, spans 10 tau at
    # any thinning: the growth rule alone decides
    slow = ar1(0.97, 400, 64, seed=1).unsqueeze(1)
    auto = thinning.AutoThinning([(0, 1)])
    auto.steps_per_sample = 20
    for step in range(400):
        auto._trace.append(slow[..., step])
    auto.window_end(1.0, 1.0, next_window_draws=1000)
    assert auto.window_taus < thinning.WINDOW_TAUS
    assert auto.last_tau / thinning.DRAWS_PER_TAU < thinning.MIN_GROWTH * 20
    assert auto.steps_per_sample == thinning.MAX_GROWTH * 20


def test_thinning_defaults_to_auto_when_warmup_chooses_the_step():
    """No step size and no thinning: warmup chooses both. A given step keeps one SG step per
    draw; a warmup too short to measure falls back to one, without an error."""

    def kernel(**kw):
        return SGLD(potential_fn=lambda p: 0.5 * p["x"].square().sum(-1),
                    initial_params={"x": torch.zeros(4, 1)}, vectorized_chains=4, **kw)

    adapted = kernel()
    harness.run(adapted, 20, 200, 0)
    assert adapted.auto_thinning and adapted.diagnostics()["num_steps_per_sample"] >= 1
    given = kernel(step_size=EPS)
    assert not given.auto_thinning and given.num_steps_per_sample == 1
    short = kernel()
    harness.run(short, 5, 2, 0)
    assert not short.auto_thinning and short.num_steps_per_sample == 1
