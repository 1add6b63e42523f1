"""L2E meta-training: the ES step lowers the meta-loss, checkpoints resume exactly, and the
inner loop is the kernel's update, and importing pyro_flat.infer does not load the data sets."""

import itertools
import math
import subprocess
import sys

import pytest
import torch

from pyro_flat.infer import L2E
from pyro_flat.infer.mcmc.l2e.meta_net import MetaNet
from pyro_flat.infer.mcmc.l2e.training import (
    MetaTrainConfig,
    MetaTrainer,
    bma_nll,
    inner_run,
    make_task,
    meta_loss,
    sample_task,
)


@pytest.fixture(scope="module")
def tasks():
    return [make_task("teacher_regression", "mlp", 16, 1, seed=0),
            make_task("digits", "mlp", 16, 1, seed=1)]


def small_config(**kw):
    base = dict(inner_steps=60, num_snapshots=5, snapshot_every=5, lr=0.05, init_planted=0.0,
                init_descent=3.0, seed=0)
    return MetaTrainConfig(**{**base, **kw})


def test_a_few_es_steps_lower_the_meta_loss(tasks):
    """From a sampler that moves too slowly (descent gain 3), six antithetic-ES steps on a fixed
    seeded task set lower the meta-loss, and the mirror image of the change raises it (so the
    estimate points downhill, not just somewhere). Everything is seeded: deterministic."""
    cfg = small_config()
    cycle = itertools.cycle(tasks)
    trainer = MetaTrainer(cfg, task_sampler=lambda g: next(cycle), log=None)
    phi0 = trainer.phi.detach().clone()
    before = meta_loss(trainer.net, tasks, cfg, [0, 1])
    for _ in range(6):
        trainer.step()
    after = meta_loss(trainer.net, tasks, cfg, [0, 1])
    mirrored = meta_loss(MetaNet.from_flat(2 * phi0 - trainer.phi.detach()), tasks, cfg, [0, 1])
    assert after < before < mirrored, (after, before, mirrored)
    assert len(trainer.history) == 6 and all(math.isfinite(r["loss"]) for r in trainer.history)


def test_checkpoint_resume_is_exact(tmp_path, tasks):
    """4 outer steps at once equal 2 steps, a checkpoint, and 2 more in a new trainer (the
    task draws, ES directions and inner seeds all come from the checkpointed generator)."""
    cfg = small_config(inner_steps=20, num_snapshots=2, outer_steps=4)

    def sampler(g):
        return tasks[int(torch.randint(len(tasks), (), generator=g))]

    whole = MetaTrainer(cfg, task_sampler=sampler, log=None)
    whole.run()
    path = tmp_path / "ckpt.pt"
    first = MetaTrainer(MetaTrainConfig(**{**cfg.__dict__, "outer_steps": 2}),
                        task_sampler=sampler, log=None)
    first.run(checkpoint=path, checkpoint_every=1)
    lines = []
    second = MetaTrainer(cfg, task_sampler=sampler, log=lines.append)
    second.run(checkpoint=path, checkpoint_every=1)
    assert lines[0].startswith("resumed from") and second.num_steps == 4
    assert torch.equal(whole.phi, second.phi)
    assert [r["loss"] for r in whole.history] == [r["loss"] for r in second.history]
    other = MetaTrainer(small_config(sigma=0.02), log=None)
    with pytest.raises(ValueError, match="sigma"):
        other.load(path)


def test_inner_loop_is_the_kernels_update(tasks):
    """Full batch and temperature 0: the meta-training inner loop and the L2E kernel on the
    same potential take exactly the same steps (the sampler trained is the sampler shipped)."""
    task = make_task("teacher_regression", "mlp", 16, 1, seed=0)
    task.batch_size = task.num_data
    net = MetaNet.init(torch.Generator().manual_seed(0), planted=3.0, descent=30.0)
    steps = 15
    cfg = small_config(inner_steps=steps, num_snapshots=1, snapshot_every=1, temperature=0.0)
    loss = inner_run(net, task, cfg, seed=0)

    idx = torch.arange(task.num_data)

    def potential(params):
        flat = torch.cat([params[n].reshape(-1) for n in task.names])
        leaf_views = task.views(flat)
        out = torch.func.functional_call(task.net, leaf_views, (task.x_train,))
        return -task.log_lik(out, task.y_train[idx]).sum() + 0.5 * flat.square().sum()

    kernel = L2E(potential_fn=potential, initial_params=task.views(task.initial_flat()),
                 meta_params=net, num_data=task.num_data, temperature=0.0)
    from pyro.infer import MCMC
    mcmc = MCMC(kernel, num_samples=steps, warmup_steps=0, disable_progbar=True)
    mcmc.run()
    final = torch.cat([mcmc.get_samples()[n][-1].reshape(-1) for n in task.names])
    kernel_loss = bma_nll(task.log_lik(task.outputs(final, task.x_val), task.y_val)[None])
    assert kernel.base_step_size == pytest.approx(math.sqrt(2.0 / task.num_data))
    assert kernel_loss == pytest.approx(loss, rel=1e-5)


def test_bma_nll_and_task_sampling():
    ll = torch.log(torch.tensor([[0.5, 0.1], [0.3, 0.7]]))
    expected = -(math.log(0.4) + math.log(0.4)) / 2
    assert bma_nll(ll) == pytest.approx(expected)
    g1, g2 = torch.Generator().manual_seed(3), torch.Generator().manual_seed(3)
    a, b = sample_task(g1), sample_task(g2)
    assert a.name == b.name and torch.equal(a.initial_flat(), b.initial_flat())


def test_bad_configuration_raises_value_error():
    with pytest.raises(ValueError, match="sigma"):
        MetaTrainConfig(sigma=0.0)
    with pytest.raises(ValueError, match="inner_steps"):
        MetaTrainConfig(inner_steps=50, num_snapshots=10, snapshot_every=20)
    with pytest.raises(ValueError, match="pairs_per_step"):
        MetaTrainConfig(pairs_per_step=0)
    with pytest.raises(ValueError, match="arch"):
        make_task("digits", "transformer", 4, 1)


def test_importing_infer_does_not_import_the_data_sets():
    code = "import sys, pyro_flat.infer; print('pyro_flat.datasets' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
