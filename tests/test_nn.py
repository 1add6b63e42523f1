"""Tests for pyro_flat.models.nn: make_bayesian, LayerInit, init_to_network,
bayesian_parameter_names."""

from __future__ import annotations

import math
import pickle

import pyro
import pyro.distributions as dist
import pytest
import torch
from pyro import poutine
from pyro.infer.autoguide.initialization import InitMessenger
from pyro.infer.mcmc.util import initialize_model
from pyro.nn import PyroModule
from pyro.nn.module import to_pyro_module_
from torch import nn

from pyro_flat.models.nn import (
    LayerInit,
    NetworkInit,
    bayesian_parameter_names,
    init_to_network,
    make_bayesian,
)


@pytest.fixture(autouse=True)
def _fresh_pyro():
    pyro.clear_param_store()
    pyro.set_rng_seed(0)
    yield
    pyro.clear_param_store()


class MLP(nn.Module):
    def __init__(self, d_in=20, d_hidden=30, d_out=5):
        super().__init__()
        self.fc1 = nn.Linear(d_in, d_hidden)
        self.fc2 = nn.Linear(d_hidden, d_out)

    def forward(self, x):
        return self.fc2(torch.tanh(self.fc1(x)))


class CNN(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3)
        self.bn = nn.BatchNorm2d(8)
        self.fc = nn.Linear(8, 4)

    def forward(self, x):
        h = torch.relu(self.bn(self.conv(x)))
        return self.fc(h.mean(dim=(2, 3)))


def _sites(model, *args):
    trace = poutine.trace(model).get_trace(*args)
    return trace, {n: s for n, s in trace.nodes.items() if s["type"] == "sample"}


def _prior_scale(site):
    """The (single) scale of an isotropic Normal prior site, checking the stride-0 layout."""
    fn = site["fn"]
    assert isinstance(fn, dist.Independent)
    base = fn.base_dist
    assert isinstance(base, dist.Normal)
    assert all(s == 0 for s in base.loc.stride()) and all(s == 0 for s in base.scale.stride())
    assert base.loc.reshape(-1)[0].item() == 0.0
    return base.scale.reshape(-1)[0].item()


# ------------------------------------------------------------------------------------------
# make_bayesian: sites, shapes, priors
# ------------------------------------------------------------------------------------------


def test_mlp_sites_shapes_and_fixed_scale():
    net = make_bayesian(MLP(), prior_scale=0.7)
    assert isinstance(net, PyroModule)
    _, sites = _sites(net, torch.randn(6, 20))
    expected = {"fc1.weight": (30, 20), "fc1.bias": (30,), "fc2.weight": (5, 30), "fc2.bias": (5,)}
    assert {n: tuple(s["value"].shape) for n, s in sites.items()} == expected
    for name, shape in expected.items():
        fn = sites[name]["fn"]
        assert fn.event_shape == shape and fn.batch_shape == ()
        assert _prior_scale(sites[name]) == pytest.approx(0.7)
    assert bayesian_parameter_names(net) == list(expected)
    assert list(net.parameters()) == []


def test_fan_in_rule_mlp_and_cnn():
    net = make_bayesian(MLP(), prior_scale=2.0, scale_rule="fan_in")
    _, sites = _sites(net, torch.randn(6, 20))
    fan_ins = {"fc1.weight": 20, "fc1.bias": 20, "fc2.weight": 30, "fc2.bias": 30}
    for name, fan_in in fan_ins.items():
        assert _prior_scale(sites[name]) == pytest.approx(2.0 / math.sqrt(fan_in))

    cnn = make_bayesian(CNN(), prior_scale=1.0, scale_rule="fan_in", bayesian_batchnorm=True)
    _, sites = _sites(cnn, torch.randn(2, 3, 8, 8))
    assert sites["conv.weight"]["value"].shape == (8, 3, 3, 3)
    assert _prior_scale(sites["conv.weight"]) == pytest.approx(1 / math.sqrt(27))
    assert _prior_scale(sites["conv.bias"]) == pytest.approx(1 / math.sqrt(27))
    assert _prior_scale(sites["fc.weight"]) == pytest.approx(1 / math.sqrt(8))
    # BatchNorm has no weight of dim >= 2: it keeps prior_scale.
    assert _prior_scale(sites["bn.weight"]) == pytest.approx(1.0)


def test_per_module_prior_scale_dict():
    net = make_bayesian(MLP(), prior_scale={"": 1.0, "fc2": 0.1})
    _, sites = _sites(net, torch.randn(3, 20))
    assert _prior_scale(sites["fc1.weight"]) == pytest.approx(1.0)
    assert _prior_scale(sites["fc2.bias"]) == pytest.approx(0.1)
    with pytest.raises(ValueError, match="prior_scale gives no scale"):
        make_bayesian(MLP(), prior_scale={"fc2": 0.1})
    with pytest.raises(ValueError, match="prior_scale has unknown module name 'fc3'"):
        make_bayesian(MLP(), prior_scale={"fc3": 0.1})
    with pytest.raises(ValueError, match=r"prior_scale\['fc1'\].*\(0, inf\)"):
        make_bayesian(MLP(), prior_scale={"": 1.0, "fc1": -1.0})


def test_prior_dtype_and_device_follow_parameter():
    net = make_bayesian(MLP().double())
    _, sites = _sites(net, torch.randn(3, 20, dtype=torch.float64))
    assert sites["fc1.weight"]["fn"].base_dist.scale.dtype == torch.float64
    assert sites["fc1.weight"]["value"].dtype == torch.float64


def test_include_exclude():
    net = make_bayesian(MLP(), include=["fc2"], exclude=["fc2.bias"])
    assert bayesian_parameter_names(net) == ["fc2.weight"]
    trace, sites = _sites(net, torch.randn(3, 20))
    assert set(sites) == {"fc2.weight"}
    # parameters left out stay nn.Parameters, i.e. pyro.param sites
    params = {n for n, s in trace.nodes.items() if s["type"] == "param"}
    assert params == {"fc1.weight", "fc1.bias", "fc2.bias"}

    net = make_bayesian(MLP(), include="fc1.weight")
    assert bayesian_parameter_names(net) == ["fc1.weight"]
    net = make_bayesian(MLP(), exclude=["fc1"])
    assert bayesian_parameter_names(net) == ["fc2.weight", "fc2.bias"]


@pytest.mark.parametrize("arg", ["include", "exclude"])
def test_unknown_names_list_valid_ones(arg):
    with pytest.raises(ValueError, match=rf"{arg} contains unknown.*'fc1\.weight'") as err:
        make_bayesian(MLP(), **{arg: ["fc1.weigth"]})
    assert "fc1.weigth" in str(err.value)
    # 'fc' is not a module prefix of 'fc1' (prefixes match whole name components)
    with pytest.raises(ValueError, match=arg):
        make_bayesian(MLP(), **{arg: ["fc"]})


def test_batchnorm_deterministic_by_default():
    cnn = make_bayesian(CNN())
    assert bayesian_parameter_names(cnn) == ["conv.weight", "conv.bias", "fc.weight", "fc.bias"]
    x = torch.randn(4, 3, 8, 8)
    trace = poutine.trace(cnn).get_trace(x)
    bn_nodes = [n for n in trace.nodes if n.startswith("bn.")]
    assert bn_nodes == []  # neither a sample nor a param site
    assert not any(k.startswith("bn.") for k in pyro.get_param_store().keys())
    assert list(cnn.parameters()) == []
    buffers = dict(cnn.named_buffers())
    assert torch.equal(buffers["bn.weight"], torch.ones(8))
    assert not buffers["bn.weight"].requires_grad
    assert set(cnn.state_dict()) >= {"bn.weight", "bn.bias", "bn.running_mean"}
    # running statistics still update in training mode
    before = buffers["bn.running_mean"].clone()
    cnn.train()
    cnn(x)
    assert not torch.equal(cnn.bn.running_mean, before)


def test_batchnorm_bayesian_with_flag():
    cnn = make_bayesian(CNN(), bayesian_batchnorm=True)
    _, sites = _sites(cnn, torch.randn(4, 3, 8, 8))
    assert sites["bn.weight"]["value"].shape == (8,)
    assert "bn.bias" in sites
    assert "bn.running_mean" in dict(cnn.named_buffers())
    with pytest.raises(ValueError, match="bayesian_batchnorm=True"):
        make_bayesian(CNN(), include=["bn"])


def test_layernorm_and_groupnorm_are_normalisation_layers():
    net = make_bayesian(nn.Sequential(nn.Linear(4, 6), nn.LayerNorm(6), nn.GroupNorm(2, 6)))
    assert bayesian_parameter_names(net) == ["0.weight", "0.bias"]
    assert {"1.weight", "1.bias", "2.weight", "2.bias"} <= set(dict(net.named_buffers()))


def test_prior_is_the_same_object_across_forwards():
    net = make_bayesian(MLP())
    x = torch.randn(3, 20)
    _, s1 = _sites(net, x)
    _, s2 = _sites(net, x)
    for name in s1:
        assert s1[name]["fn"] is s2[name]["fn"]
        assert not torch.equal(s1[name]["value"], s2[name]["value"])


def test_already_pyro_module_input():
    layer = nn.Linear(5, 3)
    to_pyro_module_(layer)
    make_bayesian(layer)
    assert bayesian_parameter_names(layer) == ["weight", "bias"]
    init = layer._pyro_samples["weight"].pyro_flat_init
    assert type(init.template) is nn.Linear  # the template is a plain torch layer
    assert init().abs().max() <= 1 / math.sqrt(5)


def test_user_pyro_module_subclass():
    class Own(PyroModule):
        def __init__(self):
            super().__init__()
            self.w = nn.Parameter(torch.randn(3, 4))

        def reset_parameters(self):
            nn.init.zeros_(self.w)

        def forward(self, x):
            return x @ self.w

    net = make_bayesian(Own())
    _, sites = _sites(net, torch.randn(2, 3))
    assert set(sites) == {"w"}
    assert torch.equal(net._pyro_samples["w"].pyro_flat_init(), torch.zeros(3, 4))


def test_whole_model_pickles():
    net = make_bayesian(CNN())
    net2 = pickle.loads(pickle.dumps(net))
    _, sites = _sites(net2, torch.randn(2, 3, 8, 8))
    assert set(sites) == set(bayesian_parameter_names(net))
    base = sites["conv.weight"]["fn"].base_dist
    assert all(s == 0 for s in base.scale.stride())


# ------------------------------------------------------------------------------------------
# bad input
# ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("bad", [0.0, -1.0, float("inf"), float("nan"), "big"])
def test_bad_prior_scale(bad):
    with pytest.raises(ValueError, match=r"prior_scale.*") as err:
        make_bayesian(MLP(), prior_scale=bad)
    if not isinstance(bad, str):
        assert "(0, inf)" in str(err.value)


def test_bad_prior_and_scale_rule_and_flags():
    with pytest.raises(ValueError, match=r"prior must be one of \['normal'\]"):
        make_bayesian(MLP(), prior="laplace")
    with pytest.raises(ValueError, match=r"scale_rule must be one of \['fixed', 'fan_in'\]"):
        make_bayesian(MLP(), scale_rule="he")
    with pytest.raises(ValueError, match="bayesian_batchnorm"):
        make_bayesian(MLP(), bayesian_batchnorm="yes")
    with pytest.raises(ValueError, match="module must be a torch.nn.Module"):
        make_bayesian(lambda x: x)
    with pytest.raises(ValueError, match="include entries must be strings"):
        make_bayesian(MLP(), include=[1])


def test_tied_parameters_rejected():
    net = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 4))
    net[1].weight = net[0].weight
    with pytest.raises(ValueError, match="tied"):
        make_bayesian(net)
    make_bayesian(net, exclude=["0.weight"])  # the tied weight stays a parameter


# ------------------------------------------------------------------------------------------
# LayerInit (prior.pyro_flat_init)
# ------------------------------------------------------------------------------------------


def _init_of(net, name):
    module_name, attr = name.rsplit(".", 1) if "." in name else ("", name)
    return net.get_submodule(module_name)._pyro_samples[attr].pyro_flat_init


def test_linear_init_is_fresh_and_bounded():
    fan_in = 100
    net = make_bayesian(nn.Sequential(nn.Linear(fan_in, 200)), prior_scale=10.0)
    init = _init_of(net, "0.weight")
    w1, w2 = init(), init()
    assert w1.shape == (200, fan_in) and w1.dtype == torch.float32 and not w1.requires_grad
    assert not torch.equal(w1, w2)
    b = 1 / math.sqrt(fan_in)
    assert w1.abs().max() <= b and w2.abs().max() <= b
    # Uniform(-b, b) has std b/sqrt(3). For n iid uniforms, sd(sample variance)/variance =
    # sqrt((mu4/sigma^4 - 1)/n) = sqrt(0.8/n), so the sample std has relative standard error
    # 0.5*sqrt(0.8/n) ~ 0.0032 at n = 20000; we allow 5 standard errors.
    n = w1.numel()
    tol = 5 * 0.5 * math.sqrt(0.8 / n)
    assert w1.std().item() == pytest.approx(b / math.sqrt(3), rel=tol)
    # the bias follows Linear's rule too
    bias = _init_of(net, "0.bias")()
    assert bias.shape == (200,) and bias.abs().max() <= b and bias.std() > b / 3


def test_init_conv_embedding_layernorm():
    net = nn.Sequential(nn.Conv2d(3, 8, 3), nn.Embedding(10, 4, padding_idx=0), nn.LayerNorm(4))
    net = make_bayesian(net, bayesian_batchnorm=True)
    conv = _init_of(net, "0.weight")()
    assert conv.shape == (8, 3, 3, 3) and conv.abs().max() <= 1 / math.sqrt(27)
    assert not torch.equal(conv, _init_of(net, "0.weight")())
    emb = _init_of(net, "1.weight")()
    assert emb.shape == (10, 4)
    assert torch.equal(emb[0], torch.zeros(4))  # padding row, as Embedding.reset_parameters
    assert emb[1:].std() > 0.5  # N(0, 1) rows
    assert torch.equal(_init_of(net, "2.weight")(), torch.ones(4))
    assert torch.equal(_init_of(net, "2.bias")(), torch.zeros(4))


def test_init_pickles_and_draws_after_unpickling():
    net = make_bayesian(MLP())
    init = _init_of(net, "fc1.weight")
    assert isinstance(init, LayerInit)
    init2 = pickle.loads(pickle.dumps(init))
    w1, w2 = init2(), init2()
    assert w1.shape == (30, 20) and not torch.equal(w1, w2)
    assert w1.abs().max() <= 1 / math.sqrt(20)
    prior2 = pickle.loads(pickle.dumps(net.fc1._pyro_samples["weight"]))
    assert prior2.pyro_flat_init().shape == (30, 20)


def test_init_is_reproducible_under_seed():
    init = _init_of(make_bayesian(MLP()), "fc1.weight")
    pyro.set_rng_seed(3)
    a = init()
    pyro.set_rng_seed(3)
    assert torch.equal(a, init())


def test_init_without_reset_parameters_copies_value():
    class Scale(nn.Module):
        def __init__(self):
            super().__init__()
            self.s = nn.Parameter(torch.arange(3.0))

        def forward(self, x):
            return x * self.s

    class HalfReset(nn.Linear):  # reset_parameters() that leaves the bias alone
        def reset_parameters(self):
            nn.init.zeros_(self.weight)

    net = make_bayesian(nn.Sequential(Scale(), HalfReset(3, 3)))
    init = _init_of(net, "0.s")
    assert init.template is None
    v = init()
    assert torch.equal(v, torch.arange(3.0))
    v.add_(1.0)  # a copy, not the stored value
    assert torch.equal(init(), torch.arange(3.0))
    assert _init_of(net, "1.weight").template is not None
    assert _init_of(net, "1.bias").template is None


# ------------------------------------------------------------------------------------------
# init_to_network
# ------------------------------------------------------------------------------------------


def _site(name, fn, value=None, is_observed=False):
    return {"name": name, "fn": fn, "value": value, "is_observed": is_observed, "type": "sample"}


def test_init_to_network_rule_a_uses_torch_init():
    net = make_bayesian(MLP(), prior_scale=10.0)
    _, sites = _sites(net, torch.randn(3, 20))
    init = NetworkInit()
    v1 = init(sites["fc1.weight"])
    v2 = init(sites["fc1.weight"])
    assert v1.shape == (30, 20) and not torch.equal(v1, v2)
    assert v1.abs().max() <= 1 / math.sqrt(20)  # a prior draw (scale 10) would exceed this


def test_init_to_network_rule_b_matrix_sites():
    init = NetworkInit()
    fn = dist.Normal(0.0, 10.0).expand([30, 4, 5]).to_event(3)
    v = init(_site("w", fn))
    b = 1 / math.sqrt(4 * 5)
    assert v.shape == (30, 4, 5) and v.abs().max() <= b and v.std() > b / 3


def test_init_to_network_rule_c_bias_after_weight():
    init = NetworkInit()
    weight = dist.Normal(0.0, 10.0).expand([30, 20]).to_event(2)
    bias = dist.Normal(0.0, 10.0).expand([30]).to_event(1)
    init(_site("layer.weight", weight))
    v = init(_site("layer.bias", bias))
    assert v.shape == (30,) and v.abs().max() <= 1 / math.sqrt(20) and v.std() > 0
    # a new trace (the name repeats) forgets the weights of the previous one: rule (d).
    # The median of 15 draws of N(0, 10^2) has sd ~ 3.2, so some of 30 entries exceed 0.22.
    v = init(_site("layer.bias", bias))
    assert v.abs().max() > 1 / math.sqrt(20)


def test_init_to_network_rule_d_and_observed():
    init = NetworkInit()
    v = init(_site("sigma", dist.Gamma(2.0, 1.0)))
    assert v.shape == () and v > 0
    obs = torch.tensor([1.0, 2.0])
    assert init(_site("y", dist.Normal(0.0, 1.0).expand([2]), obs, is_observed=True)) is obs

    class NoBatchedSample(dist.Normal):  # init_to_median's batched draw fails
        def sample(self, sample_shape=()):
            if len(sample_shape):
                raise RuntimeError("no batched samples")
            return super().sample(sample_shape)

    v = init(_site("z", NoBatchedSample(torch.zeros(3), 1.0)))
    assert v.shape == (3,)


def test_init_to_network_default_instance_and_factory():
    assert isinstance(init_to_network, NetworkInit)
    fresh = init_to_network()
    assert isinstance(fresh, NetworkInit) and fresh is not init_to_network
    pickle.loads(pickle.dumps(init_to_network))


def test_init_to_network_in_pyro_machinery():
    net = make_bayesian(MLP(50, 20, 1), prior_scale=5.0)

    def model(x):
        return net(x)

    x = torch.randn(4, 50)
    trace = poutine.trace(InitMessenger(init_to_network)(model)).get_trace(x)
    assert trace.nodes["fc1.weight"]["value"].abs().max() <= 1 / math.sqrt(50)
    params, *_ = initialize_model(model, (x,), init_strategy=init_to_network)
    assert params["fc1.weight"].abs().max() <= 1 / math.sqrt(50)
    assert params["fc2.bias"].abs().max() <= 1 / math.sqrt(20)
