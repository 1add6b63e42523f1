"""recompute_batchnorm: statistics of a draw, modes and momenta restored, bad input."""

import pytest
import torch

from pyro_flat.models.batchnorm import recompute_batchnorm
from pyro_flat.models.nn import make_bayesian


def bnn():
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.BatchNorm1d(4, momentum=0.3),
                              torch.nn.ReLU(), torch.nn.Linear(4, 2))
    return make_bayesian(net)


def test_statistics_are_those_of_the_draw():
    net = bnn().eval()
    x = torch.randn(90, 3)
    draw = {"0.weight": torch.randn(4, 3), "0.bias": torch.randn(4),
            "3.weight": torch.randn(2, 4), "3.bias": torch.randn(2)}
    (layer,) = recompute_batchnorm(net, draw, x, batch_size=30)
    # by hand: the pre-BN activations under the draw, averaged over the three batches
    h = (x @ draw["0.weight"].T + draw["0.bias"]).reshape(3, 30, 4)
    assert torch.allclose(layer.running_mean, h.mean(1).mean(0), atol=1e-5)
    assert torch.allclose(layer.running_var, h.var(1, unbiased=True).mean(0), atol=1e-5)
    assert int(layer.num_batches_tracked) == 3
    # modes and momentum restored; a second draw gives other statistics
    assert not net.training and not layer.training and layer.momentum == 0.3
    other = {k: v + 1 for k, v in draw.items()}
    recompute_batchnorm(net, other, x, batch_size=30)
    assert not torch.allclose(layer.running_mean, h.mean(1).mean(0), atol=1e-3)


def test_network_without_batchnorm_and_bad_input():
    net = make_bayesian(torch.nn.Linear(3, 2))
    assert recompute_batchnorm(net, None, torch.randn(5, 3)) == []
    with pytest.raises(ValueError, match="batch_size"):
        recompute_batchnorm(bnn(), None, torch.randn(5, 3), batch_size=0)
    with pytest.raises(ValueError, match="at least one input"):
        recompute_batchnorm(bnn(), None, torch.randn(0, 3))
