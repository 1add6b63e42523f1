"""The check of a run's draws at its end: a run whose draws' effective sample size is below 5%
of their number warns, naming the site (``pyro_flat.infer.mcmc.draw_mixing``).

The target is ``N(0, 1)`` per coordinate, sampled full-batch by SGLD at a given step ``eps``:
each coordinate is the AR(1) ``x <- (1 - eps) x + sqrt(2 eps) xi``, whose integrated
autocorrelation time is ``(2 - eps) / eps`` SG steps, and ``tau / k`` draws at ``k`` SG steps
per draw (for ``k`` much smaller than ``tau``).
"""

import math
import re
import warnings

import harness
import pyro
import pyro.distributions as dist
import torch
from harness import Z
from pyro.nn import PyroModule, PyroSample

from pyro_flat.infer import SGLD
from pyro_flat.infer.mcmc.draw_mixing import LOW_ESS_FRACTION, MAX_KEPT, MIN_DRAWS, DrawMixing
from pyro_flat.target.layout import FlatLayout

EPS = 0.05
TAU = (2 - EPS) / EPS  # 39 SG steps
MESSAGE = r"the draws' effective sample size for site '(\w+)'.* is about (\d+) of (\d+) draws"


def gaussian_kernel(thin: int, k: int | None = 64, **sites: float) -> SGLD:
    """SGLD on independent Gaussians of precision ``sites[name]`` (default: one site ``x`` of
    precision 1), ``k`` vectorised chains (``None``: one chain)."""
    sites = sites or {"x": 1.0}
    shape = (1,) if k is None else (k, 1)
    return SGLD(potential_fn=lambda p: sum(0.5 * c * p[n].square().sum(-1)
                                           for n, c in sites.items()),
                initial_params={n: torch.zeros(shape) for n in sites}, step_size=EPS,
                num_steps_per_sample=thin, vectorized_chains=k)


def run_warnings(kernel: SGLD, draws: int, warmup: int = 20) -> list[str]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        harness.run(kernel, draws, warmup, 0)
    return [str(w.message) for w in caught if issubclass(w.category, RuntimeWarning)]


def test_autocorrelated_draws_warn_with_their_ess():
    """64 chains of 400 draws at one SG step per draw: ESS = 25,600 / 39 = 656 (2.6%). The
    pooled estimate of tau has a relative sd of about sqrt(2 (2M + 1) / N) = 0.135 for a
    truncation window M of about 3 tau (Sokal) and N = 25,600 draws; the reported ESS is
    within Z = 4 of them."""
    messages = [m for m in run_warnings(gaussian_kernel(1), 400) if "draws' effective" in m]
    assert len(messages) == 1
    site, ess, draws = re.search(MESSAGE, messages[0]).groups()
    exact = 64 * 400 / TAU
    relative_sd = math.sqrt(2 * (2 * 3 * TAU + 1) / (64 * 400))
    assert site == "x" and int(draws) == 64 * 400
    assert f"below {LOW_ESS_FRACTION:.0%}" in messages[0]
    assert abs(int(ess) / exact - 1) <= Z * relative_sd


def test_a_single_chain_warns_too():
    messages = run_warnings(gaussian_kernel(1, k=None), 400)
    assert any(re.search(MESSAGE, m) for m in messages)


def test_draws_thinned_to_their_autocorrelation_do_not_warn():
    """At 40 SG steps per draw the draws' lag-1 autocorrelation is 0.95^40 = 0.13: an ESS of
    about 77% of the draws."""
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        harness.run(gaussian_kernel(40, k=8), 100, 20, 0)


def test_the_slowest_site_is_named():
    """``slow`` (precision 0.1: tau = 399 SG steps) against ``fast`` (precision 10: tau = 3)."""
    messages = run_warnings(gaussian_kernel(4, k=16, fast=10.0, slow=0.1), 200)
    sites = [re.search(MESSAGE, m).group(1) for m in messages if re.search(MESSAGE, m)]
    assert sites == ["slow"]


def test_a_run_warmup_warned_of_warns_once():
    """A given thinning far below the autocorrelation time that warmup measured is said once,
    by warmup (its last window spans 500 SG steps here), not again by the draws."""
    messages = run_warnings(gaussian_kernel(1), 400, warmup=2000)
    assert sum("autocorrelation time of about" in m for m in messages) == 1
    assert not any(re.search(MESSAGE, m) for m in messages)


def test_too_few_draws_are_not_checked():
    kernel = gaussian_kernel(1)
    assert not any(re.search(MESSAGE, m) for m in run_warnings(kernel, MIN_DRAWS - 1))


def test_network_weights_are_not_monitored():
    """A network's weights wander along flat, symmetric directions that no thinning makes
    mix; a model whose every site is a weight is not checked (``thinning`` monitors the same
    summaries)."""
    net = PyroModule[torch.nn.Linear](1, 1)
    net.weight = PyroSample(dist.Normal(0.0, 1.0).expand([1, 1]).to_event(2))
    net.bias = PyroSample(dist.Normal(0.0, 1.0).expand([1]).to_event(1))

    def model(x, y):
        mean = net(x).squeeze(-1)
        with pyro.plate("data", len(y)):
            pyro.sample("y", dist.Normal(mean, 1.0), obs=y)

    class Model(PyroModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = net

        def forward(self, x, y):
            model(x, y)

    x = torch.randn(50, 1)
    kernel = SGLD(Model(), step_size=1e-4, num_steps_per_sample=1)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        harness.run(kernel, 200, 20, 0, x, 2 * x[:, 0])
    messages = [str(w.message) for w in caught]
    assert not kernel.draw_mixing.monitors
    assert not any(re.search(MESSAGE, m) for m in messages)


def _ar1_mixing(a: float, draws: int, chains: int = 64) -> DrawMixing:
    mixing = DrawMixing(FlatLayout.from_shapes({"scale": torch.Size([])}).sites)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(chains, 1, generator=g) / math.sqrt(1 - a * a)  # the stationary law
    for _ in range(draws):
        x = a * x + torch.randn(chains, 1, generator=g)
        mixing.record(x)
    return mixing


def test_a_long_run_keeps_bounded_memory_and_its_ess():
    """20,000 draws of 64 AR(1) chains with coefficient 0.99 (tau = 199 draws, ESS = 6,432):
    past 4,096 and 8,192 draws the buffer keeps every second, then every fourth draw (5,000
    kept), whose coefficient 0.99^4 gives tau = 49.8 kept draws and the same ESS. The pooled
    estimate's relative sd is about sqrt(2 (2M + 1) / N) = 0.043 (M = 3 tau, N = 320,000 kept
    draws); within Z of them."""
    mixing = _ar1_mixing(0.99, 20_000)
    assert mixing._buffer.rows.shape[0] == MAX_KEPT
    lowest = mixing.lowest_ess()
    exact = 64 * 20_000 / ((1 + 0.99) / (1 - 0.99))
    relative_sd = math.sqrt(2 * (2 * 3 * 49.8 + 1) / (64 * 5000))
    assert lowest.num_draws == 64 * 20_000
    assert abs(lowest.ess / exact - 1) <= Z * relative_sd
    assert lowest.fraction < LOW_ESS_FRACTION


def test_thinning_the_kept_draws_raises_no_false_alarm():
    """Independent draws (coefficient 0): every fourth of 20,000 kept, an ESS per kept draw
    of about 1."""
    lowest = _ar1_mixing(0.0, 20_000, chains=4).lowest_ess()
    assert lowest.fraction > 0.5
