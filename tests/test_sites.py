"""Latent-site discovery and index injection, shared by the kernels, export and prediction."""

import pyro
import pyro.distributions as dist
import torch

from pyro_flat.target.sites import latent_sites
from pyro_flat.target.subsample import InjectIndices


def model(y):
    mu = pyro.sample("mu", dist.Normal(0.0, 1.0))
    s = pyro.sample("s", dist.HalfNormal(1.0))
    pyro.deterministic("twice", 2 * mu)
    with pyro.plate("data", len(y), subsample_size=3) as i:
        pyro.sample("y", dist.Normal(mu, s), obs=y[i])
    with pyro.plate("other", 7, subsample_size=2) as j:
        pass
    return i, j


def test_latent_sites_are_the_unobserved_non_subsample_sites_in_order():
    trace = pyro.poutine.trace(model).get_trace(torch.zeros(10))
    assert list(latent_sites(trace)) == ["mu", "s"]
    conditioned = pyro.poutine.condition(model, data={"s": torch.tensor(1.0)})
    assert list(latent_sites(pyro.poutine.trace(conditioned).get_trace(torch.zeros(10)))) == [
        "mu"]


def test_inject_indices_sets_plates_of_that_size_only():
    i, j = InjectIndices(10, torch.tensor([4, 5, 6]))(model)(torch.zeros(10))
    assert i.tolist() == [4, 5, 6]
    assert len(j) == 2  # a plate of another size keeps its own indices

    def chosen():  # indices already chosen (plate(..., subsample=...)) are kept
        with pyro.plate("data", 10, subsample=torch.tensor([0, 1])) as k:
            return k
    assert InjectIndices(10, torch.tensor([8, 9]))(chosen)().tolist() == [0, 1]
