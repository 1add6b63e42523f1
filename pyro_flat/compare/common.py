"""What every runner of ``pyro-flat compare`` receives (:class:`Context`) and returns
(:class:`Fit`), and how a method is declared (:class:`Method`).

A runner trains or samples one method and returns draws of the network's weights as
``{site: tensor(num_draws, *shape)}`` for one Bayesian network; the shared evaluation
(:mod:`pyro_flat.compare.evaluation`) turns any such draws into the table's numbers and the
figures' curves, so a runner holds only what is specific to its method.
"""

from __future__ import annotations

import copy
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

from pyro_flat.compare.config import Plan, Settings
from pyro_flat.compare.models import build_network
from pyro_flat.compare.task import likelihood, nll, num_outputs, task_of

if TYPE_CHECKING:
    from pyro_flat.models.bnn import BNN


class _NoBar:
    """A progress bar that shows nothing (tests, pipes)."""

    def update(self, n: int = 1) -> None:
        pass

    def close(self) -> None:
        pass


#: In a worker process of ``compare --jobs``: a shared counter of gradient evaluations (a
#: ``multiprocessing.Value``) that the parent shows as one progress bar.
SHARED_COUNTER: Any = None


class _CounterBar:
    """A progress bar that adds to :data:`SHARED_COUNTER`, at most every half second."""

    def __init__(self, counter: Any):
        self.counter, self.pending, self.last = counter, 0, time.monotonic()

    def update(self, n: int = 1) -> None:
        self.pending += n
        if time.monotonic() - self.last > 0.5:
            self.close()

    def close(self) -> None:
        if self.pending:
            with self.counter.get_lock():
                self.counter.value += self.pending
        self.pending, self.last = 0, time.monotonic()


@dataclass
class Context:
    """The data, settings, budget plan and seed a runner works with."""

    data: Any  # pyro_flat.datasets.Dataset, on the device
    settings: Settings
    plan: Plan
    seed: int
    model: str = "mlp"
    show_progress: bool | None = None  # None: when stderr is a terminal (tqdm's rule)
    #: ``--protocol finetune``: the trained network the methods work on (its last layer, or
    #: the network with low-rank adapters), copied by :meth:`network`; every chain and guide
    #: starts at its values
    trained: torch.nn.Module | None = None

    @property
    def num_train(self) -> int:
        return self.data.num_train

    @property
    def task(self) -> str:
        """``"classification"`` or ``"regression"`` (:func:`pyro_flat.compare.task.task_of`)."""
        return task_of(self.data)

    def network(self) -> torch.nn.Sequential:
        """A fresh plain network of the chosen architecture, on the data's device: one output
        per class, or the mean and the raw scale of a regression
        (:func:`pyro_flat.compare.task.num_outputs`)."""
        d = self.data
        if self.trained is not None:
            return copy.deepcopy(self.trained).to(d.x_train.device)
        net = build_network(self.model, d.input_shape, num_outputs(d), self.settings)
        return net.to(d.x_train.device)

    def loss(self, output: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """The plain network's mean loss on a batch: the mean of ``-log p(y | output)`` under
        :meth:`bnn`'s likelihood (:func:`pyro_flat.compare.task.nll`)."""
        return nll(self.task, output, y)

    def bayesian(self, net: torch.nn.Module | None = None) -> torch.nn.Module:
        """``net`` (default a fresh network) made Bayesian with the shared prior, in place."""
        from pyro_flat.models.nn import make_bayesian

        s = self.settings
        # fine-tuning: the chains and guides start at the trained last layer
        init = "fresh" if self.trained is None else "current"
        return make_bayesian(self.network() if net is None else net,
                             prior_scale=s.prior_scale, scale_rule=s.scale_rule, init=init)

    def bnn(self, net: torch.nn.Module | None = None) -> BNN:
        """The Pyro model of every method: ``BNN(net, likelihood, subsample_size=B)``, the
        likelihood ``Categorical()`` or, for regression,
        ``HeteroskedasticGaussian(min_scale=1e-3)`` (:func:`pyro_flat.compare.task.likelihood`).

        ``net`` (default a fresh network) is made Bayesian with the shared prior; inside the
        model its sites are named ``net.<parameter>`` (e.g. ``net.0.weight``).
        """
        from pyro_flat.models.bnn import BNN

        return BNN(self.bayesian(net), likelihood(self.task),
                   subsample_size=self.settings.batch_size)

    def bayesian_copy(self, net: torch.nn.Module) -> torch.nn.Module:
        """The Bayesian network of :meth:`bnn` for a copy of a plain ``net``: its sites are
        named as :func:`point_draws` names ``net``'s parameters."""
        return self.bnn(copy.deepcopy(net)).net

    def progress(self, total: int, label: str) -> Any:
        """A progress bar over ``total`` gradient evaluations (``update(n)``, ``close()``)."""
        if SHARED_COUNTER is not None:
            return _CounterBar(SHARED_COUNTER)
        if self.show_progress is False:
            return _NoBar()
        from tqdm.auto import tqdm

        return tqdm(total=total, desc=label, unit="grad", leave=False, file=sys.stderr,
                    disable=None if self.show_progress is None else not self.show_progress,
                    dynamic_ncols=True, mininterval=0.5)


@dataclass
class Fit:
    """A runner's result: draws for ``net``, gradient evaluations spent, optional ArviZ data."""

    net: torch.nn.Module  # the Bayesian network of Context.bnn the draws are for
    samples: dict[str, torch.Tensor]  # {site: (num_draws, *shape)}
    grad_evals: int
    idata: Any = None  # ArviZ InferenceData of the draws (MCMC methods)
    weights: torch.Tensor | None = None  # importance weights of the draws (sum 1), or equal
    notes: dict[str, Any] = field(default_factory=dict)  # method settings for results.json


@dataclass(frozen=True)
class Method:
    """One method of ``compare``, whole: its name, one line for ``--help``, its runner (the
    method's builder and post-processing composed, e.g. :func:`pyro_flat.compare.mcmc.kernel`),
    the grid ``--tune`` searches and the baselines its paired differences are taken against.

    ``search`` maps :class:`~pyro_flat.compare.config.Settings` fields to factors of their
    defaults (the candidates are the product, :data:`~pyro_flat.compare.tuning.CANDIDATES` of
    them). ``cost`` only orders the work when methods run in parallel (the costliest first).
    """

    name: str
    summary: str
    run: Callable[[str, Context], Fit]
    search: Mapping[str, tuple[float, ...]] = field(default_factory=dict)
    baselines: tuple[str, ...] = ()
    aliases: tuple[str, ...] = ()
    cost: float = 1.0  # rough time per gradient evaluation, relative to SGLD (scheduling)
    grads_per_step: int = 1  # gradient evaluations per SG step (2 for sharpness-aware steps)
    tasks: tuple[str, ...] = ("classification", "regression")  # the tasks it runs on


def stack_draws(draws: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """``[{site: tensor}, ...]`` as ``{site: tensor(num_draws, ...)}``."""
    return {k: torch.stack([d[k].detach() for d in draws]) for k in draws[0]}


#: Search grids (``Method.search``) several methods share: four step sizes, two step sizes
#: times two radii, four SVI learning rates.
LR4 = {"lr": (0.25, 0.5, 1.0, 2.0)}
LR_RHO = {"lr": (0.5, 1.0), "rho": (0.2, 1.0)}
SVI_LR4 = {"svi_lr": (0.3, 1.0, 3.0, 10.0)}


#: The prefix of the network's sites in :meth:`Context.bnn` (``BNN`` holds it as ``net``).
SITE_PREFIX = "net."


def as_site_names(draws: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Draws keyed by a plain network's parameter names, keyed by the sites of
    ``Context.bayesian_copy(net)`` instead (``0.weight`` becomes ``net.0.weight``)."""
    return {SITE_PREFIX + name: value for name, value in draws.items()}


def point_draws(net: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The parameters of a plain network as one draw, named as the sites of
    ``Context.bayesian_copy(net)``."""
    return as_site_names({name: p.detach().clone()[None] for name, p in net.named_parameters()})
