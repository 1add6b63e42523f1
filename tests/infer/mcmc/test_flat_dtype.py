"""The flat vector takes the model's widest floating dtype: float64 models (a float64 network
whose noise scale has a float32 prior, or ``BNN(net.double(), HomoskedasticGaussian())``) run
in every SG kernel, in float64, as NUTS runs them."""

from __future__ import annotations

import warnings

import harness
import pyro
import pyro.distributions as dist
import pytest
import torch
from pyro.infer import MCMC
from pyro.infer.mcmc.util import initialize_model
from pyro.nn import PyroModule, PyroSample

from pyro_flat.infer import SGLD
from pyro_flat.models.bnn import BNN
from pyro_flat.models.likelihoods import HomoskedasticGaussian
from pyro_flat.target.layout import FlatLayout

F64 = torch.float64
EPS = 1e-5
KERNELS = harness.every_kernel(EPS)


class Float64Regression(PyroModule):
    """A float64 3-8-1 tanh network (its priors built in float64) whose noise scale has a
    HalfNormal prior in torch's default float32: the first site, so the flat vector used to
    take float32 and the float64 network then failed ("mat1 and mat2 must have the same
    dtype"). Minibatched by its plate when ``batch`` is given."""

    def __init__(self, batch: int | None = 16):
        super().__init__()
        self.batch = batch
        zero = torch.tensor(0.0, dtype=F64)
        self.fc1 = PyroModule[torch.nn.Linear](3, 8).double()
        self.fc1.weight = PyroSample(dist.Normal(zero, 1.0).expand([8, 3]).to_event(2))
        self.fc1.bias = PyroSample(dist.Normal(zero, 1.0).expand([8]).to_event(1))
        self.fc2 = PyroModule[torch.nn.Linear](8, 1).double()
        self.fc2.weight = PyroSample(dist.Normal(zero, 1.0).expand([1, 8]).to_event(2))
        self.fc2.bias = PyroSample(dist.Normal(zero, 1.0).expand([1]).to_event(1))

    def forward(self, x, y=None):
        sigma = pyro.sample("sigma", dist.HalfNormal(1.0))  # float32 prior
        plate = pyro.plate("data", len(x), subsample_size=self.batch)
        with plate as i:
            pass
        mean = self.fc2(torch.tanh(self.fc1(x[i]))).squeeze(-1)
        with plate:
            pyro.sample("obs", dist.Normal(mean, sigma), obs=None if y is None else y[i])


def float64_bnn(batch: int | None = 16) -> BNN:
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(3, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))
    return BNN(net.double(), HomoskedasticGaussian(), subsample_size=batch)  # as the docs ask


MODELS = {"PyroModule": Float64Regression, "BNN": float64_bnn}


def data(dtype=F64):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(64, 3, generator=g, dtype=F64)
    y = torch.tanh(x.sum(-1)) + 0.1 * torch.randn(64, generator=g, dtype=F64)
    return x.to(dtype), y.to(dtype)


@pytest.mark.parametrize("model", list(MODELS))
@pytest.mark.parametrize("name", list(KERNELS))
def test_a_float64_model_runs_in_float64_in_every_kernel(name, model):
    """Before: RuntimeError "mat1 and mat2 must have the same dtype, but got Double and
    Float" in every kernel."""
    kernel = KERNELS[name](MODELS[model]())
    pyro.set_rng_seed(0)
    mcmc = MCMC(kernel, num_samples=4, warmup_steps=2, disable_progbar=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # short runs: noise warnings
        mcmc.run(*data())
    assert kernel.position.dtype == F64
    for site, value in mcmc.get_samples().items():
        assert value.dtype == F64 and bool(torch.isfinite(value).all()), site


def test_vectorized_chains_and_adapted_steps_run_in_float64():
    kernel = SGLD(Float64Regression(), vectorized_chains=2)  # no step size: warmup adapts
    pyro.set_rng_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        MCMC(kernel, num_samples=3, warmup_steps=4, disable_progbar=True).run(*data())
    assert kernel.position.dtype == F64 and kernel.position.shape[0] == 2


def test_the_potential_keeps_float64_precision():
    """The kernel's U and gradient at its initial point equal the float64 potential Pyro's
    NUTS builds (``initialize_model``) at the same unconstrained point to 1e-12 relative:
    far below float32's rounding (about 1e-7), so no site went through float32."""
    model = Float64Regression(batch=None)
    x, y = data()
    kernel = SGLD(model, EPS)
    pyro.set_rng_seed(0)
    kernel.setup(0, x, y)
    u, grad = kernel.potential_and_grad(None)
    params = {n: v.detach().clone().requires_grad_() for n, v in
              kernel.layout.views(kernel.position).items()}
    _, potential_fn, _, _ = initialize_model(model, (x, y))
    reference = potential_fn(params)
    assert reference.dtype == F64
    ref_grad = torch.cat([g.reshape(-1) for g in torch.autograd.grad(reference,
                                                                     list(params.values()))])
    torch.testing.assert_close(u, reference.detach(), rtol=1e-12, atol=0.0)
    torch.testing.assert_close(grad, ref_grad, rtol=1e-10, atol=1e-12)


def test_flat_dtype_is_the_widest_floating_dtype():
    f32, f16 = torch.zeros(2), torch.zeros(2, dtype=torch.float16)
    assert FlatLayout.flat_dtype([{"a": f32, "b": torch.zeros(3, dtype=F64)}]) == F64
    assert FlatLayout.flat_dtype([{"a": f16}, {"a": f32}]) == torch.float32
    assert FlatLayout.flat_dtype([{"a": f16}]) == torch.float16
    assert FlatLayout.flat_dtype([{}]) == torch.get_default_dtype()


def test_bnn_latents_take_the_inputs_dtype():
    """``obs_scale`` (and its prior) are float64 for float64 inputs, float32 for float32."""
    x, y = data()
    trace = pyro.poutine.trace(float64_bnn()).get_trace(x, y)
    assert trace.nodes["obs_scale"]["value"].dtype == F64
    assert trace.nodes["obs_scale"]["fn"].scale.dtype == F64
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(3, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))
    trace = pyro.poutine.trace(BNN(net, HomoskedasticGaussian())).get_trace(*data(torch.float32))
    assert trace.nodes["obs_scale"]["value"].dtype == torch.float32
