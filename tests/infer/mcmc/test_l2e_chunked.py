"""L2E's chunked meta-network pass and its kept buffers: the plain network's numbers across
chunk boundaries, sizes, dtypes and per-segment column scales; buffers that follow the input
they were made for; an L2E kernel reused for a model of another size gives a fresh kernel's
draws."""

from pathlib import Path

import fixed_seed_runs
import harness
import pyro
import pyro.distributions as dist
import pytest
import torch

from pyro_flat.infer import L2E
from pyro_flat.infer.mcmc.l2e.chunked import ChunkedMetaNet
from pyro_flat.infer.mcmc.l2e.meta_net import FRICTION, OUTPUT_SCALE, MetaNet

#: Draws of 3 vectorised L2E chains (with noise) on the fixed-seed runs' MLP, recorded with the
#: implementation before the chunked pass folded the normalisation and the output combination
#: into the network's weights (it evaluated (alpha, beta) on a normalised copy of the features).
PREVIOUS = Path(__file__).parent / "data" / "l2e_vectorized_previous.pt"


def random_net(seed: int = 3) -> MetaNet:
    return MetaNet.init(torch.Generator().manual_seed(seed), planted=3.0, descent=30.0)


def exact_row(net: MetaNet, x: torch.Tensor, a: float, b: float, scale: float) -> torch.Tensor:
    """``scale (a o_1 + b o_2)`` of the plain network, in float64."""
    out = net.to(torch.float64)(x.double())
    return scale * (a * out[:, 0] + b * out[:, 1])


@pytest.mark.parametrize("n", [1, 7, 30])
@pytest.mark.parametrize("a, b", [(1.0, FRICTION), (0.0, 1.0)])
def test_rows_are_the_plain_networks_outputs(n, a, b):
    """Chunks of 7 rows (one partial chunk, several, an exact multiple) against the plain
    network in float64. float32 rounding of the 9-, 32- and 32-term dot products of O(1)
    terms is below 1e-5 relative; float64 input stays float64 (1e-12)."""
    net = random_net()
    x = torch.randn(n, 9, generator=torch.Generator().manual_seed(n)) * 3.0
    rows = ChunkedMetaNet(net, chunk=7)
    exact = exact_row(net, x, a, b, 1.0)
    torch.testing.assert_close(rows(x, a, b).double(), exact, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(rows(x.double(), a, b, OUTPUT_SCALE), OUTPUT_SCALE * exact,
                               rtol=1e-12, atol=1e-15)


def test_column_scales_per_segment_scale_the_inputs_rows():
    """Segments of 3, 17 and 10 rows (chunks of 7 cut inside them) with their own column
    scales equal the plain network on the rescaled rows; a second call with new scales on
    the same buffers, and another segmentation of the same input, too."""
    net = random_net()
    g = torch.Generator().manual_seed(1)
    x = torch.randn(30, 9, generator=g)
    rows = ChunkedMetaNet(net, chunk=7)
    for segments in ([(0, 3), (3, 20), (20, 30)], [(0, 15), (15, 30)]):
        for _ in range(2):
            c = torch.rand(9, len(segments), generator=g) * 4.0
            scaled = torch.cat([x[a:b] * c[:, j] for j, (a, b) in enumerate(segments)])
            got = rows(x, 1.0, FRICTION, column_scales=c, segments=segments)
            torch.testing.assert_close(got.double(), exact_row(net, scaled, 1.0, FRICTION, 1.0),
                                       rtol=1e-5, atol=1e-5)


def test_buffers_follow_the_input_they_were_made_for():
    """The buffers and chunk views are kept while the same tensor comes back (its new
    values are read) and rebuilt for another tensor, size or layout, also for a new tensor
    allocated after the old one was freed."""
    net = random_net()
    g = torch.Generator().manual_seed(0)
    rows = ChunkedMetaNet(net, chunk=7)
    features = torch.randn(9, 30, generator=g)  # feature-major, as L2EState keeps them
    x = features.T
    same_shape = torch.randn(30, 9, generator=g)
    for inputs in (x, x.mul_(2.0), torch.randn(12, 9, generator=g), x, x.contiguous(),
                   same_shape, 3.0 * same_shape, torch.randn(30, 9, generator=g)[::2]):
        expected = exact_row(net, inputs, 1.0, FRICTION, OUTPUT_SCALE)
        torch.testing.assert_close(rows(inputs, 1.0, FRICTION, OUTPUT_SCALE).double(),
                                   expected, rtol=1e-5, atol=1e-8)
    del features, x
    fresh = torch.randn(30, 9, generator=g)
    torch.testing.assert_close(rows(fresh, 0.0, 1.0).double(), exact_row(net, fresh, 0, 1, 1),
                               rtol=1e-5, atol=1e-5)


def test_bad_arguments_are_named():
    net = random_net()
    for chunk in (0, 2.5, True):
        with pytest.raises(ValueError, match="chunk"):
            ChunkedMetaNet(net, chunk=chunk)
    with pytest.raises(ValueError, match=r"x must have shape \(n, 9\)"):
        ChunkedMetaNet(net)(torch.zeros(4, 8), 1.0, 0.0)
    for segments in ([(0, 2)], [(0, 2), (3, 4)], [(0, 2), (2, 2), (2, 4)]):
        with pytest.raises(ValueError, match="segments must tile the 4 rows"):
            ChunkedMetaNet(net)(torch.zeros(4, 9), 1.0, 0.0, segments=segments)
    with pytest.raises(ValueError, match=r"column_scales must have shape \(9, 2\)"):
        ChunkedMetaNet(net)(torch.zeros(4, 9), 1.0, 0.0, column_scales=torch.ones(9, 1),
                            segments=[(0, 1), (1, 4)])


def width_model(x: torch.Tensor, y: torch.Tensor) -> None:
    """A regression whose weight vector is as wide as the data: its latent shape (and the
    number of L2E features) follows the data set."""
    w = pyro.sample("w", dist.Normal(0.0, 1.0).expand([x.shape[1]]).to_event(1))
    s = pyro.sample("s", dist.LogNormal(0.0, 1.0))
    with pyro.plate("data", len(x), subsample_size=20) as i:
        pyro.sample("y", dist.Normal(x[i] @ w, s), obs=y[i])


def width_data(width: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(width)
    x = torch.randn(100, width, generator=g)
    return x, x.sum(1) + 0.3 * torch.randn(100, generator=g)


def test_a_kernel_rerun_on_a_model_of_another_size_equals_a_fresh_kernel():
    """One L2E kernel run on 3-, 3-, 5- and 3-wide data: each run's draws are bitwise those
    of a fresh kernel on that data (nothing of an earlier run's buffers is read)."""
    kernel = L2E(width_model, 0.05, meta_params=random_net(), num_steps_per_sample=3)
    for width in (3, 3, 5, 3):
        data = width_data(width)
        reused = harness.run(kernel, 6, 4, width, *data).get_samples()
        fresh = harness.run(L2E(width_model, 0.05, meta_params=random_net(),
                                num_steps_per_sample=3), 6, 4, width, *data).get_samples()
        assert reused["w"].shape == (6, width)
        for site in ("w", "s"):
            assert torch.equal(reused[site], fresh[site]), (width, site)


def test_vectorised_chains_draw_what_the_previous_implementation_drew():
    """Three chains in one kernel, with noise, at the fixed-seed runs' seed: the recorded draws
    of the previous implementation, within the float32 rounding that
    ``fixed_seed_runs.TOLERANCES`` justifies for the single-chain run."""
    kernel = L2E(fixed_seed_runs.mlp_model(), 1e-2, meta_params=fixed_seed_runs._meta(),
                 num_steps_per_sample=3, vectorized_chains=3)
    samples = harness.run(kernel, 8, 4, fixed_seed_runs.SEED,
                          *fixed_seed_runs.mlp_data()).get_samples()
    recorded = torch.load(PREVIOUS, weights_only=True)["samples"]
    assert samples.keys() == recorded.keys()
    for site, value in samples.items():
        torch.testing.assert_close(value, recorded[site], **fixed_seed_runs.TOLERANCES["L2E"],
                                   msg=site)
