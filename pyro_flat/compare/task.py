r"""What depends on the task in ``pyro-flat compare``: the network's head, the likelihood, the
plain network's loss, the architectures and the settings that fit the task.

* Classification: ``C`` outputs, logits of ``Categorical(logits=f(x))``; the plain network's
  loss is the cross-entropy.
* Regression: 2 outputs per input, the mean :math:`m(x)` and a raw scale :math:`r(x)`, with
  ``HeteroskedasticGaussian(min_scale=1e-3)``: :math:`y \sim \mathcal N(m(x), s(x)^2)`,
  :math:`s = \mathrm{softplus}(r) + 10^{-3}` (the network learns the mean and the noise, as
  deep ensembles do, Lakshminarayanan et al. 2017), so that no method needs a latent site
  besides the network's weights. The plain network's loss is the same Gaussian negative
  log-likelihood per point,
  :math:`\tfrac12\log 2\pi + \log s + \tfrac12 (y - m)^2 / s^2`.

The per-point loss of the plain network (:func:`nll`: SGD, SWAG, the ensembles; the sharpness
and the loss slices) is exactly :math:`-\log p(y \mid f(x))` of the Pyro likelihood
(:func:`likelihood`) the Bayesian methods sample or fit, so every method targets the same
posterior. A data object without a ``task`` attribute (a duck-typed stand-in in tests) is
classification.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F

if TYPE_CHECKING:
    from pyro_flat.compare.config import Settings
    from pyro_flat.models.likelihoods import Likelihood

#: The tasks of the built-in data sets.
TASKS = ("classification", "regression")
#: The built-in regression data sets (:mod:`pyro_flat.datasets`); the others classify.
REGRESSION_DATASETS = ("regression_gap", "diabetes", "heteroscedastic")
#: The floor of the predicted noise scale of the regression head.
MIN_SCALE = 1e-3
#: ``--model`` choices per task (the CNNs read signals and images, not tabular inputs).
MODELS_FOR_TASK = {"classification": ("mlp", "cnn"), "regression": ("mlp",)}
#: Settings that differ from :class:`~pyro_flat.compare.config.Settings`' defaults for a task
#: (those were chosen on classification); :func:`task_settings` applies them.
#:
#: Regression: ``lr = 0.002`` instead of 0.2. The curvature of the cross-entropy in the logits
#: is at most 1/2, that of the Gaussian NLL in the mean is ``1 / s(x)^2``: about 200 at the
#: smallest noise of ``heteroscedastic`` (0.07), and more wherever a draw shrinks its scale
#: towards ``MIN_SCALE``. At the quick budget, ``lr`` of 0.2 and 0.1 make the SG-MCMC chains
#: diverge on ``diabetes`` (non-finite potential); 0.05 to 0.01 still give chains that are kicked
#: out of the data's basin for a few draws (a draw's test RMSE in the tens, on targets of
#: standard deviation 1) on ``heteroscedastic``; at 0.002 every method runs on both data sets
#: and seeds 0-2 (SGHMC, whose momentum makes it the least stable, still shows one such excursion
#: on seed 2 of ``heteroscedastic``). On ``regression_gap`` (noise 0.1 everywhere) SGLD, SGHMC
#: and cyclical SGLD still have such excursions at 0.002 (cyclical SGLD even at 0.001, at the
#: start of its cycles, where its step is twice the mean): the draws of those cycles predict
#: with scales in the tens, which the RMSE and CRPS of the mixture show.
TASK_SETTINGS: dict[str, dict[str, Any]] = {"classification": {}, "regression": {"lr": 0.002}}


def dataset_task(name: str) -> str:
    """The task of the built-in data set ``name`` (without loading it)."""
    return "regression" if name in REGRESSION_DATASETS else "classification"


def task_of(data: Any) -> str:
    """The task of a loaded data set (``"classification"`` if it does not say)."""
    task = getattr(data, "task", "classification")
    if task not in TASKS:
        raise ValueError(f"task must be one of {', '.join(TASKS)}, got {task!r}")
    return task


def num_outputs(data: Any) -> int:
    """Outputs of the network per input: one per class, or the mean and the raw scale."""
    return 2 if task_of(data) == "regression" else int(data.num_classes)


def likelihood(task: str) -> Likelihood:
    """The Pyro likelihood of the task: ``Categorical()`` or
    ``HeteroskedasticGaussian(min_scale=MIN_SCALE)``."""
    from pyro_flat.models.likelihoods import Categorical, HeteroskedasticGaussian

    return HeteroskedasticGaussian(min_scale=MIN_SCALE) if task == "regression" else Categorical()


def gaussian_head(output: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The mean and the scale ``softplus(raw) + MIN_SCALE`` of regression outputs ``(B, 2)``."""
    return output[..., 0], F.softplus(output[..., 1]) + MIN_SCALE


def nll(task: str, output: torch.Tensor, y: torch.Tensor, reduction: str = "mean"
        ) -> torch.Tensor:
    """The negative log-likelihood of ``y`` given the network's ``output``, per point
    (``reduction="none"``) or its mean: the cross-entropy of logits, or the Gaussian NLL of the
    regression head, equal to ``-likelihood(task).distribution(output, {}).log_prob(y)``.

    Examples
    --------
    >>> out, y = torch.tensor([[0.0, 0.0]]), torch.tensor([0.0])
    >>> round(float(nll("regression", out, y)), 4)  # -log N(0; 0, (log 2 + 0.001)^2)
    0.5539
    """
    if task == "classification":
        return F.cross_entropy(output, y, reduction=reduction)
    mean, scale = gaussian_head(output)
    per_point = 0.5 * math.log(2 * math.pi) + scale.log() + 0.5 * ((y - mean) / scale).square()
    return per_point.mean() if reduction == "mean" else per_point


def loss_fn(task: str) -> Any:
    """``nll`` of ``task`` as a function ``(output, y) -> mean loss`` (e.g. the ``loss`` of
    :func:`pyro_flat.evaluation.flatness.sharpness`)."""
    def loss(output: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return nll(task, output, y)

    return loss


def task_settings(task: str, **overrides: Any) -> Settings:
    """The settings of ``compare`` for ``task``: :class:`~pyro_flat.compare.config.Settings`'
    defaults, then the task's own (:data:`TASK_SETTINGS`), then ``overrides``."""
    from pyro_flat.compare.config import Settings

    return Settings(**{**TASK_SETTINGS[task], **overrides})
