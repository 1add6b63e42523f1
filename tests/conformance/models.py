"""The conformance matrix's model zoo: small models written the ways Pyro users write them.

Each :class:`Problem` has a data generator (fixed seed, no downloads), a model builder and a
reduction of posterior draws to a few *identifiable* summary statistics. ``build(B)`` returns
the model minibatched by its own plate, ``pyro.plate("data", N, subsample_size=B)`` (the
indices drawn first and the network run outside the plate, the idiom of the design's "How a
step sees data"); ``build(None)`` is the full-batch model that NUTS accepts and that a kernel's
``subsample_size=B`` minibatches. The weights of a network are not identifiable (hidden units
can be permuted), so network models are summarised in function space: the posterior-predictive
mean (or class probability) at a few fixed inputs, the mean held-out log-density
(``heldout_lpd``) and the noise scale.

The models (``PROBLEMS``):

===================  =============================================================  ========
name                 model                                                          N
===================  =============================================================  ========
mlp_hier             PyroModule 1-8-1 tanh MLP, PyroSample weights sharing a        160
                     HalfNormal prior scale, HalfNormal noise
bnn_categorical      ``BNN`` 4-8-3 tanh, ``Categorical`` (iris)                     120
bnn_bernoulli        ``BNN`` 2-8-1 tanh, ``Bernoulli`` (two moons)                  200
bnn_homoskedastic    ``BNN`` 3-8-1 tanh, ``HomoskedasticGaussian`` (diabetes)       200
bnn_heteroskedastic  ``BNN`` 1-8-2 tanh, ``HeteroskedasticGaussian``                160
cnn                  ``BNN`` conv(4)-BatchNorm-ReLU-pool-Dropout-linear on 8x8     150
                     digits 0-2, network in evaluation mode
cnn_train            the same network left in training mode                        150
horseshoe            horseshoe logistic regression, global and local HalfCauchy     200
two_outputs          two observed sites (Normal and Bernoulli) in one plate         200
dirichlet_lkj        Dirichlet label weights and an LKJCholesky-correlated          200
                     bivariate normal
float64              ``BNN`` 1-8-1 tanh, learned noise, ``net.double()``, float64    160
linreg               conjugate linear regression (PyroModule), targets ``(N,)``      200
linreg_col           the same with targets shaped ``(N, 1)``                        200
bnn_col              ``BNN`` 1-8-1 tanh, learned noise, targets ``(N, 1)``          160
===================  =============================================================  ========

``linreg`` and ``linreg_col`` have an exact posterior; ``linreg_col`` and ``bnn_col`` are
compared with the posterior the user meant, that of the ``(N,)`` targets (``reference_of``).
``mlp_hier``'s shared prior scale is not among its statistics: it mixes too slowly for NUTS
(bulk ESS 47 of 800 draws, R-hat 1.08) and for the SG kernels (ESS about 15 of 800 at 100
steps per draw) to be checked at the matrix's budget.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyro
import pyro.distributions as dist
import torch
from pyro import poutine
from pyro.nn import PyroModule, PyroSample
from torch import nn

from pyro_flat.models.bnn import BNN
from pyro_flat.models.likelihoods import (
    Bernoulli,
    Categorical,
    HeteroskedasticGaussian,
    HomoskedasticGaussian,
)

Draws = dict[str, torch.Tensor]


@dataclass
class Data:
    """Training arguments of the model, held-out arguments, and fixed inputs to summarise at."""

    args: tuple[torch.Tensor, ...]
    test_args: tuple[torch.Tensor, ...]
    points: torch.Tensor | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def num_data(self) -> int:
        return int(self.args[0].shape[0])


@dataclass(frozen=True)
class Problem:
    """One model of the zoo.

    Attributes
    ----------
    name, description : str
    data : callable
        ``() -> Data``, deterministic (fixed seeds).
    build : callable
        ``(subsample_size) -> model``; ``None`` gives the full-batch model.
    summarize : callable
        ``(model, draws, data) -> {statistic: array (num_draws,)}`` for draws of the model's
        latent sites with one leading draw dimension.
    reference_of : str, optional
        The problem whose reference this one is compared with (default: its own).
    exact : callable, optional
        ``(data) -> {statistic: (mean, sd)}``: the exact posterior, used instead of NUTS.
    has_posterior : bool
        ``False`` for a model whose SG target is not a posterior (``cnn_train``): its cells
        only check that the run completes with finite draws.
    """

    name: str
    description: str
    data: Callable[[], Data]
    build: Callable[[int | None], Callable]
    summarize: Callable[[Callable, Draws, Data], dict[str, np.ndarray]]
    reference_of: str | None = None
    exact: Callable[[Data], dict[str, tuple[float, float]]] | None = None
    has_posterior: bool = True

    @property
    def reference_name(self) -> str:
        return self.reference_of or self.name


# ------------------------------------------------------------------------------ helpers


def _rng(seed: int) -> np.random.Generator:
    return np.random.default_rng(seed)


def _t(a: Any, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    return torch.as_tensor(np.asarray(a), dtype=dtype)


def _split(x: np.ndarray, y: np.ndarray, n_train: int, seed: int
           ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    perm = _rng(seed).permutation(len(x))
    tr, te = perm[:n_train], perm[n_train:]
    return x[tr], y[tr], x[te], y[te]


def _standardize(train: np.ndarray, test: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    mu, sd = train.mean(0), train.std(0)
    return (train - mu) / sd, (test - mu) / sd


def replay(model: Callable, draw: dict[str, torch.Tensor], *args: Any) -> Any:
    """The trace of ``model(*args)`` with its latent sites set to ``draw``."""
    return poutine.trace(poutine.condition(model, data=draw)).get_trace(*args)


def each_draw(draws: Draws) -> list[dict[str, torch.Tensor]]:
    n = len(next(iter(draws.values())))
    return [{k: v[i] for k, v in draws.items()} for i in range(n)]


def _summaries_of(rows: list[dict[str, float]]) -> dict[str, np.ndarray]:
    return {k: np.array([r[k] for r in rows], dtype=np.float64) for k in rows[0]}


def predictive_summaries(model: Callable, draws: Draws, data: Data, *,
                         site: str = "obs", latents: tuple[str, ...] = (),
                         probs_of: tuple[int, ...] | None = None) -> dict[str, np.ndarray]:
    """Function-space summaries of a model with one observed site ``site``.

    Per draw: the mean of the site's distribution at each of ``data.points`` (``f[i]``; for a
    categorical site, the probability of class ``probs_of[i]`` at point ``i``: ``p[i]``), the
    mean held-out log-density ``heldout_lpd`` over ``data.test_args``, and the scalar
    latents named in ``latents`` (e.g. the noise scale).
    """
    rows = []
    with torch.no_grad():
        for draw in each_draw(draws):
            row: dict[str, float] = {}
            if data.points is not None:
                fn = replay(model, draw, data.points, None).nodes[site]["fn"]
                if probs_of is not None:
                    p = fn.probs[torch.arange(len(probs_of)), torch.tensor(probs_of)]
                    row.update({f"p[{i}]": float(v) for i, v in enumerate(p)})
                else:
                    row.update({f"f[{i}]": float(v) for i, v in enumerate(fn.mean)})
            tr = replay(model, draw, *data.test_args)
            node = tr.nodes[site]
            row["heldout_lpd"] = float(node["fn"].log_prob(node["value"]).mean())
            for name in latents:
                row[name] = float(draw[name])
            rows.append(row)
    return _summaries_of(rows)


# ------------------------------------------------------------------------------ data sets


@functools.cache
def sine_data(dtype: torch.dtype = torch.float32, column: bool = False) -> Data:
    """``y = sin(2x) + 0.3 e``, ``x ~ U(-2, 2)``: 160 training and 60 held-out points; with
    ``column=True`` the training targets are shaped ``(N, 1)`` (the held-out ones stay
    ``(M,)``, so that the summaries mean what they mean for the ``(N,)`` model)."""
    rng = _rng(11)
    x = rng.uniform(-2, 2, 220)[:, None]
    y = np.sin(2 * x[:, 0]) + 0.3 * rng.standard_normal(220)
    y_train = y[:160, None] if column else y[:160]
    return Data((_t(x[:160], dtype), _t(y_train, dtype)), (_t(x[160:], dtype), _t(y[160:], dtype)),
                points=_t([[-1.5], [0.0], [1.5]], dtype))


@functools.cache
def hetero_data() -> Data:
    """``y = sin(2x) + (0.1 + 0.25|x|) e``: 160 training and 60 held-out points."""
    rng = _rng(12)
    x = rng.uniform(-2, 2, 220)
    y = np.sin(2 * x) + (0.1 + 0.25 * np.abs(x)) * rng.standard_normal(220)
    return Data((_t(x[:160, None]), _t(y[:160])), (_t(x[160:, None]), _t(y[160:])),
                points=_t([[-1.5], [0.0], [1.5]]))


@functools.cache
def iris_data() -> Data:
    from sklearn.datasets import load_iris

    x, y = load_iris(return_X_y=True)
    x, y, xt, yt = _split(x, y, 120, seed=13)
    x, xt = _standardize(x, xt)
    # three held-out flowers, one of each class, as the fixed inputs
    first = [int(np.flatnonzero(yt == c)[0]) for c in range(3)]
    return Data((_t(x), _t(y, torch.long)), (_t(xt), _t(yt, torch.long)),
                points=_t(xt[first]), extra={"classes": [int(yt[i]) for i in first]})


@functools.cache
def moons_data() -> Data:
    from sklearn.datasets import make_moons

    x, y = make_moons(260, noise=0.3, random_state=14)
    return Data((_t(x[:200]), _t(y[:200])), (_t(x[200:]), _t(y[200:])),
                points=_t([[-1.0, 0.5], [0.5, 0.25], [2.0, -0.25]]))


@functools.cache
def diabetes_data() -> Data:
    """scikit-learn's diabetes: bmi, bp and s5 (standardised), standardised target; 200
    training and 100 held-out points."""
    from sklearn.datasets import load_diabetes

    x, y = load_diabetes(return_X_y=True)
    x = x[:, [2, 3, 8]]
    x, y, xt, yt = _split(x, y, 200, seed=15)
    x, xt = _standardize(x, xt[:100])
    y, yt = _standardize(y, yt[:100])
    return Data((_t(x), _t(y)), (_t(xt), _t(yt)),
                points=_t([[-1.0, -1.0, -1.0], [0.0, 0.0, 0.0], [1.0, 1.0, 1.0]]))


@functools.cache
def digits_data() -> Data:
    """8x8 digits of classes 0, 1, 2 (pixels / 16): 50 per class for training, 20 held out."""
    from sklearn.datasets import load_digits

    d = load_digits()
    rng = _rng(16)
    train, test = [], []
    for c in range(3):
        idx = rng.permutation(np.flatnonzero(d.target == c))
        train += list(idx[:50])
        test += list(idx[50:70])
    train, test = rng.permutation(train), np.array(test)
    x = d.images / 16.0
    first = [0, 20, 40]  # one held-out image of each class
    return Data((_t(x[train, None]), _t(d.target[train], torch.long)),
                (_t(x[test, None]), _t(d.target[test], torch.long)),
                points=_t(x[test[first], None]), extra={"classes": [0, 1, 2]})


HORSESHOE_BETA = (2.0, -1.5, 1.0, 0.0, 0.0, 0.0, 0.0, 0.0)


@functools.cache
def horseshoe_data() -> Data:
    rng = _rng(17)
    x = rng.standard_normal((300, len(HORSESHOE_BETA)))
    p = 1 / (1 + np.exp(-(x @ np.array(HORSESHOE_BETA))))
    y = (rng.uniform(size=300) < p).astype(np.float64)
    return Data((_t(x[:200]), _t(y[:200])), (_t(x[200:]), _t(y[200:])))


@functools.cache
def two_outputs_data() -> Data:
    """``y_reg = x (1, -0.5) + 0.3 + 1.5 e`` and ``y_bin ~ Bernoulli(sigmoid(x (1.5, 1) - 0.5))``
    (the noise of 1.5 keeps the two heads' posterior scales within a factor of 3)."""
    rng = _rng(18)
    x = rng.standard_normal((200, 2))
    y_reg = x @ np.array([1.0, -0.5]) + 0.3 + 1.5 * rng.standard_normal(200)
    p = 1 / (1 + np.exp(-(x @ np.array([1.5, 1.0]) - 0.5)))
    y_bin = (rng.uniform(size=200) < p).astype(np.float64)
    return Data((_t(x), _t(y_reg), _t(y_bin)), ())


@functools.cache
def labelled_mvn_data() -> Data:
    """Labels with probabilities (0.5, 0.3, 0.2); points with mean (1, -1), sds 1.5 and
    correlation 0.6."""
    rng = _rng(19)
    z = rng.choice(3, size=200, p=[0.5, 0.3, 0.2])
    corr = np.array([[1.0, 0.6], [0.6, 1.0]])
    cov = np.diag([1.5, 1.5]) @ corr @ np.diag([1.5, 1.5])
    x = rng.multivariate_normal([1.0, -1.0], cov, size=200)
    return Data((_t(z, torch.long), _t(x)), ())


@functools.cache
def linreg_data(column: bool = False) -> Data:
    rng = _rng(20)
    x = rng.standard_normal((200, 2))
    y = x @ np.array([0.7, -1.2]) + 0.4 + LINREG_NOISE * rng.standard_normal(200)
    return Data((_t(x), _t(y[:, None] if column else y)), (), points=_t([[1.0, 1.0]]))


# ------------------------------------------------------------------------------ models


class HierarchicalMLP(PyroModule):
    """A 1-8-1 tanh regression network written with ``PyroModule``/``PyroSample``: every
    weight and bias ``~ N(0, prior_scale^2)`` with one shared ``prior_scale ~ HalfNormal(1)``,
    observation noise ``noise ~ HalfNormal(1)``."""

    def __init__(self, hidden: int = 8, subsample_size: int | None = None):
        super().__init__()
        self.subsample_size = subsample_size
        self.prior_scale = PyroSample(dist.HalfNormal(1.0))
        self.noise = PyroSample(dist.HalfNormal(1.0))
        self.fc1 = PyroModule[nn.Linear](1, hidden)
        self.fc2 = PyroModule[nn.Linear](hidden, 1)
        for layer in (self.fc1, self.fc2):
            for name, p in list(layer.named_parameters()):
                shape = p.shape
                setattr(layer, name, PyroSample(
                    lambda _, shape=shape: dist.Normal(0.0, self.prior_scale)
                    .expand(shape).to_event(len(shape))))

    def forward(self, x: torch.Tensor, y: torch.Tensor | None = None) -> torch.Tensor:
        noise = self.noise
        plate = pyro.plate("data", x.shape[0], subsample_size=self.subsample_size)
        with plate as ind:  # draw the indices first ...
            pass
        mean = self.fc2(torch.tanh(self.fc1(x[ind]))).squeeze(-1)  # ... run the net outside
        with plate:
            return pyro.sample("obs", dist.Normal(mean, noise),
                               obs=None if y is None else y[ind])


LINREG_NOISE = 0.5


class LinearRegression(PyroModule):
    """``y ~ N(x w + b, 0.5^2)`` with ``w, b ~ N(0, 1)``: a conjugate regression written as a
    ``PyroModule`` (``PyroModule[nn.Linear]`` with ``PyroSample`` weights)."""

    def __init__(self, in_features: int = 2, subsample_size: int | None = None):
        super().__init__()
        self.subsample_size = subsample_size
        self.linear = PyroModule[nn.Linear](in_features, 1)
        self.linear.weight = PyroSample(dist.Normal(0.0, 1.0).expand([1, in_features])
                                        .to_event(2))
        self.linear.bias = PyroSample(dist.Normal(0.0, 1.0).expand([1]).to_event(1))

    def forward(self, x: torch.Tensor, y: torch.Tensor | None = None) -> torch.Tensor:
        plate = pyro.plate("data", x.shape[0], subsample_size=self.subsample_size)
        with plate as ind:
            pass
        mean = self.linear(x[ind]).squeeze(-1)
        with plate:
            return pyro.sample("obs", dist.Normal(mean, LINREG_NOISE),
                               obs=None if y is None else y[ind])


def horseshoe_model(subsample_size: int | None = None) -> Callable:
    """Horseshoe logistic regression, non-centred as in NumPyro's example:
    ``tau ~ HalfCauchy(1)``, ``lam_j ~ HalfCauchy(1)``, ``z_j ~ N(0, 1)``,
    ``beta = tau lam z``, intercept ``b ~ N(0, 5^2)``."""

    def model(x: torch.Tensor, y: torch.Tensor | None = None) -> torch.Tensor:
        tau = pyro.sample("tau", dist.HalfCauchy(1.0))
        with pyro.plate("features", x.shape[1]):
            lam = pyro.sample("lam", dist.HalfCauchy(1.0))
            z = pyro.sample("z", dist.Normal(0.0, 1.0))
        b = pyro.sample("b", dist.Normal(0.0, 5.0))
        beta = tau * lam * z
        with pyro.plate("data", x.shape[0], subsample_size=subsample_size) as ind:
            return pyro.sample("obs", dist.Bernoulli(logits=x[ind] @ beta + b),
                               obs=None if y is None else y[ind])

    return model


def two_outputs_model(subsample_size: int | None = None) -> Callable:
    """A regression and a classification target of the same inputs, two observed sites in
    one plate."""

    def model(x: torch.Tensor, y_reg: torch.Tensor | None = None,
              y_bin: torch.Tensor | None = None) -> None:
        w_reg = pyro.sample("w_reg", dist.Normal(0.0, 1.0).expand([2]).to_event(1))
        b_reg = pyro.sample("b_reg", dist.Normal(0.0, 1.0))
        sigma = pyro.sample("sigma", dist.HalfNormal(1.0))
        w_bin = pyro.sample("w_bin", dist.Normal(0.0, 1.0).expand([2]).to_event(1))
        b_bin = pyro.sample("b_bin", dist.Normal(0.0, 1.0))
        with pyro.plate("data", x.shape[0], subsample_size=subsample_size) as ind:
            xb = x[ind]
            pyro.sample("y_reg", dist.Normal(xb @ w_reg + b_reg, sigma),
                        obs=None if y_reg is None else y_reg[ind])
            pyro.sample("y_bin", dist.Bernoulli(logits=xb @ w_bin + b_bin),
                        obs=None if y_bin is None else y_bin[ind])

    return model


def labelled_mvn_model(subsample_size: int | None = None) -> Callable:
    """Labels ``z ~ Categorical(weights)`` with ``weights ~ Dirichlet(1, 1, 1)`` and points
    ``x ~ MVN(loc, diag(scale) L L^T diag(scale))`` with ``L ~ LKJCholesky(2, 2)``,
    ``loc ~ N(0, 3^2)``, ``scale ~ HalfNormal(2)``, both observed in one plate."""

    def model(z: torch.Tensor, x: torch.Tensor) -> None:
        weights = pyro.sample("weights", dist.Dirichlet(torch.ones(3)))
        loc = pyro.sample("loc", dist.Normal(0.0, 3.0).expand([2]).to_event(1))
        scale = pyro.sample("scale", dist.HalfNormal(2.0).expand([2]).to_event(1))
        corr_chol = pyro.sample("corr_chol", dist.LKJCholesky(2, concentration=2.0))
        scale_tril = scale.unsqueeze(-1) * corr_chol
        with pyro.plate("data", x.shape[0], subsample_size=subsample_size) as ind:
            pyro.sample("z", dist.Categorical(weights), obs=z[ind])
            pyro.sample("x", dist.MultivariateNormal(loc, scale_tril=scale_tril), obs=x[ind])

    return model


def _mlp(sizes: tuple[int, ...], dtype: torch.dtype = torch.float32) -> nn.Module:
    layers: list[nn.Module] = []
    for i, (a, b) in enumerate(zip(sizes[:-1], sizes[1:], strict=True)):
        layers.append(nn.Linear(a, b))
        if i < len(sizes) - 2:
            layers.append(nn.Tanh())
    return nn.Sequential(*layers).to(dtype)


def small_cnn() -> nn.Module:
    """conv 3x3 (4 channels) - BatchNorm - ReLU - 4x4 average pool - Dropout(0.25) -
    linear to 3 classes: 91 parameters (BatchNorm's affine ones stay deterministic)."""
    return nn.Sequential(
        nn.Conv2d(1, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU(), nn.AvgPool2d(4),
        nn.Flatten(), nn.Dropout(0.25), nn.Linear(16, 3),
    )


def _bnn(make_net: Callable[[], nn.Module], likelihood: Callable[[], Any], *,
         train: bool = True, **kwargs: Any) -> Callable[[int | None], Callable]:
    def build(subsample_size: int | None) -> Callable:
        model = BNN(make_net(), likelihood(), subsample_size=subsample_size, **kwargs)
        return model.train(train)

    return build


# ------------------------------------------------------------------------------ summaries


def _latent_summaries(stats: Callable[[dict[str, torch.Tensor]], dict[str, float]]
                      ) -> Callable[[Callable, Draws, Data], dict[str, np.ndarray]]:
    def summarize(model: Callable, draws: Draws, data: Data) -> dict[str, np.ndarray]:
        with torch.no_grad():
            return _summaries_of([stats(d) for d in each_draw(draws)])

    return summarize


def _horseshoe_summaries(model: Callable, draws: Draws, data: Data) -> dict[str, np.ndarray]:
    x, y = data.test_args
    beta = draws["tau"].unsqueeze(-1) * draws["lam"] * draws["z"]  # (n, d)
    logits = beta.to(x.dtype) @ x.T + draws["b"].unsqueeze(-1).to(x.dtype)
    lpd = dist.Bernoulli(logits=logits).log_prob(y).mean(-1)
    out = {f"beta[{j}]": beta[:, j] for j in (0, 1, 2, 5)}
    out["heldout_lpd"] = lpd
    return {k: v.detach().double().numpy() for k, v in out.items()}


def _two_outputs_stats(d: dict[str, torch.Tensor]) -> dict[str, float]:
    return {"w_reg[0]": float(d["w_reg"][0]), "w_reg[1]": float(d["w_reg"][1]),
            "sigma": float(d["sigma"]), "w_bin[0]": float(d["w_bin"][0]),
            "w_bin[1]": float(d["w_bin"][1])}


def _labelled_mvn_stats(d: dict[str, torch.Tensor]) -> dict[str, float]:
    corr = d["corr_chol"] @ d["corr_chol"].T
    return {"weights[0]": float(d["weights"][0]), "weights[2]": float(d["weights"][2]),
            "corr": float(corr[1, 0]), "loc[0]": float(d["loc"][0]),
            "scale[1]": float(d["scale"][1])}


def _linreg_stats(d: dict[str, torch.Tensor]) -> dict[str, float]:
    w, b = d["linear.weight"].reshape(-1), d["linear.bias"].reshape(-1)
    return {"w[0]": float(w[0]), "w[1]": float(w[1]), "b": float(b[0]),
            "f(1,1)": float(w.sum() + b[0])}


def linreg_exact(data: Data) -> dict[str, tuple[float, float]]:
    """The conjugate posterior of :class:`LinearRegression`: Gaussian in ``(w, b)``."""
    x, y = (a.double() for a in data.args)
    y = y.reshape(-1)
    design = torch.cat([x, torch.ones(len(x), 1, dtype=x.dtype)], 1)
    precision = torch.eye(3, dtype=x.dtype) + design.T @ design / LINREG_NOISE**2
    cov = torch.linalg.inv(precision)
    mean = cov @ design.T @ y / LINREG_NOISE**2
    at = torch.tensor([1.0, 1.0, 1.0], dtype=x.dtype)  # f(1, 1) = w0 + w1 + b
    out = {"w[0]": (mean[0], cov[0, 0]), "w[1]": (mean[1], cov[1, 1]), "b": (mean[2], cov[2, 2]),
           "f(1,1)": (at @ mean, at @ cov @ at)}
    return {k: (float(m), math.sqrt(float(v))) for k, (m, v) in out.items()}


def labelled_mvn_exact(data: Data) -> dict[str, tuple[float, float]]:
    """The label weights' posterior is conjugate: ``Dirichlet(1 + counts)``."""
    counts = torch.bincount(data.args[0], minlength=3).double()
    alpha = 1 + counts
    a0 = float(alpha.sum())
    out = {}
    for i in (0, 2):
        a = float(alpha[i])
        out[f"weights[{i}]"] = (a / a0, math.sqrt(a * (a0 - a) / (a0**2 * (a0 + 1))))
    return out


def _class_summaries() -> Callable[[Callable, Draws, Data], dict[str, np.ndarray]]:
    def summarize(model: Callable, draws: Draws, data: Data) -> dict[str, np.ndarray]:
        return predictive_summaries(model, draws, data, probs_of=tuple(data.extra["classes"]))

    return summarize


def _regression_summaries(*latents: str) -> Callable[[Callable, Draws, Data],
                                                     dict[str, np.ndarray]]:
    def summarize(model: Callable, draws: Draws, data: Data) -> dict[str, np.ndarray]:
        return predictive_summaries(model, draws, data, latents=latents)

    return summarize


def _hetero_summaries(model: Callable, draws: Draws, data: Data) -> dict[str, np.ndarray]:
    out = predictive_summaries(model, draws, data)
    scales = []
    with torch.no_grad():
        for draw in each_draw(draws):
            fn = replay(model, draw, data.points, None).nodes["obs"]["fn"]
            scales.append(fn.scale[[0, 2]].double().numpy())
    scales = np.array(scales)
    out["scale[0]"], out["scale[2]"] = scales[:, 0], scales[:, 1]
    return out


# ------------------------------------------------------------------------------ the zoo


def _problems() -> dict[str, Problem]:
    sine64 = functools.partial(sine_data, torch.float64)
    sine_col = functools.partial(sine_data, torch.float32, True)
    problems = [
        Problem("mlp_hier", "PyroModule 1-8-1 tanh MLP, shared HalfNormal prior scale, "
                "HalfNormal noise", sine_data, lambda b: HierarchicalMLP(subsample_size=b),
                _regression_summaries("noise")),
        Problem("bnn_categorical", "BNN 4-8-3 tanh, Categorical (iris)", iris_data,
                _bnn(lambda: _mlp((4, 8, 3)), Categorical), _class_summaries()),
        Problem("bnn_bernoulli", "BNN 2-8-1 tanh, Bernoulli (two moons)", moons_data,
                _bnn(lambda: _mlp((2, 8, 1)), Bernoulli), _regression_summaries()),
        Problem("bnn_homoskedastic", "BNN 3-8-1 tanh, HomoskedasticGaussian (diabetes)",
                diabetes_data, _bnn(lambda: _mlp((3, 8, 1)), HomoskedasticGaussian),
                _regression_summaries("obs_scale")),
        Problem("bnn_heteroskedastic", "BNN 1-8-2 tanh, HeteroskedasticGaussian",
                hetero_data, _bnn(lambda: _mlp((1, 8, 2)), HeteroskedasticGaussian),
                _hetero_summaries),
        Problem("cnn", "BNN conv-BatchNorm-ReLU-pool-Dropout-linear, digits 0-2, eval mode",
                digits_data, _bnn(small_cnn, Categorical, train=False), _class_summaries()),
        Problem("cnn_train", "the cnn left in training mode (BatchNorm batch statistics, "
                "Dropout on): no posterior, runs only", digits_data,
                _bnn(small_cnn, Categorical, train=True), _class_summaries(),
                has_posterior=False),
        Problem("horseshoe", "horseshoe logistic regression (HalfCauchy global and local "
                "scales), non-centred", horseshoe_data, horseshoe_model, _horseshoe_summaries),
        Problem("two_outputs", "Normal and Bernoulli observed sites in one plate",
                two_outputs_data, two_outputs_model, _latent_summaries(_two_outputs_stats)),
        Problem("dirichlet_lkj", "Dirichlet label weights, LKJCholesky bivariate normal",
                labelled_mvn_data, labelled_mvn_model, _latent_summaries(_labelled_mvn_stats),
                exact=labelled_mvn_exact),
        Problem("float64", "BNN 1-8-1 tanh, learned noise, net.double() and float64 data",
                sine64, _bnn(lambda: _mlp((1, 8, 1), torch.float64), HomoskedasticGaussian),
                _regression_summaries("obs_scale")),
        Problem("linreg", "conjugate linear regression (PyroModule), targets (N,)",
                linreg_data, lambda b: LinearRegression(subsample_size=b),
                _latent_summaries(_linreg_stats), exact=linreg_exact),
        Problem("linreg_col", "the conjugate regression with targets shaped (N, 1)",
                functools.partial(linreg_data, True), lambda b: LinearRegression(subsample_size=b),
                _latent_summaries(_linreg_stats), reference_of="linreg", exact=linreg_exact),
        Problem("bnn_col", "BNN 1-8-1 tanh, learned noise, targets shaped (N, 1)", sine_col,
                _bnn(lambda: _mlp((1, 8, 1)), HomoskedasticGaussian),
                _regression_summaries("obs_scale"), reference_of="float64"),
    ]
    return {p.name: p for p in problems}


#: Every model of the zoo by name.
PROBLEMS: dict[str, Problem] = _problems()
