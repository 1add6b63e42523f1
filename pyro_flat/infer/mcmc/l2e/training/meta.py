r"""Meta-training of L2E's kinetic-energy network by antithetic evolution strategies.

The meta-loss of meta-parameters :math:`\phi` on a task is the negative log-likelihood of the
Bayesian model average of ``num_snapshots`` snapshots (every ``snapshot_every`` SG steps at the
end of an inner run of ``inner_steps`` L2E steps from the network's initialisation), on the
task's held-out set:

.. math:: \mathcal{L}(\phi) = -\frac{1}{n}\sum_{i=1}^{n} \log \frac{1}{K}\sum_{k=1}^{K}
    p(y_i \mid x_i, \theta_k(\phi)).

Its gradient is estimated by antithetic evolution strategies: for each of ``pairs_per_step``
pairs draw a task and :math:`\varepsilon \sim \mathcal{N}(0, I)`, run the inner loop at
:math:`\phi \pm \sigma\varepsilon` with the *same* initialisation, minibatches and noise, and
average :math:`\frac{\mathcal{L}(\phi + \sigma\varepsilon) - \mathcal{L}(\phi -
\sigma\varepsilon)}{2\sigma}\,\varepsilon`; Adam with gradient-norm clipping takes the outer step.
The inner loop is :func:`pyro_flat.infer.mcmc.l2e.meta_net.l2e_step_`, the update of
:class:`pyro_flat.infer.L2E`, on plain tensors (:func:`torch.func.functional_call`).

Differences from the authors' meta-training (``meta_training.py``, ``full_es_function_bma.py``),
all chosen to fit two CPU cores: inner runs of 400 steps (theirs 3000) with snapshots every 20
of the last 200 (theirs every 50 of the last 500); 500 outer steps for the shipped
meta-parameters (theirs 5000); small MLPs/CNNs on MNIST-1D, digits and a
synthetic regression (theirs conv nets on small image sets); the meta-loss on a held-out set of
256 points (theirs a single validation batch, a noisy estimate); the paper's noise
``2 C eps T`` with ``T = 1`` (theirs ``2 C noise_mult``); ``step_mult = 2`` (theirs 0.5 in
meta-training, 2 in evaluation). The same: antithetic ES with sigma 0.01 and one pair per outer
step, Adam with learning rate 0.01 and gradient-norm clipping at 1, the BMA NLL meta-loss.

Examples
--------
>>> import torch
>>> from pyro_flat.infer.mcmc.l2e.training import MetaTrainConfig, MetaTrainer, make_task
>>> task = make_task("teacher_regression", "mlp", 16, 1, seed=0)
>>> cfg = MetaTrainConfig(outer_steps=1, inner_steps=20, snapshot_every=2, seed=0)
>>> trainer = MetaTrainer(cfg, task_sampler=lambda g: task, log=None)
>>> record = trainer.step()
>>> sorted(record)[:3], trainer.num_steps
(['elapsed', 'grad_norm', 'loss'], 1)

References
----------
Kim, S., Kim, M. & Lee, J. (2024). Learning to explore for stochastic gradient MCMC.
arXiv:2408.09140. Salimans, T. et al. (2017). Evolution strategies as a scalable alternative to
reinforcement learning. arXiv:1703.03864.
"""

from __future__ import annotations

import dataclasses
import math
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from pyro_flat import validation
from pyro_flat.infer.mcmc.l2e.meta_net import L2EState, LearnedKinetic, MetaNet, l2e_step_
from pyro_flat.infer.mcmc.l2e.training.tasks import Task, sample_task

__all__ = ["MetaTrainConfig", "MetaTrainer", "bma_nll", "inner_run", "meta_loss"]

_CHECKPOINT_VERSION = 1
#: The provenance tag written into trained meta-parameters (``MetaNet.info["trained_by"]``): the
#: module's name when the shipped file was trained, kept so that every file carries the same tag.
_TRAINED_BY = "pyro_flat.infer.l2e_meta"


@dataclass
class MetaTrainConfig:
    """Settings of a meta-training run (all saved in its checkpoints).

    ``step_mult`` sets the step size of every inner run as :math:`\\epsilon =
    \\sqrt{\\text{step\\_mult} / N}` (the authors' convention, with the task's own ``N``);
    ``temperature`` is that of :class:`pyro_flat.infer.L2E` (noise variance ``2 C eps T``).
    ``init_planted``, ``init_descent`` and ``init_scale`` are the arguments ``planted``,
    ``descent`` and ``scale`` of :meth:`MetaNet.init` for the starting point.
    """

    outer_steps: int = 1000
    pairs_per_step: int = 1
    inner_steps: int = 400
    num_snapshots: int = 10
    snapshot_every: int = 20
    sigma: float = 0.01
    lr: float = 0.01
    grad_clip: float = 1.0
    step_mult: float = 2.0
    temperature: float = 1.0
    loss_cap: float = 10.0
    init_planted: float = 3.0
    init_descent: float = 30.0
    init_scale: float = 1.0
    seed: int = 0

    def __post_init__(self) -> None:
        for name in ("outer_steps", "pairs_per_step", "inner_steps", "num_snapshots",
                     "snapshot_every"):
            validation.integer_at_least(name, getattr(self, name), 1)
        for name in ("sigma", "lr", "grad_clip", "step_mult", "loss_cap"):
            validation.positive(name, getattr(self, name))
        validation.nonnegative("temperature", self.temperature)
        validation.nonnegative("init_planted", self.init_planted)
        validation.nonnegative("init_descent", self.init_descent)
        validation.positive("init_scale", self.init_scale)
        validation.integer_at_least("seed", self.seed, 0)
        if self.num_snapshots * self.snapshot_every > self.inner_steps:
            raise ValueError(
                f"num_snapshots * snapshot_every must be at most inner_steps={self.inner_steps}, "
                f"got {self.num_snapshots} * {self.snapshot_every}"
            )


def bma_nll(log_liks: torch.Tensor) -> float:
    """NLL of the model average from per-snapshot log-likelihoods ``(K, n)``."""
    k = log_liks.shape[0]
    return float(-(torch.logsumexp(log_liks, 0) - math.log(k)).mean())


def inner_run(net: MetaNet, task: Task, config: MetaTrainConfig, seed: int) -> float:
    """The meta-loss of ``net`` on ``task``: run L2E from the network's initialisation and
    return the BMA NLL of the snapshots on the held-out set (``config.loss_cap`` if the chain
    becomes non-finite; losses are capped there too)."""
    gen = torch.Generator().manual_seed(seed)
    theta = task.initial_flat()
    state = L2EState.zeros(theta, task.segments)
    kinetic = LearnedKinetic(net.to(theta.dtype))
    n, b = task.num_data, min(task.batch_size, task.num_data)
    eps = math.sqrt(config.step_mult / n)
    perm, pos = torch.randperm(n, generator=gen), 0
    first = config.inner_steps - config.snapshot_every * (config.num_snapshots - 1) - 1
    snaps = []
    with torch.no_grad():
        for t in range(config.inner_steps):
            if pos + b > n:
                perm, pos = torch.randperm(n, generator=gen), 0
            idx, pos = perm[pos: pos + b], pos + b
            u, grad = task.potential_and_grad(theta, idx)
            if not (torch.isfinite(u) and torch.isfinite(grad).all()):
                return config.loss_cap
            l2e_step_(theta, state, grad, n, eps, config.temperature, kinetic, generator=gen)
            if t >= first and (t - first) % config.snapshot_every == 0:
                snaps.append(task.log_lik(task.outputs(theta, task.x_val), task.y_val))
    loss = bma_nll(torch.stack(snaps))
    return min(loss, config.loss_cap) if math.isfinite(loss) else config.loss_cap


def meta_loss(net: MetaNet, tasks: Sequence[Task], config: MetaTrainConfig,
              seeds: Sequence[int]) -> float:
    """Mean meta-loss over a fixed task set (one inner run per task and seed)."""
    return sum(inner_run(net, t, config, s) for t, s in zip(tasks, seeds, strict=True)) / len(
        tasks)


class MetaTrainer:
    """Antithetic-ES meta-training with Adam, progress lines and exact-resume checkpoints.

    Parameters
    ----------
    config : MetaTrainConfig
    task_sampler : callable, optional
        ``generator -> Task``; defaults to
        :func:`pyro_flat.infer.mcmc.l2e.training.tasks.sample_task`.
    init : MetaNet, optional
        Starting meta-parameters; default ``MetaNet.init`` with the ``init_*`` settings, drawn
        from ``config.seed``.
    log : callable, optional
        Receives one progress line per outer step (``print`` by default, ``None`` for silence).
    """

    def __init__(self, config: MetaTrainConfig, task_sampler: Callable[[torch.Generator], Task]
                 = sample_task, init: MetaNet | None = None,
                 log: Callable[[str], Any] | None = print):
        self.config = config
        self.task_sampler = task_sampler
        self.log = log
        self.generator = torch.Generator().manual_seed(config.seed)
        if init is None:
            init = MetaNet.init(self.generator, planted=config.init_planted,
                                descent=config.init_descent, scale=config.init_scale)
        self.phi = init.to_flat().detach().clone().requires_grad_()
        self.optimizer = torch.optim.Adam([self.phi], lr=config.lr)
        self.num_steps = 0
        self.history: list[dict[str, Any]] = []
        #: Anything a driver wants checkpointed with the run (e.g. validation results).
        self.extra: dict[str, Any] = {}
        self._elapsed = 0.0

    @property
    def net(self) -> MetaNet:
        """The current meta-parameters."""
        return MetaNet.from_flat(self.phi.detach().clone(), self.provenance())

    def provenance(self) -> dict[str, Any]:
        return {"trained_by": _TRAINED_BY, "outer_steps": self.num_steps,
                "config": dataclasses.asdict(self.config)}

    def step(self) -> dict[str, Any]:
        """One outer step; returns its record (also appended to ``history``)."""
        start = time.perf_counter()
        cfg = self.config
        phi = self.phi.detach()
        grad = torch.zeros_like(phi)
        losses, names = [], []
        for _ in range(cfg.pairs_per_step):
            task = self.task_sampler(self.generator)
            direction = torch.randn(phi.shape, generator=self.generator)
            seed = int(torch.randint(2**62, (), generator=self.generator))
            plus = inner_run(MetaNet.from_flat(phi + cfg.sigma * direction), task, cfg, seed)
            minus = inner_run(MetaNet.from_flat(phi - cfg.sigma * direction), task, cfg, seed)
            delta = plus - minus if math.isfinite(plus - minus) else 0.0
            grad.add_(direction, alpha=delta / (2 * cfg.sigma * cfg.pairs_per_step))
            losses.append(0.5 * (plus + minus))
            names.append(task.name)
        norm = float(torch.linalg.vector_norm(grad))
        if norm > cfg.grad_clip:
            grad.mul_(cfg.grad_clip / norm)
        self.phi.grad = grad
        self.optimizer.step()
        self.num_steps += 1
        self._elapsed += time.perf_counter() - start
        record = {"step": self.num_steps, "loss": sum(losses) / len(losses), "grad_norm": norm,
                  "tasks": names, "elapsed": round(self._elapsed, 2)}
        self.history.append(record)
        if self.log is not None:
            self.log(f"step {self.num_steps:5d}  meta-loss {record['loss']:.4f}  "
                     f"|grad| {norm:.3g}  {', '.join(names)}  {self._elapsed:.0f}s")
        return record

    def run(self, checkpoint: str | os.PathLike[str] | None = None, checkpoint_every: int = 25,
            callback: Callable[[MetaTrainer], Any] | None = None) -> MetaNet:
        """Run until ``config.outer_steps``; resume from ``checkpoint`` if it exists and save it
        every ``checkpoint_every`` steps (and at the end). ``callback(self)`` runs after each
        step."""
        validation.integer_at_least("checkpoint_every", checkpoint_every, 1)
        if checkpoint is not None and os.path.exists(checkpoint):
            self.load(checkpoint)
            if self.log is not None:
                self.log(f"resumed from {checkpoint} at step {self.num_steps}")
        while self.num_steps < self.config.outer_steps:
            self.step()
            if callback is not None:
                callback(self)
            if checkpoint is not None and (self.num_steps % checkpoint_every == 0
                                           or self.num_steps == self.config.outer_steps):
                self.save(checkpoint)
        return self.net

    # ------------------------------------------------------------------ checkpoints

    def state_dict(self) -> dict[str, Any]:
        return {
            "version": _CHECKPOINT_VERSION,
            "config": dataclasses.asdict(self.config),
            "phi": self.phi.detach().clone(),
            "optimizer": self.optimizer.state_dict(),
            "generator": self.generator.get_state(),
            "num_steps": self.num_steps,
            "history": list(self.history),
            "elapsed": self._elapsed,
            "extra": dict(self.extra),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state.get("version") != _CHECKPOINT_VERSION:
            raise ValueError(f"checkpoint version {state.get('version')} is not "
                             f"{_CHECKPOINT_VERSION}")
        saved = {k: v for k, v in state["config"].items() if k != "outer_steps"}
        mine = {k: v for k, v in dataclasses.asdict(self.config).items() if k != "outer_steps"}
        if saved != mine:
            diff = sorted(k for k in mine if saved.get(k) != mine[k])
            raise ValueError(f"the checkpoint was written with other settings: {diff}")
        with torch.no_grad():
            self.phi.copy_(state["phi"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.generator.set_state(state["generator"])
        self.num_steps = int(state["num_steps"])
        self.history = list(state["history"])
        self._elapsed = float(state["elapsed"])
        self.extra = dict(state.get("extra", {}))

    def save(self, path: str | os.PathLike[str]) -> None:
        """Write a checkpoint atomically (a crash never leaves a half-written file)."""
        tmp = f"{os.fspath(path)}.tmp"
        torch.save(self.state_dict(), tmp)
        os.replace(tmp, path)

    def load(self, path: str | os.PathLike[str]) -> None:
        self.load_state_dict(torch.load(path, weights_only=False))
