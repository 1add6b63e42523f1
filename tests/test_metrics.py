import math

import numpy as np
import pytest
import scipy.stats
import sklearn
import torch
from sklearn.metrics import accuracy_score, brier_score_loss, log_loss, roc_auc_score

from pyro_flat.evaluation import classification

SKLEARN_MULTICLASS_BRIER = tuple(int(v) for v in sklearn.__version__.split(".")[:2]) >= (1, 7)


def random_probs(n=200, c=5, seed=0, dtype=torch.float64, sharpness=2.0):
    g = torch.Generator().manual_seed(seed)
    probs = torch.softmax(sharpness * torch.randn(n, c, generator=g, dtype=dtype), -1)
    y = torch.randint(c, (n,), generator=g)
    return probs, y


def ece_reference(probs, y, num_bins):
    """ECE by an explicit loop over bins ((lo, hi], confidence 0 in the first bin)."""
    p, y = probs.double().numpy(), y.numpy()
    conf, pred = p.max(1), p.argmax(1)
    total = 0.0
    for m in range(num_bins):
        lo, hi = m / num_bins, (m + 1) / num_bins
        in_bin = (conf > lo) & (conf <= hi)
        if m == 0:
            in_bin |= conf == 0
        if in_bin.any():
            total += in_bin.mean() * abs((pred[in_bin] == y[in_bin]).mean() - conf[in_bin].mean())
    return total


# ------------------------------------------------------------------ against scikit-learn / scipy


@pytest.mark.parametrize("seed", [0, 1])
def test_accuracy_matches_sklearn(seed):
    probs, y = random_probs(seed=seed)
    assert classification.accuracy(probs, y) == pytest.approx(
        accuracy_score(y.numpy(), probs.argmax(-1).numpy()), abs=1e-12
    )


@pytest.mark.parametrize("seed", [0, 1])
def test_nll_matches_sklearn_log_loss(seed):
    probs, y = random_probs(seed=seed)
    expected = log_loss(y.numpy(), probs.numpy(), labels=list(range(probs.shape[1])))
    assert classification.nll(probs, y) == pytest.approx(expected, abs=1e-6)


def test_nll_clamps_zero_probability():
    probs = torch.tensor([[1.0, 0.0], [0.5, 0.5]])
    y = torch.tensor([1, 0])
    expected = (-math.log(classification.NLL_EPSILON) + math.log(2.0)) / 2
    assert classification.nll(probs, y) == pytest.approx(expected, abs=1e-6)


@pytest.mark.skipif(not SKLEARN_MULTICLASS_BRIER, reason="multiclass Brier needs sklearn>=1.7")
def test_brier_matches_sklearn_multiclass():
    probs, y = random_probs(seed=3)
    expected = brier_score_loss(
        y.numpy(), probs.numpy(), labels=list(range(probs.shape[1])), scale_by_half=False
    )
    assert classification.brier(probs, y) == pytest.approx(expected, abs=1e-6)


def test_brier_binary_is_twice_sklearn():
    probs, y = random_probs(c=2, seed=4)
    # sklearn's binary Brier is the mean of (p_1 - y)^2, half the sum over both classes
    expected = 2 * brier_score_loss(y.numpy(), probs[:, 1].numpy())
    assert classification.brier(probs, y) == pytest.approx(expected, abs=1e-6)


def test_brier_by_hand():
    probs = torch.tensor([[0.9, 0.1], [0.3, 0.7], [0.6, 0.4]])
    y = torch.tensor([0, 1, 1])
    assert classification.brier(probs, y) == pytest.approx((0.02 + 0.18 + 0.72) / 3, abs=1e-6)


def test_predictive_entropy_matches_scipy():
    probs, _ = random_probs(seed=5)
    expected = scipy.stats.entropy(probs.numpy(), axis=1)
    per_example = classification.predictive_entropy(probs, reduction="none")
    assert isinstance(per_example, torch.Tensor) and per_example.shape == (probs.shape[0],)
    np.testing.assert_allclose(per_example.numpy(), expected, atol=1e-6)
    assert classification.predictive_entropy(probs) == pytest.approx(expected.mean(), abs=1e-6)


def test_predictive_entropy_extremes():
    probs = torch.tensor([[1.0, 0.0, 0.0], [1 / 3, 1 / 3, 1 / 3]])
    h = classification.predictive_entropy(probs, reduction="none")
    assert h[0].item() == pytest.approx(0.0, abs=1e-9)
    assert h[1].item() == pytest.approx(math.log(3), abs=1e-6)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_ood_auroc_matches_sklearn_with_ties(seed):
    g = torch.Generator().manual_seed(seed)
    # integer scores: many ties within and across the two groups
    s_in = torch.randint(0, 6, (150,), generator=g).double()
    s_out = torch.randint(2, 8, (90,), generator=g).double()
    labels = np.r_[np.zeros(150), np.ones(90)]
    expected = roc_auc_score(labels, np.r_[s_in.numpy(), s_out.numpy()])
    assert classification.ood_auroc(s_in, s_out) == pytest.approx(expected, abs=1e-6)


def test_ood_auroc_continuous_matches_sklearn():
    g = torch.Generator().manual_seed(7)
    s_in, s_out = torch.randn(300, generator=g), torch.randn(200, generator=g) + 0.7
    labels = np.r_[np.zeros(300), np.ones(200)]
    expected = roc_auc_score(labels, np.r_[s_in.numpy(), s_out.numpy()])
    assert classification.ood_auroc(s_in, s_out) == pytest.approx(expected, abs=1e-6)


def test_ood_auroc_extremes():
    low, high = torch.tensor([0.0, 0.1, 0.2]), torch.tensor([0.5, 0.9])
    assert classification.ood_auroc(low, high) == 1.0
    assert classification.ood_auroc(high, low) == 0.0
    assert classification.ood_auroc(torch.ones(4), torch.ones(3)) == 0.5
    # 0.2 vs 0.2 is a tie worth one half: (1 + 1 + 1 + 0.5) / 4
    assert classification.ood_auroc(torch.tensor([0.1, 0.2]), torch.tensor([0.3, 0.2])) == 0.875


# ------------------------------------------------------------------ ECE


def test_ece_by_hand():
    # confidences 0.9, 0.8 (bin (13/15, 14/15] and (11/15, 12/15]) and 0.6 twice.
    probs = torch.tensor([[0.9, 0.1], [0.2, 0.8], [0.6, 0.4], [0.4, 0.6]])
    y = torch.tensor([0, 0, 0, 0])  # correct, wrong, correct, wrong
    # 15 bins: {0.9}: |1 - 0.9|, {0.8}: |0 - 0.8|, {0.6, 0.6}: |0.5 - 0.6|
    expected = (1 * 0.1 + 1 * 0.8 + 2 * 0.1) / 4
    assert classification.ece(probs, y) == pytest.approx(expected, abs=1e-6)
    # one bin: |accuracy - mean confidence|
    assert classification.ece(probs, y, num_bins=1) == pytest.approx(abs(0.5 - 0.725), abs=1e-6)
    # two bins (0, 0.5], (0.5, 1]: every confidence is in the second
    assert classification.ece(probs, y, num_bins=2) == pytest.approx(abs(0.5 - 0.725), abs=1e-6)


def test_ece_bin_edges_are_right_closed():
    # confidence exactly 0.5 belongs to (0, 0.5], not (0.5, 1]
    probs = torch.tensor([[0.5, 0.5], [0.75, 0.25]], dtype=torch.float64)
    y = torch.tensor([1, 0])  # argmax of the tie is class 0: wrong; second correct
    # bins: (0, .5]: {0.5, wrong} -> |0 - 0.5|; (.5, 1]: {0.75, right} -> |1 - 0.75|
    assert classification.ece(probs, y, num_bins=2) == pytest.approx((0.5 + 0.25) / 2, abs=1e-12)


def test_ece_perfectly_calibrated_and_confident():
    probs = torch.eye(4)
    assert classification.ece(probs, torch.arange(4)) == pytest.approx(0.0, abs=1e-12)
    assert classification.ece(probs, torch.tensor([1, 2, 3, 0])) == pytest.approx(1.0, abs=1e-12)


@pytest.mark.parametrize("num_bins", [1, 3, 10, 15, 50])
def test_ece_matches_loop_reference(num_bins):
    probs, y = random_probs(n=500, c=4, seed=num_bins)
    assert classification.ece(probs, y, num_bins=num_bins) == pytest.approx(
        ece_reference(probs, y, num_bins), abs=1e-6
    )


# ------------------------------------------------------------------ types and validation


def test_float32_inputs_and_python_floats():
    probs64, y = random_probs(seed=8)
    probs32 = probs64.float()
    for fn in (classification.accuracy, classification.nll, classification.ece,
               classification.brier):
        out = fn(probs32, y)
        assert type(out) is float
        assert out == pytest.approx(fn(probs64, y), abs=1e-5)
    assert type(classification.predictive_entropy(probs32)) is float
    assert type(classification.ood_auroc(torch.randn(5), torch.randn(4))) is float


def test_tiny_rounding_above_one_is_accepted():
    probs = torch.tensor([[1.0 + 1e-7, 0.0], [0.5, 0.5]])
    assert classification.accuracy(probs, torch.tensor([0, 0])) == 1.0


@pytest.mark.parametrize(
    "probs, y, match",
    [
        (torch.rand(4), torch.zeros(4, dtype=torch.long), "probs must have shape"),
        (torch.ones(4, 1), torch.zeros(4, dtype=torch.long), "probs must have shape"),
        (torch.empty(0, 3), torch.zeros(0, dtype=torch.long), "probs must have shape"),
        (torch.tensor([[2.0, -1.0]]), torch.tensor([0]), r"probs must hold probabilities in"),
        (torch.tensor([[0.7, 0.7]]), torch.tensor([0]), "each row of probs must sum to 1"),
        (torch.tensor([[float("nan"), 1.0]]), torch.tensor([0]), "probs must be finite"),
        (torch.tensor([[1, 0]]), torch.tensor([0]), "probs must be a floating-point"),
        ([[0.5, 0.5]], torch.tensor([0]), "probs must be a torch.Tensor"),
        (torch.tensor([[0.5, 0.5]]), torch.tensor([2]), r"y must hold class indices in \[0, 1\]"),
        (torch.tensor([[0.5, 0.5]]), torch.tensor([-1]), "y must hold class indices"),
        (torch.tensor([[0.5, 0.5]]), torch.tensor([0.0]), "y must hold integer class indices"),
        (torch.tensor([[0.5, 0.5]]), torch.tensor([0, 1]), r"y must have shape \(num_data,\)"),
        (torch.tensor([[0.5, 0.5]]), torch.tensor([[0]]), r"y must have shape \(num_data,\)"),
    ],
)
def test_invalid_probs_and_labels(probs, y, match):
    for fn in (classification.accuracy, classification.nll, classification.ece,
               classification.brier):
        with pytest.raises(ValueError, match=match):
            fn(probs, y)


@pytest.mark.parametrize("num_bins", [0, -3, 1.5, True, "15"])
def test_invalid_num_bins(num_bins):
    probs, y = random_probs(n=10)
    with pytest.raises(ValueError, match="num_bins"):
        classification.ece(probs, y, num_bins=num_bins)


def test_invalid_entropy_arguments():
    with pytest.raises(ValueError, match="reduction"):
        classification.predictive_entropy(torch.eye(2), reduction="sum")
    with pytest.raises(ValueError, match="probs"):
        classification.predictive_entropy(torch.tensor([[0.2, 0.2]]))


@pytest.mark.parametrize(
    "s_in, s_out, match",
    [
        (torch.empty(0), torch.ones(3), "scores_in"),
        (torch.ones(3), torch.empty(0), "scores_out"),
        (torch.ones(3, 1), torch.ones(3), "scores_in must have shape"),
        (torch.ones(3), torch.tensor([1.0, float("inf")]), "scores_out must be finite"),
        (torch.ones(3), torch.tensor([True, False]), "scores_out must hold real scores"),
        ([0.1, 0.2], torch.ones(3), "scores_in must be a torch.Tensor"),
    ],
)
def test_invalid_ood_scores(s_in, s_out, match):
    with pytest.raises(ValueError, match=match):
        classification.ood_auroc(s_in, s_out)


# ------------------------------------------------------- AUPR, equal-mass ECE, mutual information


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_ood_aupr_matches_sklearn_with_ties(seed):
    from sklearn.metrics import average_precision_score

    g = torch.Generator().manual_seed(seed)
    s_in = torch.randint(0, 6, (150,), generator=g).double()
    s_out = torch.randint(2, 8, (90,), generator=g).double()
    labels = np.r_[np.zeros(150), np.ones(90)]
    expected = average_precision_score(labels, np.r_[s_in.numpy(), s_out.numpy()])
    assert classification.ood_aupr(s_in, s_out) == pytest.approx(expected, abs=1e-6)
    g = torch.Generator().manual_seed(10 + seed)
    s_in, s_out = torch.randn(300, generator=g), torch.randn(200, generator=g) + 0.7
    labels = np.r_[np.zeros(300), np.ones(200)]
    expected = average_precision_score(labels, np.r_[s_in.numpy(), s_out.numpy()])
    assert classification.ood_aupr(s_in, s_out) == pytest.approx(expected, abs=1e-6)


def test_ood_aupr_extremes():
    assert classification.ood_aupr(torch.tensor([0.0, 1.0]), torch.tensor([2.0, 3.0])) == 1.0
    # all scores tied: one threshold, precision = share of positives
    assert classification.ood_aupr(torch.zeros(3), torch.zeros(1)) == pytest.approx(0.25)
    with pytest.raises(ValueError, match="scores_out"):
        classification.ood_aupr(torch.zeros(3), torch.tensor([float("nan")]))


def ece_mass_reference(probs, y, num_bins):
    """Equal-mass ECE by a loop: sorted confidences cut into near-equal consecutive groups."""
    p, y = probs.double().numpy(), y.numpy()
    conf, pred = p.max(1), p.argmax(1)
    order = np.argsort(conf, kind="stable")
    total = 0.0
    for members in np.array_split(order, num_bins):
        if len(members):
            acc = (pred[members] == y[members]).mean()
            total += len(members) / len(conf) * abs(acc - conf[members].mean())
    return total


@pytest.mark.parametrize("num_bins", [1, 7, 15, 199, 250])
def test_ece_equal_mass_matches_loop_reference(num_bins):
    probs, y = random_probs(n=199, seed=num_bins)
    expected = ece_mass_reference(probs, y, num_bins)
    ece = classification.ece(probs, y, num_bins, binning="mass")
    assert ece == pytest.approx(expected, abs=1e-12)


def test_ece_binning_must_be_known():
    probs, y = random_probs()
    with pytest.raises(ValueError, match="binning must be 'width' or 'mass'"):
        classification.ece(probs, y, binning="quantile")


def test_mutual_information_by_hand_and_bounds():
    g = torch.Generator().manual_seed(3)
    draws = torch.softmax(2 * torch.randn(6, 40, 4, generator=g, dtype=torch.float64), -1)
    mi = classification.mutual_information(draws, reduction="none")
    # by hand: entropy of the mean minus mean entropy, per example
    mean = draws.mean(0)
    expected = -(mean * mean.log()).sum(-1) + (draws * draws.log()).sum(-1).mean(0)
    assert torch.allclose(mi, expected, atol=1e-12)
    # 0 <= I <= total predictive entropy; identical draws give 0
    total = classification.predictive_entropy(mean, reduction="none")
    assert torch.all(mi >= 0) and torch.all(mi <= total)
    same = draws[:1].expand(5, -1, -1)
    assert classification.mutual_information(same) == pytest.approx(0, abs=1e-12)
    with pytest.raises(ValueError, match="num_draws, num_data, num_classes"):
        classification.mutual_information(mean)
    with pytest.raises(ValueError, match="reduction"):
        classification.mutual_information(draws, reduction="sum")


# ------------------------------------------------------------- against a reference predictive


def test_agreement_and_total_variation_by_hand():
    p = torch.tensor([[0.7, 0.2, 0.1], [0.1, 0.1, 0.8], [0.4, 0.4, 0.2], [0.0, 1.0, 0.0],
                      [0.6, 0.1, 0.3]], dtype=torch.float64)
    q = torch.tensor([[0.5, 0.3, 0.2], [0.6, 0.1, 0.3], [0.3, 0.5, 0.2], [1.0, 0.0, 0.0],
                      [0.45, 0.1, 0.45]], dtype=torch.float64)
    # top-1 (ties: the first class): 0|0 agree, 2|0 no, 0|1 no, 1|0 no, 0|0 agree
    assert classification.agreement(p, q) == 0.4
    # per point 1/2 sum |p - q|: (0.2+0.1+0.1)/2, (0.5+0+0.5)/2, (0.1+0.1+0)/2, (1+1+0)/2,
    # (0.15+0+0.15)/2
    tv = classification.total_variation(p, q, reduction="none")
    assert torch.allclose(tv, torch.tensor([0.2, 0.5, 0.1, 1.0, 0.15], dtype=torch.float64),
                          atol=1e-12)
    assert classification.total_variation(p, q) == pytest.approx(1.95 / 5, abs=1e-12)
    assert tv.dtype == torch.float64


def test_agreement_and_total_variation_follow_the_competition_definitions():
    """The NeurIPS 2021 BDL competition scores, written out in NumPy from their definition."""
    p, _ = random_probs(n=300, c=4, seed=5)
    q, _ = random_probs(n=300, c=4, seed=6)
    pn, qn = p.numpy(), q.numpy()
    assert classification.agreement(p, q) == pytest.approx((pn.argmax(-1) == qn.argmax(-1)).mean())
    assert classification.total_variation(p, q) == pytest.approx(np.abs(pn - qn).sum(-1).mean() / 2)


def test_total_variation_properties():
    p, _ = random_probs(n=50, c=3, seed=1)
    q, _ = random_probs(n=50, c=3, seed=2)
    tv = classification.total_variation(p, q, reduction="none")
    assert torch.allclose(tv, classification.total_variation(q, p, reduction="none"))  # symmetric
    assert bool(((tv > 0) & (tv <= 1)).all())
    assert classification.total_variation(p, p) == 0.0 and classification.agreement(p, p) == 1.0
    # two classes: TV is |p_0 - q_0|; disjoint supports are at distance 1
    p2 = torch.tensor([[0.9, 0.1], [0.25, 0.75]])
    q2 = torch.tensor([[0.6, 0.4], [0.5, 0.5]])
    assert classification.total_variation(p2, q2) == pytest.approx((0.3 + 0.25) / 2, abs=1e-7)
    assert classification.total_variation(torch.eye(2), torch.eye(2).flip(0)) == 1.0


@pytest.mark.parametrize("fn", [classification.agreement, classification.total_variation])
def test_reference_metrics_reject_bad_input(fn):
    p, _ = random_probs(n=10, c=3)
    with pytest.raises(ValueError, match=r"reference_probs must have the shape of probs"):
        fn(p, p[:9])
    with pytest.raises(ValueError, match=r"reference_probs must have the shape of probs"):
        fn(p, random_probs(n=10, c=4)[0])
    with pytest.raises(ValueError, match=r"each row of reference_probs must sum to 1"):
        fn(p, 0.5 * p)
    with pytest.raises(ValueError, match=r"^probs must hold probabilities"):
        fn(p - 1, p)
    with pytest.raises(ValueError, match=r"reference_probs must be a torch.Tensor"):
        fn(p, p.numpy())
    with pytest.raises(ValueError, match="reduction"):
        classification.total_variation(p, p, reduction="sum")
