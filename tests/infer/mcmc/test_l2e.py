"""L2E: the meta-network port, the features, the update rule, and the kernel on Gaussian targets.

The Gaussian checks run 256 independent chains at once (``harness.GaussianTarget``) and use
``harness.check_gaussian``: every moment within 4.5 Monte Carlo standard errors (from the ESS)
of the sampler's exact stationary law.
"""

import math
from pathlib import Path

import harness
import pyro
import pyro.distributions as dist
import pytest
import torch

from pyro_flat import kernel_diagnostics
from pyro_flat.infer import L2E
from pyro_flat.infer.mcmc.l2e.meta_net import (
    DECAYS,
    NORM_EPS,
    L2EState,
    LearnedKinetic,
    MetaNet,
    l2e_step_,
)

OFFICIAL = Path(__file__).resolve().parents[3] / ".." / "shared" / "reference" / (
    "l2e_official_meta_params.npz")
needs_official = pytest.mark.skipif(not OFFICIAL.exists(), reason="reference file absent")


def random_net(seed: int = 0) -> MetaNet:
    return MetaNet.init(torch.Generator().manual_seed(seed), planted=3.0, descent=30.0)


@needs_official
def test_authors_meta_params_reproduce_the_fixture():
    net = MetaNet.load(OFFICIAL)
    out = net(torch.stack([torch.zeros(9), torch.ones(9)]))
    expected = torch.tensor([[-0.32551, 2.14761], [-6.30087, -31.17571]])
    assert torch.allclose(out, expected, atol=1e-4), out


def test_meta_net_shapes_files_and_flat_round_trip(tmp_path):
    net = random_net()
    assert net.num_params == 9 * 32 + 32 + 32 * 32 + 32 + 32 * 2 + 2
    x = torch.randn(7, 9)
    assert net(x).shape == (7, 2)
    path = tmp_path / "meta.npz"
    net.save(path)
    loaded = MetaNet.load(path)
    assert torch.equal(loaded(x), net(x))
    assert loaded.info["descent"] == 30.0
    assert torch.equal(MetaNet.from_flat(net.to_flat())(x), net(x))
    assert torch.equal(MetaNet.from_arrays(net.to_arrays())(x), net(x))


def test_meta_net_rejects_bad_parameters():
    arrays = random_net().to_arrays()
    with pytest.raises(ValueError, match="linear_2.b"):
        MetaNet.from_arrays({k: v for k, v in arrays.items() if k != "linear_2.b"})
    arrays["linear_0.w"] = arrays["linear_0.w"][:8]
    with pytest.raises(ValueError, match=r"layer 0 .* \(9, 32\)"):
        MetaNet.from_arrays(arrays)
    with pytest.raises(ValueError, match="1442"):
        MetaNet.from_flat(torch.zeros(10))


def test_features_are_normalised_per_tensor():
    """Each of the 9 features is divided by sqrt(1e-5 + mean(x^2)) over its own segment."""
    g = torch.Generator().manual_seed(0)
    theta = torch.randn(30, generator=g)
    state = L2EState.zeros(theta, [(0, 10), (10, 30)])
    state.raw.copy_(torch.randn(30, 9, generator=g) * torch.logspace(-4, 2, 9))
    state.raw[10:] *= 50.0
    out = state.normalise_()
    for a, b in [(0, 10), (10, 30)]:
        x = state.raw[a:b]
        assert torch.allclose(out[a:b], x / torch.sqrt(NORM_EPS + x.pow(2).mean(0)))
        big = x.pow(2).mean(0) > 1.0  # where eps is negligible, unit mean square
        assert torch.allclose(out[a:b, big].pow(2).mean(0), torch.ones(int(big.sum())))


def test_learned_kinetic_sees_grad_over_n_theta_r_and_moments():
    theta, grad_u, n = torch.randn(12), torch.randn(12), 40.0
    state = L2EState.zeros(theta)
    seen = {}

    class Spy(LearnedKinetic):
        def momentum_drift(self, theta, state, friction):
            out = super().momentum_drift(theta, state, friction)
            seen[True] = state.raw.clone()
            return out

        def velocity(self, theta, state):
            out = super().velocity(theta, state)
            seen[False] = state.raw.clone()
            return out

    l2e_step_(theta.clone(), state, grad_u, n, 0.1, 1.0, Spy(random_net()))
    raw = seen[True]
    assert torch.allclose(raw[:, 0], grad_u / n)
    assert torch.allclose(raw[:, 1], theta)
    assert torch.equal(raw[:, 2], torch.zeros(12))  # r starts at zero
    for j, d in enumerate(DECAYS):  # moving averages from zero after one step
        assert torch.allclose(raw[:, 3 + j], (1 - d) * grad_u / n)
    assert torch.equal(seen[False][:, 2], state.r)  # the second evaluation sees the new r


def reference_step(params, r, moments, grads_u, n, eps, noise, net, c=0.1, temp=1.0):
    """The authors' per-tensor update written out directly (lists of tensors)."""
    decays = torch.tensor(DECAYS)

    def features(p, g, m, mom):
        x = torch.cat([g[..., None], p[..., None], mom[..., None], m], -1)
        axes = tuple(range(p.ndim))
        return x * torch.rsqrt(NORM_EPS + x.pow(2).mean(axes, keepdim=True))

    new_p, new_r, new_m = [], [], []
    for p, mom, m, gu, xi in zip(params, r, moments, grads_u, noise, strict=True):
        g = gu / n
        m = decays * m + (1 - decays) * g[..., None]
        out = 1e-3 * net(features(p, g, m, mom).reshape(-1, 9)).reshape(*p.shape, 2)
        mom = mom - eps * (n * g + out[..., 0] + c * out[..., 1])
        mom = mom + math.sqrt(2 * c * eps * temp) * xi
        out = 1e-3 * net(features(p, g, m, mom).reshape(-1, 9)).reshape(*p.shape, 2)
        new_p.append(p + eps * out[..., 1])
        new_r.append(mom)
        new_m.append(m)
    return new_p, new_r, new_m


@pytest.mark.parametrize("official", [False, True])
def test_update_matches_the_authors_equations(official):
    if official and not OFFICIAL.exists():
        pytest.skip("reference file absent")
    net = MetaNet.load(OFFICIAL) if official else random_net()
    torch.manual_seed(1)
    shapes = [(4, 3), (3,), (2, 2, 2)]
    params = [torch.randn(s) for s in shapes]
    r = [torch.zeros(s) for s in shapes]
    moments = [torch.zeros(*s, 6) for s in shapes]
    flat = torch.cat([p.reshape(-1) for p in params])
    bounds = [(0, 12), (12, 15), (15, 23)]
    state = L2EState.zeros(flat, bounds)
    kinetic = LearnedKinetic(net)
    n, eps = 1000.0, math.sqrt(2 / 1000)
    for step in range(5):
        grads = [torch.randn(s) * 10 for s in shapes]
        gen = torch.Generator().manual_seed(step)
        l2e_step_(flat, state, torch.cat([g.reshape(-1) for g in grads]), n, eps, 1.0, kinetic,
                  generator=gen)
        noise = torch.randn(23, generator=torch.Generator().manual_seed(step))
        noise = [noise[a:b].view(s) for (a, b), s in zip(bounds, shapes, strict=True)]
        params, r, moments = reference_step(params, r, moments, grads, n, eps, noise, net)
    assert torch.allclose(flat, torch.cat([p.reshape(-1) for p in params]), atol=1e-6)
    assert torch.allclose(state.r, torch.cat([x.reshape(-1) for x in r]), atol=1e-5)
    assert torch.allclose(state.moments, torch.cat([m.reshape(-1, 6) for m in moments]))


def test_standard_kinetic_energy_samples_a_gaussian():
    target = harness.correlated_2d()
    eps, friction, temp = 0.1, 3.0, 0.5
    kernel = L2E(potential_fn=target, initial_params=target.initial_params(), step_size=eps,
                 kinetic_energy="standard", friction=friction, temperature=temp,
                 num_steps_per_sample=5)
    mcmc = harness.run(kernel, num_samples=600, warmup_steps=60)
    exact = harness.underdamped_exact_cov(target.precision, eps, friction, 1.0, temp)
    harness.check_gaussian(harness.chains_of(mcmc), target.mean, temp * target.cov,
                           exact_cov=exact)


def regression_model(x, y):
    w = pyro.sample("w", dist.Normal(0.0, 1.0).expand([2]).to_event(1))
    b = pyro.sample("b", dist.Normal(0.0, 1.0))
    with pyro.plate("data", len(x), subsample_size=25) as i:
        pyro.sample("y", dist.Normal(x[i] @ w + b, 0.5), obs=y[i])


def regression_data():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(200, 2, generator=g)
    return x, x @ torch.tensor([1.0, -2.0]) + 0.5 * torch.randn(200, generator=g)


def test_default_step_size_uses_the_models_n_and_is_deterministic():
    x, y = regression_data()
    runs = [harness.run(L2E(regression_model, meta_params=random_net(),
                            num_steps_per_sample=4), 10, 5, 7, x, y) for _ in range(2)]
    assert runs[0].kernel.base_step_size == pytest.approx(math.sqrt(2.0 / 200))
    assert runs[0].kernel.step_size is None  # the rule is in force; nothing wrote over it
    assert runs[0].kernel.data_size == 200
    for site in ("w", "b"):
        assert torch.equal(runs[0].get_samples()[site], runs[1].get_samples()[site])
    stats = kernel_diagnostics(runs[0])[0]["sample_stats"]
    assert set(stats) == {"lp", "step_size", "grad_norm", "diverging"}
    assert len(stats["lp"]) == 10 and torch.isfinite(stats["lp"]).all()


def full_batch_regression_model(x, y):
    w = pyro.sample("w", dist.Normal(0.0, 1.0).expand([2]).to_event(1))
    b = pyro.sample("b", dist.Normal(0.0, 1.0))
    with pyro.plate("data", len(x)):
        pyro.sample("y", dist.Normal(x @ w + b, 0.5), obs=y)


def test_full_batch_model_gives_n_from_its_data_plate():
    """With a given step and no subsampling, N is the size of the plate around the observed
    site (it was taken to be 1, silently: features N times too large, a posterior about 8
    times too narrow in the conformance matrix), and the run is the one num_data=N gives."""
    x, y = regression_data()
    runs = [harness.run(L2E(full_batch_regression_model, 0.05, meta_params=random_net(),
                            num_steps_per_sample=3, **n), 6, 4, 3, x, y)
            for n in ({}, {"num_data": 200})]
    assert runs[0].kernel.data_size == 200
    for site in ("w", "b"):
        assert torch.equal(runs[0].get_samples()[site], runs[1].get_samples()[site])


def no_plate_model(x, y):
    w = pyro.sample("w", dist.Normal(0.0, 1.0).expand([2]).to_event(1))
    pyro.sample("y", dist.Normal(x @ w, 0.5).to_event(1), obs=y)


def test_unknown_n_is_an_error_not_one():
    x, y = regression_data()
    with pytest.raises(ValueError, match=r"needs the dataset size N.*num_data=N"):
        harness.run(L2E(no_plate_model, 0.05, meta_params=random_net()), 2, 1, 0, x, y)
    target = harness.correlated_2d()
    with pytest.raises(ValueError, match=r"num_data=N"):
        harness.run(L2E(potential_fn=target, initial_params=target.initial_params(),
                        step_size=0.05, meta_params=random_net()), 2, 1)
    # told N, or with the standard kinetic energy (which does not read N), it runs
    kernel = L2E(no_plate_model, 0.05, meta_params=random_net(), num_data=200)
    assert harness.run(kernel, 2, 1, 0, x, y).kernel.data_size == 200
    kernel = L2E(no_plate_model, 0.05, kinetic_energy="standard")
    harness.run(kernel, 2, 1, 0, x, y)


def test_kernel_pickles_for_worker_processes():
    import pickle

    x, y = regression_data()
    kernel = L2E(regression_model, meta_params=random_net(), num_steps_per_sample=2)
    clone = pickle.loads(pickle.dumps(kernel))
    a = harness.run(kernel, 5, 2, 0, x, y).get_samples()["w"]
    b = harness.run(clone, 5, 2, 0, x, y).get_samples()["w"]
    assert torch.equal(a, b)


def test_authors_settings():
    s = L2E.authors_settings(50000, step_mult=2.0, noise_mult=1e-3)
    assert s["step_size"] == pytest.approx(math.sqrt(2 / 50000))
    # the injected variance 2 C eps T equals the authors' 2 C noise_mult
    assert 2 * 0.1 * s["step_size"] * s["temperature"] == pytest.approx(2 * 0.1 * 1e-3)


def test_shipped_meta_parameters_load():
    net = MetaNet.shipped()
    assert net.num_params == 1442
    assert net.info.get("trained_by") == "pyro_flat.infer.l2e_meta"
    assert torch.isfinite(net(torch.ones(1, 9))).all()


def test_bad_arguments_raise_value_error():
    target = harness.correlated_2d(num_chains=2)
    common = dict(potential_fn=target, initial_params=target.initial_params())
    with pytest.raises(ValueError, match="kinetic_energy"):
        L2E(step_size=0.1, kinetic_energy="relativistic", **common)
    with pytest.raises(ValueError, match="friction"):
        L2E(meta_params=random_net(), step_size=0.1, friction=0.0, **common)
    with pytest.raises(ValueError, match="step_mult"):
        L2E(meta_params=random_net(), step_mult=-1.0, **common)
    with pytest.raises(ValueError, match="num_data"):
        L2E(meta_params=random_net(), num_data=0, **common)
    with pytest.raises(ValueError, match="meta_params"):
        L2E(meta_params=3.0, step_size=0.1, **common)
    with pytest.raises(ValueError, match="step_size"):
        L2E(meta_params=random_net(), step_size=-1.0, **common)
    with pytest.raises(ValueError, match="num_data"):  # step_size=None needs N
        harness.run(L2E(meta_params=random_net(), **common), 2, 0)
    with pytest.raises(ValueError, match="segments"):
        L2EState.zeros(torch.zeros(5), [(0, 2), (3, 5)])
