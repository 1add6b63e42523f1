"""LeanELBO is Trace_ELBO: the same loss, gradients, draws and random stream for the guides it
covers (on models written here for the test, not the package's own BNN only), and exactly
Trace_ELBO, with one warning, for the guides it does not."""

import warnings

import pyro
import pyro.distributions as dist
import pytest
import torch
from pyro.infer import SVI, Trace_ELBO
from pyro.infer.autoguide import (
    AutoDelta,
    AutoDiagonalNormal,
    AutoMultivariateNormal,
    AutoNormal,
)
from pyro.nn import PyroModule, PyroParam, PyroSample
from torch.distributions import constraints

from pyro_flat.infer import LeanELBO, LocalReparameterization, SharpnessAwareELBO

GUIDES = {"AutoNormal": AutoNormal, "AutoDiagonalNormal": AutoDiagonalNormal,
          "AutoDelta": AutoDelta}


@pytest.fixture
def float64():
    old = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    yield
    torch.set_default_dtype(old)


# ------------------------------------------------------------------------------ user models

class TwoLayerNet(PyroModule):
    """A network written the way Pyro's tutorials write one: PyroSample priors by hand, a
    learned (non-random) output noise, a HalfCauchy prior scale of the first layer."""

    def __init__(self, d_in=3, hidden=5):
        super().__init__()
        self.tau = PyroSample(dist.HalfCauchy(1.0))
        self.fc1 = PyroModule[torch.nn.Linear](d_in, hidden)
        self.fc1.weight = PyroSample(lambda _: dist.Normal(0.0, self.tau).expand(
            [hidden, d_in]).to_event(2))
        self.fc1.bias = PyroSample(dist.Normal(0.0, 1.0).expand([hidden]).to_event(1))
        self.fc2 = PyroModule[torch.nn.Linear](hidden, 1)
        self.fc2.weight = PyroSample(dist.Normal(0.0, 1.0).expand([1, hidden]).to_event(2))
        self.fc2.bias = PyroSample(dist.Normal(0.0, 1.0).expand([1]).to_event(1))
        self.log_noise = PyroParam(torch.tensor(-1.0))

    def forward(self, x, y=None):
        mean = self.fc2(torch.tanh(self.fc1(x))).squeeze(-1)
        with pyro.plate("data", x.shape[0], subsample_size=8) as ind:
            pyro.sample("obs", dist.Normal(mean[ind], self.log_noise.exp()), obs=y[ind])


def logistic_model(x, y):
    """Bayesian logistic regression with a LogNormal prior scale and a Dirichlet mixing
    weight (a simplex: a shape-changing transform), minibatched by the model's plate."""
    s = pyro.sample("s", dist.LogNormal(0.0, 0.5))
    w = pyro.sample("w", dist.Normal(0.0, s).expand([x.shape[1]]).to_event(1))
    p = pyro.sample("p", dist.Dirichlet(torch.ones(3)))
    with pyro.plate("data", x.shape[0], subsample_size=10) as i:
        logits = x[i] @ w + p[0] - p[2]
        pyro.sample("y", dist.Bernoulli(logits=logits), obs=y[i])


def data(n=40, d=3):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(n, d, generator=g)
    return x, (x.sum(-1) + 0.3 * torch.randn(n, generator=g))


def classification_data(n=40, d=3):
    x, y = data(n, d)
    return x, (y > 0).to(x.dtype)


MODELS = {"net": (lambda: TwoLayerNet(), data),
          "logistic": (lambda: logistic_model, classification_data)}


def setup(model_name, guide_name, lrt=False):
    pyro.clear_param_store()
    make, make_data = MODELS[model_name]
    model, args = make(), make_data()
    guide = GUIDES[guide_name](model)
    pyro.set_rng_seed(3)
    guide(*args)  # create the parameters, then move them off their initial values
    with torch.no_grad():
        for _, p in pyro.get_param_store().named_parameters():
            p.add_(0.1 * torch.randn_like(p))
    if lrt:
        wrap = LocalReparameterization()
        model, guide = wrap.model(model), wrap.guide(guide)
    return model, guide, args


def loss_and_grads(elbo, model, guide, args, seed=11):
    store = pyro.get_param_store()
    for _, p in store.named_parameters():
        p.grad = None
    pyro.set_rng_seed(seed)
    loss = elbo.loss_and_grads(model, guide, *args)
    after = torch.rand(1)  # where the random stream continues
    return loss, {k: p.grad.clone() for k, p in store.named_parameters()
                  if p.grad is not None}, after


def assert_same(got, ref, rtol):
    assert got[0] == pytest.approx(ref[0], rel=rtol)
    assert got[1].keys() == ref[1].keys()
    for k in ref[1]:
        torch.testing.assert_close(got[1][k], ref[1][k], rtol=rtol, atol=rtol, msg=k)
    assert torch.equal(got[2], ref[2])


# ------------------------------------------------------------------------- same as Trace_ELBO

@pytest.mark.parametrize("guide_name", list(GUIDES))
@pytest.mark.parametrize("model_name", list(MODELS))
@pytest.mark.parametrize("num_particles", [1, 3])
def test_loss_gradients_and_stream_are_trace_elbo(float64, model_name, guide_name,
                                                   num_particles):
    """In float64 the only differences are the order of the sums and the guide's log-density
    written with the standardised draw: rounding at 1e-12 relative (the tolerance 1e-9 leaves
    three orders of magnitude for accumulation over a few hundred terms)."""
    model, guide, args = setup(model_name, guide_name)
    ref = loss_and_grads(Trace_ELBO(num_particles=num_particles), model, guide, args)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the lean path applies: no fall-back warning
        got = loss_and_grads(LeanELBO(num_particles=num_particles), model, guide, args)
    assert_same(got, ref, rtol=1e-9)


@pytest.mark.parametrize("guide_name", ["AutoNormal", "AutoDiagonalNormal"])
def test_local_reparameterisation_is_trace_elbo(float64, guide_name):
    model, guide, args = setup("net", guide_name, lrt=True)
    ref = loss_and_grads(Trace_ELBO(), model, guide, args)
    got = loss_and_grads(LeanELBO(), model, guide, args)
    assert_same(got, ref, rtol=1e-9)


@pytest.mark.parametrize("guide_name", ["AutoNormal", "AutoDiagonalNormal"])
def test_float32_bnn_first_step_within_float32_rounding(guide_name):
    """The package's BNN in float32, from a guide that has never run (the first call sets it
    up, drawing the same random numbers on both paths): agreement to float32 rounding of sums
    of ~1e3 terms (1e-5 relative)."""
    from pyro_flat.models.bnn import BNN
    from pyro_flat.models.likelihoods import Categorical

    results = []
    for elbo in (Trace_ELBO(), LeanELBO()):
        pyro.clear_param_store()
        torch.manual_seed(0)
        net = torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.ReLU(),
                                  torch.nn.Linear(16, 4))
        model = BNN(net, Categorical(), subsample_size=16)
        x, y = torch.randn(64, 6), torch.randint(0, 4, (64,))
        guide = GUIDES[guide_name](model, init_scale=0.05)
        results.append(loss_and_grads(elbo, model, guide, (x, y)))
    assert_same(results[1], results[0], rtol=1e-5)


@pytest.mark.parametrize("guide_name", list(GUIDES))
def test_svi_runs_the_same_optimisation(float64, guide_name):
    """Twenty SVI steps from the same start and seed: the same parameters (Adam amplifies
    rounding only mildly over 20 steps: 1e-7 relative)."""
    finals = []
    for elbo in (Trace_ELBO(), LeanELBO()):
        model, guide, args = setup("logistic", guide_name)
        pyro.set_rng_seed(5)
        svi = SVI(model, guide, pyro.optim.Adam({"lr": 0.05}), elbo)
        losses = [svi.step(*args) for _ in range(20)]
        finals.append((losses, {k: p.detach().clone()
                                for k, p in pyro.get_param_store().named_parameters()}))
    assert finals[1][0] == pytest.approx(finals[0][0], rel=1e-7)
    for k, v in finals[0][1].items():
        torch.testing.assert_close(finals[1][1][k], v, rtol=1e-7, atol=1e-7, msg=k)


def test_loss_and_differentiable_loss(float64):
    model, guide, args = setup("logistic", "AutoNormal")
    for method in ("loss", "differentiable_loss"):
        pyro.set_rng_seed(2)
        ref = getattr(Trace_ELBO(), method)(model, guide, *args)
        pyro.set_rng_seed(2)
        got = getattr(LeanELBO(), method)(model, guide, *args)
        assert float(got.detach() if torch.is_tensor(got) else got) == pytest.approx(
            float(ref.detach() if torch.is_tensor(ref) else ref), rel=1e-9)
    pyro.set_rng_seed(2)
    loss = LeanELBO().differentiable_loss(model, guide, *args)
    assert loss.requires_grad


def test_sharpness_aware_elbo_runs_on_the_lean_path(float64):
    """SharpnessAwareELBO at rho > 0: the lean path equals its trace path."""
    model, guide, args = setup("net", "AutoNormal")
    trace_path = SharpnessAwareELBO(rho=0.1)
    trace_path.lean_guide = lambda *a: None
    ref = loss_and_grads(trace_path, model, guide, args)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        got = loss_and_grads(SharpnessAwareELBO(rho=0.1), model, guide, args)
    assert_same(got, ref, rtol=1e-9)


# ------------------------------------------------------------------------------- fall-back

def handwritten_guide(x, y):
    loc = pyro.param("w_loc", torch.zeros(x.shape[1]))
    scale = pyro.param("w_scale", torch.ones(x.shape[1]), constraint=constraints.positive)
    pyro.sample("s", dist.LogNormal(0.0, 0.5))
    pyro.sample("w", dist.Normal(loc, scale).to_event(1))
    pyro.sample("p", dist.Dirichlet(torch.ones(3)))


def local_model(x, y):
    w = pyro.sample("w", dist.Normal(0.0, 1.0).expand([x.shape[1]]).to_event(1))
    with pyro.plate("data", x.shape[0]):
        z = pyro.sample("z", dist.Normal(0.0, 1.0))
        pyro.sample("y", dist.Normal(x @ w + z, 1.0), obs=y)


FALLBACKS = {
    "hand-written guide": (logistic_model, lambda m: handwritten_guide, "function",
                           classification_data),
    "AutoMultivariateNormal": (logistic_model, AutoMultivariateNormal, "AutoMultivariateNormal",
                               classification_data),
    "local latent": (local_model, AutoNormal, "inside a plate", data),
}


@pytest.mark.parametrize("case", list(FALLBACKS))
def test_other_guides_fall_back_to_trace_elbo_with_one_warning(float64, case):
    model, make_guide, reason, make_data = FALLBACKS[case]
    pyro.clear_param_store()
    args = make_data()
    guide = make_guide(model)
    pyro.set_rng_seed(0)
    guide(*args)
    ref = loss_and_grads(Trace_ELBO(), model, guide, args)
    elbo = LeanELBO()
    with pytest.warns(UserWarning, match="runs as Trace_ELBO") as record:
        got = loss_and_grads(elbo, model, guide, args)
    assert any(reason.lower() in str(w.message).lower() for w in record)
    assert got[0] == ref[0]  # exactly Trace_ELBO
    for k in ref[1]:
        assert torch.equal(got[1][k], ref[1][k]), k
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # said once
        loss_and_grads(elbo, model, guide, args)


def vectorizable_model(x, y):
    w = pyro.sample("w", dist.Normal(0.0, 1.0).expand([x.shape[1]]).to_event(1))
    with pyro.plate("data", x.shape[0]):
        pyro.sample("y", dist.Normal((w * x).sum(-1), 1.0), obs=y)


def test_vectorized_particles_fall_back(float64):
    pyro.clear_param_store()
    model, args = vectorizable_model, data()
    guide = AutoNormal(model)
    guide(*args)
    with pytest.warns(UserWarning, match="vectorize_particles"):
        got = loss_and_grads(LeanELBO(num_particles=2, vectorize_particles=True,
                                      max_plate_nesting=1), model, guide, args)
    ref = loss_and_grads(Trace_ELBO(num_particles=2, vectorize_particles=True,
                                    max_plate_nesting=1), model, guide, args)
    assert got[0] == ref[0]


def test_one_loss_for_two_guides(float64):
    """A LeanELBO object used with one guide, then another, then the first again, draws each
    from its own parameters (its drawer follows the guide it is given)."""
    elbo = LeanELBO()
    model, normal, args = setup("logistic", "AutoNormal")
    diagonal = AutoDiagonalNormal(model)
    diagonal(*args)
    for guide in (normal, diagonal, normal):
        ref = loss_and_grads(Trace_ELBO(), model, guide, args)
        got = loss_and_grads(elbo, model, guide, args)
        assert_same(got, ref, rtol=1e-9)


def test_a_model_latent_the_guide_does_not_draw_is_a_clear_error(float64):
    pyro.clear_param_store()
    args = classification_data()
    guide = AutoNormal(pyro.poutine.block(logistic_model, hide=["p"]))
    guide(*args)
    with pytest.raises(RuntimeError, match="latent site 'p', which the guide does not draw"):
        LeanELBO().loss_and_grads(logistic_model, guide, *args)
