"""``compare --tune``: the declared search, the validation split, the choice, and that the test
set never reaches the search."""

import contextlib
import dataclasses
import io
import json
import math

import pytest
import torch

from pyro_flat import cli
from pyro_flat.compare import registry, run, tuning
from pyro_flat.compare.common import Context
from pyro_flat.compare.config import Budget, Settings, make_plan
from pyro_flat.datasets import load_dataset


def test_every_method_has_a_search_of_equal_size_that_contains_its_defaults():
    defaults = Settings()
    assert all(m.search for m in registry.ALL.values())  # every method carries its grid
    for method in registry.ALL:
        found = tuning.candidates(method, defaults)
        assert len(found) == tuning.CANDIDATES
        assert len({tuple(sorted(c.items())) for c in found}) == tuning.CANDIDATES
        # the defaults are one of the candidates: the search can only improve on them
        assert {k: getattr(defaults, k) for k in found[0]} in found
    assert tuning.CANDIDATES * tuning.TUNING_SHARE == 1  # the search costs one run


def test_a_grid_of_the_wrong_size_or_an_unknown_setting_is_refused():
    tuning.check_search("sgld", {"lr": (0.5, 1.0, 2.0, 4.0)})
    with pytest.raises(ValueError, match="4 candidates of Settings fields"):
        tuning.check_search("sgld", {"lr": (0.5, 1.0, 2.0)})
    with pytest.raises(ValueError, match="4 candidates of Settings fields"):
        tuning.check_search("sgld", {"not_a_setting": (0.5, 1.0, 2.0, 4.0)})


def test_candidates_follow_the_defaults():
    shifted = Settings(lr=0.01, rho=0.1)
    assert [c["lr"] for c in tuning.candidates("sgld", shifted)] == [0.0025, 0.005, 0.01, 0.02]
    assert {c["rho"] for c in tuning.candidates("sasgld", shifted)} == {0.02, 0.1}
    with pytest.raises(ValueError, match="method must be one of"):
        tuning.candidates("nuts", shifted)


def test_validation_split_is_a_stratified_partition_of_the_training_set():
    data = load_dataset("digits", seed=3)
    val = tuning.validation_split(data, seed=3)
    n = data.num_train
    assert val.num_train + val.num_test == n
    assert val.num_test == pytest.approx(tuning.VALIDATION_FRACTION * n, abs=1)
    rows = torch.cat([val.x_train, val.x_test])
    # a partition: every training row once (the digits have duplicate images: compare counts)
    assert torch.equal(torch.sort(rows.sum(1)).values, torch.sort(data.x_train.sum(1)).values)
    share = torch.bincount(val.y_test, minlength=10) / val.num_test
    overall = torch.bincount(data.y_train, minlength=10) / n
    assert torch.allclose(share, overall, atol=1.5 / val.num_test * 10)
    assert torch.equal(val.x_ood, data.x_ood)
    again = tuning.validation_split(data, seed=3)
    assert torch.equal(again.y_test, val.y_test)
    other = tuning.validation_split(data, seed=4)
    assert not torch.equal(other.y_test, val.y_test)
    with pytest.raises(ValueError, match="fraction"):
        tuning.validation_split(data, seed=3, fraction=1.0)


def test_choice_is_the_lowest_finite_validation_nll():
    trials = [{"values": {"lr": 0.1}, "status": "ok", "nll": 0.5},
              {"values": {"lr": 0.2}, "status": "failed: diverged", "nll": math.nan},
              {"values": {"lr": 0.4}, "status": "ok", "nll": 0.3},
              {"values": {"lr": 0.8}, "status": "ok", "nll": math.nan}]
    assert tuning.choose("sgld", trials) == {"lr": 0.4}
    assert tuning.choose("sgld", trials[1:2]) == {}


def _main(argv):
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = cli.main(argv)
    return code, out.getvalue(), err.getvalue()


def test_tune_end_to_end_chooses_from_the_trials_and_never_sees_the_test_set(
        tmp_path, monkeypatch):
    data = load_dataset("digits", seed=0)
    seen = []
    evaluate = run.evaluate

    def recording(fit, d, seed, **kwargs):
        seen.append(d.x_test)
        return evaluate(fit, d, seed, **kwargs)

    monkeypatch.setattr(run, "evaluate", recording)
    out = tmp_path / "out"
    code, stdout, stderr = _main(["compare", "--dataset", "digits", "--budget", "80",
                                  "--methods", "sgld", "--tune", "--jobs", "1",
                                  "--out", str(out)])
    assert code == 0, stderr
    assert "hyper-parameters chosen on the validation split" in stdout
    result = json.loads((out / "results.json").read_text())
    report = result["tuning"]["by_seed"]["0"]
    assert set(report) == {"sgld", "sgd"}
    for method, entry in report.items():
        trials = entry["trials"]
        assert [t["values"] for t in trials] == tuning.candidates(method, Settings())
        best = min(trials, key=lambda t: t["nll"])
        assert entry["chosen"] == best["values"]
    # 8 tuning runs on validation rows (training rows), then 2 final runs on the test set
    assert len(seen) == 2 * tuning.CANDIDATES + 2
    train_rows = {tuple(r.tolist()) for r in data.x_train}
    test_rows = {tuple(r.tolist()) for r in data.x_test} - train_rows
    for x in seen[:-2]:
        rows = {tuple(r.tolist()) for r in x}
        assert rows <= train_rows and not rows & test_rows
    assert torch.equal(seen[-1], data.x_test)


def test_the_final_run_uses_the_chosen_values(tmp_path):
    out = tmp_path / "out"
    code, _, stderr = _main(["compare", "--dataset", "digits", "--budget", "80", "--methods",
                             "sasgld", "--tune", "--jobs", "1", "--out", str(out)])
    assert code == 0, stderr
    result = json.loads((out / "results.json").read_text())
    chosen = result["tuning"]["by_seed"]["0"]["sasgld"]["chosen"]
    row = next(r for r in result["results"] if r["method"] == "sasgld")
    # the same method run directly with the chosen settings gives the same row
    data = load_dataset("digits", seed=0)
    settings = dataclasses.replace(Settings(), **chosen)
    ctx = Context(data, settings, make_plan(Budget(steps=80), 0.8), 0, "mlp", False)
    direct, *_ = run.run_method("sasgld", ctx, export=False)
    assert direct["nll"] == pytest.approx(row["nll"], rel=1e-6)
    assert direct["accuracy"] == row["accuracy"]
