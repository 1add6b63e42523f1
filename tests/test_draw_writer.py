"""Draws streamed to disk with ``pyro_flat.DrawWriter`` and opened with ``open_draws``: the
same data as ``to_arviz`` of the same run, for every kind of chain, resumed runs included."""

from __future__ import annotations

import warnings

import arviz_compat
import numpy as np
import pyro
import pyro.distributions as dist
import pyro.infer.mcmc.api
import pytest
import torch
import xarray as xr
from pyro.infer import MCMC

from pyro_flat import DrawWriter, open_draws, to_arviz
from pyro_flat.infer import SGLD, ContourSGLD, EntropyMCMC

NUM_SAMPLES = 25
WARMUP = 5
N = 120
NO_REPLAY = {"log_likelihood": False, "posterior_predictive": False, "observed_data": False}


def logistic_model(x, y):
    """Hierarchical logistic regression: a weight scale (constrained) and weights."""
    scale = pyro.sample("scale", dist.HalfNormal(1.0))
    w = pyro.sample("w", dist.Normal(0.0, scale).expand([x.shape[1]]).to_event(1))
    b = pyro.sample("b", dist.Normal(0.0, 1.0))
    with pyro.plate("data", len(x), subsample_size=40) as i:
        pyro.sample("y", dist.Bernoulli(logits=x[i] @ w + b), obs=y[i])


@pytest.fixture(scope="module")
def data():
    g = torch.Generator().manual_seed(1)
    x = torch.randn(N, 4, generator=g)
    y = torch.bernoulli(torch.sigmoid(x @ torch.tensor([1.0, -2.0, 0.5, 0.0])), generator=g)
    return x, y


def _mcmc(kernel, *, num_chains=1, num_samples=NUM_SAMPLES, warmup=WARMUP, parallel=False,
          **kwargs) -> MCMC:
    with pytest.MonkeyPatch.context() as mp, warnings.catch_warnings():
        # chains one after another in this process, or worker processes, whatever the cores
        mp.setattr(pyro.infer.mcmc.api.mp, "cpu_count", lambda: num_chains + 1 if parallel else 1)
        warnings.filterwarnings("ignore", message="num_chains=.*sequentially")
        return MCMC(kernel, num_samples=num_samples, warmup_steps=warmup,
                    num_chains=num_chains, disable_progbar=True, **kwargs)


def _group(data, name: str) -> xr.Dataset:
    return data[name].to_dataset() if arviz_compat.ARVIZ_1 else getattr(data, name)


def _assert_same(opened, exported, constrained=("scale",)) -> None:
    """Same variables, dims, coordinates and values; bitwise, except sites that pass through
    a transform (applied per draw by the writer, per array by Pyro: equal to rounding)."""
    for group in ("posterior", "sample_stats"):
        a, b = _group(opened, group), _group(exported, group)
        assert sorted(a.data_vars) == sorted(b.data_vars), group
        assert dict(a.sizes) == dict(b.sizes), group
        xr.testing.assert_equal(a.coords.to_dataset(), b.coords.to_dataset())
        for name in b.data_vars:
            assert a[name].dims == b[name].dims and a[name].dtype == b[name].dtype, name
            np.testing.assert_array_equal(a[name].coords["chain"], b[name].coords["chain"])
            np.testing.assert_array_equal(a[name].coords["draw"], b[name].coords["draw"])
            if name.split("__")[0] in constrained:
                np.testing.assert_allclose(a[name].values, b[name].values, rtol=1e-6)
            else:
                np.testing.assert_array_equal(a[name].values, b[name].values, err_msg=name)


KERNELS = {
    "SGLD": lambda: SGLD(logistic_model, step_size=2e-3, num_steps_per_sample=2),
    "EntropyMCMC": lambda: EntropyMCMC(logistic_model, step_size=2e-3, eta=1.0),
    "ContourSGLD": lambda: ContourSGLD(logistic_model, step_size=2e-3, num_bins=20,
                                       auto_bins=True),
    "SGLD-vectorized": lambda: SGLD(logistic_model, step_size=2e-3, vectorized_chains=2),
}


@pytest.mark.parametrize("name", sorted(KERNELS))
def test_streamed_draws_open_as_to_arviz_of_the_same_run(name, data, tmp_path):
    writer = DrawWriter(tmp_path / "draws", num_samples=NUM_SAMPLES, block_size=4)
    mcmc = _mcmc(KERNELS[name](), hook_fn=writer)
    pyro.set_rng_seed(0)
    mcmc.run(*data)
    opened = open_draws(tmp_path / "draws")
    _assert_same(opened, to_arviz(mcmc, **NO_REPLAY))
    assert opened.attrs["pyro_flat_kernel"] == type(mcmc.kernel).__name__
    assert opened.attrs["num_sg_steps"] == to_arviz(mcmc, **NO_REPLAY).attrs["num_sg_steps"]
    stats = _group(opened, "sample_stats")
    if name == "EntropyMCMC":
        assert {"w__guide", "scale__guide"} <= set(_group(opened, "posterior").data_vars)
        assert "coupling_distance" in stats
    if name == "ContourSGLD":
        assert np.isfinite(stats["log_weight"].values).all()


@pytest.mark.parametrize("parallel", [False, True], ids=["sequential", "worker-processes"])
def test_pyro_chains_land_as_chains(parallel, data, tmp_path):
    writer = DrawWriter(tmp_path / "draws", num_samples=NUM_SAMPLES, block_size=8)
    mcmc = _mcmc(KERNELS["SGLD"](), num_chains=2, parallel=parallel, hook_fn=writer)
    pyro.set_rng_seed(0)
    mcmc.run(*data)
    assert sorted(p.name for p in (tmp_path / "draws").iterdir()) == ["part-00000.nc",
                                                                     "part-00001.nc"]
    _assert_same(open_draws(tmp_path / "draws"), to_arviz(mcmc, **NO_REPLAY))


def test_save_params_keeps_only_what_is_asked_and_the_file_gets_everything(data, tmp_path):
    writer = DrawWriter(tmp_path / "draws", num_samples=NUM_SAMPLES)
    pyro.set_rng_seed(0)
    mcmc = _mcmc(KERNELS["EntropyMCMC"](), hook_fn=writer, save_params=["b"])
    mcmc.run(*data)
    assert list(mcmc.get_samples()) == ["b"]
    pyro.set_rng_seed(0)
    reference = _mcmc(KERNELS["EntropyMCMC"]())
    reference.run(*data)
    _assert_same(open_draws(tmp_path / "draws"), to_arviz(reference, **NO_REPLAY))


def test_sites_stats_and_thin_select_what_is_written(data, tmp_path):
    writer = DrawWriter(tmp_path / "draws", num_samples=NUM_SAMPLES, sites=["w"],
                        stats=["lp", "diverging"], thin=3)
    pyro.set_rng_seed(0)
    mcmc = _mcmc(KERNELS["SGLD-vectorized"](), hook_fn=writer)
    mcmc.run(*data)
    exported = to_arviz(mcmc, var_names=["w"], thin=3, **NO_REPLAY)
    opened = open_draws(tmp_path / "draws")
    assert sorted(_group(opened, "sample_stats").data_vars) == ["diverging", "lp"]
    for group, names in (("posterior", ["w"]), ("sample_stats", ["lp", "diverging"])):
        for name in names:
            xr.testing.assert_equal(_group(opened, group)[name], _group(exported, group)[name])


@pytest.mark.parametrize("name", ["ContourSGLD", "SGLD-vectorized"])
def test_a_resumed_run_appends_bitwise(name, data, tmp_path):
    pyro.set_rng_seed(0)
    whole = _mcmc(KERNELS[name](), num_samples=30,
                  hook_fn=DrawWriter(tmp_path / "whole", num_samples=30))
    whole.run(*data)

    pyro.set_rng_seed(0)
    first = _mcmc(KERNELS[name](), num_samples=18,
                  hook_fn=DrawWriter(tmp_path / "parts", num_samples=18))
    first.run(*data)
    kernel = KERNELS[name]()
    kernel.load_state_dict(first.kernel.state_dict())
    pyro.set_rng_seed(123)  # the checkpoint, not the seed, decides what follows
    rest = _mcmc(kernel, num_samples=12, warmup=0,
                 hook_fn=DrawWriter(tmp_path / "parts", num_samples=12, resume=True))
    rest.run(*data)

    resumed, reference = open_draws(tmp_path / "parts"), open_draws(tmp_path / "whole")
    _assert_same(resumed, reference, constrained=())  # both written per draw: bitwise
    assert resumed.attrs["num_sg_steps"] == reference.attrs["num_sg_steps"]


def test_the_writer_holds_at_most_a_block(data, tmp_path):
    block = 3
    writer = DrawWriter(tmp_path / "draws", num_samples=NUM_SAMPLES, block_size=block,
                        hook_fn=lambda kernel, params, stage, i: seen.append(
                            (stage, i, writer._chain)))
    seen: list = []
    pyro.set_rng_seed(0)
    _mcmc(KERNELS["SGLD"](), hook_fn=writer, save_params=[]).run(*data)
    for stage, i, chain in seen:
        if stage == "Sample" and chain is not None:
            assert len(chain.rows) <= block
            assert chain.part.num_draws >= i + 1 - block  # the rest is on disk already


def test_opening_is_lazy_and_arviz_computes_on_it(data, tmp_path):
    writer = DrawWriter(tmp_path / "draws", num_samples=NUM_SAMPLES)
    pyro.set_rng_seed(0)
    _mcmc(KERNELS["SGLD-vectorized"](), hook_fn=writer, save_params=[]).run(*data)
    opened = open_draws(tmp_path / "draws")
    w = _group(opened, "posterior")["w"]
    assert not isinstance(w.variable._data, np.ndarray)  # still on disk
    import arviz as az

    summary = az.summary(opened, var_names=["b"])
    mean = float(_group(opened, "posterior")["b"].mean())
    assert summary.loc["b", "mean"] == pytest.approx(mean, abs=1e-3)  # rounded to 3 decimals


def test_an_interrupted_run_opens_with_a_warning(data, tmp_path):
    def interrupt(kernel, params, stage, i):
        if stage.startswith("Sample") and i == 15:
            raise KeyboardInterrupt

    writer = DrawWriter(tmp_path / "draws", num_samples=NUM_SAMPLES, block_size=2,
                        hook_fn=interrupt)
    pyro.set_rng_seed(0)
    with pytest.raises(KeyboardInterrupt):
        _mcmc(KERNELS["SGLD"](), hook_fn=writer).run(*data)
    writer.close()
    with pytest.warns(RuntimeWarning, match="did not finish"):
        opened = open_draws(tmp_path / "draws")
    # close() writes the buffered draw 14 (block [14, 15]): all but draw 15, whose
    # statistics wait for the step the interrupt stopped (it wrote 14 draws)
    assert _group(opened, "posterior").sizes["draw"] == 15


def test_bad_arguments_are_named(data, tmp_path):
    (tmp_path / "taken").mkdir()
    with pytest.raises(ValueError, match="exists.*resume=True"):
        DrawWriter(tmp_path / "taken", num_samples=5)
    with pytest.raises(ValueError, match="resume=True.*holds no draw store"):
        DrawWriter(tmp_path / "nothing", num_samples=5, resume=True)
    for kwargs, message in (({"num_samples": 0}, "num_samples"), ({"thin": 0}, "thin"),
                            ({"block_size": 0}, "block_size"), ({"sites": "w"}, "sites"),
                            ({"chain_offset": -1}, "chain_offset")):
        with pytest.raises(ValueError, match=message):
            DrawWriter(tmp_path / "fresh", **{"num_samples": 5, **kwargs})
    writer = DrawWriter(tmp_path / "draws", num_samples=5, sites=["w", "weights"])
    with pytest.raises(ValueError, match=r"\['weights'\].*sites the run draws: \['b', 'scale'"):
        _mcmc(KERNELS["SGLD"](), num_samples=5, hook_fn=writer).run(*data)
    writer = DrawWriter(tmp_path / "draws2", num_samples=5, stats=["lp", "log_weight"])
    with pytest.raises(ValueError, match=r"\['log_weight'\].*statistics of SGLD"):
        _mcmc(KERNELS["SGLD"](), num_samples=5, hook_fn=writer).run(*data)
    with pytest.raises(ValueError, match="no draws"):
        open_draws(tmp_path / "taken")


def test_writers_of_other_chains_share_a_store_with_chain_offset(data, tmp_path):
    runs = []
    for offset, seed in ((2, 1), (0, 0)):  # e.g. two ranks, each with 2 vectorised chains
        writer = DrawWriter(tmp_path / "draws", num_samples=NUM_SAMPLES, chain_offset=offset)
        pyro.set_rng_seed(seed)
        mcmc = _mcmc(KERNELS["SGLD-vectorized"](), hook_fn=writer, save_params=["b"])
        mcmc.run(*data)
        runs.append(mcmc.get_samples(group_by_chain=True)["b"][0].T)  # (K, draws)
    opened = _group(open_draws(tmp_path / "draws"), "posterior")
    assert opened["chain"].values.tolist() == [0, 1, 2, 3]
    np.testing.assert_array_equal(opened["b"].values, torch.cat(runs[::-1]).numpy())
    writer = DrawWriter(tmp_path / "draws", num_samples=NUM_SAMPLES, chain_offset=2)
    with pytest.raises(ValueError, match="already holds chains"):
        _mcmc(KERNELS["SGLD-vectorized"](), hook_fn=writer).run(*data)


def mixed_model(x, y):
    """Latents whose transform changes their shape (a 2 x 2 LKJ Cholesky factor stored as 1
    value, a 3-simplex as 2), a full-batch plate and two observed sites."""
    chol = pyro.sample("chol", dist.LKJCholesky(2, 2.0))
    weights = pyro.sample("weights", dist.Dirichlet(torch.ones(3)))
    w = pyro.sample("w", dist.Normal(0.0, 1.0).expand([x.shape[1], 2]).to_event(2))
    mean = x @ w
    with pyro.plate("data", len(x)):
        pyro.sample("y", dist.MultivariateNormal(mean, scale_tril=chol),
                    obs=torch.stack([y, 1.0 - y], -1))
        pyro.sample("k", dist.Categorical(weights), obs=(y * 2).long())


@pytest.mark.parametrize("chains", [None, 2])
def test_shape_changing_latents_are_written_in_their_constrained_shape(chains, data, tmp_path):
    writer = DrawWriter(tmp_path / "draws", num_samples=NUM_SAMPLES, block_size=4)
    kernel = SGLD(mixed_model, step_size=1e-3, vectorized_chains=chains)
    mcmc = _mcmc(kernel, hook_fn=writer)
    pyro.set_rng_seed(0)
    mcmc.run(*data)
    opened = open_draws(tmp_path / "draws")
    _assert_same(opened, to_arviz(mcmc, **NO_REPLAY), constrained=("chol", "weights"))
    posterior = _group(opened, "posterior")
    assert posterior["chol"].shape[-2:] == (2, 2) and posterior["weights"].shape[-1] == 3


def test_parts_that_do_not_belong_together_are_refused(data, tmp_path):
    """Two writers of one store whose runs drew other sites (or the same site in another
    shape): open_draws names the part and the difference instead of padding with NaN. A part
    cut short is named in a warning and the store opens with the intact parts."""
    store = tmp_path / "draws"
    for offset, sites in ((0, ["b", "w"]), (2, ["b"])):
        writer = DrawWriter(store, num_samples=NUM_SAMPLES, chain_offset=offset, sites=sites)
        _mcmc(KERNELS["SGLD-vectorized"](), hook_fn=writer, save_params=[]).run(*data)
    with pytest.raises(ValueError, match=r"part-00002.nc .* does not belong with "
                                         r"part-00000.nc: its posterior lacks \['w'\]"):
        open_draws(store)
    other = tmp_path / "shapes"
    for offset, x in ((0, data[0]), (2, data[0][:, :3])):  # w of 4, then of 3 elements
        writer = DrawWriter(other, num_samples=NUM_SAMPLES, chain_offset=offset)
        _mcmc(KERNELS["SGLD-vectorized"](), hook_fn=writer, save_params=[]).run(x, data[1])
    with pytest.raises(ValueError, match=r"holds w of \(shape, dtype\) \(\(3,\), 'float32'\) "
                                         r"instead of \(\(4,\), 'float32'\)"):
        open_draws(other)
    part = other / "part-00002.nc"  # a rank killed before its first flush, say
    part.write_bytes(part.read_bytes()[:100])
    with pytest.warns(RuntimeWarning, match=f"cannot read the parts {str(part)!r}"):
        opened = _group(open_draws(other), "posterior")
    assert opened["chain"].values.tolist() == [0, 1]  # the intact part's chains
    nothing = tmp_path / "nothing"
    nothing.mkdir()
    (nothing / "part-00000.nc").write_bytes(b"")
    with pytest.raises(ValueError, match="cannot read any part of the draw store"):
        open_draws(nothing)


def test_num_samples_is_checked_against_the_run(data, tmp_path):
    """A writer told more draws than the run makes writes the draws it got and says so at the
    end of the run (it wrote none, and only open_draws warned); told fewer, it stops at the
    first draw beyond them."""
    writer = DrawWriter(tmp_path / "more", num_samples=NUM_SAMPLES + 5)
    mcmc = _mcmc(KERNELS["SGLD"](), hook_fn=writer, save_params=[])
    with pytest.raises(ValueError, match=rf"DrawWriter\(num_samples={NUM_SAMPLES + 5}\), but "
                                         rf"the run drew {NUM_SAMPLES} draws per chain"):
        mcmc.run(*data)
    with pytest.warns(RuntimeWarning, match="did not finish"):
        opened = _group(open_draws(tmp_path / "more"), "posterior")
    assert opened.sizes["draw"] == NUM_SAMPLES
    writer = DrawWriter(tmp_path / "fewer", num_samples=NUM_SAMPLES - 5)
    with pytest.raises(ValueError, match=rf"num_samples={NUM_SAMPLES - 5}\) got draw "
                                         rf"{NUM_SAMPLES - 5} of the run"):
        _mcmc(KERNELS["SGLD"](), hook_fn=writer, save_params=[]).run(*data)


def test_resume_refuses_a_kernel_that_does_not_continue_the_store(data, tmp_path):
    """resume=True with a fresh kernel, or with a checkpoint of another moment of the chain,
    is an error naming the part (both appended duplicated draws bit for bit, silently)."""
    store = tmp_path / "draws"
    pyro.set_rng_seed(0)
    first = _mcmc(KERNELS["SGLD"](), num_samples=10, hook_fn=DrawWriter(store, num_samples=10))
    first.run(*data)
    stale = first.kernel.state_dict()
    second = KERNELS["SGLD"]()
    second.load_state_dict(stale)
    _mcmc(second, num_samples=10, warmup=0,
          hook_fn=DrawWriter(store, num_samples=10, resume=True)).run(*data)

    def resume(kernel):
        return _mcmc(kernel, num_samples=5, warmup=0,
                     hook_fn=DrawWriter(store, num_samples=5, resume=True)).run(*data)

    with pytest.raises(ValueError, match="part-00000.nc does not continue with this kernel: "
                                         "the kernel starts afresh"):
        resume(KERNELS["SGLD"]())
    old = KERNELS["SGLD"]()
    old.load_state_dict(stale)  # taken after the first run, the store has two
    with pytest.raises(ValueError, match="checkpoint taken after .* SG steps, the part ends "
                                         "after"):
        resume(old)
    pyro.set_rng_seed(1)  # another chain, stopped after as many SG steps
    other = _mcmc(KERNELS["SGLD"](), num_samples=20)
    other.run(*data)
    elsewhere = KERNELS["SGLD"]()
    elsewhere.load_state_dict(other.kernel.state_dict())
    with pytest.raises(ValueError, match="holds another position than the one the part ends"):
        resume(elsewhere)
    good = KERNELS["SGLD"]()
    good.load_state_dict(second.state_dict())
    resume(good)
    assert _group(open_draws(store), "posterior").sizes["draw"] == 25
