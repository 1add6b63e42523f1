"""Regression targets of shape (N, 1) against a mean of shape (B,): what each entry point does.

The diabetes regression (342 training points, 10 inputs, standardised targets), a 10-8-1 tanh
network with a learned noise scale, minibatches of 64, at one fixed initialisation: the
negative ELBO of ``LeanELBO`` and ``Trace_ELBO`` (``AutoNormal``, mean of 20 particles at a
fixed seed), the minibatch potential ``U`` of an SGLD kernel (mean over its first 20 draws at
a step size of 1e-6, i.e. at its initial point), and the shape of ``to_arviz``'s log-likelihood
of the draws of the ``(N,)`` run, with the targets shaped ``(N,)`` and ``(N, 1)``. Two
models: ``BNN(net, HomoskedasticGaussian(), subsample_size=64)`` and the same network written
as a user would (``PyroModule`` + ``PyroSample``, ``pyro.plate("data", N, subsample_size=64)``,
the mean squeezed to ``(B,)``). An entry point that refuses the input prints its error.

Run: ``.venv/bin/python benchmarks/broadcast_targets.py`` (a few seconds; prints a table).
"""

from __future__ import annotations

import warnings

import pyro
import pyro.distributions as dist
import torch
from pyro.infer import MCMC, Trace_ELBO
from pyro.infer.autoguide import AutoNormal
from pyro.nn import PyroModule, PyroSample

import pyro_flat
from pyro_flat.datasets import load_dataset
from pyro_flat.infer import SGLD
from pyro_flat.infer.svi.lean_elbo import LeanELBO
from pyro_flat.models.bnn import BNN
from pyro_flat.models.likelihoods import HomoskedasticGaussian

BATCH = 64


class UserRegression(PyroModule):
    """A 10-8-1 tanh regression BNN with a learned noise scale, minibatched by its plate."""

    def __init__(self, d: int, hidden: int = 8):
        super().__init__()
        self.fc1 = PyroModule[torch.nn.Linear](d, hidden)
        self.fc1.weight = PyroSample(dist.Normal(0.0, 1.0).expand([hidden, d]).to_event(2))
        self.fc1.bias = PyroSample(dist.Normal(0.0, 1.0).expand([hidden]).to_event(1))
        self.fc2 = PyroModule[torch.nn.Linear](hidden, 1)
        self.fc2.weight = PyroSample(dist.Normal(0.0, 1.0).expand([1, hidden]).to_event(2))
        self.fc2.bias = PyroSample(dist.Normal(0.0, 1.0).expand([1]).to_event(1))

    def forward(self, x: torch.Tensor, y: torch.Tensor | None = None) -> None:
        sigma = pyro.sample("sigma", dist.HalfNormal(1.0))
        plate = pyro.plate("data", len(x), subsample_size=BATCH)
        with plate as ind:
            pass
        mean = self.fc2(torch.tanh(self.fc1(x[ind]))).squeeze(-1)  # (B,)
        with plate:
            pyro.sample("obs", dist.Normal(mean, sigma), obs=None if y is None else y[ind])


def make_bnn(d: int) -> BNN:
    net = torch.nn.Sequential(torch.nn.Linear(d, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))
    return BNN(net, HomoskedasticGaussian(), subsample_size=BATCH)


def attempt(fn, *args) -> str:
    try:
        return fn(*args)
    except (ValueError, RuntimeError) as e:
        first = str(e).strip().splitlines()[0]
        return f"{type(e).__name__}: {first[:90]}"


def elbo_loss(elbo, model, x, y) -> str:
    pyro.clear_param_store()
    pyro.set_rng_seed(0)
    guide = AutoNormal(model)
    guide(x, y)
    pyro.set_rng_seed(1)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        losses = [elbo.loss(model, guide, x, y) for _ in range(20)]
    return f"{sum(losses) / len(losses):,.0f}"


def sgld_potential(model, x, y) -> str:
    pyro.set_rng_seed(0)
    kernel = SGLD(model, step_size=1e-6)
    mcmc = MCMC(kernel, num_samples=20, warmup_steps=0, disable_progbar=True)
    mcmc.run(x, y)
    u = -kernel.diagnostics()["sample_stats"]["lp"]
    return f"{float(u.mean()):,.0f}", mcmc


def export_shape(draws: dict, model, x, y) -> str:
    idata = pyro_flat.to_arviz(draws, model=model, model_args=(x, y), posterior_predictive=False)
    return str(tuple(idata.log_likelihood["obs"].shape))


def main() -> None:
    torch.manual_seed(0)
    data = load_dataset("diabetes", seed=0)
    x, y = data.x_train, data.y_train
    rows = []
    for name, build in (("BNN", lambda: make_bnn(x.shape[1])),
                        ("PyroModule", lambda: UserRegression(x.shape[1]))):
        for label, target in (("(N,)", y), ("(N, 1)", y.unsqueeze(1))):
            pyro.set_rng_seed(0)
            model = build()
            lean = attempt(elbo_loss, LeanELBO(), model, x, target)
            trace = attempt(elbo_loss, Trace_ELBO(), model, x, target)
            run: dict = {}

            def potential(model: torch.nn.Module, target: torch.Tensor, run: dict) -> str:
                u, run["mcmc"] = sgld_potential(model, x, target)
                return u

            u = attempt(potential, model, target, run)
            if label == "(N,)":  # the draws to export, with either targets
                draws = pyro_flat.get_samples(run["mcmc"])
            shape = attempt(export_shape, draws, model, x, target)
            rows.append((name, label, lean, trace, u, shape))
    header = ("model", "y", "LeanELBO loss", "Trace_ELBO loss", "SGLD U (mean of 20 draws)",
              "to_arviz log_likelihood")
    print("| " + " | ".join(header) + " |")
    print("|" + "---|" * len(header))
    for row in rows:
        print("| " + " | ".join(row) + " |")


if __name__ == "__main__":
    main()
