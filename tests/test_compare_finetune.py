"""``pyro-flat compare --protocol finetune`` and the ``laplace`` method: the network is trained
first, the methods run on its last layer over the frozen backbone's features, starting at the
trained values."""

from __future__ import annotations

import json

import pyro
import torch
from test_cli import run, table_rows  # the CLI tests' helpers

from pyro_flat.compare import registry
from pyro_flat.compare.common import Context
from pyro_flat.compare.config import BUDGETS, Settings, make_plan
from pyro_flat.compare.finetune import pretrain
from pyro_flat.datasets import load_dataset


def test_finetune_protocol_runs_every_method_on_the_trained_last_layer(tmp_path):
    out = tmp_path / "ft"
    code, stdout, stderr = run(["compare", "--dataset", "digits", "--model", "mlp",
                                "--protocol", "finetune", "--budget", "160", "--methods",
                                "sgld,svi,laplace", "--jobs", "1", "--out", str(out)])
    assert code == 0, stderr
    assert "training mlp 64-100-100-10 by 3000 SGD steps" in stderr
    assert "the last layer of mlp 64-100-100-10" in stderr
    header, rows = table_rows(stdout)
    assert [r[0] for r in rows] == ["sgld", "svi", "laplace", "sgd"]
    for r in rows:
        assert float(r[1]) > 0.9, r  # a trained network's head: accurate from the start
    result = json.loads((out / "results.json").read_text())
    assert result["settings"]["protocol"] == "finetune"
    notes = result["method_notes"]["laplace"]
    assert notes["prior_precision"] > 0 and notes["structure"] == "kron"
    import arviz as az

    posterior = az.from_netcdf(out / "draws_sgld.nc").posterior
    assert set(posterior.data_vars) == {"net.0.weight", "net.0.bias"}  # the head alone
    assert posterior["net.0.weight"].shape[-2:] == (10, 100)


def test_chains_and_networks_start_at_the_trained_head():
    settings = Settings(finetune_steps=200)
    data = load_dataset("digits", seed=0)
    features, trained, _ = pretrain(data, settings, "mlp", seed=0)
    assert features.x_train.shape == (data.num_train, 100)
    state = {k: v.clone() for k, v in trained.state_dict().items()}
    ctx = Context(features, settings, make_plan(BUDGETS["quick"], 0.8), 0, "finetune",
                  trained=trained)
    torch.testing.assert_close(ctx.network()[0].weight, state["0.weight"])
    from pyro.infer import MCMC

    from pyro_flat.infer import SGLD

    pyro.set_rng_seed(0)
    mcmc = MCMC(SGLD(ctx.bnn(), step_size=1e-12), num_samples=1, warmup_steps=0,
                disable_progbar=True)
    mcmc.run(features.x_train, features.y_train)
    torch.testing.assert_close(mcmc.get_samples()["net.0.weight"][0], state["0.weight"],
                               rtol=0, atol=1e-5)


def test_adapters_part_runs_every_family_on_low_rank_adapters(tmp_path):
    """--finetune-part adapters: the methods see the inputs and sample or fit the adapters'
    factors alone (SGD and its ensembles and SWAG too), starting at B = 0; laplace is the
    subnetwork Laplace of the factors."""
    out = tmp_path / "lora"
    code, stdout, stderr = run(["compare", "--dataset", "digits", "--model", "mlp",
                                "--protocol", "finetune", "--finetune-part", "adapters",
                                "--budget", "40", "--methods", "sgld,swag,ensemble,laplace",
                                "--jobs", "1", "--out", str(out)])
    assert code == 0, stderr
    assert "rank-4 adapters on the linear layers of mlp 64-100-100-10" in stderr
    _, rows = table_rows(stdout)
    assert [r[0] for r in rows] == ["sgld", "swag", "ensemble", "laplace", "sgd"]
    import arviz as az

    posterior = az.from_netcdf(out / "draws_sgld.nc").posterior
    assert set(posterior.data_vars) == {f"net.{i}.lora_{f}" for i in (0, 2, 4) for f in "ab"}
    result = json.loads((out / "results.json").read_text())
    assert result["method_notes"]["laplace"]["structure"] == "diag (adapters)"
    code, _, stderr = run(["compare", "--dataset", "digits", "--finetune-part", "adapters"])
    assert code == 2 and "only with --protocol finetune" in stderr


def test_laplace_is_for_classification():
    assert "laplace" not in registry.implemented("regression")
    code, _, stderr = run(["compare", "--dataset", "diabetes", "--methods", "laplace",
                           "--budget", "20"])
    assert code == 2
    assert "laplace do(es) not run on the regression data set 'diabetes'" in stderr
