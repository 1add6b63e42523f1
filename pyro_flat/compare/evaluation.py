"""The numbers and curves of ``pyro-flat compare``, the same for every method.

From a :class:`~pyro_flat.compare.common.Fit` (draws of one Bayesian network): the Bayesian
model average over the draws on the test and OOD inputs, weighted by the fit's importance
weights, if any, and its scores; the mean sharpness of the draws
(:func:`pyro_flat.evaluation.flatness.sharpness` of the task's negative log-likelihood,
:func:`pyro_flat.compare.task.nll`), and a loss slice through the last draw along a
filter-normalised random direction (:func:`pyro_flat.evaluation.flatness.loss_along_direction`);
and the kernel Stein discrepancy of the (weighted) draws to the Bayesian posterior of the
network (:func:`pyro_flat.evaluation.stein.stein_discrepancy`, for networks of at most
:data:`~pyro_flat.compare.config.KSD_MAX_PARAMETERS` parameters).

* Classification (:data:`METRICS`): the averaged class probabilities
  (:func:`pyro_flat.evaluation.predictive.bma_probs`), their accuracy, NLL, ECE, Brier score and OOD
  AUROC (predictive entropy).
* Regression (:data:`REGRESSION_METRICS`): the Gaussian mixture over the draws
  (:class:`pyro_flat.compare.mixture.GaussianMixture`), its RMSE (of the mixture mean), NLL
  (exact mixture density), CRPS (closed form), calibration error (central-interval coverage
  from the PIT) and OOD AUROC (predictive standard deviation), all in the standardised units
  of the targets; for 1-D inputs also the mixture over a grid spanning the OOD inputs (the
  figure ``predictive.png``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch

from pyro_flat.compare.common import Fit
from pyro_flat.compare.config import KSD_BATCH, KSD_MAX_PARAMETERS, RHO, SHARPNESS_POINTS
from pyro_flat.compare.mixture import GaussianMixture, calibration_error
from pyro_flat.compare.task import gaussian_head, likelihood, loss_fn, task_of

#: Metric columns of the table for classification, in order.
METRICS = ("accuracy", "nll", "ece", "brier", "ood_auroc", "sharpness", "ksd")
#: Metric columns of the table for regression, in order.
REGRESSION_METRICS = ("rmse", "nll", "crps", "calibration_error", "ood_auroc", "sharpness",
                      "ksd")
#: Metrics for which a larger value is better (the others: smaller is better).
HIGHER_IS_BETTER = frozenset({"accuracy", "ood_auroc", "agreement"})
#: Column headers of the printed tables.
HEADERS = {"accuracy": "accuracy", "nll": "NLL", "ece": "ECE", "brier": "Brier",
           "ood_auroc": "OOD AUROC", "sharpness": "sharpness", "rmse": "RMSE", "crps": "CRPS",
           "calibration_error": "calib. error", "agreement": "agreement (HMC)",
           "tv": "TV (HMC)", "w2": "W2 (HMC)", "ksd": "KSD"}
#: The kernel Stein discrepancy column, in both tasks' descriptions.
KSD_DESCRIPTION = (
    f"KSD (kernel Stein discrepancy of the weighted draws to the network's Bayesian posterior "
    f"at temperature 1: IMQ kernel (1 + |x - y|^2)^(-1/2) on the raw parameters, U-statistic "
    f"(its signed square root: near 0, of either sign, for a sampler of the posterior) "
    f"with one independent minibatch of {KSD_BATCH} training points per draw for its score; "
    f"nan for networks of more than {KSD_MAX_PARAMETERS} parameters; lower is closer)")
#: What the metrics of each task are (``results.json``'s ``metrics``).
DESCRIPTIONS = {
    "classification": (
        "test-set accuracy, NLL (mean -log p(y|x), p clamped at 1e-12), ECE (15 equal-width "
        "bins), Brier (sum over classes), OOD AUROC (predictive entropy, test vs OOD), "
        "sharpness (mean over draws of L(theta + 0.05 g/|g|) - L(theta), mean training "
        "loss on the first 1000 training points); " + KSD_DESCRIPTION
    ),
    "regression": (
        "test set, in standardised target units (original units: y_mean + y_std * y): the "
        "predictive is the (importance-)weighted mixture over draws of N(m_s(x), s_s(x)^2), "
        "s = softplus(raw) + 1e-3; RMSE of the mixture mean; NLL (mean -log mixture density, "
        "nats, exact); CRPS (closed form for Gaussian mixtures); calibration error (mean over "
        "p in 0.1, ..., 0.9 of |share of test points inside their central p interval - p|, "
        "from the PIT of the exact mixture CDF); OOD AUROC (mixture predictive standard "
        "deviation, test vs OOD); sharpness (mean over draws of L(theta + 0.05 g/|g|) - "
        "L(theta), L the mean Gaussian NLL on the first 1000 training points); " + KSD_DESCRIPTION
    ),
}
#: The grid of the loss slices.
SLICE_ALPHAS = tuple(i / 10 for i in range(-10, 11))
#: Inputs of the predictive curve of a 1-D regression (``predictive.png``).
CURVE_POINTS = 300


def task_metrics(task: str) -> tuple[tuple[str, ...], frozenset[str]]:
    """The metric columns of ``task`` and those of them for which higher is better.

    Examples
    --------
    >>> task_metrics("regression")[0]
    ('rmse', 'nll', 'crps', 'calibration_error', 'ood_auroc', 'sharpness', 'ksd')
    >>> sorted(task_metrics("classification")[1])
    ['accuracy', 'ood_auroc']
    """
    if task not in DESCRIPTIONS:
        raise ValueError(f"task must be 'classification' or 'regression', got {task!r}")
    metrics = REGRESSION_METRICS if task == "regression" else METRICS
    return metrics, frozenset(m for m in metrics if m in HIGHER_IS_BETTER)


@dataclass
class Evaluation:
    """The table's metrics of one method and what its figures need: the class probabilities
    (classification) or the Gaussian mixtures (regression; ``curve`` for 1-D inputs: the grid
    of inputs and the mixture there)."""

    metrics: dict[str, float]
    probs_test: torch.Tensor | None
    probs_ood: torch.Tensor | None
    loss_slice: tuple[torch.Tensor, torch.Tensor]
    test: GaussianMixture | None = None
    ood: GaussianMixture | None = None
    curve: tuple[torch.Tensor, GaussianMixture] | None = None


def scores(probs_test: torch.Tensor, probs_ood: torch.Tensor, y: torch.Tensor) -> dict:
    """Accuracy, NLL, ECE, Brier score and OOD AUROC (by predictive entropy)."""
    from pyro_flat.evaluation import classification

    return {
        "accuracy": classification.accuracy(probs_test, y),
        "nll": classification.nll(probs_test, y),
        "ece": classification.ece(probs_test, y),
        "brier": classification.brier(probs_test, y),
        "ood_auroc": classification.ood_auroc(
            classification.predictive_entropy(probs_test, reduction="none"),
            classification.predictive_entropy(probs_ood, reduction="none"),
        ),
    }


def regression_scores(test: GaussianMixture, ood: GaussianMixture, y: torch.Tensor) -> dict:
    """RMSE of the mean, NLL, CRPS and calibration error of the mixture ``test`` on ``y``, and
    the OOD AUROC of its predictive standard deviation against ``ood``'s."""
    from pyro_flat.evaluation import classification, regression

    return {
        "rmse": regression.rmse(test.mean(), y),
        "nll": float(-test.log_prob(y).mean()),
        "crps": float(test.crps(y).mean()),
        "calibration_error": calibration_error(test.cdf(y)),
        "ood_auroc": classification.ood_auroc(test.sd(), ood.sd()),
    }


def mixture(net: torch.nn.Module, samples: dict[str, torch.Tensor], x: torch.Tensor,
            weights: torch.Tensor | None) -> GaussianMixture:
    """The predictive mixture of the regression network ``net`` over the draws at ``x``."""
    from pyro_flat.evaluation.predictive import draw_outputs

    loc, scale = gaussian_head(draw_outputs(net, samples, x).cpu().double())
    return GaussianMixture.equal(loc, scale, None if weights is None else weights.cpu())


def _curve_inputs(data: Any) -> torch.Tensor:
    """A grid over the range of the training, test and OOD inputs of a 1-D data set."""
    xs = torch.cat([data.x_train, data.x_test, data.x_ood]).reshape(-1)
    return torch.linspace(float(xs.min()), float(xs.max()), CURVE_POINTS,
                          device=data.x_train.device).unsqueeze(1)


def stein_of(fit: Fit, data: Any) -> float:
    """The kernel Stein discrepancy of ``fit``'s (weighted) draws to the Bayesian posterior of
    its network on the training data (``nan`` for a network of more than
    :data:`~pyro_flat.compare.config.KSD_MAX_PARAMETERS` parameters, or for fewer than two
    draws of non-zero weight)."""
    import pyro

    from pyro_flat.evaluation.stein import stein_discrepancy

    first = {k: v[0] for k, v in fit.samples.items()}
    num_draws = len(next(iter(fit.samples.values())))
    weighted = num_draws if fit.weights is None else int((fit.weights > 0).sum())
    if sum(v.numel() for v in first.values()) > KSD_MAX_PARAMETERS or weighted < 2:
        return math.nan
    net, lik = fit.net, likelihood(task_of(data))

    def model(x: torch.Tensor, y: torch.Tensor) -> None:
        """The run's model (Context.bnn) on the data it is given: the network outside the
        plate (its priors global), the likelihood (no latent sites of its own) inside."""
        out = net(x)
        with pyro.plate("data", len(x)):
            pyro.sample("obs", lik.distribution(out, {}), obs=y)

    log_weights = None if fit.weights is None else fit.weights.double().log()
    return stein_discrepancy(model, fit.samples, data.x_train, data.y_train,
                             subsample_size=min(KSD_BATCH, len(data.x_train)),
                             log_weights=log_weights, estimator="u")


def evaluate(fit: Fit, data: Any, seed: int, full: bool = True) -> Evaluation:
    """Score ``fit`` on ``data``; the slice direction is drawn with ``seed``. Without ``full``
    (a ``--tune`` candidate, judged by its NLL alone) the sharpness is ``nan`` and the loss
    slice and the 1-D predictive curve are left out."""
    from pyro_flat.evaluation.flatness import loss_along_direction, mean_loss, sharpness
    from pyro_flat.evaluation.predictive import bma_probs

    task = task_of(data)
    loss = loss_fn(task)
    net = fit.net
    net.eval()
    x, y = data.x_train[:SHARPNESS_POINTS], data.y_train[:SHARPNESS_POINTS]
    sharp = (sharpness(net, fit.samples, x, y, rho=RHO, task=task, loss=loss).cpu() if full
             else torch.full((len(next(iter(fit.samples.values()))),), math.nan))
    if fit.weights is None:
        mean_sharpness = float(sharp.mean())
    else:
        mean_sharpness = float((fit.weights.cpu().double() * sharp.double()).sum())
    curve = None
    if task == "regression":
        probs_test = probs_ood = None
        test, ood = (mixture(net, fit.samples, x_, fit.weights) for x_ in (data.x_test,
                                                                           data.x_ood))
        row = regression_scores(test, ood, data.y_test.cpu())
        if full and tuple(data.x_train.shape[1:]) == (1,):
            grid = _curve_inputs(data)
            curve = (grid.cpu().reshape(-1), mixture(net, fit.samples, grid, fit.weights))
    else:
        test = ood = None
        if fit.weights is None:
            probs_test = bma_probs(net, fit.samples, data.x_test).cpu()
            probs_ood = bma_probs(net, fit.samples, data.x_ood).cpu()
        else:  # importance-weighted model average (ContourSGLD)
            w = fit.weights.cpu().double()
            probs_test, probs_ood = (
                torch.einsum("s,snc->nc", w, bma_probs(net, fit.samples, x_,
                                                       return_per_draw=True)[1].cpu().double()
                             ).float()
                for x_ in (data.x_test, data.x_ood))
        row = scores(probs_test, probs_ood, data.y_test.cpu())
    row["sharpness"] = mean_sharpness
    row["ksd"] = stein_of(fit, data) if full else math.nan
    if not full:
        return Evaluation(row, probs_test, probs_ood, (torch.zeros(0), torch.zeros(0)), test,
                          ood, curve)
    last = {k: v[-1] for k, v in fit.samples.items()}
    generator = torch.Generator().manual_seed(seed)
    alphas, losses = loss_along_direction(mean_loss(net, x, y, task, loss=loss), last,
                                          alphas=SLICE_ALPHAS, generator=generator)
    return Evaluation(row, probs_test, probs_ood, (alphas, losses), test, ood, curve)
