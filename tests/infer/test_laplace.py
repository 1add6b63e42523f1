"""Laplace (pyro_flat.infer.laplace): the last layer's curvature against autograd's Hessian,
the marginal likelihood and predictives against laplace-torch (last layer and subnetworks),
the structures' square roots and output covariances against dense algebra, the prior
precision's optimum, and the guide."""

from __future__ import annotations

import math

import pytest
import torch
from pyro.infer import Predictive

import pyro_flat
from pyro_flat.evaluation.predictive import guide_draws
from pyro_flat.infer.laplace import LaplaceGuide, LastLayerLaplace, SubnetworkLaplace
from pyro_flat.infer.laplace.curvature import FullCurvature, KronCurvature
from pyro_flat.models.bnn import BNN
from pyro_flat.models.likelihoods import Categorical
from pyro_flat.models.nn import make_bayesian

STRUCTURES = ("kron", "diag", "full")


def problem(task: str = "classification", outputs: int = 3):
    """A trained-looking 4-8-C tanh network (random weights) and 50 points."""
    g = torch.Generator().manual_seed(0)
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(),
                              torch.nn.Linear(8, outputs))
    x = torch.randn(50, 4, generator=g)
    y = (torch.randint(0, outputs, (50,), generator=g) if task == "classification"
         else torch.randn(50, outputs, generator=g))
    return net, x, y


def last_layer_loss(net, x, y, theta, task, sigma=1.0):
    """-log p(y | x, theta) with the last layer's parameters theta (weight rows, bias)."""
    feats = net[1](net[0](x)).double()
    w, b = theta[:-net[2].out_features].reshape(net[2].weight.shape), theta[
        -net[2].out_features:]
    out = feats @ w.T + b
    if task == "classification":
        return torch.nn.functional.cross_entropy(out, y, reduction="sum")
    return 0.5 * (out - y.double()).square().sum() / sigma**2


@pytest.mark.parametrize("task", ["classification", "regression"])
def test_ggn_of_a_linear_last_layer_is_the_hessian(task):
    """The last layer enters the outputs linearly, so its GGN is the loss's Hessian exactly
    (autograd, float64, to 1e-9); the diagonal structure is its diagonal, and the Kronecker
    one is G kron A on the weights and G on the bias."""
    net, x, y = problem(task)
    la = {s: LastLayerLaplace(net, task, s, sigma_noise=0.7).fit(x, y) for s in STRUCTURES}
    theta = la["full"].map_parameters
    hessian = torch.autograd.functional.hessian(
        lambda t: last_layer_loss(net, x, y, t, task, 0.7), theta)
    torch.testing.assert_close(la["full"].curvature.matrix, hessian, rtol=1e-9, atol=1e-9)
    torch.testing.assert_close(la["diag"].curvature.diagonal, hessian.diagonal(), rtol=1e-9,
                               atol=1e-9)
    kron = la["kron"].curvature
    g = kron.g_vectors @ torch.diag(kron.g_values) @ kron.g_vectors.T
    torch.testing.assert_close(g, hessian[-3:, -3:], rtol=1e-9, atol=1e-9)  # the bias block


def dense_precision(la: LastLayerLaplace) -> torch.Tensor:
    """The posterior precision of ``la``'s structure as a dense matrix."""
    c, delta = la.curvature, la.prior_precision
    if isinstance(c, FullCurvature):
        h = c.matrix
    elif isinstance(c, KronCurvature):
        g = c.g_vectors @ torch.diag(c.g_values) @ c.g_vectors.T
        a = c.a_vectors @ torch.diag(c.a_values) @ c.a_vectors.T
        h = torch.block_diag(torch.kron(g, a), g)
    else:
        h = torch.diag(c.diagonal)
    return h + delta * torch.eye(len(h), dtype=h.dtype)


@pytest.mark.parametrize("structure", STRUCTURES)
def test_square_root_log_det_and_output_covariance_are_the_dense_ones(structure):
    net, x, y = problem()
    la = LastLayerLaplace(net, "classification", structure, prior_precision=2.5).fit(x, y)
    precision = dense_precision(la)
    cov = torch.linalg.inv(precision)
    n = la.curvature.num_parameters
    root = la.curvature.scale_noise(torch.eye(n, dtype=torch.float64), 2.5)  # rows: S e_i
    torch.testing.assert_close(root.T @ root, cov, rtol=1e-8, atol=1e-10)
    assert la.log_det_precision() == pytest.approx(float(torch.logdet(precision)), rel=1e-10)
    feats = la.features(x[:6]).double()
    eye = torch.eye(3, dtype=torch.float64)
    jac = torch.cat([torch.einsum("cd,mh->mcdh", eye, feats).reshape(6, 3, -1),
                     eye.expand(6, -1, -1)], -1)
    torch.testing.assert_close(la.functional(x[:6])[1], jac @ cov @ jac.transpose(1, 2),
                               rtol=1e-8, atol=1e-10)


@pytest.mark.parametrize("task", ["classification", "regression"])
@pytest.mark.parametrize("structure", STRUCTURES)
@pytest.mark.parametrize("prior_precision", [1.0, 3.7])
def test_agrees_with_laplace_torch(task, structure, prior_precision):
    """laplace-torch (Daxberger et al. 2021) on the same network and data: the marginal
    likelihood to 1e-6 relative and the probit predictive (classification) or the linearised
    mean and variance (regression) to 1e-5 (laplace-torch computes in float32; the issue's
    bars are 1e-3 and 1e-4)."""
    laplace = pytest.importorskip("laplace")
    net, x, y = problem(task, 3 if task == "classification" else 2)
    kw = {"sigma_noise": 0.7} if task == "regression" else {}
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=50)
    ref = laplace.Laplace(net, task, subset_of_weights="last_layer",
                          hessian_structure=structure, prior_precision=prior_precision, **kw)
    ref.fit(loader)
    mine = LastLayerLaplace(net, task, structure, prior_precision=prior_precision,
                            **kw).fit(x, y)
    assert_agrees(mine, ref, task, x[:10])


def assert_agrees(mine, ref, task, x):
    """Marginal likelihood to 1e-6 relative; the probit predictive (classification) or the
    linearised mean and variance (regression) at ``x`` to 1e-5."""
    assert mine.log_marginal_likelihood() == pytest.approx(ref.log_marginal_likelihood().item(),
                                                           rel=1e-6)
    if task == "classification":
        expected = ref(x, pred_type="glm", link_approx="probit").double()
        torch.testing.assert_close(mine.predictive(x), expected, rtol=0, atol=1e-5)
    else:
        f_mu, f_var = ref(x, pred_type="glm")
        mean, cov = mine.functional(x)
        torch.testing.assert_close(mean, f_mu.double(), rtol=0, atol=1e-5)
        torch.testing.assert_close(cov, f_var.double(), rtol=0, atol=1e-5)


@pytest.mark.parametrize("structure", STRUCTURES)
def test_prior_precision_maximises_the_marginal_likelihood(structure):
    """At the chosen delta the derivative in log delta vanishes (central difference) and
    nearby values are no better; laplace-torch's gradient search, if installed, ends no
    higher."""
    net, x, y = problem()
    la = LastLayerLaplace(net, "classification", structure).fit(x, y)
    delta = la.optimize_prior_precision()
    h = 1e-4
    up, down = (la.log_marginal_likelihood(delta * math.exp(s)) for s in (h, -h))
    assert abs(up - down) / (2 * h) < 1e-4
    best = la.log_marginal_likelihood()
    assert best >= max(la.log_marginal_likelihood(delta * f) for f in (0.9, 1.1))
    try:
        import laplace
    except ImportError:
        return
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=50)
    ref = laplace.Laplace(net, "classification", subset_of_weights="last_layer",
                          hessian_structure=structure)
    ref.fit(loader)
    ref.optimize_prior_precision(method="marglik", pred_type="glm", link_approx="probit")
    assert best >= ref.log_marginal_likelihood().item() - 1e-4


def test_monte_carlo_predictive_averages_the_draws():
    net, x, y = problem()
    la = LastLayerLaplace(net, "classification", "kron").fit(x, y)
    probs = la.predictive(x[:5], link="mc", num_samples=20,
                          generator=torch.Generator().manual_seed(1))
    feats = la.features(x[:5]).double()
    by_hand = torch.stack([(feats @ w.double().T + b.double()).softmax(-1) for w, b in
                           la.sample_layer(20, torch.Generator().manual_seed(1))]).mean(0)
    torch.testing.assert_close(probs, by_hand, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(probs.sum(-1), torch.ones(5, dtype=torch.float64))


def test_guide_draws_the_last_layer_and_keeps_the_rest():
    """Through Predictive and guide_draws: every backbone site is the trained value, the last
    layer's draws have the Laplace covariance (each entry within 4 Monte Carlo standard
    errors over 4,000 draws), and the draws export to ArviZ with the model."""
    net, x, y = problem()
    la = LastLayerLaplace(net, "classification", "full", prior_precision=2.0).fit(x, y)
    guide = LaplaceGuide(la)
    trained = net[0].weight.detach().clone()
    model = BNN(make_bayesian(net), Categorical())  # in place: la keeps its own copy
    draws = guide_draws(guide, 4000, x, y)
    assert set(draws) == {"net.0.weight", "net.0.bias", "net.2.weight", "net.2.bias"}
    assert torch.equal(draws["net.0.weight"][17], trained)
    theta = torch.cat([draws["net.2.weight"].reshape(4000, -1), draws["net.2.bias"]], 1)
    theta = theta.double()
    cov = torch.linalg.inv(dense_precision(la))
    sd = cov.diagonal().sqrt()
    centred = theta - la.map_parameters
    assert ((centred.mean(0)).abs() <= 4 * sd / math.sqrt(4000)).all()
    empirical = centred.T @ centred / 4000
    se = torch.sqrt((cov.diagonal()[:, None] * cov.diagonal()[None, :] + cov.square()) / 4000)
    assert ((empirical - cov).abs() <= 4 * se).all()
    obs = Predictive(model, guide=guide, num_samples=3)(x)["obs"]
    assert obs.shape == (3, 50)
    idata = pyro_flat.to_arviz({k: v[:100] for k, v in draws.items()}, model=model,
                               model_args=(x, y))
    assert idata.log_likelihood["obs"].shape[-1] == 50


def test_bad_inputs_name_the_argument():
    net, x, y = problem()
    with pytest.raises(ValueError, match="likelihood must be"):
        LastLayerLaplace(net, "poisson")
    with pytest.raises(ValueError, match=r"structure must be one of \['diag', 'full', 'kron'\]"):
        LastLayerLaplace(net, structure="lowrank")
    with pytest.raises(ValueError, match="sigma_noise"):
        LastLayerLaplace(net, "regression", sigma_noise=0.0)
    with pytest.raises(ValueError, match="no nn.Linear"):
        LastLayerLaplace(torch.nn.Tanh())
    with pytest.raises(ValueError, match="has no bias"):
        LastLayerLaplace(torch.nn.Linear(3, 2, bias=False))
    with pytest.raises(ValueError, match="same number of points"):
        LastLayerLaplace(net).fit(x, y[:10])
    with pytest.raises(RuntimeError, match=r"fit\(x, y\) first"):
        LastLayerLaplace(net).log_marginal_likelihood()
    with pytest.raises(ValueError, match="must be fitted"):
        LaplaceGuide(LastLayerLaplace(net))
    with pytest.raises(ValueError, match="link must be"):
        LastLayerLaplace(net).fit(x, y).predictive(x, link="logit")


# --------------------------------------------------------------------------- subnetworks

SUBNET = torch.tensor([0, 3, 5, 17, 40, 41, 42, 50, 57])  # entries of both layers


@pytest.mark.parametrize("task", ["classification", "regression"])
@pytest.mark.parametrize("structure", ["full", "diag"])
def test_subnetwork_agrees_with_laplace_torch(task, structure):
    """laplace-torch's subnetwork Laplace on the same entries: marginal likelihood to 1e-6
    relative, the probit predictive (or the linearised mean and variance) to 1e-5."""
    laplace = pytest.importorskip("laplace")
    net, x, y = problem(task, 3 if task == "classification" else 2)
    kw = {"sigma_noise": 0.7} if task == "regression" else {}
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=50)
    ref = laplace.Laplace(net, task, subset_of_weights="subnetwork", hessian_structure=structure,
                          subnetwork_indices=SUBNET, prior_precision=2.0, **kw)
    ref.fit(loader)
    mine = SubnetworkLaplace(net, SUBNET, task, structure, prior_precision=2.0, **kw).fit(x, y)
    assert_agrees(mine, ref, task, x[:10])


def test_subnetwork_of_the_last_layer_is_the_last_layer_laplace():
    """Chosen by name, the last layer's parameters give LastLayerLaplace's full approximation
    (Jacobians by torch.func against the closed form). To 1e-6: the subnetwork runs the whole
    network in float64, LastLayerLaplace takes the backbone's features in float32."""
    net, x, y = problem()
    sub = SubnetworkLaplace(net, "2", prior_precision=1.7).fit(x, y)
    last = LastLayerLaplace(net, "classification", "full", prior_precision=1.7).fit(x, y)
    torch.testing.assert_close(sub.curvature.matrix, last.curvature.matrix, rtol=1e-6,
                               atol=1e-6)
    assert sub.log_marginal_likelihood() == pytest.approx(last.log_marginal_likelihood(),
                                                          rel=1e-6)
    torch.testing.assert_close(sub.predictive(x[:7]), last.predictive(x[:7]), rtol=1e-6,
                               atol=1e-6)
    probs = sub.predictive(x[:3], link="mc", num_samples=5,
                           generator=torch.Generator().manual_seed(0))
    torch.testing.assert_close(probs, last.predictive(x[:3], link="mc", num_samples=5,
                                                      generator=torch.Generator().manual_seed(0)),
                               rtol=1e-6, atol=1e-6)


def test_subnetwork_of_low_rank_adapters():
    """The adapters' factors of add_lora as the subnetwork (every other parameter frozen)."""
    from pyro_flat.models.finetune import add_lora, lora_parameter_names

    net, x, y = problem()
    adapted = add_lora(net, ["0", "2"], rank=2, generator=torch.Generator().manual_seed(0))
    la = SubnetworkLaplace(adapted, lora_parameter_names(adapted), structure="diag").fit(x, y)
    assert la.curvature.num_parameters == 2 * (4 + 8) + 2 * (8 + 3)
    la.optimize_prior_precision()
    probs = la.predictive(x[:4])
    assert probs.shape == (4, 3) and torch.allclose(probs.sum(-1), torch.ones(4,
                                                                               dtype=probs.dtype))


def test_subnetwork_bad_inputs():
    net, x, y = problem()
    with pytest.raises(ValueError, match=r"not found: \['9'\]"):
        SubnetworkLaplace(net, "9")
    with pytest.raises(ValueError, match=r"distinct positions in \[0, 67\)"):
        SubnetworkLaplace(net, torch.tensor([1, 1]))
    with pytest.raises(ValueError, match=r"distinct positions"):
        SubnetworkLaplace(net, torch.tensor([70]))
    with pytest.raises(ValueError, match="structure must be 'full' or 'diag'"):
        SubnetworkLaplace(net, "2", structure="kron")
