"""Tests of ``pyro_flat.to_arviz``: real runs of SGLD, SGHMC and NUTS exported to ArviZ."""

from __future__ import annotations

import warnings
from types import SimpleNamespace

import arviz_compat
import numpy as np
import pyro
import pyro.distributions as dist
import pyro.infer.mcmc.api
import pytest
import torch
from pyro.infer import MCMC, NUTS
from pyro.nn import PyroModule, PyroSample

from pyro_flat import kernel_diagnostics, to_arviz
from pyro_flat.infer import SGHMC, SGLD

with warnings.catch_warnings():  # ArviZ 0.23 announces its 1.x refactor on import
    warnings.simplefilter("ignore", FutureWarning)
    import arviz as az

NUM_SAMPLES = 30
N = 200


def model(x, y):
    w = pyro.sample("w", dist.Normal(0.0, 1.0).expand([3]).to_event(1))
    s = pyro.sample("s", dist.HalfNormal(1.0))
    with pyro.plate("data", len(x), subsample_size=32) as i:
        pyro.sample("y", dist.Normal(x[i] @ w, s), obs=y[i])


def tiny_model(y):
    mu = pyro.sample("mu", dist.Normal(0.0, 1.0))
    with pyro.plate("data", len(y)):
        pyro.sample("y", dist.Normal(mu, 1.0), obs=y)


def _run(kernel, num_chains: int, *args) -> MCMC:
    """Run ``kernel`` with chains drawn sequentially in this process, whatever the core count."""
    pyro.set_rng_seed(0)
    with pytest.MonkeyPatch.context() as mp, warnings.catch_warnings():
        mp.setattr(pyro.infer.mcmc.api.mp, "cpu_count", lambda: 1)
        warnings.filterwarnings("ignore", message="num_chains=.*sequentially")
        mcmc = MCMC(kernel, num_samples=NUM_SAMPLES, warmup_steps=10, num_chains=num_chains,
                    disable_progbar=True)
        mcmc.run(*args)
    return mcmc


@pytest.fixture(scope="module")
def data():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(N, 3, generator=g)
    y = x @ torch.tensor([1.0, -1.0, 0.5]) + 0.3 * torch.randn(N, generator=g)
    return x, y


@pytest.fixture(scope="module")
def runs(data):
    return {
        "sgld1": _run(SGLD(model, step_size=1e-3, num_steps_per_sample=2), 1, *data),
        "sgld2": _run(SGLD(model, step_size=1e-3, num_steps_per_sample=2), 2, *data),
        "sghmc2": _run(SGHMC(model, step_size=1e-3, friction=10.0), 2, *data),
    }


@pytest.fixture(scope="module")
def nuts_run():
    y = torch.randn(10, generator=torch.Generator().manual_seed(1)) + 0.5
    return _run(NUTS(tiny_model), 1, y)


RUNS = [("sgld1", 1, "SGLD"), ("sgld2", 2, "SGLD"), ("sghmc2", 2, "SGHMC")]


@pytest.mark.parametrize("key,chains,kernel", RUNS)
def test_groups_dims_shapes(runs, key, chains, kernel):
    idata = to_arviz(runs[key])
    # the log-likelihood (per data point), replicates and the observed data come by default
    assert arviz_compat.groups(idata) == {"posterior", "sample_stats", "log_likelihood",
                                          "posterior_predictive", "observed_data"}
    assert idata.log_likelihood["y"].shape == (chains, NUM_SAMPLES, N)
    post = idata.posterior
    assert set(post.data_vars) == {"w", "s"}
    assert post["w"].dims == ("chain", "draw", "w_dim_0")
    assert post["w"].shape == (chains, NUM_SAMPLES, 3)
    assert post["s"].dims == ("chain", "draw")
    assert post["s"].shape == (chains, NUM_SAMPLES)
    np.testing.assert_array_equal(post["draw"].values, np.arange(NUM_SAMPLES))
    for name in idata.sample_stats.data_vars:
        assert idata.sample_stats[name].dims == ("chain", "draw")
        assert idata.sample_stats[name].shape == (chains, NUM_SAMPLES)


@pytest.mark.parametrize("key,chains,kernel", RUNS)
def test_posterior_equals_get_samples_without_copy(runs, key, chains, kernel):
    mcmc = runs[key]
    idata = to_arviz(mcmc)
    for name, value in mcmc.get_samples(group_by_chain=True).items():
        exported = idata.posterior[name].values
        np.testing.assert_array_equal(exported, value.numpy())
        assert exported.dtype == np.float32
        assert np.shares_memory(exported, value.numpy())
    assert float(idata.posterior["s"].min()) > 0  # constrained space


@pytest.mark.parametrize("key,chains,kernel", RUNS)
def test_sample_stats(runs, key, chains, kernel):
    mcmc = runs[key]
    stats = to_arviz(mcmc).sample_stats
    assert {"lp", "step_size", "grad_norm", "diverging"} <= set(stats.data_vars)
    assert stats["diverging"].dtype == bool
    assert not stats["diverging"].values.any()
    np.testing.assert_allclose(stats["step_size"].values, 1e-3, rtol=1e-6)
    assert np.isfinite(stats["lp"].values).all()
    assert (stats["grad_norm"].values > 0).all()
    for c in range(chains):
        for name, value in kernel_diagnostics(mcmc)[c]["sample_stats"].items():
            np.testing.assert_array_equal(stats[name].values[c], value.numpy())


@pytest.mark.parametrize("key,chains,kernel", RUNS)
def test_attrs(runs, key, chains, kernel):
    idata = to_arviz(runs[key])
    steps = [d["num_sg_steps"] for d in kernel_diagnostics(runs[key])]
    for attrs in (idata.attrs, idata.posterior.attrs, idata.sample_stats.attrs):
        assert attrs["inference_library"] == "pyro"
        assert attrs["inference_library_version"] == pyro.__version__
        assert attrs["pyro_flat_kernel"] == kernel
        assert list(attrs["num_sg_steps"]) == steps
    assert len(steps) == chains and all(s > 0 for s in steps)


@pytest.mark.filterwarnings("ignore:More chains:UserWarning")  # ArviZ, when one draw is kept
@pytest.mark.parametrize("thin", [1, 3, 7, NUM_SAMPLES, NUM_SAMPLES + 5])
def test_thin(runs, thin):
    mcmc = runs["sgld2"]
    idata = to_arviz(mcmc, thin=thin)
    kept = np.arange(0, NUM_SAMPLES, thin)
    np.testing.assert_array_equal(idata.posterior["draw"].values, kept)
    np.testing.assert_array_equal(idata.sample_stats["draw"].values, kept)
    samples = mcmc.get_samples(group_by_chain=True)
    np.testing.assert_array_equal(idata.posterior["w"].values, samples["w"].numpy()[:, ::thin])
    for c in range(2):
        lp = kernel_diagnostics(mcmc)[c]["sample_stats"]["lp"].numpy()
        np.testing.assert_array_equal(idata.sample_stats["lp"].values[c], lp[::thin])


@pytest.mark.parametrize("thin", [0, -1, 1.5, "2", True, None])
def test_thin_invalid(runs, thin):
    with pytest.raises(ValueError, match="thin"):
        to_arviz(runs["sgld1"], thin=thin)


def test_var_names(runs):
    mcmc = runs["sgld2"]
    assert set(to_arviz(mcmc, var_names="w").posterior.data_vars) == {"w"}
    idata = to_arviz(mcmc, var_names=["s", "w"])
    assert list(idata.posterior.data_vars) == ["s", "w"]
    assert "lp" in idata.sample_stats  # statistics are per draw, not per site
    for bad in (["w", "bias"], "bias", []):
        with pytest.raises(ValueError, match=r"var_names.*available: \['s', 'w'\]"):
            to_arviz(mcmc, var_names=bad)


def test_coords_and_dims(runs):
    idata = to_arviz(runs["sgld2"], dims={"w": ["feature"]}, coords={"feature": ["a", "b", "c"]})
    assert idata.posterior["w"].dims == ("chain", "draw", "feature")
    assert list(idata.posterior["feature"].values) == ["a", "b", "c"]
    assert idata.posterior["w"].sel(feature="b").shape == (2, NUM_SAMPLES)


@pytest.mark.filterwarnings("ignore::matplotlib.MatplotlibDeprecationWarning")
def test_arviz_functions_run(runs):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    for key in ("sgld2", "sghmc2"):
        idata = to_arviz(runs[key])
        summary = az.summary(idata)
        assert {"w[0]", "w[1]", "w[2]", "s"} <= set(summary.index)
        assert np.isfinite(summary["r_hat"]).all()
        ess = az.ess(idata)
        assert float(ess["s"]) > 0
        rhat = az.rhat(idata)
        assert np.isfinite(rhat["w"].values).all()
        axes = az.plot_trace(idata)
        if not arviz_compat.ARVIZ_1:  # 1.x returns a PlotCollection
            assert axes.shape == (2, 2)
        plt.close("all")
    assert float(az.ess(to_arviz(runs["sgld1"]))["s"]) > 0  # one chain


def test_nuts_exports_diverging_and_log_likelihood(nuts_run):
    """Pyro's NUTS keeps only the indices of its divergent draws: they become ``diverging``."""
    idata = to_arviz(nuts_run)
    assert arviz_compat.groups(idata) == {"posterior", "sample_stats", "log_likelihood",
                                          "posterior_predictive", "observed_data"}
    diverging = idata.sample_stats["diverging"].values
    assert diverging.shape == (1, NUM_SAMPLES) and diverging.dtype == bool
    nuts_diagnostics = kernel_diagnostics(nuts_run)[0]
    assert np.flatnonzero(diverging[0]).tolist() == nuts_diagnostics["divergences"]
    assert list(idata.sample_stats.attrs["acceptance_rate"]) == [
        nuts_diagnostics["acceptance rate"]]
    np.testing.assert_array_equal(
        idata.posterior["mu"].values, nuts_run.get_samples(group_by_chain=True)["mu"].numpy()
    )
    assert idata.posterior.attrs["pyro_flat_kernel"] == "NUTS"
    assert "num_sg_steps" not in idata.posterior.attrs
    assert to_arviz(nuts_run, thin=2).posterior["mu"].shape == (1, NUM_SAMPLES // 2)


def test_unrun_mcmc_raises():
    mcmc = MCMC(NUTS(tiny_model), num_samples=5, disable_progbar=True)
    with pytest.raises(ValueError, match="mcmc.run"):
        to_arviz(mcmc)


def _fake_mcmc(sample_stats):
    """A stand-in for a run of two chains (``None``: a chain that reported no statistics)."""
    samples = {"w": torch.zeros(2, 4, 3)}
    diags = [{"divergences": [], "num_sg_steps": 8} | ({} if s is None else {"sample_stats": s})
             for s in sample_stats]
    return SimpleNamespace(
        kernel=SGLD(model, step_size=1e-3),
        _diagnostics=diags,
        get_samples=lambda group_by_chain=False: samples,
    )


def _stats_only(mcmc):
    """The export of a fake run that never ran its model: no replayed groups."""
    return to_arviz(mcmc, log_likelihood=False, posterior_predictive=False,
                    observed_data=False)


def test_malformed_statistics_are_left_out_with_a_warning():
    good = {"lp": torch.zeros(4), "diverging": torch.tensor([0, 1, 0, 0])}
    bad = {"lp": torch.zeros(3), "diverging": torch.zeros(4, dtype=torch.bool)}
    with pytest.warns(RuntimeWarning, match="'lp'"):
        idata = _stats_only(_fake_mcmc([good, bad]))
    assert list(idata.sample_stats.data_vars) == ["diverging"]
    assert idata.sample_stats["diverging"].dtype == bool  # cast from an integer tensor
    assert idata.sample_stats["diverging"].values[0].tolist() == [False, True, False, False]


def test_statistics_missing_in_one_chain_leave_only_diverging():
    """Without per-draw statistics in every chain, only what every chain has is exported: the
    indices of divergent draws, as for Pyro's own kernels."""
    mcmc = _fake_mcmc([{"lp": torch.zeros(4)}, None])
    idata = _stats_only(mcmc)
    assert arviz_compat.groups(idata) == {"posterior", "sample_stats"}
    assert list(idata.sample_stats.data_vars) == ["diverging"]
    assert not idata.sample_stats["diverging"].values.any()
    assert list(idata.posterior.attrs["num_sg_steps"]) == [8, 8]


# ---------------------------------------------- log_likelihood, posterior_predictive, observed


def test_log_likelihood_per_observation_with_a_subsampling_plate():
    """A PyroModule with pyro.plate(subsample_size=64): one log-likelihood per data point (400),
    equal to the Normal log-density under each draw; az.loo and az.summary run on the result."""
    import harness
    from pyro.infer import MCMC

    from pyro_flat.infer import SGLD

    x, y = harness.linear_regression_data()
    model = harness.BayesianLinearRegression(2, 2.0, 1.0, batch_size=64)
    pyro.set_rng_seed(0)
    mcmc = MCMC(SGLD(model, step_size=2e-4, num_steps_per_sample=5), num_samples=40,
                warmup_steps=40, num_chains=2, disable_progbar=True)
    mcmc.run(x, y)
    idata = to_arviz(mcmc, thin=2, log_likelihood=True, posterior_predictive=True,
                     observed_data=True)
    ll = idata.log_likelihood["obs"].values
    assert ll.shape == (2, 20, 400)
    samples = mcmc.get_samples(group_by_chain=True)
    c, d = 1, 6  # draw index 12 of chain 1 (thin 2)
    w, b = samples["net.weight"][c, 2 * d], samples["net.bias"][c, 2 * d]
    expected = torch.distributions.Normal((x @ w.T).squeeze(-1) + b, 1.0).log_prob(y)
    np.testing.assert_allclose(ll[c, d], expected.numpy(), rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(idata.observed_data["obs"].values, y.numpy())
    assert idata.posterior_predictive["obs"].shape == (2, 20, 400)
    loo = az.loo(idata)
    assert np.isfinite(arviz_compat.elpd(loo))
    assert set(az.summary(idata, var_names=["net.bias"]).index) == {"net.bias[0]"}


def test_log_likelihood_needs_a_model():
    from pyro.infer import MCMC

    from pyro_flat.infer import SGLD

    kernel = SGLD(potential_fn=lambda p: (p["x"] ** 2).sum(), step_size=0.1,
                  initial_params={"x": torch.zeros(2)})
    mcmc = MCMC(kernel, num_samples=5, warmup_steps=0, disable_progbar=True)
    mcmc.run()
    with pytest.raises(ValueError, match="built from a model"):
        to_arviz(mcmc, log_likelihood=True)


def test_arviz_1x_branch_builds_a_datatree(runs):
    """On ArviZ 1.x (Python >= 3.12, the environment ``./dev test`` also runs) the export is a
    ``DataTree``. On 3.11, where ArviZ stops at 0.x, the 1.x branch runs with ArviZ 1.x's
    ``from_dict`` (``arviz_base``) in place of 0.x's."""
    with pytest.MonkeyPatch.context() as mp:
        if not arviz_compat.ARVIZ_1:
            arviz_base = pytest.importorskip("arviz_base")
            mp.setattr(az, "__version__", "1.0.0")
            mp.setattr(az, "from_dict", arviz_base.from_dict)
        tree = to_arviz(runs["sgld2"], dims={"w": ["feature"]}, thin=3)
    assert type(tree).__name__ == "DataTree"
    assert set(tree.children) == {"posterior", "sample_stats", "log_likelihood",
                                  "posterior_predictive", "observed_data"}
    assert tree["posterior"]["w"].dims == ("chain", "draw", "feature")
    assert tree["posterior"]["w"].shape == (2, NUM_SAMPLES // 3, 3)
    np.testing.assert_array_equal(tree["posterior"]["draw"].values, np.arange(0, NUM_SAMPLES, 3))
    w = runs["sgld2"].get_samples(group_by_chain=True)["w"].numpy()
    np.testing.assert_array_equal(tree["posterior"]["w"].values, w[:, ::3])
    assert tree["sample_stats"]["diverging"].dtype == bool
    assert tree["log_likelihood"]["y"].shape == (2, NUM_SAMPLES // 3, N)
    assert tree.attrs["pyro_flat_kernel"] == "SGLD"
    assert tree["sample_stats"].attrs["inference_library"] == "pyro"


# ---------------------------------------------- full-batch plates, several observed sites


def full_batch_model(x, y):
    w = pyro.sample("w", dist.Normal(0.0, 1.0).expand([3]).to_event(1))
    s = pyro.sample("s", dist.HalfNormal(1.0))
    with pyro.plate("data", len(x)):
        pyro.sample("y", dist.Normal(x @ w, s), obs=y)


def two_site_model(x, y, counts):
    """A regression and a Poisson count model sharing a latent: two observed sites, one of them
    in a plate of another size."""
    w = pyro.sample("w", dist.Normal(0.0, 1.0).expand([3]).to_event(1))
    rate = pyro.sample("rate", dist.Gamma(2.0, 1.0))
    with pyro.plate("data", len(x)):
        pyro.sample("y", dist.Normal(x @ w, 0.3), obs=y)
    with pyro.plate("days", len(counts)):
        pyro.sample("counts", dist.Poisson(rate), obs=counts)


@pytest.mark.parametrize("kernel", ["SGLD", "NUTS"])
def test_full_batch_plate_exports_every_group(data, kernel):
    """The model NUTS takes (``pyro.plate("data", N)``, no subsampling): log-likelihood per
    observation, equal to SciPy's Normal log-density under each draw; observed data; one
    posterior-predictive replicate per draw; ArviZ's loo, compare and plot_ppc with no extra
    argument."""
    from scipy import stats

    x, y = data
    k = SGLD(full_batch_model, step_size=1e-4, num_steps_per_sample=2) if kernel == "SGLD" \
        else NUTS(full_batch_model)
    mcmc = _run(k, 2 if kernel == "SGLD" else 1, x, y)
    idata = to_arviz(mcmc)
    chains = 2 if kernel == "SGLD" else 1
    assert idata.log_likelihood["y"].shape == (chains, NUM_SAMPLES, N)
    assert idata.posterior_predictive["y"].shape == (chains, NUM_SAMPLES, N)
    np.testing.assert_array_equal(idata.observed_data["y"].values, y.numpy())
    w = idata.posterior["w"].values
    s = idata.posterior["s"].values
    expected = stats.norm.logpdf(y.numpy(), np.einsum("nd,cmd->cmn", x.numpy(), w),
                                 s[..., None])
    np.testing.assert_allclose(idata.log_likelihood["y"].values, expected, rtol=1e-4, atol=1e-4)
    assert "diverging" in idata.sample_stats
    assert np.isfinite(arviz_compat.elpd(az.loo(idata)))
    ranked = az.compare({"a": idata, "b": to_arviz(mcmc)})
    assert len(ranked) == 2
    import matplotlib

    matplotlib.use("Agg")
    arviz_compat.plot_ppc(to_arviz(mcmc))  # the default export has what it needs


def test_several_observed_sites(data):
    x, y = data
    counts = torch.tensor([3.0, 1.0, 4.0, 2.0, 2.0])
    mcmc = _run(SGLD(two_site_model, step_size=1e-4, num_steps_per_sample=2), 1, x, y, counts)
    idata = to_arviz(mcmc, posterior_predictive=True)
    assert idata.log_likelihood["y"].shape == (1, NUM_SAMPLES, N)
    assert idata.log_likelihood["counts"].shape == (1, NUM_SAMPLES, 5)
    assert idata.posterior_predictive["counts"].shape == (1, NUM_SAMPLES, 5)
    np.testing.assert_array_equal(idata.observed_data["counts"].values, counts.numpy())
    from scipy import stats

    rate = idata.posterior["rate"].values[..., None]
    np.testing.assert_allclose(idata.log_likelihood["counts"].values,
                               stats.poisson.logpmf(counts.numpy(), rate), rtol=1e-5)
    assert np.isfinite(arviz_compat.elpd(az.loo(idata, var_name="counts")))


def test_log_likelihood_can_be_switched_off(data):
    x, y = data
    mcmc = _run(SGLD(full_batch_model, step_size=1e-4), 1, x, y)
    idata = to_arviz(mcmc, log_likelihood=False, posterior_predictive=False,
                     observed_data=False)
    assert arviz_compat.groups(idata) == {"posterior", "sample_stats"}


def test_a_potential_fn_run_exports_without_replay():
    kernel = SGLD(potential_fn=lambda p: 0.5 * (p["x"] ** 2).sum(),
                  initial_params={"x": torch.zeros(2)}, step_size=0.1)
    mcmc = _run(kernel, 1)
    assert arviz_compat.groups(to_arviz(mcmc)) == {"posterior", "sample_stats"}
    with pytest.raises(ValueError, match="log_likelihood need a model"):
        to_arviz(mcmc, log_likelihood=True)


@pytest.mark.parametrize("dims, match", [
    ({"w": ["a", "b"]}, r"dims\['w'\] names 2 dimension\(s\) \['a', 'b'\], but the site has 1 "
                        r"in posterior: shape \(3,\)"),
    ({"s": ["a"]}, r"dims\['s'\] names 1 .* has 0 in posterior"),
    ({"y": []}, r"dims\['y'\] names 0 .* has 1 in log_likelihood: shape \(200,\)"),
    ({"w": "feature"}, r"dims\['w'\] must be a list of dimension names"),
])
def test_dims_of_the_wrong_length_are_named(runs, dims, match):
    with pytest.raises(ValueError, match=match):
        to_arviz(runs["sgld1"], dims=dims)


def test_export_leaves_the_random_stream_as_it_was(runs):
    pyro.set_rng_seed(5)
    to_arviz(runs["sgld1"])  # draws posterior-predictive replicates
    after = torch.rand(3)
    pyro.set_rng_seed(5)
    assert torch.equal(after, torch.rand(3))


def test_sample_stats_public_accessor(runs, nuts_run):
    from pyro_flat import sample_stats

    mcmc = runs["sgld2"]
    grouped = sample_stats(mcmc, group_by_chain=True)
    assert list(grouped) == ["lp", "step_size", "grad_norm", "diverging"]
    for name, value in grouped.items():
        assert value.shape == (2, NUM_SAMPLES)
        for chain in range(2):
            expected = kernel_diagnostics(mcmc)[chain]["sample_stats"][name]
            assert torch.equal(value[chain], expected.to(value.dtype)), name
    flat = sample_stats(mcmc)
    assert torch.equal(flat["lp"], grouped["lp"].reshape(-1))  # chains one after another
    assert list(sample_stats(nuts_run)) == ["diverging"]
    with pytest.raises(ValueError, match="mcmc.run"):
        sample_stats(MCMC(NUTS(tiny_model), num_samples=5, disable_progbar=True))


# ------------------------------------------- the replay leaves the model as it was (eval mode)


class DropoutBatchNormNet(PyroModule):
    """A 3-16-1 network with BatchNorm and Dropout, written as a Pyro user writes it."""

    def __init__(self):
        super().__init__()
        self.fc1 = PyroModule[torch.nn.Linear](3, 16)
        self.fc1.weight = PyroSample(dist.Normal(0.0, 1.0).expand([16, 3]).to_event(2))
        self.fc1.bias = PyroSample(dist.Normal(0.0, 1.0).expand([16]).to_event(1))
        self.bn = torch.nn.BatchNorm1d(16)
        self.drop = torch.nn.Dropout(0.5)
        self.fc2 = PyroModule[torch.nn.Linear](16, 1)
        self.fc2.weight = PyroSample(dist.Normal(0.0, 1.0).expand([1, 16]).to_event(2))
        self.fc2.bias = PyroSample(dist.Normal(0.0, 1.0).expand([1]).to_event(1))

    def forward(self, x):
        return self.fc2(self.drop(torch.tanh(self.bn(self.fc1(x))))).squeeze(-1)


class DropoutBatchNormRegression(PyroModule):
    def __init__(self):
        super().__init__()
        self.net = DropoutBatchNormNet()

    def forward(self, x, y=None):
        s = pyro.sample("s", dist.HalfNormal(1.0))
        mean = self.net(x)
        with pyro.plate("data", len(x)):
            pyro.sample("y", dist.Normal(mean, s), obs=y)


GLOBAL_NET = DropoutBatchNormNet()


def function_model(x, y=None):
    """The same model as a plain function of a module-level network."""
    s = pyro.sample("s", dist.HalfNormal(1.0))
    mean = GLOBAL_NET(x)
    with pyro.plate("data", len(x)):
        pyro.sample("y", dist.Normal(mean, s), obs=y)


def _module_state(net):
    return ({name: m.training for name, m in net.named_modules()},
            {name: b.clone() for name, b in net.named_buffers()})


def _eval_log_likelihood(model, net, draws, x, y):
    """By hand: every module in evaluation mode, each draw conditioned, the site's log_prob."""
    out = []
    flags = {m: m.training for m in net.modules()}
    net.eval()
    try:
        for d in range(len(draws["s"])):
            draw = {k: v[d] for k, v in draws.items()}
            trace = pyro.poutine.trace(pyro.poutine.condition(model, draw)).get_trace(x, y)
            out.append(trace.nodes["y"]["fn"].log_prob(y).detach())
    finally:
        for m, flag in flags.items():
            m.training = flag
    return torch.stack(out).numpy()


@pytest.mark.parametrize("kind", ["PyroModule", "function of a global network"])
def test_replay_in_eval_mode_leaves_the_network_as_it_was(data, kind):
    """Sampled in training mode and left so; the export replays with Dropout off and BatchNorm
    on its running statistics, and afterwards every training flag and every running statistic
    is what it was, to the bit. Before: the replay moved running_mean, running_var and
    num_batches_tracked and kept Dropout on (a log-likelihood of random masks)."""
    x, y = data
    model = DropoutBatchNormRegression() if kind == "PyroModule" else function_model
    net = model.net if kind == "PyroModule" else GLOBAL_NET
    net.train()
    pyro.set_rng_seed(0)
    mcmc = MCMC(SGLD(model, step_size=1e-5), num_samples=4, warmup_steps=2,
                disable_progbar=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        mcmc.run(x, y)
    flags, buffers = _module_state(net)
    assert all(flags.values()) and int(net.bn.num_batches_tracked) > 0
    idata = to_arviz(mcmc)
    after_flags, after_buffers = _module_state(net)
    assert after_flags == flags
    for name, value in buffers.items():
        assert torch.equal(after_buffers[name], value), name
    expected = _eval_log_likelihood(model, net, mcmc.get_samples(), x, y)
    np.testing.assert_allclose(idata.log_likelihood["y"].values[0], expected, rtol=1e-5,
                               atol=1e-5)
    # eval_mode=False replays the modules as they are (training: Dropout on, batch
    # statistics), and still leaves them as they were
    train = to_arviz(mcmc, eval_mode=False).log_likelihood["y"].values[0]
    assert np.abs(train - expected).max() > 1e-2
    after_flags, after_buffers = _module_state(net)
    assert after_flags == flags
    for name, value in buffers.items():
        assert torch.equal(after_buffers[name], value), name


# ----------------------------------------------------- draws and model sites must match


@pytest.fixture(scope="module")
def full_batch_draws(data):
    x, y = data
    mcmc = _run(SGLD(full_batch_model, step_size=1e-4), 1, x, y)
    return mcmc.get_samples()


def test_a_draw_named_differently_from_the_site_is_an_error(data, full_batch_draws):
    """Before: the draw was ignored and the latent 's' drawn from its prior, silently."""
    x, y = data
    draws = dict(full_batch_draws)
    draws["sigma"] = draws.pop("s")
    with pytest.raises(ValueError, match=r"the draw 'sigma' is not a sample site of the model"
                                         r".*sample sites: \['data', 's', 'w', 'y'\]"):
        to_arviz(draws, model=full_batch_model, model_args=(x, y))
    extra = {**full_batch_draws, "w_typo": full_batch_draws["w"]}
    with pytest.raises(ValueError, match="the draw 'w_typo' is not a sample site"):
        to_arviz(extra, model=full_batch_model, model_args=(x, y))


def test_a_latent_site_without_a_draw_is_an_error(data, full_batch_draws):
    x, y = data
    draws = {"w": full_batch_draws["w"]}
    with pytest.raises(ValueError, match=r"the model's latent site 's' has no draw"):
        to_arviz(draws, model=full_batch_model, model_args=(x, y))


def deterministic_model(x, y):
    w = pyro.sample("w", dist.Normal(0.0, 1.0).expand([3]).to_event(1))
    s = pyro.sample("s", dist.HalfNormal(1.0))
    pyro.deterministic("w_norm", w.norm())
    with pyro.plate("data", len(x)):
        pyro.sample("y", dist.Normal(x @ w, s), obs=y)


def test_kernel_copies_deterministic_subsample_and_observed_draws_are_fine(data,
                                                                          full_batch_draws):
    from pyro_flat.infer import EntropyMCMC

    x, y = data
    pyro.set_rng_seed(0)
    mcmc = _run(EntropyMCMC(full_batch_model, 1e-4, eta=0.1), 1, x, y)
    assert "w__guide" in mcmc.get_samples()  # EntropyMCMC's copies of the sites
    assert to_arviz(mcmc).log_likelihood["y"].shape == (1, NUM_SAMPLES, N)
    draws = dict(mcmc.get_samples())
    num = len(draws["w"])
    draws["w_norm"] = draws["w"].norm(dim=-1)  # deterministic
    draws["data"] = torch.arange(N).expand(num, N)  # the plate's (full) subsample indices
    idata = to_arviz(draws, model=deterministic_model, model_args=(x, y))
    assert idata.log_likelihood["y"].shape == (1, num, N)
    draws["y"] = y.expand(num, N)  # the observed site's value (then not replayed)
    assert "y" in to_arviz(draws, model=deterministic_model, model_args=(x, y)).posterior
