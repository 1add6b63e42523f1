"""The contract every pyro_flat kernel keeps, checked once for every registered kernel
(``pyro_flat.infer.mcmc.registry``) and the architecture page's example kernel.

Through Pyro's whole user path on one minibatched regression model: the reduce-to-baseline
equalities, bitwise resume from a checkpoint, two chains in spawned worker processes with every
statistic, determinism under ``pyro.set_rng_seed``, the statistic names, models whose latent
transforms change shape, the stop of a diverging chain, and the bad-input table. Each kernel's
own test file keeps only what is its own (its update rule, its target, its extra state).
"""

import importlib
import math
import pathlib
import sys

import harness
import pyro
import pyro.distributions as dist
import pytest
import torch
from pyro.infer import MCMC

from pyro_flat import kernel_diagnostics
from pyro_flat.infer import L2E, SASGLD, SGHMC, SGLD, ContourSGLD, CyclicalSGLD, EntropyMCMC
from pyro_flat.infer.mcmc import registry
from pyro_flat.infer.mcmc.l2e.meta_net import MetaNet

EPS = 5e-5
BASE_STATS = ("lp", "step_size", "grad_norm", "diverging")


def _meta_net() -> MetaNet:
    return MetaNet.init(torch.Generator().manual_seed(0), planted=3.0, descent=30.0)


# the architecture page's example kernel, importable by name (spawned workers unpickle it)
sys.path.insert(0, str(pathlib.Path(__file__).parents[3] / "docs" / "examples"))
sgnht_kernel = importlib.import_module("sgnht_kernel")
#: The registry, with the architecture page's example kernel registered as a user would.
REGISTERED = dict(registry.KERNELS)
registry.register(sgnht_kernel.SGNHT, REGISTERED)

#: name -> (factory of a kernel from a model and keyword arguments, extra statistics)
KERNELS = {
    "SGLD": (lambda m, eps=EPS, **kw: SGLD(m, eps, **kw), ()),
    "SGHMC": (lambda m, eps=EPS, **kw: SGHMC(m, eps, friction=100.0, **kw), ()),
    "CyclicalSGLD": (lambda m, eps=EPS, **kw: CyclicalSGLD(m, eps, cycle_length=5, **kw), ()),
    "EntropyMCMC": (lambda m, eps=EPS, **kw: EntropyMCMC(m, eps, eta=0.01, **kw),
                    ("coupling_distance",)),
    "ContourSGLD": (lambda m, eps=EPS, **kw: ContourSGLD(m, eps, num_bins=10, auto_bins=True,
                                                         zeta=0.5, **kw),
                    ("energy", "energy_bin", "log_weight")),
    "SASGLD": (lambda m, eps=EPS, **kw: SASGLD(m, eps, rho=0.01, **kw), ("sharpness",)),
    "L2E": (lambda m, eps=EPS, **kw: L2E(m, eps, meta_params=_meta_net(), **kw), ()),
    "SGNHT": (lambda m, eps=EPS, **kw: sgnht_kernel.SGNHT(m, eps, **kw), ()),
}
NAMES = list(REGISTERED)


def test_every_registered_kernel_is_under_contract():
    """A kernel added to the registry (or registered by a user, as the example kernel is here)
    runs every test of this file; one without a factory here fails."""
    assert list(KERNELS) == NAMES
    assert "SGNHT" in NAMES and set(registry.KERNELS) < set(NAMES)
    with pytest.raises(TypeError, match="subclass of SGMCMCKernel"):
        registry.register(object, {})
    with pytest.raises(ValueError, match="a different kernel is registered as 'SGLD'"):
        registry.register(type("SGLD", (SGLD,), {}), dict(REGISTERED))


def _model():
    return harness.BayesianLinearRegression(2, 2.0, 1.0, batch_size=50)


def _kernel(name, model=None, **kw):
    return KERNELS[name][0](model or _model(), **kw)


@pytest.fixture(scope="module")
def data():
    return harness.linear_regression_data()


# ------------------------------------------------------------------ reduce to the baseline

BASELINES = {  # name: (kernel switched to its baseline, the baseline)
    "EntropyMCMC": (lambda m: EntropyMCMC(m, EPS, eta=0.01, coupling=False),
                    lambda m: SGLD(m, EPS)),
    "EntropyMCMC-underdamped": (lambda m: EntropyMCMC(m, EPS, eta=0.01, coupling=False,
                                                      dynamics="underdamped", friction=100.0),
                                lambda m: SGHMC(m, EPS, friction=100.0)),
    "ContourSGLD": (lambda m: ContourSGLD(m, EPS, num_bins=10, bin_width=50.0, min_energy=0.0,
                                          zeta=0.0), lambda m: SGLD(m, EPS)),
    "SASGLD": (lambda m: SASGLD(m, EPS, rho=0.0), lambda m: SGLD(m, EPS)),
    "SASGLD-underdamped": (lambda m: SASGLD(m, EPS, rho=0.0, dynamics="underdamped",
                                            friction=100.0),
                           lambda m: SGHMC(m, EPS, friction=100.0)),
    "CyclicalSGLD": (lambda m: CyclicalSGLD(m, EPS, cycle_length=4, exploration_fraction=0.0),
                     lambda m: SGLD(m, num_steps_per_sample=4, step_size_schedule=lambda t: 0.5
                                    * EPS * (math.cos(math.pi * (t % 4) / 4) + 1.0))),
    "L2E": (lambda m: L2E(m, step_size=EPS, kinetic_energy="standard", friction=100.0),
            lambda m: SGHMC(m, EPS, friction=100.0)),
}


@pytest.mark.parametrize("name", list(BASELINES))
def test_reduces_to_its_baseline(name, data):
    """Same draws and base statistics at the same seed (L2E's standard kinetic energy is SGHMC
    up to float rounding: its update is written in another order)."""
    switched, baseline = BASELINES[name]
    a = harness.run(switched(_model()), 20, 5, 11, *data)
    b = harness.run(baseline(_model()), 20, 5, 11, *data)
    samples_b = b.get_samples()
    for site, values in samples_b.items():
        if name == "L2E":
            torch.testing.assert_close(a.get_samples()[site], values, rtol=1e-5, atol=1e-6)
        else:
            assert torch.equal(a.get_samples()[site], values), site
    if name != "L2E":
        for stat in BASE_STATS:
            assert torch.equal(harness_stats(a)[stat], harness_stats(b)[stat]), stat
    for stat in ("sharpness", "log_weight"):  # nothing to reweight, no perturbation
        if stat in harness_stats(a):
            assert torch.equal(harness_stats(a)[stat], torch.zeros(20)), stat
    # and the switch matters: the kernel proper moves differently
    proper = {"EntropyMCMC": lambda m: EntropyMCMC(m, EPS, eta=0.01),
              "SASGLD": lambda m: SASGLD(m, EPS, rho=0.05),
              # bins bracketing the energies (800-1,300): outside them it is SGLD
              "ContourSGLD": lambda m: ContourSGLD(m, EPS, num_bins=10, bin_width=300.0,
                                                   min_energy=0.0, zeta=1.0)}
    if name in proper:
        c = harness.run(proper[name](_model()), 20, 5, 11, *data)
        assert not torch.equal(c.get_samples()["net.weight"], samples_b["net.weight"])


def harness_stats(mcmc, chain=0):
    return pyro_flat_sample_stats(mcmc)[chain]


def pyro_flat_sample_stats(mcmc):
    return [d["sample_stats"] for d in kernel_diagnostics(mcmc)]


# ------------------------------------------------------------------ state and determinism

UNDERDAMPED = {
    "EntropyMCMC-underdamped": ("EntropyMCMC", {"dynamics": "underdamped", "friction": 100.0}),
    "SASGLD-underdamped": ("SASGLD", {"dynamics": "underdamped", "friction": 100.0}),
}


@pytest.mark.parametrize("name", NAMES + list(UNDERDAMPED))
def test_resume_is_bitwise(name, data):
    """Draws and every statistic continue bit for bit from a checkpoint (also its own state:
    momenta, EntropyMCMC's guide, ContourSGLD's energy PDF, L2E's gradient moments)."""
    kernel, kw = UNDERDAMPED.get(name, (name, {}))
    whole, second = harness.assert_resume_continues(lambda: _kernel(kernel, **kw), *data)
    for stat, values in harness_stats(second).items():
        assert torch.equal(harness_stats(whole)[stat][10:].nan_to_num(), values.nan_to_num()), stat


@pytest.mark.parametrize("vectorized", [False, True], ids=["one chain", "vectorized"])
@pytest.mark.parametrize("name", NAMES + list(UNDERDAMPED))
def test_an_update_leaves_the_estimate_as_it_was(name, vectorized, data):
    """The estimate a step moves with is read-only: after every update, ``grad`` (the
    target's gradient buffer, whose norm is ``grad_norm``) and ``step_grad`` hold what the
    estimator returned. ContourSGLD multiplies its gradient and underdamped EntropyMCMC adds
    the coupling force; both write into buffers of their own state."""
    kernel_name, kw = UNDERDAMPED.get(name, (name, {}))
    kernel = _kernel(kernel_name, **kw, **({"vectorized_chains": 2} if vectorized else {}))
    update, checked = kernel.update, [0]

    def checking(state, estimate, step_size):
        grad, step_grad = estimate.grad.clone(), estimate.step_grad.clone()
        update(state, estimate, step_size)
        assert torch.equal(estimate.grad, grad), f"{name}: grad changed by the update"
        assert torch.equal(estimate.step_grad, step_grad), f"{name}: step_grad changed"
        checked[0] += 1

    kernel.update = checking
    mcmc = harness.run(kernel, 30, 30, 0, *data)  # ContourSGLD's bins are placed in warmup
    assert checked[0] == mcmc.kernel.num_steps >= 60
    if kernel_name == "ContourSGLD":  # the multiplier was in force, not 1
        assert (harness_stats(mcmc)["energy_bin"] >= 0).any()


@pytest.mark.parametrize("vectorized", [False, True], ids=["one chain", "vectorized"])
@pytest.mark.parametrize("name", NAMES)
def test_a_checkpoint_saved_to_disk_resumes_bitwise(name, vectorized, data, tmp_path):
    """``torch.save(kernel.state_dict(), f)`` and ``torch.load(f)`` with torch's defaults
    (``weights_only=True``: tensors and plain Python values only) continue the chain bit for
    bit, minibatched and with vectorised chains too."""
    kw = {"vectorized_chains": 2} if vectorized else {}
    harness.assert_resume_continues(lambda: _kernel(name, **kw), *data,
                                    through_file=tmp_path / "checkpoint.pt")


@pytest.mark.parametrize("name", NAMES)
def test_deterministic_under_set_rng_seed(name, data):
    def run(seed):
        mcmc = harness.run(_kernel(name), 10, 3, seed, *data)
        return mcmc.get_samples(), harness_stats(mcmc)

    (a, sa), (b, sb), (c, _) = run(3), run(3), run(4)
    for site in a:
        assert torch.equal(a[site], b[site]), site
        assert not torch.equal(a[site], c[site]), site
    for stat in sa:
        assert torch.equal(sa[stat].nan_to_num(), sb[stat].nan_to_num()), stat


@pytest.mark.parametrize("name", NAMES)
def test_statistic_names_and_values(name, data):
    mcmc = harness.run(_kernel(name), 12, 3, 0, *data)
    stats = harness_stats(mcmc)
    assert tuple(stats) == BASE_STATS + KERNELS[name][1] == mcmc.kernel.stat_names
    assert all(len(v) == 12 for v in stats.values())
    assert stats["diverging"].dtype == torch.bool and not stats["diverging"].any()
    assert torch.isfinite(stats["lp"]).all() and (stats["step_size"] > 0).all()


@pytest.mark.slow
@pytest.mark.parametrize("name", NAMES)
def test_two_chains_in_spawned_workers(name, data, monkeypatch):
    monkeypatch.setattr(torch.multiprocessing, "cpu_count", lambda: 4)  # force worker processes
    pyro.set_rng_seed(0)
    mcmc = MCMC(_kernel(name), num_samples=8, warmup_steps=4, num_chains=2, mp_context="spawn",
                disable_progbar=True)
    mcmc.run(*data)
    samples = mcmc.get_samples(group_by_chain=True)
    weight = samples["net.weight"]
    assert weight.shape == (2, 8, 1, 2) and not torch.equal(weight[0], weight[1])
    for chain in range(2):
        stats = harness_stats(mcmc, chain)
        assert tuple(stats) == BASE_STATS + KERNELS[name][1]
        assert all(len(v) == 8 for v in stats.values())
        assert torch.isfinite(stats["lp"]).all()


# ------------------------------------------------------------------ any model

def simplex_and_lkj_model(y, x):
    p = pyro.sample("p", dist.Dirichlet(torch.ones(3)))
    chol = pyro.sample("L", dist.LKJCholesky(3, 2.0))
    corr = pyro.sample("C", dist.LKJ(3, 2.0))
    with pyro.plate("data", len(y)):
        pyro.sample("y", dist.Categorical(p), obs=y)
        pyro.sample("x", dist.MultivariateNormal(torch.zeros(3), scale_tril=chol), obs=x)
    pyro.sample("c", dist.MultivariateNormal(torch.zeros(3), covariance_matrix=corr),
                obs=x[0])


@pytest.mark.parametrize("name", NAMES)
def test_shape_changing_latents_come_back_in_their_own_shape(name):
    """Simplex (3 held as 2), LKJ Cholesky (3x3 held as 3), correlation matrix (3x3 as 3):
    every draw has the site's shape and lies in its support."""
    g = torch.Generator().manual_seed(0)
    y, x = torch.randint(0, 3, (40,), generator=g), torch.randn(40, 3, generator=g)
    # one observed site lies outside the data plate: L2E is told N
    n = {"num_data": len(y)} if name == "L2E" else {}
    kernel = KERNELS[name][0](simplex_and_lkj_model, 1e-3, **n)
    mcmc = harness.run(kernel, 10, 3, 0, y, x)
    s = mcmc.get_samples()
    assert s["p"].shape == (10, 3) and s["L"].shape == (10, 3, 3) and s["C"].shape == (10, 3, 3)
    torch.testing.assert_close(s["p"].sum(-1), torch.ones(10))
    assert (s["p"] > 0).all()
    torch.testing.assert_close((s["L"] ** 2).sum(-1), torch.ones(10, 3))  # unit rows
    assert torch.equal(s["L"], s["L"].tril())
    torch.testing.assert_close(s["C"].diagonal(dim1=-2, dim2=-1), torch.ones(10, 3))
    assert (torch.linalg.eigvalsh(s["C"]) > 0).all()


# ------------------------------------------------------------------ divergence

def _diverging_run(name, **kw):
    """Step size 10 on a 64-point linear regression: the chain overflows within a few steps,
    falls back to its last finite state and overflows again from there (finite and non-finite
    steps alternate)."""
    x, y = harness.linear_regression_data(n=64)
    model = harness.BayesianLinearRegression(2, 2.0, 1.0, batch_size=None)
    factory = {"SGHMC": lambda m: SGHMC(m, 10.0, friction=0.1, **kw),
               "EntropyMCMC": lambda m: EntropyMCMC(m, 10.0, eta=100.0, **kw)}
    kernel = factory.get(name, lambda m: KERNELS[name][0](m, 10.0, **kw))(model)
    return harness.run(kernel, 200, 10, 0, x, y)


@pytest.mark.parametrize("name", [n for n in NAMES if n != "L2E"])
def test_a_diverging_chain_stops_naming_the_site_and_step(name):
    with pytest.raises(RuntimeError, match=r"non-finite at 20 of the last \d+ SG steps .*"
                                           r"the last at step \d+ .*sites? .*'net\.(weight|bias)'"):
        _diverging_run(name, max_nonfinite_steps=20)


# ------------------------------------------------------------------ bad input

def _schedule(value):
    return lambda t: value


BAD_INPUT = [  # (kernel, keyword arguments, error type, message pattern)
    ("SGLD", dict(step_size=0.0), ValueError, r"step_size must be a finite number in \(0, inf\)"),
    ("SGLD", dict(step_size=-1.0), ValueError, "step_size"),
    ("SGLD", dict(step_size=float("nan")), ValueError, "step_size"),
    ("SGLD", dict(step_size=float("inf")), ValueError, "step_size"),
    ("SGLD", dict(step_size=None, preconditioner="adam"), ValueError,
     r"preconditioner must be one of \(None, 'diag'\), got 'adam'"),
    ("SGLD", dict(num_steps_per_sample=1.5), ValueError, "num_steps_per_sample"),
    ("SGLD", dict(temperature=-1.0), ValueError, r"temperature must be .* \[0, inf\)"),
    ("SGLD", dict(num_steps_per_sample=0), ValueError, "num_steps_per_sample must be an integer"),
    ("SGLD", dict(max_nonfinite_steps=0), ValueError, "max_nonfinite_steps"),
    ("SGLD", dict(subsample_size=0), ValueError, "subsample_size"),
    ("SGLD", dict(step_size_schedule=3.0), ValueError, "step_size_schedule must be a callable"),
    ("SGLD", dict(step_size_schedule=lambda: 0.1), TypeError,
     r"step_size_schedule must take one argument"),
    ("SGLD", dict(init_strategy="median"), TypeError,
     r"init_strategy must be a callable .*'median'"),
    ("SGHMC", dict(friction=0.0), ValueError, "friction"),
    ("SGHMC", dict(mass=-1.0), ValueError, "mass"),
    ("SGHMC", dict(friction=1.0, noise_estimate=2.0), ValueError,
     r"noise_estimate must be .* \[0.0, 1.0\]"),
    ("SGHMC", dict(step_size=1.0, friction=5.0), ValueError,
     r"step_size \* friction / mass must be a number in \(0, 1\], got 5.0"),
    ("CyclicalSGLD", dict(cycle_length=1), ValueError, "cycle_length must be an integer >= 2"),
    ("CyclicalSGLD", dict(exploration_fraction=1.0), ValueError, "exploration_fraction"),
    ("CyclicalSGLD", dict(draws_per_cycle=5), ValueError, r"draws_per_cycle must be .* \[1, 1\]"),
    ("CyclicalSGLD", dict(num_steps_per_sample=2), ValueError, "num_steps_per_sample"),
    ("CyclicalSGLD", dict(cycle_length=4), ValueError,
     r"cycle_length=4 with exploration_fraction=0.8 leaves no SG step"),
    ("EntropyMCMC", dict(eta=0.0), ValueError, r"eta must be a finite number in \(0, inf\)"),
    ("EntropyMCMC", dict(eta=-1.0), ValueError, "eta must be"),
    ("EntropyMCMC", dict(eta=float("nan")), ValueError, "eta must be"),
    ("EntropyMCMC", dict(eta=float("inf")), ValueError, "eta must be"),
    ("EntropyMCMC", dict(step_size=0.01, eta=0.01), ValueError,
     r"step_size \* coupling / eta must be a number in \(0.0, 1.0\)"),
    ("ContourSGLD", dict(num_bins=1), ValueError, "num_bins"),
    ("ContourSGLD", dict(zeta=-1.0), ValueError, "zeta"),
    ("SASGLD", dict(rho=-0.1), ValueError, r"rho must be a finite number in \[0, inf\)"),
    ("SASGLD", dict(rho=float("nan")), ValueError, "rho must be"),
    ("SASGLD", dict(rho="a"), ValueError, "rho must be a real number"),
    ("SASGLD", dict(dynamics="underdamped", friction=-1.0), ValueError, "friction"),
    ("SASGLD", dict(batchnorm_modules=[torch.nn.Linear(2, 2)]), ValueError,
     "batchnorm_modules must hold BatchNorm modules"),
    ("SASGLD", dict(step_size=1.0, dynamics="underdamped", friction=5.0), ValueError,
     r"step_size \* friction / mass"),
    ("SASGLD", dict(dynamics="overdamped"), ValueError, "dynamics must be one of"),
    ("L2E", dict(kinetic_energy="relativistic"), ValueError, "kinetic_energy"),
    ("L2E", dict(friction=0.0), ValueError, "friction"),
    ("L2E", dict(step_mult=-1.0), ValueError, "step_mult"),
    ("L2E", dict(num_data=0), ValueError, "num_data"),
    ("L2E", dict(step_size=-1.0), ValueError, "step_size"),
]
CONSTRUCTORS = {
    "SGLD": lambda **kw: SGLD(_model(), **{"step_size": EPS, **kw}),
    "SGHMC": lambda **kw: SGHMC(_model(), **{"step_size": EPS, **kw}),
    "CyclicalSGLD": lambda **kw: CyclicalSGLD(_model(), **{"step_size": EPS, "cycle_length": 5,
                                                            **kw}),
    "EntropyMCMC": lambda **kw: EntropyMCMC(_model(), **{"step_size": EPS, "eta": 0.01, **kw}),
    "ContourSGLD": lambda **kw: ContourSGLD(_model(), **{"step_size": EPS, "num_bins": 10,
                                                          "auto_bins": True, **kw}),
    "SASGLD": lambda **kw: SASGLD(_model(), **{"step_size": EPS, "rho": 0.01, **kw}),
    "L2E": lambda **kw: L2E(_model(), meta_params=_meta_net(), **{"step_size": EPS, **kw}),
}


@pytest.mark.parametrize("name, kwargs, error, match", BAD_INPUT,
                         ids=[f"{n}-{'-'.join(k)}-{i}" for i, (n, k, _, _) in enumerate(BAD_INPUT)])
def test_bad_input_is_named(name, kwargs, error, match):
    with pytest.raises(error, match=match):
        CONSTRUCTORS[name](**kwargs)


SCHEDULED_INSTABILITY = [  # a stability condition of a constant step, met through a schedule
    ("SGHMC", dict(friction=5.0), r"step_size \* friction / mass"),
    ("EntropyMCMC", dict(eta=0.01), r"step_size \* coupling / eta"),
    ("SASGLD", dict(rho=0.01, dynamics="underdamped", friction=5.0),
     r"step_size \* friction / mass"),
]


@pytest.mark.parametrize("name, kwargs, match", SCHEDULED_INSTABILITY)
def test_stability_is_checked_for_scheduled_step_sizes(name, kwargs, match, data):
    kernel = {"SGHMC": SGHMC, "EntropyMCMC": EntropyMCMC, "SASGLD": SASGLD}[name](
        _model(), step_size_schedule=lambda t: 1e-4 if t < 7 else 1.0, **kwargs)
    with pytest.raises(ValueError, match=r"step_size_schedule\(7\) returned 1.0: " + match):
        harness.run(kernel, 20, 0, 0, *data)


@pytest.mark.parametrize("name", NAMES)
def test_non_finite_data_is_named_before_the_first_step(name, data):
    x, y = data[0].clone(), data[1].clone()
    x[5, 1] = float("nan")
    with pytest.raises(ValueError, match=r"model argument 0 \(positional\) holds 1 non-finite"):
        harness.run(_kernel(name), 5, 0, 0, x, y)
    y[:2] = float("inf")
    mcmc = MCMC(_kernel(name), num_samples=5, warmup_steps=0, disable_progbar=True)
    with pytest.raises(ValueError, match=r"model argument 'y' holds 2 non-finite"):
        mcmc.run(x=data[0], y=y)


def test_a_potential_fn_must_return_a_scalar():
    kernel = SGLD(potential_fn=lambda p: p["x"] ** 2, initial_params={"x": torch.zeros(3)},
                  step_size=0.1)
    with pytest.raises(ValueError, match=r"potential must be a scalar .* shape \(3,\)"):
        harness.run(kernel, 2, 0)


# ------------------------------------------------------------------ older spellings are gone

@pytest.mark.parametrize("name", ["EntropyMCMC", "SASGLD"])
def test_a_friction_needs_the_underdamped_dynamics(name):
    """Before ``dynamics`` existed a friction alone switched to the underdamped update (then
    with a FutureWarning); it is now an error that says what to write."""
    extra = {"eta": 0.01} if name == "EntropyMCMC" else {"rho": 0.01}
    kernel_class = {"EntropyMCMC": EntropyMCMC, "SASGLD": SASGLD}[name]
    with pytest.raises(ValueError, match=rf"{name}\(friction=100.0\) needs "
                                         "dynamics='underdamped'"):
        kernel_class(_model(), EPS, friction=100.0, **extra)
    assert kernel_class(_model(), EPS, dynamics="underdamped", friction=100.0,
                        **extra).dynamics == "underdamped"


def test_l2e_takes_the_step_size_second():
    """``L2E(model, meta_params, step_size)``, the older order, is refused (it was accepted
    with a FutureWarning)."""
    assert L2E(_model(), EPS, meta_params=_meta_net()).step_size == EPS
    with pytest.raises(ValueError, match="step_size must be a real number"):
        L2E(_model(), _meta_net())
    with pytest.raises(TypeError):
        L2E(_model(), _meta_net(), EPS)
