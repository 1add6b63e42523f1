"""Every kernel's draws at a fixed seed are bitwise those recorded before the kernels were
restructured (``fixed_seed_runs.py``), and a checkpoint written then still loads and continues
the chain to the same draws. L2E's are replayed within float32 rounding
(``fixed_seed_runs.TOLERANCES`` says why)."""

import fixed_seed_runs
import pytest
import torch

RECORDED = torch.load(fixed_seed_runs.PATH, weights_only=False)


@pytest.mark.parametrize("name", list(fixed_seed_runs.RUNS))
def test_draws_and_statistics_are_the_recorded_ones(name):
    recorded = RECORDED["runs"][name]
    now = fixed_seed_runs.run(name, with_resume=False)
    for part in ("samples", "stats", "extras"):
        # diagnostics may gain fields (warmup's records gained the friction it chose with
        # the step); the recorded ones stay as they were
        assert fixed_seed_runs.differences(now[part], recorded[part],
                                           tol=fixed_seed_runs.TOLERANCES.get(name),
                                           new_keys=part == "extras") == [], part


@pytest.mark.parametrize("name", list(fixed_seed_runs.RUNS))
def test_a_recorded_checkpoint_continues_the_chain(name):
    recorded = RECORDED["runs"][name]
    resumed = fixed_seed_runs.resume(name, recorded["state"])
    assert fixed_seed_runs.differences(resumed, recorded["resumed"],
                                       tol=fixed_seed_runs.TOLERANCES.get(name)) == []
