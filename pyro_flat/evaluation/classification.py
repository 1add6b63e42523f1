"""Predictive metrics of a classifier: accuracy, NLL, calibration, Brier score, OOD detection.

Every function takes torch tensors and returns a Python float (``predictive_entropy`` can also
return the per-example entropies, the usual OOD score). ``probs`` is a ``(num_data,
num_classes)`` tensor of predicted class probabilities, e.g. the Bayesian model average of
:func:`pyro_flat.evaluation.predictive.bma_probs`, and ``y`` the ``(num_data,)`` integer class
labels. Computations run in float64 on the CPU, so results do not depend on the input dtype or
device.

Examples
--------
>>> import torch
>>> from pyro_flat.evaluation import classification
>>> probs = torch.tensor([[0.9, 0.1], [0.3, 0.7], [0.6, 0.4]])
>>> y = torch.tensor([0, 1, 1])
>>> classification.accuracy(probs, y)  # doctest: +ELLIPSIS
0.666...
>>> # ((0.1^2 + 0.1^2) + (0.3^2 + 0.3^2) + (0.6^2 + 0.6^2)) / 3
>>> round(classification.brier(probs, y), 4)
0.3067
>>> classification.ood_auroc(torch.tensor([0.1, 0.2]), torch.tensor([0.3, 0.2]))
0.875
"""

from __future__ import annotations

import torch

from pyro_flat import validation

__all__ = [
    "NLL_EPSILON",
    "accuracy",
    "agreement",
    "brier",
    "checked_probs_and_labels",
    "ece",
    "mutual_information",
    "nll",
    "ood_aupr",
    "ood_auroc",
    "predictive_entropy",
    "total_variation",
]

#: Probabilities are clamped at this value before the log in :func:`nll` (and the entropy).
NLL_EPSILON: float = 1e-12

# Slack for rounding in probabilities computed in float32 (e.g. averages of softmax outputs).
_PROB_TOL = 1e-5
_SUM_TOL = 1e-3


def _as_probs(probs: torch.Tensor, name: str = "probs") -> torch.Tensor:
    """``probs`` as a float64 CPU tensor after checking it is a (num_data, num_classes) simplex."""
    if not torch.is_tensor(probs):
        raise ValueError(f"{name} must be a torch.Tensor, got {type(probs).__name__}")
    if probs.dim() != 2 or probs.shape[0] == 0 or probs.shape[1] < 2:
        raise ValueError(
            f"{name} must have shape (num_data, num_classes) with num_data >= 1 and "
            f"num_classes >= 2, got {tuple(probs.shape)}"
        )
    if not probs.is_floating_point():
        raise ValueError(f"{name} must be a floating-point tensor, got dtype {probs.dtype}")
    p = probs.detach().to("cpu", torch.float64)
    if not bool(torch.isfinite(p).all()):
        raise ValueError(f"{name} must be finite (probabilities in [0, 1])")
    if bool((p < -_PROB_TOL).any()) or bool((p > 1 + _PROB_TOL).any()):
        raise ValueError(
            f"{name} must hold probabilities in [0, 1], got values in "
            f"[{float(p.min()):.6g}, {float(p.max()):.6g}] (pass softmax(logits), not logits)"
        )
    sums = p.sum(-1)
    worst = float((sums - 1).abs().max())
    if worst > _SUM_TOL:
        raise ValueError(
            f"each row of {name} must sum to 1 (a distribution over classes); the worst row is "
            f"off by {worst:.3g}"
        )
    return p.clamp(0.0, 1.0)


def _as_labels(y: torch.Tensor, num_data: int, num_classes: int, name: str = "y") -> torch.Tensor:
    if not torch.is_tensor(y):
        raise ValueError(f"{name} must be a torch.Tensor, got {type(y).__name__}")
    if y.dim() != 1 or y.shape[0] != num_data:
        raise ValueError(
            f"{name} must have shape (num_data,) = ({num_data},) to match probs, "
            f"got {tuple(y.shape)}"
        )
    if y.is_floating_point() or y.is_complex() or y.dtype == torch.bool:
        raise ValueError(f"{name} must hold integer class indices, got dtype {y.dtype}")
    y = y.detach().to("cpu", torch.int64)
    if bool((y < 0).any()) or bool((y >= num_classes).any()):
        raise ValueError(
            f"{name} must hold class indices in [0, {num_classes - 1}], got values in "
            f"[{int(y.min())}, {int(y.max())}]"
        )
    return y


def checked_probs_and_labels(probs: torch.Tensor, y: torch.Tensor
                             ) -> tuple[torch.Tensor, torch.Tensor]:
    """``probs`` and ``y`` as every metric here takes them: float64 probabilities on the CPU
    (a ``(num_data, num_classes)`` simplex) and int64 labels in ``[0, num_classes)``, or a
    ``ValueError`` naming the argument and what it must be.

    Examples
    --------
    >>> p, y = checked_probs_and_labels(torch.tensor([[0.2, 0.8]]), torch.tensor([1]))
    >>> p.dtype, y.tolist()
    (torch.float64, [1])
    """
    p = _as_probs(probs)
    return p, _as_labels(y, p.shape[0], p.shape[1])


def accuracy(probs: torch.Tensor, y: torch.Tensor) -> float:
    """Share of examples whose most probable class (``argmax``, first on ties) is ``y``."""
    p, y = checked_probs_and_labels(probs, y)
    return float((p.argmax(-1) == y).double().mean())


def nll(probs: torch.Tensor, y: torch.Tensor) -> float:
    r"""Mean negative log-likelihood :math:`-\frac1n \sum_i \log \max(p_{i, y_i}, \epsilon)`.

    ``epsilon`` is :data:`NLL_EPSILON`, so a confidently wrong prediction costs at most
    ``-log(1e-12) ≈ 27.6`` instead of infinity.
    """
    p, y = checked_probs_and_labels(probs, y)
    p_true = p.gather(1, y.unsqueeze(1)).squeeze(1)
    return float(-p_true.clamp_min(NLL_EPSILON).log().mean())


def ece(probs: torch.Tensor, y: torch.Tensor, num_bins: int = 15, binning: str = "width") -> float:
    r"""Expected calibration error over ``num_bins`` confidence bins.

    The confidence of an example is its largest probability, and

    .. math:: \mathrm{ECE} = \sum_m \frac{|B_m|}{n}\,
        \big|\mathrm{acc}(B_m) - \mathrm{conf}(B_m)\big|

    (Naeini et al. 2015; Guo et al. 2017), empty bins contributing nothing.

    Parameters
    ----------
    probs, y : torch.Tensor
        ``(num_data, num_classes)`` probabilities and ``(num_data,)`` labels.
    num_bins : int
        ``M >= 1``.
    binning : {"width", "mass"}
        ``"width"``: bin ``m = 1..M`` holds the confidences in :math:`((m-1)/M, m/M]`
        (confidence 0 goes to the first bin). ``"mass"``: equal-mass (adaptive) bins, the
        variant the Entropy-MCMC authors report: the examples sorted by confidence (ties in
        input order) are cut into ``M`` consecutive groups whose sizes differ by at most one
        (the first ``n mod M`` groups one larger), as ``torch.tensor_split`` cuts them.

    Examples
    --------
    >>> p = torch.tensor([[0.9, 0.1], [0.8, 0.2], [0.6, 0.4], [0.55, 0.45]])
    >>> y = torch.tensor([0, 1, 0, 0])
    >>> round(ece(p, y, num_bins=2, binning="mass"), 6)  # (|2 - 1.15| + |1 - 1.7|) / 4
    0.3875
    """
    num_bins = validation.integer_at_least("num_bins", num_bins, 1)
    if binning not in ("width", "mass"):
        raise ValueError(f"binning must be 'width' or 'mass', got {binning!r}")
    p, y = checked_probs_and_labels(probs, y)
    conf, pred = p.max(-1)
    correct = (pred == y).double()
    n = conf.shape[0]
    if binning == "width":
        # bucketize(right=False) puts x in bin i with edges[i-1] < x <= edges[i]: (lo, hi] bins.
        inner_edges = torch.arange(1, num_bins, dtype=torch.float64) / num_bins
        bins = torch.bucketize(conf, inner_edges, right=False)
    else:
        order = torch.argsort(conf, stable=True)
        bins = torch.empty(n, dtype=torch.long)
        for m, members in enumerate(torch.tensor_split(order, num_bins)):
            bins[members] = m
    sum_conf = torch.zeros(num_bins, dtype=torch.float64).index_add_(0, bins, conf)
    sum_correct = torch.zeros(num_bins, dtype=torch.float64).index_add_(0, bins, correct)
    # sum_m |B_m|/n * |acc_m - conf_m| = sum_m |sum_correct_m - sum_conf_m| / n
    return float((sum_correct - sum_conf).abs().sum() / n)


def brier(probs: torch.Tensor, y: torch.Tensor) -> float:
    r"""Multi-class Brier score :math:`\frac1n \sum_i \sum_c (p_{ic} - [y_i = c])^2`, in [0, 2]."""
    p, y = checked_probs_and_labels(probs, y)
    onehot = torch.nn.functional.one_hot(y, p.shape[1]).double()
    return float(((p - onehot) ** 2).sum(-1).mean())


def predictive_entropy(probs: torch.Tensor, *, reduction: str = "mean") -> float | torch.Tensor:
    r"""Entropy :math:`H_i = -\sum_c p_{ic} \log p_{ic}` (nats) of each predictive distribution.

    Parameters
    ----------
    probs : torch.Tensor
        ``(num_data, num_classes)`` probabilities.
    reduction : {"mean", "none"}
        ``"mean"`` returns the mean entropy as a float; ``"none"`` returns the ``(num_data,)``
        float64 tensor of per-example entropies (an OOD score for :func:`ood_auroc`).
    """
    if reduction not in ("mean", "none"):
        raise ValueError(f"reduction must be 'mean' or 'none', got {reduction!r}")
    p = _as_probs(probs)
    # 0 log 0 = 0: the clamp only changes terms whose factor p is (numerically) zero.
    h = -(p * p.clamp_min(NLL_EPSILON).log()).sum(-1)
    return float(h.mean()) if reduction == "mean" else h


def mutual_information(
    draw_probs: torch.Tensor, *, reduction: str = "mean"
) -> float | torch.Tensor:
    r"""Mutual information between the label and the parameters: the epistemic uncertainty.

    With per-draw predictive probabilities :math:`p^{(s)}_{ic}` and their average
    :math:`\bar p_{ic}`, :math:`I_i = H[\bar p_i] - \frac1S \sum_s H[p^{(s)}_i]` (nats):
    the total predictive entropy minus its expected (aleatoric) part (Houlsby et al. 2011,
    "BALD"; Depeweg et al. 2018). It is 0 when all draws agree.

    Parameters
    ----------
    draw_probs : torch.Tensor
        ``(num_draws, num_data, num_classes)`` probabilities of each draw.
    reduction : {"mean", "none"}
        The mean over examples as a float, or the ``(num_data,)`` float64 tensor.

    Examples
    --------
    >>> agree = torch.tensor([[[0.5, 0.5]], [[0.5, 0.5]]])
    >>> disagree = torch.tensor([[[1.0, 0.0]], [[0.0, 1.0]]])
    >>> mutual_information(agree), round(mutual_information(disagree), 4)  # 0 and log 2
    (0.0, 0.6931)
    """
    if reduction not in ("mean", "none"):
        raise ValueError(f"reduction must be 'mean' or 'none', got {reduction!r}")
    if not torch.is_tensor(draw_probs) or draw_probs.dim() != 3:
        shape = tuple(draw_probs.shape) if torch.is_tensor(draw_probs) else type(draw_probs)
        raise ValueError("draw_probs must be a (num_draws, num_data, num_classes) tensor, got "
                         f"{shape}")
    s, n, c = draw_probs.shape
    p = _as_probs(draw_probs.reshape(s * n, c), "draw_probs").reshape(s, n, c)
    h_each = -(p * p.clamp_min(NLL_EPSILON).log()).sum(-1)
    mean = p.mean(0)
    h_mean = -(mean * mean.clamp_min(NLL_EPSILON).log()).sum(-1)
    mi = (h_mean - h_each.mean(0)).clamp_min(0.0)  # >= 0 by concavity, up to rounding
    return float(mi.mean()) if reduction == "mean" else mi


def _as_scores(scores: torch.Tensor, name: str) -> torch.Tensor:
    if not torch.is_tensor(scores):
        raise ValueError(f"{name} must be a torch.Tensor, got {type(scores).__name__}")
    if scores.dim() != 1 or scores.shape[0] == 0:
        raise ValueError(f"{name} must have shape (n,) with n >= 1, got {tuple(scores.shape)}")
    if scores.is_complex() or scores.dtype == torch.bool:
        raise ValueError(f"{name} must hold real scores, got dtype {scores.dtype}")
    s = scores.detach().to("cpu", torch.float64)
    if not bool(torch.isfinite(s).all()):
        raise ValueError(f"{name} must be finite")
    return s


def _labelled_scores(scores_in: torch.Tensor, scores_out: torch.Tensor) -> tuple:
    """Pooled scores and labels (OOD = 1, the positives) as NumPy arrays for scikit-learn."""
    s_in = _as_scores(scores_in, "scores_in")
    s_out = _as_scores(scores_out, "scores_out")
    labels = torch.cat([torch.zeros_like(s_in), torch.ones_like(s_out)])
    return labels.numpy(), torch.cat([s_in, s_out]).numpy()


def ood_auroc(scores_in: torch.Tensor, scores_out: torch.Tensor) -> float:
    r"""Area under the ROC curve for telling OOD from in-distribution by a score.

    Higher scores must mean "more out-of-distribution" (e.g. the predictive entropy). The area
    is the Mann-Whitney statistic :math:`P(s_\text{out} > s_\text{in}) + \frac12 P(s_\text{out}
    = s_\text{in})`, computed from the ranks of the pooled scores with ties given their average
    rank: ``1`` separates perfectly, ``0.5`` is chance. Computed by scikit-learn's
    ``roc_auc_score``.

    Parameters
    ----------
    scores_in : torch.Tensor
        ``(n_in,)`` scores of in-distribution examples (the negatives).
    scores_out : torch.Tensor
        ``(n_out,)`` scores of out-of-distribution examples (the positives).
    """
    from sklearn.metrics import roc_auc_score

    return float(roc_auc_score(*_labelled_scores(scores_in, scores_out)))


def ood_aupr(scores_in: torch.Tensor, scores_out: torch.Tensor) -> float:
    r"""Area under the precision-recall curve for finding OOD examples by a score.

    OOD examples are the positives and higher scores mean "more out-of-distribution". The
    area is the average precision :math:`\sum_k (R_k - R_{k-1}) P_k` over the distinct score
    thresholds in decreasing order (precision :math:`P_k` and recall :math:`R_k` of "score
    :math:`\ge` threshold k"), the step-wise sum without interpolation, computed by
    scikit-learn's ``average_precision_score``. Chance level is the share of
    positives, :math:`n_\text{out} / (n_\text{in} + n_\text{out})`.

    Parameters
    ----------
    scores_in : torch.Tensor
        ``(n_in,)`` scores of in-distribution examples (the negatives).
    scores_out : torch.Tensor
        ``(n_out,)`` scores of out-of-distribution examples (the positives).

    Examples
    --------
    >>> ood_aupr(torch.tensor([0.1, 0.4]), torch.tensor([0.35, 0.8]))  # P = 1, 2/3 at R = .5, 1
    0.8333333333333333
    """
    from sklearn.metrics import average_precision_score

    return float(average_precision_score(*_labelled_scores(scores_in, scores_out)))


def _probs_pair(probs: torch.Tensor, reference_probs: torch.Tensor
                ) -> tuple[torch.Tensor, torch.Tensor]:
    p = _as_probs(probs)
    q = _as_probs(reference_probs, "reference_probs")
    if p.shape != q.shape:
        raise ValueError(
            f"reference_probs must have the shape of probs, {tuple(p.shape)} (the same points "
            f"and classes, in the same order), got {tuple(q.shape)}"
        )
    return p, q


def agreement(probs: torch.Tensor, reference_probs: torch.Tensor) -> float:
    r"""Share of points whose most probable class is the reference's: top-1 agreement.

    .. math:: \mathrm{agreement} = \frac1n \sum_i
        \big[\arg\max_c p_{ic} = \arg\max_c q_{ic}\big]

    with ``argmax`` taking the first class on ties, as NumPy's and the NeurIPS 2021
    approximate-inference competition's scoring code (Wilson et al. 2022) do. ``q`` is the
    reference predictive, e.g. the HMC one of
    :func:`pyro_flat.evaluation.hmc_reference.hmc_reference` (Izmailov et al. 2021); 1 is perfect
    agreement. The score compares predictions, not labels: no test labels are needed.

    Parameters
    ----------
    probs : torch.Tensor
        ``(num_data, num_classes)`` probabilities of the method scored.
    reference_probs : torch.Tensor
        The reference probabilities of the same points, same shape.

    Examples
    --------
    >>> p = torch.tensor([[0.6, 0.4], [0.3, 0.7], [0.5, 0.5]])
    >>> q = torch.tensor([[0.9, 0.1], [0.6, 0.4], [0.2, 0.8]])
    >>> agreement(p, q)  # point 1 agrees; 2 does not; 3 ties, so class 0, which q does not pick
    0.3333333333333333

    References
    ----------
    Izmailov, P., Vikram, S., Hoffman, M. D. & Wilson, A. G. (2021). What are Bayesian neural
    network posteriors really like? ICML. Wilson, A. G., Izmailov, P., Hoffman, M. D., et al.
    (2022). Evaluating approximate inference in Bayesian deep learning. NeurIPS 2021
    Competitions and Demonstrations Track, PMLR 176.
    """
    p, q = _probs_pair(probs, reference_probs)
    return float((p.argmax(-1) == q.argmax(-1)).double().mean())


def total_variation(
    probs: torch.Tensor, reference_probs: torch.Tensor, *, reduction: str = "mean"
) -> float | torch.Tensor:
    r"""Total variation distance between predictive and reference class distributions.

    .. math:: \mathrm{TV} = \frac1n \sum_i \tfrac12 \sum_c |p_{ic} - q_{ic}|

    The per-point distance is the largest difference in probability the two distributions
    give one set of classes, in ``[0, 1]``; the mean over points is the NeurIPS 2021
    approximate-inference competition's score (Wilson et al. 2022; lower is better), with
    ``q`` the reference predictive, e.g. HMC's (Izmailov et al. 2021).

    Parameters
    ----------
    probs : torch.Tensor
        ``(num_data, num_classes)`` probabilities of the method scored.
    reference_probs : torch.Tensor
        The reference probabilities of the same points, same shape.
    reduction : {"mean", "none"}
        The mean over points as a float, or the ``(num_data,)`` float64 tensor.

    Examples
    --------
    >>> p = torch.tensor([[0.6, 0.4, 0.0], [0.2, 0.3, 0.5]])
    >>> q = torch.tensor([[0.6, 0.4, 0.0], [0.5, 0.3, 0.2]])
    >>> round(total_variation(p, q), 6)  # (0 + (0.3 + 0 + 0.3) / 2) / 2
    0.15
    """
    if reduction not in ("mean", "none"):
        raise ValueError(f"reduction must be 'mean' or 'none', got {reduction!r}")
    p, q = _probs_pair(probs, reference_probs)
    tv = 0.5 * (p - q).abs().sum(-1)
    return float(tv.mean()) if reduction == "mean" else tv
