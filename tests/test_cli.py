import contextlib
import csv
import io
import json
import math
import pickle

import arviz as az
import pytest
import torch

import pyro_flat
from pyro_flat import cli

METHODS = ["sgld", "sghmc", "csgld", "entropy", "sasgld", "sgd"]
HEADER = ("method", "accuracy", "NLL", "ECE", "Brier", "OOD AUROC", "sharpness", "grad evals",
          "draws", "wall time (s)")


def run(argv):
    """``main(argv)`` in-process: (exit status, stdout, stderr)."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = cli.main(argv)
        except SystemExit as exc:
            code = exc.code
    return code, out.getvalue(), err.getvalue()


def table_rows(stdout):
    lines = [line for line in stdout.splitlines() if line.startswith("|")]
    cells = [[c.strip() for c in line.strip("|").split("|")] for line in lines]
    return cells[0], cells[2:]  # header, rows (the second line is the alignment rule)


@pytest.fixture(scope="module")
def digits_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("run") / "results"
    code, stdout, stderr = run(
        ["compare", "--dataset", "digits", "--budget", "60", "--out", str(out)]
    )
    return code, stdout, stderr, out


def test_compare_prints_one_table(digits_run):
    code, stdout, stderr, _ = digits_run
    assert code == 0, stderr
    header, rows = table_rows(stdout)
    assert tuple(header) == HEADER
    assert [r[0] for r in rows] == METHODS
    for r in rows:
        acc, nll, ece, brier, auroc, sharp = map(float, r[1:7])
        assert 0.5 < acc <= 1 and nll > 0 and 0 <= ece <= 1 and 0 <= brier <= 2
        assert 0 <= auroc <= 1 and math.isfinite(sharp)
    # equal budget of gradient evaluations: 60, SASGLD's two per step rounded down to whole
    # steps per draw (thin 5 -> 2 steps, 12 draws, 48 gradients)
    assert [int(r[7]) for r in rows] == [60, 60, 60, 60, 48, 60]
    assert [int(r[8]) for r in rows] == [9, 9, 9, 18, 9, 1]  # kept draws; one network for SGD
    # one short progress line per method on stderr
    assert sum(line.startswith("[") for line in stderr.splitlines()) == len(METHODS)


def test_compare_writes_csv_and_json(digits_run):
    code, stdout, _, out = digits_run
    assert code == 0
    with open(out / "results.csv", newline="") as f:
        reader = csv.DictReader(f)
        assert tuple(reader.fieldnames) == cli.COLUMNS
        csv_rows = list(reader)
    assert [r["method"] for r in csv_rows] == METHODS
    assert all(r["status"] == "ok" for r in csv_rows)
    result = json.loads((out / "results.json").read_text())
    assert result["dataset"] == "digits" and result["budget"] == 60 and result["seed"] == 0
    assert result["pyro_flat_version"] == pyro_flat.__version__
    assert result["architecture"] == [64, 100, 100, 10]
    assert [r["method"] for r in result["results"]] == METHODS
    _, table = table_rows(stdout)
    for row_csv, row_json, row_table in zip(csv_rows, result["results"], table, strict=True):
        assert set(row_json) == set(cli.COLUMNS)
        assert float(row_csv["accuracy"]) == pytest.approx(row_json["accuracy"])
        assert float(row_table[1]) == pytest.approx(row_json["accuracy"], abs=5e-5)
        expected = 48 if row_json["method"] == "sasgld" else 60  # see the test above
        assert int(row_csv["grad_evals"]) == row_json["grad_evals"] == expected


def test_compare_writes_draws_as_netcdf(digits_run):
    _, _, _, out = digits_run
    assert sorted(p.name for p in out.iterdir()) == sorted(
        ["results.csv", "results.json", "draws_csgld.nc", "draws_sghmc.nc", "draws_sgld.nc",
         "draws_entropy.nc", "draws_sasgld.nc"]
    )
    for method, kernel in [("sgld", "SGLD"), ("sghmc", "SGHMC"), ("csgld", "CyclicalSGLD"),
                           ("entropy", "EntropyMCMC")]:
        idata = az.from_netcdf(out / f"draws_{method}.nc")
        sites = {"0.weight", "0.bias", "2.weight", "2.bias", "4.weight", "4.bias"}
        if method == "entropy":  # the guiding variable comes with the draws
            sites |= {site + "__guide" for site in sites}
        assert set(idata.posterior.data_vars) == sites
        assert idata.posterior["0.weight"].shape == (1, 9, 100, 64)
        assert {"lp", "step_size", "grad_norm", "diverging"} <= set(idata.sample_stats.data_vars)
        assert idata.posterior.attrs["pyro_flat_kernel"] == kernel


def test_rerun_replaces_a_previous_output(digits_run, tmp_path):
    _, _, _, first = digits_run
    out = tmp_path / "again"
    code, _, stderr = run(["compare", "--dataset", "digits", "--budget", "20", "--methods",
                           "sgld", "--out", str(out)])
    assert code == 0, stderr
    (out / "draws_sghmc.nc").write_bytes((first / "draws_sghmc.nc").read_bytes())  # stale
    code, stdout, stderr = run(["compare", "--dataset", "digits", "--budget", "20", "--methods",
                                "csgld", "--out", str(out)])
    assert code == 0, stderr
    assert sorted(p.name for p in out.iterdir()) == ["draws_csgld.nc", "results.csv",
                                                     "results.json"]
    assert [r[0] for r in table_rows(stdout)[1]] == ["csgld", "sgd"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["again"]  # no temporary folders


def one_error_line(stderr):
    lines = stderr.strip().splitlines()
    assert len(lines) == 1, stderr
    assert lines[0].startswith("pyro-flat") and ": error: " in lines[0]
    return lines[0]


@pytest.mark.parametrize(
    "args, expected",
    [
        (["--methods", "sgld,contour,swag"],
         "not implemented yet: contour, swag (implemented: sgld, sghmc, csgld, entropy, sasgld)"),
        (["--methods", "ensembles"], "not implemented yet: ensembles"),
        (["--methods", "sgld,nuts"], "unknown method(s) nuts"),
        (["--methods", ","], "name at least one of sgld, sghmc, csgld"),
        (["--dataset", "cifar10"], "argument --dataset: invalid choice: 'cifar10'"),
        (["--model", "resnet"], "argument --model: invalid choice: 'resnet'"),
        (["--budget", "0"], "argument --budget"),
        (["--budget", "-5"], "argument --budget"),
        (["--budget", "1.5"], "argument --budget"),
        (["--budget", "fast"], "argument --budget"),
        (["--budget", "19"], "integer >= 20"),
        (["--seed", "-1"], "argument --seed"),
        (["--device", "nonsense"], "argument --device"),
        (["--threads", "0"], "argument --threads"),
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


def test_failure_while_writing_leaves_nothing(tmp_path, monkeypatch):
    def broken_writer(folder, rows, meta, draws):
        (folder / "results.csv").write_text("half")
        raise OSError("disk full")

    monkeypatch.setattr(cli, "_write_results", broken_writer)
    out = tmp_path / "new" / "out"
    code, _, stderr = run(["compare", "--dataset", "digits", "--budget", "20", "--methods",
                           "sgld", "--out", str(out)])
    assert code == 1
    assert "cannot write the results" in stderr and "disk full" in stderr
    assert list(tmp_path.iterdir()) == []  # neither the folder, its parent, nor a temp folder


def test_a_failing_method_is_reported_not_faked(tmp_path, monkeypatch):
    real = cli.run_mcmc

    def flaky(method, *args, **kwargs):
        if method == "sghmc":
            raise RuntimeError("the chain diverged\nat step 3")
        return real(method, *args, **kwargs)

    monkeypatch.setattr(cli, "run_mcmc", flaky)
    out = tmp_path / "out"
    code, stdout, stderr = run(["compare", "--dataset", "digits", "--budget", "20", "--methods",
                                "sgld,sghmc", "--out", str(out)])
    assert code == 1
    assert "failed: sghmc" in stderr.splitlines()[-1]
    _, rows = table_rows(stdout)
    assert [r[0] for r in rows] == ["sgld", "sghmc (failed)", "sgd"]
    assert rows[1][1:9] == ["-"] * 8  # metrics, sharpness, grad evals, draws
    result = json.loads((out / "results.json").read_text())["results"]
    assert result[1]["status"] == "failed: RuntimeError: the chain diverged at step 3"
    assert result[1]["accuracy"] is None and result[0]["status"] == "ok"
    assert not (out / "draws_sghmc.nc").exists() and (out / "draws_sgld.nc").exists()


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
                   "--model", "--threads"):
        assert option in text
    for name in cli.PLANNED:  # argparse may wrap a line after a hyphen
        assert name in "".join(text.split())


def test_no_command_is_a_usage_error(capsys):
    with pytest.raises(SystemExit) as exc:
        cli.main([])
    assert exc.value.code == 2
    assert len(capsys.readouterr().err.strip().splitlines()) == 1


def test_threads_are_restored(tmp_path):
    before = torch.get_num_threads()
    code, _, _ = run(["compare", "--dataset", "digits", "--budget", "20", "--methods", "sgld",
                      "--threads", "2", "--out", str(tmp_path / "o")])
    assert code == 0 and torch.get_num_threads() == before


@pytest.mark.parametrize("steps", [20, 60, 1001, 12_000])
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
    assert quick.steps == 12_000 and quick.num_draws == 12
    assert cli.make_plan(cli.BUDGETS["full"], 0.8).steps == 120_000


def test_model_pickles():
    net = cli.build_mlp(4, 3, (5,))
    model = pickle.loads(pickle.dumps(cli.ClassifierModel(net, 8)))
    assert model.batch_size == 8 and isinstance(model.net, torch.nn.Sequential)


def test_table_formats_missing_values():
    rows = [{"method": "sgld", **dict.fromkeys(cli.METRICS, math.nan), "grad_evals": None,
             "draws": None, "wall_time_s": 1.25, "status": "failed: x"}]
    assert table_rows(cli.format_table(rows))[1] == [["sgld (failed)", *["-"] * 8, "1.2"]]
