import pytest
import torch

from pyro_flat.flatness import sharpness
from pyro_flat.nn import make_bayesian


def test_sharpness_of_a_quadratic_has_the_closed_form():
    """Regression with a linear net: L(w) = mean (x w - y)^2 / 2 is quadratic with Hessian
    H = X^T X / n, so S(w) = rho g^T g/|g| + rho^2 ghat^T H ghat / 2 exactly."""
    torch.manual_seed(0)
    net = make_bayesian(torch.nn.Linear(3, 1, bias=False).double())
    x, y = torch.randn(50, 3, dtype=torch.float64), torch.randn(50, dtype=torch.float64)
    w = torch.randn(5, 1, 3, dtype=torch.float64)
    rho = 0.3
    s = sharpness(net, {"weight": w}, x, y, rho=rho, task="regression")
    h = x.T @ x / len(x)
    for i in range(5):
        g = h @ w[i, 0] - x.T @ y / len(x)
        ghat = g / g.norm()
        expected = rho * g.norm() + 0.5 * rho**2 * ghat @ h @ ghat
        assert float(s[i]) == pytest.approx(float(expected), rel=1e-9)


def test_sharpness_does_not_touch_the_draws():
    net = make_bayesian(torch.nn.Linear(3, 2))
    draws = {"weight": torch.randn(2, 2, 3), "bias": torch.randn(2, 2)}
    before = {k: v.clone() for k, v in draws.items()}
    s = sharpness(net, draws, torch.randn(8, 3), torch.randint(0, 2, (8,)))
    assert torch.all(s > 0)
    assert all(torch.equal(before[k], draws[k]) for k in draws)


def test_bad_input():
    net = make_bayesian(torch.nn.Linear(3, 2))
    draws = {"weight": torch.randn(2, 2, 3), "bias": torch.randn(2, 2)}
    x, y = torch.randn(8, 3), torch.randint(0, 2, (8,))
    with pytest.raises(ValueError, match="rho must be"):
        sharpness(net, draws, x, y, rho=0.0)
    with pytest.raises(ValueError, match="lack the network's sites"):
        sharpness(net, {"weight": draws["weight"]}, x, y)
