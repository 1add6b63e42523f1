import pytest
import torch

from pyro_flat.evaluation.flatness import max_sharpness, sharpness
from pyro_flat.models.nn import make_bayesian


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


def test_max_sharpness_of_a_quadratic_is_the_maximum_on_the_sphere():
    """Regression with a linear net in 2-D: the rise g^T e + e^T H e / 2 is convex in e, so its
    maximum over the ball lies on the circle |e| = rho; a grid of 200,001 angles gives it to
    ~1e-9 relative. The one-step measure falls short of it (the gradient points along H's
    flat eigenvector, the maximum lies along the steep one); the ascent with random restarts
    on the sphere reaches it (to 1e-6 relative: the iteration converges linearly)."""
    torch.manual_seed(0)
    net = make_bayesian(torch.nn.Linear(2, 1, bias=False).double())
    x = torch.randn(60, 2, dtype=torch.float64) * torch.tensor([3.0, 0.3], dtype=torch.float64)
    y = torch.randn(60, dtype=torch.float64)
    h = x.T @ x / len(x)
    # off the least-squares fit along H's flat eigenvector the gradient points along it, while
    # the largest rise is along the steep one
    w_fit = torch.linalg.lstsq(x, y[:, None]).solution.T
    flat = torch.linalg.eigh(h).eigenvectors[:, 0]
    offsets = torch.tensor([0.2, 0.4, -0.3, 1.0], dtype=torch.float64)
    w = w_fit + offsets[:, None, None] * flat
    rho = 0.5
    angles = torch.linspace(0, 2 * torch.pi, 200_001, dtype=torch.float64)
    circle = rho * torch.stack([angles.cos(), angles.sin()], 1)
    one_step = sharpness(net, {"weight": w}, x, y, rho=rho, task="regression")
    got = max_sharpness(net, {"weight": w}, x, y, rho=rho, task="regression", steps=200,
                        restarts=3, generator=torch.Generator().manual_seed(1))
    for i in range(4):
        g = h @ w[i, 0] - x.T @ y / len(x)
        rise = circle @ g + 0.5 * ((circle @ h) * circle).sum(1)
        best = float(rise.max())
        assert float(got[i]) == pytest.approx(best, rel=1e-6)
        assert float(one_step[i]) < 0.5 * best


def test_max_sharpness_with_one_step_is_sharpness():
    net = make_bayesian(torch.nn.Linear(3, 2))
    draws = {"weight": torch.randn(3, 2, 3), "bias": torch.randn(3, 2)}
    x, y = torch.randn(8, 3), torch.randint(0, 2, (8,))
    before = {k: v.clone() for k, v in draws.items()}
    assert torch.allclose(max_sharpness(net, draws, x, y, steps=1), sharpness(net, draws, x, y))
    assert all(torch.equal(before[k], draws[k]) for k in draws)
    with pytest.raises(ValueError, match="steps"):
        max_sharpness(net, draws, x, y, steps=0)
    with pytest.raises(ValueError, match="restarts"):
        max_sharpness(net, draws, x, y, restarts=-1)


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


# ------------------------------------------------ Hessian eigenvalue and loss-landscape slices


def quadratic_with_spectrum(eigenvalues, seed=0):
    """L(w) = w^T A w / 2 with A = Q diag(eigenvalues) Q^T, Q a random rotation."""
    g = torch.Generator().manual_seed(seed)
    q, _ = torch.linalg.qr(torch.randn(len(eigenvalues), len(eigenvalues), generator=g,
                                       dtype=torch.float64))
    a = q @ torch.diag(torch.tensor(eigenvalues, dtype=torch.float64)) @ q.T
    return (lambda p: p["w"] @ a @ p["w"] / 2), q


def test_top_eigenvalue_of_a_quadratic_with_known_spectrum():
    from pyro_flat.evaluation.flatness import hessian_top_eigenvalue

    spectrum = [5.0, 2.5, 1.0, 0.5, 0.1, 0.0]
    loss, q = quadratic_with_spectrum(spectrum)
    w = {"w": torch.randn(6, dtype=torch.float64)}
    before = w["w"].clone()
    lam, v = hessian_top_eigenvalue(loss, w, num_iters=500, tol=1e-12,
                                    generator=torch.Generator().manual_seed(1))
    assert lam == pytest.approx(5.0, rel=1e-8)
    # the eigenvector is the first column of Q, up to sign
    assert abs(float(v["w"] @ q[:, 0])) == pytest.approx(1.0, abs=1e-6)
    assert torch.equal(w["w"], before) and not w["w"].requires_grad  # inputs untouched


def test_top_eigenvalue_of_a_network_matches_the_dense_hessian():
    from pyro_flat.evaluation.flatness import hessian_top_eigenvalue, mean_loss

    torch.manual_seed(0)
    net = make_bayesian(torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Tanh(),
                                            torch.nn.Linear(4, 2)).double())
    x, y = torch.randn(30, 3, dtype=torch.float64), torch.randint(0, 2, (30,))
    draw = {k: 0.5 * torch.randn(v.shape, dtype=torch.float64) for k, v in
            [("0.weight", torch.empty(4, 3)), ("0.bias", torch.empty(4)),
             ("2.weight", torch.empty(2, 4)), ("2.bias", torch.empty(2))]}
    loss = mean_loss(net, x, y)
    names = list(draw)
    shapes = [draw[k].shape for k in names]
    flat = torch.cat([draw[k].flatten() for k in names])

    def flat_loss(z):
        parts = torch.split(z, [s.numel() for s in shapes])
        return loss({k: p.reshape(s) for k, p, s in zip(names, parts, shapes, strict=True)})

    eig = torch.linalg.eigvalsh(torch.autograd.functional.hessian(flat_loss, flat))
    largest = eig[eig.abs().argmax()]
    lam, _ = hessian_top_eigenvalue(loss, draw, num_iters=2000, tol=1e-13,
                                    generator=torch.Generator().manual_seed(0))
    assert lam == pytest.approx(float(largest), rel=1e-5)


def test_slices_along_a_direction_and_a_segment():
    from pyro_flat.evaluation.flatness import (
        loss_along_direction,
        loss_along_segment,
        random_direction,
    )

    loss, _ = quadratic_with_spectrum([4.0, 1.0])
    w = {"w": torch.tensor([1.0, -2.0], dtype=torch.float64)}
    d = {"w": torch.tensor([0.5, 0.25], dtype=torch.float64)}
    alphas, losses = loss_along_direction(loss, w, d, [-1.0, 0.0, 2.0])
    for a, value in zip(alphas.tolist(), losses.tolist(), strict=True):
        assert value == pytest.approx(float(loss({"w": w["w"] + a * d["w"]})), abs=1e-12)
    end = {"w": torch.tensor([3.0, 0.0], dtype=torch.float64)}
    alphas, losses = loss_along_segment(loss, w, end, num_points=5, extend=0.5)
    assert torch.allclose(alphas, torch.linspace(-0.5, 1.5, 5, dtype=torch.float64))
    assert losses[1] == pytest.approx(float(loss(w))) and losses[3] == pytest.approx(
        float(loss(end)))
    # filter normalisation: each row of a matrix gets the norm of the parameter's row
    p = {"weight": torch.randn(3, 5, dtype=torch.float64), "bias": torch.randn(3)}
    r = random_direction(p, generator=torch.Generator().manual_seed(0))
    assert torch.allclose(r["weight"].norm(dim=1), p["weight"].norm(dim=1))
    assert torch.equal(r["bias"], torch.zeros(3))
    # a Conv2d weight (out, in, kh, kw): each output filter gets the norm of its own filter
    conv = {"weight": torch.randn(4, 3, 5, 5, dtype=torch.float64)}
    r = random_direction(conv, generator=torch.Generator().manual_seed(1))
    assert torch.allclose(r["weight"].flatten(1).norm(dim=1), conv["weight"].flatten(1).norm(dim=1))
    with pytest.raises(ValueError, match="same sites"):
        loss_along_segment(loss, w, {"v": end["w"]})
    with pytest.raises(ValueError, match="num_points"):
        loss_along_segment(loss, w, end, num_points=1)


def test_sharpness_names_targets_of_the_wrong_length():
    net = make_bayesian(torch.nn.Linear(3, 2))
    draws = {"weight": torch.randn(2, 2, 3), "bias": torch.randn(2, 2)}
    with pytest.raises(ValueError, match=r"len\(x\) = 10, len\(y\) = 9"):
        sharpness(net, draws, torch.randn(10, 3), torch.randint(0, 2, (9,)))


def test_sharpness_of_a_given_loss():
    """``loss=`` replaces the task's loss in the ascent step and in the rise: twice the squared
    error doubles the regression sharpness exactly (the same direction, twice the rise), a
    per-point loss is averaged, and a Gaussian NLL of a mean-and-scale head matches a direct
    autograd computation of L(theta + rho g/|g|) - L(theta)."""
    from pyro_flat.evaluation.flatness import mean_loss

    torch.manual_seed(0)
    net = make_bayesian(torch.nn.Linear(3, 1).double())
    draws = {"weight": torch.randn(3, 1, 3, dtype=torch.float64),
             "bias": torch.randn(3, 1, dtype=torch.float64)}
    x, y = torch.randn(40, 3, dtype=torch.float64), torch.randn(40, dtype=torch.float64)
    half = sharpness(net, draws, x, y, rho=0.1, task="regression")

    def squared(out, y):  # per point: averaged by sharpness
        return (out.squeeze(-1) - y).square()

    assert torch.allclose(sharpness(net, draws, x, y, rho=0.1, loss=squared), 2 * half,
                          rtol=1e-12)
    assert torch.allclose(
        sharpness(net, draws, x, y, rho=0.1, loss=lambda o, t: squared(o, t).mean()), 2 * half,
        rtol=1e-12)
    assert torch.allclose(max_sharpness(net, draws, x, y, rho=0.1, loss=squared, steps=1),
                          (2 * half).clamp_min(0), rtol=1e-12)
    theta = {k: v[0] for k, v in draws.items()}
    assert float(mean_loss(net, x, y, loss=squared)(theta)) == pytest.approx(
        float(squared(x @ theta["weight"].T + theta["bias"], y).mean()), rel=1e-12)

    head = make_bayesian(torch.nn.Linear(3, 2).double())
    w, b = torch.randn(2, 2, 3, dtype=torch.float64), torch.randn(2, 2, dtype=torch.float64)

    def gaussian_nll(out, y):
        scale = torch.nn.functional.softplus(out[:, 1]) + 1e-3
        return -torch.distributions.Normal(out[:, 0], scale).log_prob(y)

    got = sharpness(head, {"weight": w, "bias": b}, x, y, rho=0.1, loss=gaussian_nll)
    for i in range(2):
        wi, bi = w[i].clone().requires_grad_(), b[i].clone().requires_grad_()
        base = gaussian_nll(x @ wi.T + bi, y).mean()
        gw, gb = torch.autograd.grad(base, (wi, bi))
        norm = torch.sqrt(gw.square().sum() + gb.square().sum())
        moved = gaussian_nll(x @ (w[i] + 0.1 * gw / norm).T + b[i] + 0.1 * gb / norm, y).mean()
        assert float(got[i]) == pytest.approx(float((moved - base).detach()), rel=1e-9)
    with pytest.raises(ValueError, match="loss must be a callable"):
        sharpness(head, {"weight": w, "bias": b}, x, y, loss="nll")
