"""SharpnessAwareELBO: rho = 0 (and rho -> 0) is Trace_ELBO, the closed-form ascent step on a
quadratic, a conjugate linear regression, AutoDelta = SAM on MAP, the name rule, bad input."""

import math

import pyro
import pyro.distributions as dist
import pytest
import torch
from harness import unconstrained
from pyro.infer import SVI, Trace_ELBO
from pyro.infer.autoguide import (
    AutoDelta,
    AutoDiagonalNormal,
    AutoLowRankMultivariateNormal,
    AutoNormal,
)
from torch.distributions import constraints

from pyro_flat.infer import SharpnessAwareELBO
from pyro_flat.infer.svi.sharpness_elbo import default_mean_and_scale
from pyro_flat.optim import SAM

Z = 4.5  # standard errors, as in tests/harness.py


# ------------------------------------------------------------------------------------ models

def regression_model(x, y, batch=10):
    """A vectorisable Bayesian linear regression with minibatches (random subsample)."""
    w = pyro.sample("w", dist.Normal(0.0, 1.0).expand([x.shape[1]]).to_event(1))
    with pyro.plate("data", len(x), subsample_size=batch) as i:
        pyro.sample("y", dist.Normal((w * x[i]).sum(-1), 0.5), obs=y[i])


def handwritten_guide(x, y, batch=10):
    d = x.shape[1]
    loc = pyro.param("w_loc", torch.zeros(d, dtype=x.dtype))
    scale = pyro.param("w_scale", torch.full((d,), 0.3, dtype=x.dtype),
                       constraint=constraints.positive)
    pyro.sample("w", dist.Normal(loc, scale).to_event(1))


def make_guide(kind, model, *args):
    guide = {"AutoNormal": lambda: AutoNormal(model, init_scale=0.3),
             "AutoDiagonalNormal": lambda: AutoDiagonalNormal(model, init_scale=0.3),
             "handwritten": lambda: handwritten_guide}[kind]()
    pyro.set_rng_seed(123)
    guide(*args)  # create the parameters
    store = pyro.get_param_store()
    with torch.no_grad():  # move them off their symmetric initial values
        for name in store.keys():
            unconstrained(name).add_(0.1 * torch.randn_like(unconstrained(name)))
    return guide


def regression_data(n=50, d=2, dtype=torch.float64):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(n, d, generator=g, dtype=dtype)
    y = x @ torch.linspace(1.0, -1.0, d, dtype=dtype) + 0.5 * torch.randn(n, generator=g,
                                                                          dtype=dtype)
    return x, y


def loss_and_grads(elbo, model, guide, *args, seed=7):
    store = pyro.get_param_store()
    for name in store.keys():
        unconstrained(name).grad = None
    pyro.set_rng_seed(seed)
    loss = elbo.loss_and_grads(model, guide, *args)
    after = torch.rand(1)  # the random stream after the call
    return loss, {k: unconstrained(k).grad.clone() for k in store.keys()}, after


GUIDES = ["AutoNormal", "AutoDiagonalNormal", "handwritten"]
PARTICLES = [(1, False), (3, False), (3, True)]


# ---------------------------------------------------------------------- reduce to Trace_ELBO

@pytest.mark.parametrize("kind", GUIDES)
@pytest.mark.parametrize("num_particles,vectorize", PARTICLES)
def test_rho_zero_is_trace_elbo(kind, num_particles, vectorize):
    x, y = regression_data()
    guide = make_guide(kind, regression_model, x, y)
    kw = dict(num_particles=num_particles, vectorize_particles=vectorize)
    ref = loss_and_grads(Trace_ELBO(**kw), regression_model, guide, x, y)
    got = loss_and_grads(SharpnessAwareELBO(rho=0.0, **kw), regression_model, guide, x, y)
    # The lean path (LeanELBO) writes the guide's log-density with the standardised draw and
    # sums the terms in another order. The guide's parameters are float32 (initialised from the
    # float32 prior Normal(0., 1.)), so the two agree to float32 rounding (~1e-7 per term).
    assert got[0] == pytest.approx(ref[0], rel=1e-8, abs=1e-5)
    assert got[1].keys() == ref[1].keys()
    for k in ref[1]:
        torch.testing.assert_close(got[1][k], ref[1][k], rtol=1e-5, atol=1e-5, msg=k)
    assert torch.equal(got[2], ref[2])


@pytest.mark.parametrize("kind", GUIDES)
@pytest.mark.parametrize("num_particles,vectorize", PARTICLES)
def test_tiny_rho_replays_the_same_noise_and_minibatch(kind, num_particles, vectorize):
    """The two-pass path with rho -> 0 must reproduce Trace_ELBO: only if the second pass reuses
    the first pass's guide noise and minibatch (a fresh draw changes the gradients at O(1))."""
    x, y = regression_data()
    guide = make_guide(kind, regression_model, x, y)
    kw = dict(num_particles=num_particles, vectorize_particles=vectorize)
    ref = loss_and_grads(Trace_ELBO(**kw), regression_model, guide, x, y)
    got = loss_and_grads(SharpnessAwareELBO(rho=1e-9, **kw), regression_model, guide, x, y)
    assert got[0] == pytest.approx(ref[0], rel=1e-8, abs=1e-5)  # float32 guide (see above)
    for k in ref[1]:
        # the gradient moves by |H e| <= ||H|| rho (far below 1e-6 here) and by float32
        # rounding of the guide's terms on the lean path
        assert torch.allclose(got[1][k], ref[1][k], rtol=1e-5, atol=1e-5), k
    assert torch.equal(got[2], ref[2])  # the random stream continues as after Trace_ELBO


def test_no_means_is_trace_elbo():
    x, y = regression_data()
    guide = make_guide("AutoNormal", regression_model, x, y)
    ref = loss_and_grads(Trace_ELBO(), regression_model, guide, x, y)
    got = loss_and_grads(SharpnessAwareELBO(rho=0.5, mean_params=lambda name: False),
                         regression_model, guide, x, y)
    assert got[0] == pytest.approx(ref[0], rel=1e-8, abs=1e-5)  # float32 guide (see above)
    for k in ref[1]:
        torch.testing.assert_close(got[1][k], ref[1][k], rtol=1e-5, atol=1e-5, msg=k)


# ------------------------------------------------------------- closed form on a quadratic

def quadratic_target(dim=3):
    g = torch.Generator().manual_seed(1)
    a = torch.randn(dim, dim, generator=g, dtype=torch.float64)
    h = a @ a.T + torch.eye(dim, dtype=torch.float64)
    m = torch.randn(dim, generator=g, dtype=torch.float64)
    return h, m


def quadratic_model(h, m):
    # -log p(w) = (w - m)^T H (w - m) / 2 + const: gradient H (w - m), Hessian H
    pyro.sample("w", dist.MultivariateNormal(m, precision_matrix=h))


MEAN_AND_SCALE = {"AutoNormal": ("AutoNormal.locs.w", "AutoNormal.scales.w"),
                  "AutoDiagonalNormal": ("AutoDiagonalNormal.loc", "AutoDiagonalNormal.scale"),
                  "handwritten": ("w_loc", "w_scale")}


def quadratic_guide(h, m):
    handwritten_guide(torch.zeros(1, len(m), dtype=m.dtype), None)


@pytest.mark.parametrize("geometry,radius", [(False, "metric"), (True, "metric"),
                                             (True, "euclidean")])
@pytest.mark.parametrize("kind", GUIDES)
def test_ascent_step_has_the_closed_form_direction_and_length(kind, geometry, radius):
    h, m = quadratic_target()
    model = quadratic_model
    guide = {"handwritten": lambda: quadratic_guide}.get(kind, lambda: None)()
    if guide is None:
        guide = AutoNormal(model, init_scale=0.3) if kind == "AutoNormal" else \
            AutoDiagonalNormal(model, init_scale=0.3)
    pyro.set_rng_seed(0)
    guide(h, m)
    store = pyro.get_param_store()
    loc_name, scale_name = MEAN_AND_SCALE[kind]
    with torch.no_grad():
        unconstrained(loc_name).add_(torch.tensor([0.5, -0.3, 0.2], dtype=torch.float64))
    mu = store[loc_name].detach().clone()
    sigma = store[scale_name].detach().clone()
    # the guide's noise z at the seed the losses use (the guide runs first in Trace_ELBO)
    pyro.set_rng_seed(7)
    w = pyro.poutine.trace(guide).get_trace(h, m).nodes["w"]["value"]
    z = (w - mu) / sigma
    rho = 0.2
    _, g0, _ = loss_and_grads(Trace_ELBO(), model, guide, h, m)
    elbo = SharpnessAwareELBO(rho=rho, geometry=geometry, radius=radius)
    _, g1, _ = loss_and_grads(elbo, model, guide, h, m)
    g = h @ (mu + sigma * z - m)  # the mean's gradient at mu (the entropy term has none)
    assert torch.allclose(g0[loc_name], g, atol=1e-10)
    d = 1.0 / sigma if geometry else torch.ones_like(sigma)
    if radius == "metric":
        e = rho * d * g / torch.sqrt(g @ (d * g))
    else:
        e = rho * d * g / torch.linalg.vector_norm(d * g)
    # direction D g and length rho in the ball's norm (radius="metric") or in the Euclidean
    # norm (radius="euclidean"), recovered from the gradients alone
    e_seen = torch.linalg.solve(h, g1[loc_name] - g0[loc_name])
    assert torch.allclose(e_seen, e, atol=1e-10)
    norm = d if radius == "metric" else torch.ones_like(d)
    assert float(torch.sqrt(e_seen @ (e_seen / norm))) == pytest.approx(rho, rel=1e-9)
    # the scale takes its gradient at mu' (Danskin): d/dsigma = z * H(mu' + sigma z - m) - 1/sigma
    raw = unconstrained(scale_name)
    to_sigma = torch.distributions.transform_to(store.get_state()["constraints"][scale_name])
    dsigma_du = torch.autograd.functional.jacobian(to_sigma, raw.detach()).diagonal()
    expected = (z * (h @ (mu + e + sigma * z - m)) - 1.0 / sigma) * dsigma_du
    assert torch.allclose(g1[scale_name], expected, atol=1e-9)
    # the means are restored exactly
    assert torch.equal(store[loc_name].detach(), mu)


# --------------------------------------------------------------- conjugate linear regression

@pytest.mark.slow
def test_conjugate_regression_fit_stays_at_the_closed_form_posterior():
    """Mean-field Gaussian SVI with a small rho on y = X b + N(0, 1), b ~ N(0, I).

    Closed form: posterior precision L = I + X^T X, mean m = L^-1 X^T y; the mean-field optimum
    has means m and scales 1 / sqrt(L_ii). With rho > 0 the means stay at m in expectation (at
    mu = m the ascent step e(z) is odd in z, so E[L e] = 0), and the scale's stationarity
    equation L_ii s + c - 1/s = 0 gains |c| = |E[z_i (L e)_i]| <= sqrt(2/pi) ||L||_2 rho, which
    moves s by at most that over L_ii (its slope is >= L_ii). Tolerance: that bias plus Z
    standard errors of the averaged final iterates (batch means over 10 batches).
    """
    g = torch.Generator().manual_seed(3)
    n, d = 100, 3
    x = torch.randn(n, d, generator=g, dtype=torch.float64)
    y = x @ torch.tensor([1.0, -0.5, 0.25], dtype=torch.float64) + torch.randn(
        n, generator=g, dtype=torch.float64)
    lam = torch.eye(d, dtype=torch.float64) + x.T @ x
    m = torch.linalg.solve(lam, x.T @ y)
    s_mf = lam.diagonal().rsqrt()

    def model(x, y):
        b = pyro.sample("b", dist.Normal(torch.zeros(d, dtype=x.dtype), 1.0).to_event(1))
        with pyro.plate("data", n):
            pyro.sample("y", dist.Normal((b * x).sum(-1), 1.0), obs=y)

    rho = 0.002
    pyro.set_rng_seed(0)
    guide = AutoNormal(model, init_scale=0.1)
    elbo = SharpnessAwareELBO(rho=rho, num_particles=16, vectorize_particles=True)
    svi = SVI(model, guide, pyro.optim.ClippedAdam({"lr": 0.02, "lrd": 0.999}), elbo)
    locs, scales = [], []
    for step in range(1500):
        svi.step(x, y)
        if step >= 700:
            locs.append(guide.locs.b.detach().clone())
            scales.append(guide.scales.b.detach().clone())
    locs, scales = torch.stack(locs), torch.stack(scales)

    def mean_and_se(v):
        batches = v.reshape(10, -1, d).mean(1)
        return v.mean(0), batches.std(0) / math.sqrt(10)

    loc_hat, loc_se = mean_and_se(locs)
    scale_hat, scale_se = mean_and_se(scales)
    bias = math.sqrt(2 / math.pi) * float(torch.linalg.matrix_norm(lam, 2)) * rho \
        / lam.diagonal()
    assert ((loc_hat - m).abs() <= Z * loc_se + 1e-4).all(), (loc_hat, m, loc_se)
    assert ((scale_hat - s_mf).abs() <= bias + Z * scale_se + 1e-4).all(), (
        scale_hat, s_mf, bias, scale_se)
    # the check can fail: the tolerance is well below the posterior's own spread
    assert (Z * loc_se + 1e-4 < 0.2 * s_mf).all()


# -------------------------------------------------------------------- AutoDelta: SAM on MAP

def test_autodelta_map_step_equals_a_sam_step():
    torch.manual_seed(0)
    x = torch.randn(40, 3, dtype=torch.float64)
    y = x @ torch.tensor([1.0, -2.0, 0.5], dtype=torch.float64) + 0.3 * torch.randn(
        40, dtype=torch.float64)

    def model(x, y):
        w = pyro.sample("w", dist.Normal(torch.zeros(3, dtype=x.dtype), 2.0).to_event(1))
        s = pyro.sample("s", dist.LogNormal(torch.tensor(0.0, dtype=x.dtype), 1.0))
        with pyro.plate("data", len(x)):
            pyro.sample("y", dist.Normal((w * x).sum(-1), s), obs=y)

    rho, lr = 0.1, 1e-3
    guide = AutoDelta(model)
    pyro.set_rng_seed(0)
    guide(x, y)
    store = pyro.get_param_store()
    start = {k: unconstrained(k).detach().clone() for k in store.keys()}
    # SAM in a plain torch loop on the same loss, -log p(theta, y), in the unconstrained space
    theta = {k: v.clone().requires_grad_() for k, v in start.items()}
    opt = SAM(list(theta.values()), torch.optim.SGD, rho=rho, lr=lr)

    def closure():
        opt.zero_grad()
        w = theta["AutoDelta.w"]
        s_raw = theta["AutoDelta.s"]
        s = torch.distributions.transform_to(store.get_state()["constraints"]["AutoDelta.s"])(s_raw)
        data = {"w": w, "s": s}
        loss = -pyro.poutine.trace(pyro.poutine.condition(model, data)).get_trace(
            x, y).log_prob_sum()
        loss.backward()
        return loss

    svi = SVI(model, guide, pyro.optim.SGD({"lr": lr}), SharpnessAwareELBO(rho=rho))
    for _ in range(5):
        opt.step(closure)
        svi.step(x, y)
    for k in start:
        assert not torch.equal(unconstrained(k).detach(), start[k])
        assert torch.allclose(unconstrained(k).detach(), theta[k].detach(), atol=1e-12), k


# ------------------------------------------------------------------------ the rule, BN, input

@pytest.mark.parametrize("name,store,expected", [
    ("w_loc", ["w_scale"], (True, "w_scale")),
    ("bias_mu", ["bias_sigma"], (True, "bias_sigma")),
    ("layer.weight_mean", ["layer.weight_std"], (True, "layer.weight_std")),
    ("w_loc", [], (True, None)),
    ("local_scale", [], (False, None)),
    ("temperature", [], (False, None)),
])
def test_name_rule_for_handwritten_guides(name, store, expected):
    assert default_mean_and_scale(name, store) == expected


def test_autoguides_go_by_structure_not_site_names():
    def model():
        # site names holding "scale" / "loc" tokens must not confuse the rule
        pyro.sample("noise_scale", dist.LogNormal(0.0, 1.0))
        pyro.sample("loc", dist.Normal(0.0, 1.0))

    cases = {AutoNormal: {"AutoNormal.locs.noise_scale": (True, "AutoNormal.scales.noise_scale"),
                          "AutoNormal.locs.loc": (True, "AutoNormal.scales.loc"),
                          "AutoNormal.scales.loc": (False, None)},
             AutoDiagonalNormal: {"AutoDiagonalNormal.loc": (True, "AutoDiagonalNormal.scale"),
                                  "AutoDiagonalNormal.scale": (False, None)},
             AutoDelta: {"AutoDelta.noise_scale": (True, None), "AutoDelta.loc": (True, None)}}
    for cls, expected in cases.items():
        pyro.clear_param_store()
        guide = cls(model)
        guide()
        names = list(pyro.get_param_store().keys())
        assert set(expected) <= set(names)
        for name, want in expected.items():
            assert default_mean_and_scale(name, names, guide) == want, name


def test_overrides_choose_means_and_scales():
    x, y = regression_data()
    pyro.set_rng_seed(0)
    handwritten_guide(x, y)
    elbo = SharpnessAwareELBO(rho=0.1, geometry=True, mean_params=["w_loc"],
                              scale_params={"w_loc": "w_scale"})
    pyro.set_rng_seed(1)
    elbo.loss_and_grads(regression_model, handwritten_guide, x, y)
    with pytest.raises(ValueError, match="mean_params"):
        SharpnessAwareELBO(rho=0.1, mean_params=["nope"]).loss_and_grads(
            regression_model, handwritten_guide, x, y)


def test_geometry_needs_scales():
    x, y = regression_data()
    guide = AutoDelta(regression_model)
    with pytest.raises(ValueError, match="geometry=True needs a scale"):
        SharpnessAwareELBO(rho=0.1, geometry=True).loss_and_grads(regression_model, guide, x, y)


@pytest.mark.parametrize("rho", [-0.1, float("nan"), float("inf"), "big", None])
def test_bad_rho(rho):
    with pytest.raises(ValueError, match="rho"):
        SharpnessAwareELBO(rho=rho)


def test_bad_arguments():
    with pytest.raises(ValueError, match="mean_params"):
        SharpnessAwareELBO(mean_params="w_loc")
    with pytest.raises(ValueError, match="radius must be 'metric' or 'euclidean'"):
        SharpnessAwareELBO(geometry=True, radius="l2")
    with pytest.raises(ValueError, match="batchnorm_modules"):
        SharpnessAwareELBO(batchnorm_modules=[torch.nn.Linear(2, 2)])


def test_batchnorm_statistics_move_once_per_step():
    from pyro.nn import PyroModule, PyroSample

    class Net(PyroModule):
        def __init__(self):
            super().__init__()
            self.fc = PyroModule[torch.nn.Linear](3, 2)
            self.fc.weight = PyroSample(dist.Normal(0.0, 1.0).expand([2, 3]).to_event(2))
            self.bn = torch.nn.BatchNorm1d(2)

        def forward(self, x, y):
            out = self.bn(self.fc(x)).sum(-1)
            with pyro.plate("data", len(x)):
                pyro.sample("y", dist.Normal(out, 1.0), obs=y)

    torch.manual_seed(0)
    x, y = torch.randn(16, 3), torch.randn(16)
    stats = {}
    for name, elbo in (("trace", Trace_ELBO()), ("sa", SharpnessAwareELBO(rho=0.5))):
        pyro.clear_param_store()
        torch.manual_seed(1)
        net = Net()
        guide = AutoNormal(net)
        pyro.set_rng_seed(2)
        elbo.loss_and_grads(net, guide, x, y)
        stats[name] = (net.bn.running_mean.clone(), int(net.bn.num_batches_tracked))
    assert torch.equal(stats["sa"][0], stats["trace"][0])
    assert stats["sa"][1] == stats["trace"][1] == 2  # guide setup + one step


# --------------------------------------------------- guides the lean path does not cover


def test_low_rank_guide_warns_what_really_happens_the_sharpness_aware_step():
    """AutoLowRankMultivariateNormal is not on LeanELBO's lean path. Before, the warning said
    "runs as Trace_ELBO here", but the step is applied: the gradients are Trace_ELBO's at the
    guide's loc moved by e = rho g / |g| (g: Trace_ELBO's gradient of loc at the same seed),
    the loss is Trace_ELBO's at the unmoved loc. The warning now says that."""
    x, y = regression_data()
    pyro.clear_param_store()
    guide = AutoLowRankMultivariateNormal(regression_model, rank=1, init_scale=0.3)
    pyro.set_rng_seed(123)
    guide(x, y)
    loc = "AutoLowRankMultivariateNormal.loc"
    with torch.no_grad():
        unconstrained(loc).add_(torch.tensor([0.3, -0.2]))
    at_mu = loss_and_grads(Trace_ELBO(), regression_model, guide, x, y)
    rho, g = 0.1, at_mu[1][loc]
    with torch.no_grad():
        unconstrained(loc).add_(rho * g / g.norm())
    moved = loss_and_grads(Trace_ELBO(), regression_model, guide, x, y)
    with torch.no_grad():
        unconstrained(loc).sub_(rho * g / g.norm())
    with pytest.warns(UserWarning) as record:
        got = loss_and_grads(SharpnessAwareELBO(rho=rho), regression_model, guide, x, y)
    (message,) = [str(w.message) for w in record]
    assert message.startswith("SharpnessAwareELBO takes its sharpness-aware step on "
                              "Trace_ELBO's traces here instead of LeanELBO's lean path (the "
                              "guide is a AutoLowRankMultivariateNormal")
    assert "radius rho=0.1" in message and "loc" in message
    assert "runs as Trace_ELBO" not in message
    assert got[0] == at_mu[0]  # the loss at the unmoved means
    for k in moved[1]:  # every gradient at the moved means, not at mu
        torch.testing.assert_close(got[1][k], moved[1][k], rtol=1e-6, atol=1e-7, msg=k)
        assert not torch.allclose(got[1][k], at_mu[1][k], rtol=1e-3), k


def test_low_rank_guide_at_rho_zero_runs_as_trace_elbo_and_says_so():
    x, y = regression_data()
    pyro.clear_param_store()
    guide = AutoLowRankMultivariateNormal(regression_model, rank=1)
    guide(x, y)
    with pytest.warns(UserWarning, match="SharpnessAwareELBO runs as Trace_ELBO here: the "
                                         "guide is a AutoLowRankMultivariateNormal"):
        loss_and_grads(SharpnessAwareELBO(rho=0.0), regression_model, guide, x, y)
