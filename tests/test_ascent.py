"""The shared ascent step: its closed form, one flat tensor equals many, the no-perturbation
rule, gradients without a value, preallocated output and bad input."""

import math

import pytest
import torch

from pyro_flat.optim.ascent import asam_metric, ascent_perturbation


def gradient(seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(3, 2, generator=g, dtype=torch.float64),
            torch.randn(4, generator=g, dtype=torch.float64)]


@pytest.mark.parametrize("geometry", [False, True])
def test_closed_form_and_radius(geometry):
    grads = gradient()
    theta = [torch.randn_like(g) for g in grads]
    metric = asam_metric(theta, 0.1) if geometry else None
    e = ascent_perturbation(grads, 0.3, metric=metric)
    g = torch.cat([t.reshape(-1) for t in grads])
    d = torch.cat([(t.abs() + 0.1).square().reshape(-1) for t in theta]) if geometry \
        else torch.ones_like(g)
    expected = 0.3 * d * g / torch.sqrt(g @ (d * g))
    flat = torch.cat([t.reshape(-1) for t in e])
    assert torch.allclose(flat, expected, atol=1e-14)
    assert float(torch.sqrt(flat @ (flat / d))) == pytest.approx(0.3, rel=1e-12)
    # the same step on one flat vector
    (one,) = ascent_perturbation([g], 0.3, metric=None if metric is None else [d])
    assert torch.allclose(one, expected, atol=1e-14)


@pytest.mark.parametrize("bad", [0.0, math.nan, math.inf])
def test_zero_or_non_finite_gradient_gives_no_perturbation(bad):
    grads = [torch.full((3,), bad), torch.zeros(2)]
    assert ascent_perturbation(grads, 0.5) is None
    assert ascent_perturbation(grads, 0.5, metric=asam_metric(grads, 0.01)) is None
    assert ascent_perturbation(gradient(), 0.0) is None  # rho = 0
    assert ascent_perturbation([None, None], 0.5) is None


def test_missing_gradients_count_as_zero():
    g = gradient()
    e = ascent_perturbation([g[0], None, g[1]], 0.2)
    assert e[1] is None
    ref = ascent_perturbation(g, 0.2)
    assert torch.equal(e[0], ref[0]) and torch.equal(e[2], ref[1])


@pytest.mark.parametrize("geometry", [False, True])
def test_out_writes_into_the_buffers(geometry):
    g, z = torch.randn(50), torch.randn(50)
    buf = torch.empty(50)
    metric = asam_metric([z], out=[buf]) if geometry else None
    (e,) = ascent_perturbation([g], 0.05, metric=metric, out=[buf])
    assert e is buf
    ref = ascent_perturbation([g], 0.05, metric=asam_metric([z]) if geometry else None)[0]
    assert torch.equal(e, ref)


def test_no_gradient_flows_and_nothing_changes():
    theta = torch.randn(5, requires_grad=True)
    g = theta * 2.0  # a gradient that is part of a graph
    before = g.detach().clone()
    (e,) = ascent_perturbation([g], 0.1, metric=asam_metric([theta]))
    assert not e.requires_grad and torch.equal(g.detach(), before)


def test_bad_input():
    with pytest.raises(ValueError, match="rho"):
        ascent_perturbation(gradient(), -0.1)
    with pytest.raises(ValueError, match="metric"):
        ascent_perturbation(gradient(), 0.1, metric=[torch.ones(1)])
    with pytest.raises(ValueError, match="out"):
        ascent_perturbation(gradient(), 0.1, out=[])
