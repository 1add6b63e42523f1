"""``pyro-flat compare`` on the regression data sets: the two-output network with the
heteroscedastic Gaussian likelihood, the regression metrics, tables, files and figures."""

import csv
import json
import math

import arviz as az
import numpy as np
import pyro
import pytest
import torch
from test_cli import replace_runner, run, table_rows

from pyro_flat import cli
from pyro_flat.compare import evaluation, figures, output, task
from pyro_flat.compare.common import Context, point_draws
from pyro_flat.datasets import load_dataset
from pyro_flat.models.likelihoods import HeteroskedasticGaussian

HEADER = ("method", "RMSE", "NLL", "CRPS", "calib. error", "OOD AUROC", "sharpness", "KSD",
          "grad evals", "draws", "wall time (s)")
METHODS = ["sgld", "sasgld", "svi", "swag", "ensemble"]
BUDGET = 160
DRAWS = {"ensemble": 4, "sgd": 1}
SITES = {"net.0.weight", "net.0.bias", "net.2.weight", "net.2.bias", "net.4.weight", "net.4.bias"}


@pytest.fixture(scope="module")
def diabetes_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("regression") / "diabetes"
    code, stdout, stderr = run(["compare", "--dataset", "diabetes", "--budget", str(BUDGET),
                                "--jobs", "1", "--methods", ",".join(METHODS),
                                "--out", str(out)])
    return code, stdout, stderr, out


def test_diabetes_table_has_the_regression_columns(diabetes_run):
    code, stdout, stderr, _ = diabetes_run
    assert code == 0, stderr
    assert "mlp 10-100-100-2" in stderr  # two outputs: the mean and the raw scale
    header, rows = table_rows(stdout)
    assert tuple(header) == HEADER
    assert [r[0] for r in rows] == [*METHODS, "sgd"]  # no "(failed)"
    for r in rows:
        rmse, nll, crps, cal, auroc, sharp, ksd = (math.nan if v == "-" else float(v)
                                                   for v in r[1:8])
        # standardised targets: predicting 0 has RMSE about 1 and CRPS about 0.57
        assert 0 < rmse < 1.2 and math.isfinite(nll) and 0 < crps < 0.8, r
        assert 0 <= cal <= 0.5 and 0 <= auroc <= 1 and math.isfinite(sharp), r
        assert math.isfinite(ksd) == (DRAWS.get(r[0], 12) > 1), r  # 11,402 parameters
        assert int(r[9]) == DRAWS.get(r[0], 12), r


def test_diabetes_files(diabetes_run):
    code, stdout, _, out = diabetes_run
    assert code == 0
    methods = [*METHODS, "sgd"]
    assert sorted(p.name for p in out.iterdir()) == sorted(
        ["results.csv", "results.json", "results.md", "reliability.png", "uncertainty.png",
         "loss_slices.png", *(f"draws_{m}.nc" for m in methods)])  # no predictive.png: 10-D
    with open(out / "results.csv", newline="") as f:
        reader = csv.DictReader(f)
        assert tuple(reader.fieldnames) == output.columns(evaluation.REGRESSION_METRICS)
        rows = list(reader)
    assert all(r["status"] == "ok" for r in rows)
    assert all(math.isfinite(float(r[m])) for r in rows for m in evaluation.REGRESSION_METRICS
               if (m, r["method"]) != ("ksd", "sgd"))  # one draw: no Stein discrepancy
    result = json.loads((out / "results.json").read_text())
    assert result["task"] == "regression" and result["architecture"] == "mlp 10-100-100-2"
    assert result["likelihood"] == "HeteroskedasticGaussian(min_scale=0.001)"
    assert "standardised" in result["metrics"] and "CRPS" in result["metrics"]
    assert result["settings"]["lr"] == task.TASK_SETTINGS["regression"]["lr"]
    assert result["y_std"] > 0 and result["figures"] == list(figures.FIGURES)
    assert tuple(table_rows((out / "results.md").read_text())[0]) == HEADER
    for name in ("reliability.png", "uncertainty.png", "loss_slices.png"):
        data = (out / name).read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 10_000, name


def test_diabetes_draws_are_readable_and_score_the_table_nll(diabetes_run):
    """The netCDF draws carry the test set's log-likelihood under the heteroscedastic
    Gaussian; for equally weighted draws the table's NLL is -mean log mean_s p_s(y), the NLL
    of the mixture, computed here from the file alone."""
    _, _, _, out = diabetes_run
    result = json.loads((out / "results.json").read_text())
    nll = {r["method"]: r["nll"] for r in result["results"]}
    for method in [*METHODS, "sgd"]:
        idata = az.from_netcdf(out / f"draws_{method}.nc")
        assert set(idata.posterior.data_vars) == SITES, method
        draws = DRAWS.get(method, 12)
        assert idata.posterior["net.4.weight"].shape == (1, draws, 2, 100), method
        log_lik = torch.as_tensor(idata.log_likelihood["obs"].values[0]).double()
        assert log_lik.shape == (draws, 100)
        mixture_nll = -(torch.logsumexp(log_lik, 0) - math.log(draws)).mean()
        assert float(mixture_nll) == pytest.approx(nll[method], abs=1e-4), method


def test_plain_network_loss_is_the_pyro_likelihood():
    """The loss SGD, SWAG and the ensembles minimise is, point by point, -log p of the model
    the Bayesian methods sample: the observed site of Context.bnn() with the same weights."""
    data = load_dataset("diabetes", num_train=100)
    plan = cli.make_plan(cli.Budget(steps=40), 0.8)
    ctx = Context(data, task.task_settings("regression"), plan, seed=0, show_progress=False)
    net = ctx.network()
    with torch.no_grad():
        net[-1].bias.copy_(torch.tensor([0.3, -1.5]))  # a scale well away from softplus(0)
    x, y = data.x_train, data.y_train
    with torch.no_grad():
        out = net(x)
    dist = HeteroskedasticGaussian(min_scale=1e-3).distribution(out, {})
    per_point = task.nll("regression", out, y, reduction="none")
    assert torch.allclose(per_point, -dist.log_prob(y), atol=1e-5)
    assert float(ctx.loss(out, y)) == pytest.approx(float(per_point.mean()), rel=1e-6)
    model = ctx.bnn()
    assert isinstance(model.likelihood, HeteroskedasticGaussian)
    assert model.likelihood.min_scale == 1e-3
    weights = {k: v[0] for k, v in point_draws(net).items()}
    trace = pyro.poutine.trace(pyro.poutine.condition(model, data=weights)
                               ).get_trace(x, y)  # 100 points: one full minibatch
    obs = trace.nodes["obs"]
    log_lik = obs["fn"].log_prob(obs["value"])
    assert torch.allclose(-log_lik.detach(), per_point, atol=1e-5)


def test_seeds_give_regression_summaries_and_a_predictive_figure(tmp_path):
    """--seeds 3 on the 1-D heteroscedastic set: the summary and the paired differences carry
    the regression metrics, and the 1-D data set adds predictive.png."""
    out = tmp_path / "seeds"
    code, stdout, stderr = run(["compare", "--dataset", "heteroscedastic", "--budget", "40",
                                "--methods", "sgld,sasgld", "--seeds", "3", "--jobs", "1",
                                "--out", str(out)])
    assert code == 0, stderr
    summary, pairs = stdout.split("paired differences")
    header, rows = table_rows(summary)
    assert tuple(header) == ("method", *HEADER[1:8], "grad evals", "wall time (s)", "seeds")
    assert [r[0] for r in rows] == ["sgld", "sasgld", "sgd"] and all(r[-1] == "3" for r in rows)
    header, rows = table_rows(pairs)
    assert tuple(header) == ("method - baseline", *HEADER[1:8], "seeds")
    assert [r[0] for r in rows] == ["sasgld - sgld"]
    result = json.loads((out / "results.json").read_text())
    (pair,) = result["paired_differences"]
    crps = {m: np.array([r["crps"] for r in result["results"] if r["method"] == m])
            for m in ("sgld", "sasgld")}
    assert pair["crps"] == pytest.approx(float((crps["sasgld"] - crps["sgld"]).mean()))
    assert "calibration_error_se" in result["summary"][0] and "accuracy" not in pair
    assert {"paired_differences.png", "predictive.png"} <= set(result["figures"])
    for name in ("paired_differences.png", "predictive.png", "reliability.png"):
        assert (out / name).stat().st_size > 10_000, name


def test_cnn_is_refused_for_regression(tmp_path):
    out = tmp_path / "out"
    code, stdout, stderr = run(["compare", "--dataset", "diabetes", "--model", "cnn",
                                "--budget", "20", "--out", str(out)])
    assert code == 2 and stdout == ""
    (line,) = stderr.strip().splitlines()
    assert "error: argument --model: 'cnn' does not fit the regression data set 'diabetes'" in (
        line) and line.endswith("choose from mlp")
    assert list(tmp_path.iterdir()) == []


def test_tasks_of_the_data_sets():
    """compare knows the task of a data set before loading it; it agrees with the loader."""
    for name in ("digits", "regression_gap", "diabetes", "heteroscedastic"):
        assert task.dataset_task(name) == load_dataset(name, num_train=20).task, name
    assert set(task.REGRESSION_DATASETS) <= set(cli.DATASETS)
    assert evaluation.task_metrics("classification") == (
        evaluation.METRICS, frozenset({"accuracy", "ood_auroc"}))
    assert evaluation.task_metrics("regression") == (
        evaluation.REGRESSION_METRICS, frozenset({"ood_auroc"}))


def test_plain_networks_train_on_the_context_loss(monkeypatch):
    """SGD, SWAG and the ensembles (train_map) minimise Context.loss on each minibatch."""
    from pyro_flat.compare.sgd import train_map

    data = load_dataset("heteroscedastic", num_train=64)
    plan = cli.make_plan(cli.Budget(steps=40), 0.8)
    ctx = Context(data, task.task_settings("regression"), plan, seed=0, show_progress=False)
    seen = []

    def spy(self, output, y):
        seen.append((tuple(output.shape), tuple(y.shape)))
        return task.nll(self.task, output, y)

    monkeypatch.setattr(Context, "loss", spy)
    net = ctx.network()
    before = ctx.loss(net(data.x_train), data.y_train).item()
    train_map(ctx, net, 30)
    assert seen[1:] == [((64, 2), (64,))] * 30  # one full batch of 64 per step
    assert task.nll("regression", net(data.x_train), data.y_train).item() < before


def test_importance_weights_enter_the_regression_mixture():
    """ContourSGLD's weights: a weight of one on the second draw scores that draw alone."""
    from types import SimpleNamespace

    from pyro_flat.compare.common import Fit
    from pyro_flat.compare.evaluation import evaluate
    from pyro_flat.models.nn import make_bayesian

    torch.manual_seed(0)
    net = make_bayesian(torch.nn.Linear(1, 2))
    samples = {"weight": torch.randn(3, 2, 1), "bias": torch.randn(3, 2)}
    x = torch.linspace(-2, 2, 60).unsqueeze(1)
    y = torch.sin(x).squeeze(1)
    data = SimpleNamespace(x_train=x, y_train=y, x_test=x[:40], y_test=y[:40], x_ood=x[40:],
                           task="regression")
    weights = torch.tensor([0.0, 1.0, 0.0], dtype=torch.float64)
    weighted = evaluate(Fit(net, samples, 1, weights=weights), data, seed=0)
    alone = evaluate(Fit(net, {k: v[1:2] for k, v in samples.items()}, 1), data, seed=0)
    equal = evaluate(Fit(net, samples, 1), data, seed=0)
    for key in evaluation.REGRESSION_METRICS:  # (one draw has no Stein discrepancy: nan)
        assert weighted.metrics[key] == pytest.approx(alone.metrics[key], abs=1e-9,
                                                      nan_ok=True), key
    assert equal.metrics["nll"] != pytest.approx(alone.metrics["nll"], abs=1e-3)
    x_curve, mixture = weighted.curve  # 1-D inputs: the predictive over a grid
    assert x_curve.shape == (evaluation.CURVE_POINTS,) and mixture.loc.shape[1] == len(x_curve)


def test_a_failing_regression_method_gets_an_empty_regression_row(tmp_path, monkeypatch):
    def diverged(method, ctx):
        raise RuntimeError("the chain diverged")

    replace_runner(monkeypatch, "sghmc", diverged)
    out = tmp_path / "out"
    code, stdout, _ = run(["compare", "--dataset", "regression_gap", "--budget", "20",
                           "--methods", "sghmc", "--jobs", "1", "--out", str(out)])
    assert code == 1
    header, rows = table_rows(stdout)
    assert tuple(header) == HEADER
    assert rows[0][:10] == ["sghmc (failed)", *["-"] * 9] and rows[1][0] == "sgd"
    result = json.loads((out / "results.json").read_text())["results"]
    assert result[0]["rmse"] is None and result[0]["calibration_error"] is None
    assert (out / "predictive.png").is_file()  # of the methods that ran


@pytest.mark.parametrize("count", [4, 7])
def test_paired_difference_figure_has_a_panel_per_metric(tmp_path, monkeypatch, count):
    from matplotlib.figure import Figure

    from pyro_flat.compare import seeds

    metrics = ("rmse", "nll", "crps", "calibration_error", "ood_auroc", "sharpness",
               "accuracy")[:count]
    by_seed = {s: [{"method": m, "status": "ok", **{k: v + 0.1 * s for k in metrics}}
                   for m, v in (("sgld", 1.0), ("sasgld", 0.9))] for s in range(3)}
    pairs = seeds.paired_differences(by_seed, metrics=metrics)
    drawn = []
    monkeypatch.setattr(Figure, "savefig", lambda fig, *a, **k: drawn.append(fig))
    assert seeds.write_figure(tmp_path, pairs, metrics=metrics) == [seeds.FIGURE]
    titles = [ax.get_title() for ax in drawn[0].axes if ax.axison]
    assert [t.split(" (")[0] for t in titles] == [evaluation.HEADERS[m] for m in metrics]
