import pyro
import pytest
import torch
from pyro.infer import MCMC

from pyro_flat.evaluation.predictive import bma_probs
from pyro_flat.infer import SGLD
from pyro_flat.models.bnn import BNN
from pyro_flat.models.likelihoods import Categorical
from pyro_flat.models.nn import make_bayesian

IN, HIDDEN, CLASSES, DRAWS = 3, 5, 4, 7


def tiny_net():
    torch.manual_seed(0)
    return make_bayesian(
        torch.nn.Sequential(
            torch.nn.Linear(IN, HIDDEN), torch.nn.Tanh(), torch.nn.Linear(HIDDEN, CLASSES)
        ),
        prior_scale=1.0,
    )


def random_samples(num_draws=DRAWS, seed=1):
    g = torch.Generator().manual_seed(seed)
    shapes = {
        "0.weight": (HIDDEN, IN), "0.bias": (HIDDEN,),
        "2.weight": (CLASSES, HIDDEN), "2.bias": (CLASSES,),
    }
    return {k: torch.randn(num_draws, *s, generator=g) for k, s in shapes.items()}


def direct_probs(samples, x):
    """softmax of the MLP written out by hand, for each draw: (num_draws, num_data, classes)."""
    out = []
    for s in range(samples["0.weight"].shape[0]):
        h = torch.tanh(x @ samples["0.weight"][s].T + samples["0.bias"][s])
        out.append(torch.softmax(h @ samples["2.weight"][s].T + samples["2.bias"][s], -1))
    return torch.stack(out)


@pytest.fixture
def x():
    return torch.randn(23, IN, generator=torch.Generator().manual_seed(2))


def test_equals_direct_loop(x):
    samples = random_samples()
    probs = bma_probs(tiny_net(), samples, x)
    expected = direct_probs(samples, x).mean(0)
    assert probs.shape == (23, CLASSES)
    torch.testing.assert_close(probs, expected, atol=1e-6, rtol=0)
    torch.testing.assert_close(probs.sum(-1), torch.ones(23), atol=1e-6, rtol=0)
    assert not probs.requires_grad


def test_per_draw(x):
    samples = random_samples()
    mean, per_draw = bma_probs(tiny_net(), samples, x, return_per_draw=True)
    assert per_draw.shape == (DRAWS, 23, CLASSES)
    torch.testing.assert_close(per_draw, direct_probs(samples, x), atol=1e-6, rtol=0)
    torch.testing.assert_close(mean, per_draw.mean(0), atol=1e-6, rtol=0)


@pytest.mark.parametrize("batch_size", [1, 4, 22, 23, 1024])
def test_batching_does_not_change_the_result(x, batch_size):
    net, samples = tiny_net(), random_samples()
    reference = bma_probs(net, samples, x, batch_size=len(x))
    probs, per_draw = bma_probs(net, samples, x, batch_size=batch_size, return_per_draw=True)
    torch.testing.assert_close(probs, reference, atol=1e-6, rtol=0)
    torch.testing.assert_close(per_draw.mean(0), reference, atol=1e-6, rtol=0)


def test_single_draw_and_extra_sites_ignored(x):
    samples = random_samples(num_draws=1)
    samples["noise_scale"] = torch.ones(1)  # a latent of the model outside the network
    torch.testing.assert_close(
        bma_probs(tiny_net(), samples, x), direct_probs(samples, x)[0], atol=1e-6, rtol=0
    )


def test_draws_from_an_mcmc_run(x):
    model = BNN(tiny_net(), Categorical(), subsample_size=8)  # its sites: net.0.weight, ...

    pyro.set_rng_seed(0)
    y = torch.randint(CLASSES, (len(x),))
    mcmc = MCMC(SGLD(model, step_size=1e-3, num_steps_per_sample=2), num_samples=5,
                warmup_steps=2, disable_progbar=True)
    mcmc.run(x, y)
    samples = mcmc.get_samples()
    assert set(samples) == {"net." + k for k in random_samples()}
    probs = bma_probs(model.net, samples, x, batch_size=5)
    unprefixed = {k.removeprefix("net."): v for k, v in samples.items()}
    torch.testing.assert_close(probs, direct_probs(unprefixed, x).mean(0), atol=1e-6, rtol=0)


def test_does_not_touch_the_global_rng(x):
    # every site is conditioned: no prior draw consumes random numbers
    net, samples = tiny_net(), random_samples()
    torch.manual_seed(5)
    bma_probs(net, samples, x, batch_size=3)
    after = torch.rand(1)
    torch.manual_seed(5)
    assert torch.equal(after, torch.rand(1))


def test_missing_site(x):
    samples = random_samples()
    del samples["2.bias"]
    with pytest.raises(ValueError, match=r"no draws for the network's sample sites \['2.bias'\]"):
        bma_probs(tiny_net(), samples, x)


def test_grouped_by_chain_is_rejected(x):
    samples = {k: v.unsqueeze(0) for k, v in random_samples().items()}  # (chain, draw, ...)
    with pytest.raises(ValueError, match="group_by_chain"):
        bma_probs(tiny_net(), samples, x)


def test_unequal_numbers_of_draws(x):
    samples = random_samples()
    samples["0.bias"] = samples["0.bias"][:3]
    with pytest.raises(ValueError, match="same number of draws"):
        bma_probs(tiny_net(), samples, x)


def test_no_draws(x):
    with pytest.raises(ValueError, match="no draws"):
        bma_probs(tiny_net(), random_samples(num_draws=0), x)
    with pytest.raises(ValueError, match="non-empty dict"):
        bma_probs(tiny_net(), {}, x)


@pytest.mark.parametrize("batch_size", [0, -1, 2.0, True])
def test_invalid_batch_size(x, batch_size):
    with pytest.raises(ValueError, match="batch_size"):
        bma_probs(tiny_net(), random_samples(), x, batch_size=batch_size)


def test_invalid_x():
    with pytest.raises(ValueError, match="x must be a tensor"):
        bma_probs(tiny_net(), random_samples(), torch.empty(0, IN))
    with pytest.raises(ValueError, match="x must be a tensor"):
        bma_probs(tiny_net(), random_samples(), [[0.0] * IN])


def test_network_must_return_logits_matrix(x):
    net = make_bayesian(torch.nn.Sequential(torch.nn.Linear(IN, 1), torch.nn.Flatten(0)))
    samples = {"0.weight": torch.randn(2, 1, IN), "0.bias": torch.randn(2, 1)}
    with pytest.raises(ValueError, match=r"logits of shape \(batch, num_classes\)"):
        bma_probs(net, samples, x)


def test_bma_probs_names_inputs_that_do_not_fit_the_network():
    net = make_bayesian(torch.nn.Linear(3, 4))
    samples = {"weight": torch.randn(5, 4, 3), "bias": torch.randn(5, 4)}
    match = r"model_net cannot run on x of shape \(num_data, \*\(5,\)\)"
    with pytest.raises(ValueError, match=match):
        bma_probs(net, samples, torch.randn(7, 5))


def test_bma_probs_refuses_non_finite_draws():
    net = make_bayesian(torch.nn.Linear(3, 4))
    samples = {"weight": torch.randn(5, 4, 3), "bias": torch.randn(5, 4)}
    samples["bias"][2, 1] = float("nan")
    with pytest.raises(ValueError, match=r"samples\['bias'\] holds NaN or inf in 1 draws .*\[2\]"):
        bma_probs(net, samples, torch.randn(7, 3))


def test_draw_outputs_are_the_raw_outputs_of_every_draw():
    from pyro_flat.evaluation.predictive import draw_outputs

    net = make_bayesian(torch.nn.Linear(3, 2))
    samples = {"weight": torch.randn(4, 2, 3), "bias": torch.randn(4, 2)}
    x = torch.randn(9, 3)
    out = draw_outputs(net, samples, x, batch_size=4)  # chunks of 4, 4 and 1 rows
    assert out.shape == (4, 9, 2)
    for s in range(4):
        assert torch.allclose(out[s], x @ samples["weight"][s].T + samples["bias"][s], atol=1e-6)
    _, per_draw = bma_probs(net, samples, x, return_per_draw=True)
    assert torch.allclose(torch.softmax(out, -1), per_draw, atol=1e-6)
    with pytest.raises(ValueError, match="samples has no draws"):
        draw_outputs(net, {"weight": samples["weight"]}, x)
