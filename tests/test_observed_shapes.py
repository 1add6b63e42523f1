"""No silent broadcasting: an observed site whose value and distribution broadcast into a larger
log-density is a ValueError naming the site and both shapes, in every kernel (checked once, at
setup), in LeanELBO (once per argument shapes), in to_arviz's replay and through BNN (which reads
targets (N, 1) as (N,)); the shapes Pyro users legitimately write stay allowed."""

from __future__ import annotations

import warnings

import harness
import pyro
import pyro.distributions as dist
import pytest
import torch
from pyro.infer import MCMC, Trace_ELBO
from pyro.infer.autoguide import AutoNormal
from pyro.nn import PyroModule, PyroSample

import pyro_flat.target.log_joint as log_joint_module
import pyro_flat.target.tracing as tracing_module
from pyro_flat import to_arviz
from pyro_flat.infer import SGLD
from pyro_flat.infer.svi.lean_elbo import LeanELBO
from pyro_flat.models.bnn import BNN
from pyro_flat.models.likelihoods import Categorical, HomoskedasticGaussian
from pyro_flat.target.observed_shapes import observed_shape_error

N, B, D = 96, 16, 3


class Regression(PyroModule):
    """A 3-8-1 tanh regression BNN with a learned noise scale, written as a Pyro user writes it:
    PyroSample priors, the network run outside the plate, minibatched by the plate when
    ``batch`` is given. ``squeeze=False`` keeps the network's (B, 1) output as the mean."""

    def __init__(self, batch: int | None = B, squeeze: bool = True):
        super().__init__()
        self.batch, self.squeeze = batch, squeeze
        self.fc1 = PyroModule[torch.nn.Linear](D, 8)
        self.fc1.weight = PyroSample(dist.Normal(0.0, 1.0).expand([8, D]).to_event(2))
        self.fc1.bias = PyroSample(dist.Normal(0.0, 1.0).expand([8]).to_event(1))
        self.fc2 = PyroModule[torch.nn.Linear](8, 1)
        self.fc2.weight = PyroSample(dist.Normal(0.0, 1.0).expand([1, 8]).to_event(2))
        self.fc2.bias = PyroSample(dist.Normal(0.0, 1.0).expand([1]).to_event(1))

    def forward(self, x, y=None):
        sigma = pyro.sample("sigma", dist.HalfNormal(1.0))
        plate = pyro.plate("data", len(x), subsample_size=self.batch)
        with plate as i:
            pass
        out = self.fc2(torch.tanh(self.fc1(x[i])))
        mean = out.squeeze(-1) if self.squeeze else out
        with plate:
            pyro.sample("obs", dist.Normal(mean, sigma), obs=None if y is None else y[i])


@pytest.fixture(scope="module")
def data():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(N, D, generator=g)
    y = torch.tanh(x @ torch.tensor([1.0, -0.5, 0.3])) + 0.1 * torch.randn(N, generator=g)
    return x, y


EPS = 1e-5
KERNELS = harness.every_kernel(EPS)

#: what the message must hold: the site, the value's shape and the distribution's shape
TARGETS_N1 = (r"observed site 'obs': the value of shape \(16, 1\) and the distribution of "
              r"shape \(16,\)")


def run(kernel, *args, num_samples=3):
    mcmc = MCMC(kernel, num_samples=num_samples, warmup_steps=1, disable_progbar=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # short runs: noise warnings
        mcmc.run(*args)
    return mcmc


# ------------------------------------------------------------------------------ the kernels

@pytest.mark.parametrize("name", list(KERNELS))
def test_every_kernel_refuses_targets_n1_against_a_mean_b(data, name):
    """Before: U was about B = 16 times too large, silently (the (16, 16) log-density)."""
    x, y = data
    pyro.set_rng_seed(0)
    with pytest.raises(ValueError, match=TARGETS_N1):
        run(KERNELS[name](Regression()), x, y.unsqueeze(1))


@pytest.mark.parametrize("mode", ["subsample_size", "vectorized_chains", "full batch"])
def test_kernels_refuse_it_in_every_mode(data, mode):
    x, y = data
    model = Regression(batch=None)
    kw = {"subsample_size": {"subsample_size": B}, "vectorized_chains": {"vectorized_chains": 2},
          "full batch": {}}[mode]
    size = B if mode == "subsample_size" else N
    pyro.set_rng_seed(0)
    with pytest.raises(ValueError, match=rf"observed site 'obs'.*\({size}, 1\).*\({size},\)"):
        run(SGLD(model, EPS, **kw), x, y.unsqueeze(1))


def test_a_network_output_b1_against_targets_b_is_refused_too(data):
    """The reverse mistake: the plate broadcasts the (B, 1) mean to (B, B) along dim -2."""
    x, y = data
    with pytest.raises(ValueError, match=r"observed site 'obs'.*along dim -2, which is no "
                                         r"plate's.*scored 16 times"):
        run(SGLD(Regression(squeeze=False), EPS), x, y)


def _count_checks(monkeypatch) -> list[str]:
    """The names of the sites checked from now on, by tracing and by the log-joint messenger."""
    calls: list[str] = []
    real = tracing_module.check_observed_site
    for module in (tracing_module, log_joint_module):
        monkeypatch.setattr(module, "check_observed_site",
                            lambda site: calls.append(site["name"]) or real(site))
    return calls


def test_the_check_runs_once_at_setup_not_per_step(data, monkeypatch):
    """The hot path pays nothing: one check per observed site when the kernel traces the model
    (once per chain), none in the 3 x 5 SG steps that follow."""
    calls = _count_checks(monkeypatch)
    x, y = data
    pyro.set_rng_seed(0)
    run(SGLD(Regression(), EPS, num_steps_per_sample=5), x, y)
    assert calls == ["obs"]
    calls.clear()
    run(SGLD(Regression(), EPS, vectorized_chains=3), x, y)
    assert calls == ["obs"] * 3


# ------------------------------------------------------------------------------- LeanELBO

def _loss(elbo, model, *args):
    pyro.clear_param_store()
    pyro.set_rng_seed(0)
    guide = AutoNormal(model)
    guide(*args)
    return elbo.loss(model, guide, *args)


def test_lean_elbo_refuses_it_as_trace_elbo_does(data, monkeypatch):
    x, y = data
    with pytest.raises(ValueError, match="invalid log_prob shape"):
        _loss(Trace_ELBO(), Regression(), x, y.unsqueeze(1))
    with pytest.raises(ValueError, match=TARGETS_N1):  # before: a loss ~16 times too large
        _loss(LeanELBO(), Regression(), x, y.unsqueeze(1))
    # checked on the first particle of each argument shape only
    calls = _count_checks(monkeypatch)
    elbo, model = LeanELBO(), Regression()
    pyro.clear_param_store()
    guide = AutoNormal(model)
    guide(x, y)
    for _ in range(4):
        elbo.loss(model, guide, x, y)
    assert calls == ["obs"]
    elbo.loss(model, guide, x[:50], y[:50])  # new shapes: checked again
    assert calls == ["obs", "obs"]


# -------------------------------------------------------------------------------- to_arviz

def test_to_arviz_refuses_it_in_the_replay(data):
    """Before: a full-batch model exported a (1, draws, N, N) log-likelihood, silently."""
    x, y = data
    model = Regression(batch=None)
    pyro.set_rng_seed(0)
    draws = {k: v for k, v in run(SGLD(model, EPS), x, y).get_samples().items()}
    assert to_arviz(draws, model=model, model_args=(x, y)).log_likelihood["obs"].shape == (
        1, 3, N)
    with pytest.raises(ValueError, match=rf"observed site 'obs'.*\({N}, 1\).*\({N},\)"):
        to_arviz(draws, model=model, model_args=(x, y.unsqueeze(1)))


# ------------------------------------------------------------------------------------- BNN

def _bnn(likelihood, out=1, batch=B):
    torch.manual_seed(1)
    net = torch.nn.Sequential(torch.nn.Linear(D, 8), torch.nn.Tanh(), torch.nn.Linear(8, out))
    return BNN(net, likelihood, subsample_size=batch)


def test_bnn_reads_targets_n1_as_n(data):
    """The documented rule: one trailing dimension of size 1 is dropped, so (N, 1) and (N,)
    are the same model (the same loss, potential and export, to the bit)."""
    x, y = data
    model = _bnn(HomoskedasticGaussian())
    assert _loss(LeanELBO(), model, x, y.unsqueeze(1)) == _loss(LeanELBO(), model, x, y)
    lps = []
    for target in (y, y.unsqueeze(1)):
        pyro.set_rng_seed(0)
        kernel = SGLD(_bnn(HomoskedasticGaussian()), EPS)
        mcmc = run(kernel, x, target)
        lps.append(kernel.diagnostics()["sample_stats"]["lp"])
    assert torch.equal(lps[0], lps[1])
    draws = mcmc.get_samples()
    ll = [to_arviz(draws, model=model, model_args=(x, t)).log_likelihood["obs"].values
          for t in (y, y.unsqueeze(1))]
    assert ll[0].shape == (1, 3, N) and (ll[0] == ll[1]).all()


def test_bnn_refuses_other_shapes_naming_both():
    """One-hot rows against Categorical: torch would score each row's C entries as C labels."""
    g = torch.Generator().manual_seed(0)
    x, labels = torch.randn(N, D, generator=g), torch.randint(0, 3, (N,), generator=g)
    one_hot = torch.nn.functional.one_hot(labels, 3)
    model = _bnn(Categorical(), out=3)
    with pytest.raises(ValueError, match=r"BNN: observed site 'obs': the targets of the "
                                         r"minibatch have shape \(16, 3\) and the likelihood's "
                                         r"distribution has shape \(16,\)"):
        model(x, one_hot)
    model(x, labels)  # class indices, (N,) or (N, 1), are fine
    model(x, labels.unsqueeze(1))


# ------------------------------------------------------------------- what stays allowed

def _trace_site(model, *args):
    return pyro.poutine.trace(model).get_trace(*args).nodes["obs"]


def _error(model, *args):
    site = _trace_site(model, *args)
    return observed_shape_error(site["name"], site["fn"], site["value"],
                                site["cond_indep_stack"])


def test_shapes_users_legitimately_write_are_allowed():
    y = torch.randn(N)

    def iid_without_plate(y):  # NUTS accepts it: each observation once
        mu = pyro.sample("mu", dist.Normal(0.0, 1.0))
        pyro.sample("obs", dist.Normal(mu, 1.0), obs=y)

    def scalar_value_in_a_plate(y):  # one value shared by the plate's elements
        mu = pyro.sample("mu", dist.Normal(0.0, 1.0))
        with pyro.plate("data", N):
            pyro.sample("obs", dist.Normal(mu * torch.ones(N), 1.0), obs=y[0])

    def multi_output(y):  # event dims
        mu = pyro.sample("mu", dist.Normal(0.0, 1.0))
        with pyro.plate("data", N):
            pyro.sample("obs", dist.Normal(mu * torch.ones(N, 2), 1.0).to_event(1),
                        obs=y.unsqueeze(-1).expand(N, 2))

    def replicates(y):  # two observations per point, on a dimension of the value's own
        mu = pyro.sample("mu", dist.Normal(0.0, 1.0))
        with pyro.plate("data", N):
            pyro.sample("obs", dist.Normal(mu * torch.ones(N), 1.0), obs=torch.stack([y, y]))

    def two_plates(y):
        mu = pyro.sample("mu", dist.Normal(0.0, 1.0))
        with pyro.plate("rows", 2, dim=-2), pyro.plate("data", N, dim=-1):
            pyro.sample("obs", dist.Normal(mu, 1.0), obs=torch.stack([y, y]))

    for model in (iid_without_plate, scalar_value_in_a_plate, multi_output, replicates,
                  two_plates):
        assert _error(model, y) is None, model.__name__


def test_the_rule_names_the_site_and_both_shapes():
    def model(y):
        mu = pyro.sample("mu", dist.Normal(0.0, 1.0).expand([N]).to_event(1))
        pyro.sample("obs", dist.Normal(mu, 1.0), obs=y)  # no plate

    message = _error(model, torch.randn(N, 1))
    assert message.startswith(f"observed site 'obs': the value of shape ({N}, 1) and the "
                              f"distribution of shape ({N},)")
    assert f"log-density of shape ({N}, {N})" in message
    assert "y.squeeze(-1)" in message
