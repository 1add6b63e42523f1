"""The numbers and curves of ``pyro-flat compare``, the same for every method.

From a :class:`~pyro_flat.compare.common.Fit` (draws of one Bayesian network): the Bayesian
model average over the draws on the test and OOD inputs (:func:`pyro_flat.predictive.bma_probs`,
weighted by the fit's importance weights, if any), its accuracy, NLL, ECE, Brier score and OOD
AUROC (predictive entropy), the mean sharpness of the draws
(:func:`pyro_flat.flatness.sharpness`), and a loss slice through the last draw along a
filter-normalised random direction (:func:`pyro_flat.flatness.loss_along_direction`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from pyro_flat.compare.common import Fit
from pyro_flat.compare.config import RHO, SHARPNESS_POINTS

#: Metric columns of the table, in order.
METRICS = ("accuracy", "nll", "ece", "brier", "ood_auroc", "sharpness")
#: The grid of the loss slices.
SLICE_ALPHAS = tuple(i / 10 for i in range(-10, 11))


@dataclass
class Evaluation:
    """The table's metrics of one method and what its figures need."""

    metrics: dict[str, float]
    probs_test: torch.Tensor
    probs_ood: torch.Tensor
    loss_slice: tuple[torch.Tensor, torch.Tensor]


def scores(probs_test: torch.Tensor, probs_ood: torch.Tensor, y: torch.Tensor) -> dict:
    """Accuracy, NLL, ECE, Brier score and OOD AUROC (by predictive entropy)."""
    from pyro_flat import metrics

    return {
        "accuracy": metrics.accuracy(probs_test, y),
        "nll": metrics.nll(probs_test, y),
        "ece": metrics.ece(probs_test, y),
        "brier": metrics.brier(probs_test, y),
        "ood_auroc": metrics.ood_auroc(
            metrics.predictive_entropy(probs_test, reduction="none"),
            metrics.predictive_entropy(probs_ood, reduction="none"),
        ),
    }


def evaluate(fit: Fit, data: Any, seed: int) -> Evaluation:
    """Score ``fit`` on ``data``; the slice direction is drawn with ``seed``."""
    from pyro_flat.flatness import loss_along_direction, mean_loss, sharpness
    from pyro_flat.predictive import bma_probs

    net = fit.net
    net.eval()
    x, y = data.x_train[:SHARPNESS_POINTS], data.y_train[:SHARPNESS_POINTS]
    sharp = sharpness(net, fit.samples, x, y, rho=RHO).cpu()
    if fit.weights is None:
        probs_test = bma_probs(net, fit.samples, data.x_test).cpu()
        probs_ood = bma_probs(net, fit.samples, data.x_ood).cpu()
        mean_sharpness = float(sharp.mean())
    else:  # importance-weighted model average (ContourSGLD)
        w = fit.weights.cpu().double()
        probs_test, probs_ood = (
            torch.einsum("s,snc->nc", w, bma_probs(net, fit.samples, x_, return_per_draw=True
                                                   )[1].cpu().double()).float()
            for x_ in (data.x_test, data.x_ood))
        mean_sharpness = float((w * sharp.double()).sum())
    row = scores(probs_test, probs_ood, data.y_test.cpu())
    row["sharpness"] = mean_sharpness
    last = {k: v[-1] for k, v in fit.samples.items()}
    generator = torch.Generator().manual_seed(seed)
    alphas, losses = loss_along_direction(mean_loss(net, x, y), last, alphas=SLICE_ALPHAS,
                                          generator=generator)
    return Evaluation(row, probs_test, probs_ood, (alphas, losses))
