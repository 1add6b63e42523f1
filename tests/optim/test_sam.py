"""SAM: the closed-form step on a quadratic, rho = 0 is the base optimiser, ASAM's ball,
BatchNorm statistics frozen in the perturbed pass, F-SWAG collection, bad input, zero gradients
and per-group radii."""


import pytest
import torch

from pyro_flat.infer.mcmc.sharpness import find_batchnorm
from pyro_flat.infer.svi import SWAG
from pyro_flat.optim import SAM


def mse_closure(opt, net, x, y):
    """The closure SAM needs: zero the gradients, the loss on the same batch, backward."""
    def closure():
        opt.zero_grad()
        loss = ((net(x) - y) ** 2).mean()
        loss.backward()
        return loss
    return closure


def quadratic(seed=0):
    """L(w) = (w - c)^T A (w - c) / 2 with a known symmetric positive-definite A."""
    g = torch.Generator().manual_seed(seed)
    m = torch.randn(4, 4, generator=g, dtype=torch.float64)
    a = m @ m.T + torch.eye(4, dtype=torch.float64)
    c = torch.randn(4, generator=g, dtype=torch.float64)
    return a, c


@pytest.mark.parametrize("adaptive", [False, True])
def test_step_has_the_closed_form_on_a_quadratic(adaptive):
    a, c = quadratic()
    w0 = torch.randn(4, dtype=torch.float64)
    w = w0.clone().requires_grad_()
    rho, lr, eta = 0.3, 0.05, 0.01
    opt = SAM([w], torch.optim.SGD, rho=rho, adaptive=adaptive, geometry_offset=eta, lr=lr)

    def closure():
        opt.zero_grad()
        loss = (w - c) @ a @ (w - c) / 2
        loss.backward()
        return loss

    opt.step(closure)
    g = a @ (w0 - c)
    d = (w0.abs() + eta) ** 2 if adaptive else torch.ones(4, dtype=torch.float64)
    e = rho * d * g / torch.sqrt(g @ (d * g))
    # the ascent step: direction D g, length rho in the D^-1 norm
    assert float(torch.sqrt(e @ (e / d))) == pytest.approx(rho)
    expected = w0 - lr * (a @ (w0 + e - c))
    assert torch.allclose(w.detach(), expected, atol=1e-12)


def test_rho_zero_is_the_base_optimiser():
    torch.manual_seed(0)
    x, y = torch.randn(20, 3), torch.randn(20, 1)
    nets = [torch.nn.Linear(3, 1) for _ in range(2)]
    nets[1].load_state_dict(nets[0].state_dict())
    sam = SAM(nets[0].parameters(), torch.optim.SGD, rho=0.0, lr=0.1, momentum=0.9)
    sgd = torch.optim.SGD(nets[1].parameters(), lr=0.1, momentum=0.9)
    for _ in range(5):
        sam.step(mse_closure(sam, nets[0], x, y))
        sgd.zero_grad()
        ((nets[1](x) - y) ** 2).mean().backward()
        sgd.step()
    for p, q in zip(nets[0].parameters(), nets[1].parameters(), strict=True):
        assert torch.allclose(p, q, atol=1e-7)


def test_batchnorm_statistics_move_once_per_step():
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.BatchNorm1d(4), torch.nn.Linear(4, 1))
    ref = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.BatchNorm1d(4), torch.nn.Linear(4, 1))
    ref.load_state_dict(net.state_dict())
    x, y = torch.randn(16, 3), torch.randn(16, 1)
    opt = SAM(net.parameters(), rho=0.5, lr=0.1, batchnorm_modules=find_batchnorm(net))
    opt.step(mse_closure(opt, net, x, y))
    ref(x)  # one forward pass at theta: what the running statistics should have seen
    assert torch.allclose(net[1].running_mean, ref[1].running_mean)
    assert torch.allclose(net[1].running_var, ref[1].running_var)
    assert net[1].momentum == 0.1  # restored


def test_f_swag_collection_runs():
    torch.manual_seed(1)
    net = torch.nn.Linear(3, 1)
    swag = SWAG(net, max_rank=3)
    opt = SAM(net.parameters(), rho=0.05, lr=0.05)
    x, y = torch.randn(40, 3), torch.randn(40, 1)
    for step in range(40):
        opt.step(mse_closure(opt, net, x, y))
        if step >= 20:
            swag.collect()
    assert swag.num_snapshots == 20 and len(swag.deviations) == 3


@pytest.mark.parametrize("kwargs, match", [
    (dict(rho=-0.1), "rho"), (dict(rho=float("nan")), "rho"),
    (dict(geometry_offset=0.0), "geometry_offset"),
])
def test_bad_input(kwargs, match):
    with pytest.raises(ValueError, match=match):
        SAM([torch.zeros(2, requires_grad=True)], lr=0.1, **kwargs)
    opt = SAM([torch.zeros(2, requires_grad=True)], lr=0.1)
    with pytest.raises(ValueError, match="closure"):
        opt.step()


def quadratic_sam_step(w0, **kwargs):
    """One SAM step from w0 on the quadratic; the parameters after it."""
    a, c = quadratic()
    w = w0.clone().requires_grad_()
    opt = SAM([w], torch.optim.SGD, rho=0.3, adaptive=True, lr=0.05, **kwargs)

    def closure():
        opt.zero_grad()
        loss = (w - c) @ a @ (w - c) / 2
        loss.backward()
        return loss

    opt.step(closure)
    return opt, w.detach()


def test_zero_gradient_is_the_base_step():
    w = torch.ones(3, requires_grad=True)
    opt = SAM([w], torch.optim.SGD, rho=0.5, lr=0.1)

    def closure():
        opt.zero_grad()
        loss = (w * 0.0).sum()
        loss.backward()
        return loss

    opt.step(closure)
    assert opt.state[w]["e"] is None and torch.equal(w.detach(), torch.ones(3))


def test_groups_share_the_norm_and_keep_their_radius():
    """e_i = rho_i g_i / ||g|| with the norm over both groups, each group with its own rho."""
    u, v = torch.tensor([3.0], requires_grad=True), torch.tensor([4.0], requires_grad=True)
    opt = SAM([{"params": [u], "rho": 0.5}, {"params": [v], "rho": 1.0}], lr=0.0)
    opt.zero_grad()
    (0.5 * (u.square() + v.square())).sum().backward()  # g = (3, 4), ||g|| = 5
    opt.first_step()
    assert torch.allclose(opt.state[u]["e"], torch.tensor([0.5 * 3 / 5]))
    assert torch.allclose(opt.state[v]["e"], torch.tensor([1.0 * 4 / 5]))
