"""``compare --reference hmc``: the NUTS reference row, and each method's agreement, total
variation or Wasserstein-2 distance to it."""

import json

import pytest
import torch
from test_cli import run

from pyro_flat.compare import reference
from pyro_flat.evaluation import classification
from pyro_flat.evaluation.regression import wasserstein2


@pytest.fixture
def small_nuts(monkeypatch):
    """A short reference, enough for the plumbing (the sampler is tested in
    tests/test_hmc_reference.py)."""
    monkeypatch.setattr(reference, "NUM_CHAINS", 2)
    monkeypatch.setattr(reference, "WARMUP_STEPS", 20)
    monkeypatch.setattr(reference, "NUM_SAMPLES", 8)
    monkeypatch.setattr(reference, "MAX_TREE_DEPTH", 4)


def _rows(out):
    result = json.loads((out / "results.json").read_text())
    return result, {r["method"]: r for r in result["results"]}


def test_classification_reference_scores_every_method(tmp_path, small_nuts):
    out = tmp_path / "out"
    code, stdout, stderr = run(["compare", "--dataset", "digits", "--hidden", "4",
                                  "--budget", "40", "--methods", "sgld,swag",
                                  "--reference", "hmc", "--jobs", "1", "--out", str(out)])
    assert code == 0, stderr
    header = next(line for line in stdout.splitlines() if line.startswith("| method"))
    assert "agreement (HMC)" in header and "TV (HMC)" in header
    result, rows = _rows(out)
    assert set(rows) == {"sgld", "swag", "sgd", "hmc"}
    ref = rows["hmc"]
    assert ref["agreement"] == 1.0 and ref["tv"] == pytest.approx(0.0, abs=1e-7)
    diagnostics = result["reference"]["0"]
    assert diagnostics["chains"] == 2 and diagnostics["draws_per_chain"] == 8
    assert len(diagnostics["divergences"]) == 2
    # 8 draws per chain cannot pass R-hat <= 1.01 and 100 effective draws per chain: flagged
    assert diagnostics["converged"] is False and diagnostics["problems"]
    assert "the HMC reference failed its convergence checks" in stdout
    for name in ("sgld", "swag", "sgd"):
        assert 0.0 <= rows[name]["agreement"] <= 1.0 and 0.0 <= rows[name]["tv"] <= 1.0
    # sgld's agreement recomputed from the exported draws and the reference's
    import arviz as az

    from pyro_flat.compare.common import Context
    from pyro_flat.compare.config import Budget, Settings, make_plan
    from pyro_flat.datasets import load_dataset
    from pyro_flat.evaluation.predictive import bma_probs

    data = load_dataset("digits", seed=0)
    ctx = Context(data, Settings(hidden=(4,)), make_plan(Budget(steps=40), 0.8), 0, "mlp",
                  False)

    def probs(name):
        posterior = az.from_netcdf(out / f"draws_{name}.nc").posterior
        draws = {k: torch.as_tensor(posterior[k].values).flatten(0, 1)
                 for k in posterior.data_vars if k.startswith("net.")}
        return bma_probs(ctx.bnn().net, draws, data.x_test)

    p_sgld, p_hmc = probs("sgld"), probs("hmc")
    assert rows["sgld"]["agreement"] == pytest.approx(classification.agreement(p_sgld, p_hmc))
    assert rows["sgld"]["tv"] == pytest.approx(classification.total_variation(p_sgld, p_hmc),
                                               abs=1e-6)


def test_regression_w2_is_the_distance_between_predictive_draws(tmp_path, small_nuts):
    out = tmp_path / "out"
    code, stdout, stderr = run(["compare", "--dataset", "diabetes", "--hidden", "4",
                                  "--budget", "40", "--methods", "sgld",
                                  "--reference", "hmc", "--jobs", "1", "--out", str(out)])
    assert code == 0, stderr
    _, rows = _rows(out)
    assert set(rows) == {"sgld", "sgd", "hmc"}
    assert rows["hmc"]["w2"] < rows["sgld"]["w2"]
    assert rows["sgd"]["w2"] > 0


def test_mixture_draws_follow_the_weights_and_the_noise():
    from pyro_flat.compare.mixture import GaussianMixture

    loc = torch.tensor([[0.0, 10.0], [5.0, -5.0]])
    scale = torch.tensor([[1.0, 2.0], [1.0, 1.0]])
    g = torch.Generator().manual_seed(0)
    draws = GaussianMixture(loc, scale, torch.tensor([1.0, 0.0])).sample(4000, g)
    # only the first component: mean (0, 10), sd (1, 2); 4 standard errors of 4,000 draws
    assert draws.shape == (4000, 2)
    assert torch.allclose(draws.mean(0), torch.tensor([0.0, 10.0], dtype=torch.float64),
                          atol=4 * 2 / 4000**0.5)
    assert torch.allclose(draws.std(0), torch.tensor([1.0, 2.0], dtype=torch.float64),
                          rtol=0.05)
    even = GaussianMixture.equal(loc, scale).sample(4000, g)
    # an even mixture of N(0, 1) and N(5, 1): mean 2.5 (sd 2.69, standard error 0.043)
    assert float(even[:, 0].mean()) == pytest.approx(2.5, abs=4 * 2.69 / 4000**0.5)


def test_w2_of_a_predictive_against_itself_is_its_sampling_noise():
    g = torch.Generator().manual_seed(0)
    a, b = torch.randn(1000, 50, generator=g), torch.randn(800, 50, generator=g)
    # two samples of N(0, 1): W2 of order n^(-1/2) ~ 0.05; a shift of 1 is at distance ~1
    assert wasserstein2(a, b) < 0.15
    assert wasserstein2(a, b + 1.0) == pytest.approx(1.0, abs=0.15)
