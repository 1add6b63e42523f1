"""The compiled meta-network kernel: the torch path's numbers (to float32 rounding) for any
number of rows, segments and threads; used only where it applies; a machine that cannot build
it falls back to torch and says why."""

import os
import subprocess
import sys

import pytest
import torch

from pyro_flat.infer.mcmc.l2e import native
from pyro_flat.infer.mcmc.l2e.chunked import ChunkedMetaNet
from pyro_flat.infer.mcmc.l2e.meta_net import FRICTION, OUTPUT_SCALE, MetaNet

needs_kernel = pytest.mark.skipif(native.status() != "available",
                                  reason=f"native kernel: {native.status()}")


def rows(net, features, segments, scales, native_flag, a=1.0, b=FRICTION):
    chunked = ChunkedMetaNet(net, native=native_flag)
    return chunked(features.T, a, b, OUTPUT_SCALE, column_scales=scales,
                   segments=segments).clone()


@needs_kernel
@pytest.mark.parametrize("sizes", [[1], [15], [16], [17], [40, 3, 100], [1000, 16, 7, 4096]])
@pytest.mark.parametrize("threads", [1, 2])
def test_kernel_computes_the_torch_paths_rows(sizes, threads):
    """Segments shorter than, equal to and longer than the kernel's 16-row blocks (its
    one-row tail loop included), with per-segment column scales, one and two threads, against
    the torch path: the same float32 network summed in another order, so equal to ~1e-6 of
    the largest output (the 9-, 32- and 32-term sums of O(1) terms round at ~1e-7 each)."""
    g = torch.Generator().manual_seed(sum(sizes))
    net = MetaNet.init(g, planted=3.0, descent=30.0)
    n = sum(sizes)
    bounds = torch.tensor([0, *sizes]).cumsum(0).tolist()
    segments = list(zip(bounds[:-1], bounds[1:], strict=True))
    features = torch.randn(9, n, generator=g)
    scales = torch.rand(9, len(sizes), generator=g) + 0.5
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        for a, b in [(1.0, FRICTION), (0.0, 1.0)]:
            got = rows(net, features, segments, scales, True, a, b)
            want = rows(net, features, segments, scales, False, a, b)
            tol = 1e-6 * float(want.abs().max())
            assert torch.allclose(got, want, rtol=0, atol=tol), (got - want).abs().max()
            assert not torch.equal(got, torch.zeros_like(got))
    finally:
        torch.set_num_threads(previous)


@needs_kernel
def test_threads_split_the_rows_without_changing_them():
    g = torch.Generator().manual_seed(0)
    net = MetaNet.init(g)
    features = torch.randn(9, 3 * 2048 + 5, generator=g)  # several blocks of 2,048 rows
    segments = [(0, 10), (10, features.shape[1])]
    scales = torch.rand(9, 2, generator=g)
    previous = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = rows(net, features, segments, scales, True)
        torch.set_num_threads(3)
        three = rows(net, features, segments, scales, True)
    finally:
        torch.set_num_threads(previous)
    assert torch.equal(one, three)  # each row is computed alone, whatever thread runs it


def test_kernel_applies_only_to_float32_feature_major_cpu_input():
    net = MetaNet.init(torch.Generator().manual_seed(0))
    features = torch.randn(9, 50)
    assert not native.applies(features.T.double(), 32)
    assert not native.applies(features.T.contiguous(), 32)  # row-major rows: not the layout
    assert not native.applies(features.T, 16)
    got = rows(net.to(torch.float64), features.double(), [(0, 50)], None, None)
    want = rows(net.to(torch.float64), features.double(), [(0, 50)], None, False)
    assert torch.equal(got, want)  # float64: the torch path, whatever the machine
    with pytest.raises(ValueError, match="native=True, but the compiled kernel does not apply"):
        rows(net.to(torch.float64), features.double(), [(0, 50)], None, True)
    with pytest.raises(ValueError, match="native must be None, True or False"):
        ChunkedMetaNet(net, native="yes")


@pytest.mark.parametrize("env, reason", [
    ({"PYRO_FLAT_NATIVE": "0"}, "PYRO_FLAT_NATIVE=0"),
    ({"CC": "false"}, "building the kernel failed"),
])
def test_without_the_kernel_l2e_runs_on_torch_and_says_why(env, reason, tmp_path):
    """A fresh process (the kernel is loaded once per process) with the kernel switched off,
    or with a compiler that fails (and an empty cache): the status names the reason and an L2E
    chain runs on torch's kernels."""
    script = (
        "import torch, pyro, pyro.distributions as dist\n"
        "from pyro.infer import MCMC\n"
        "from pyro_flat.infer import L2E\n"
        "from pyro_flat.infer.mcmc.l2e import native\n"
        "print(native.status())\n"
        "def model():\n"
        "    pyro.sample('w', dist.Normal(0.0, 1.0).expand([40]).to_event(1))\n"
        "mcmc = MCMC(L2E(model, 1e-2, num_data=10), num_samples=3, warmup_steps=0,\n"
        "            disable_progbar=True)\n"
        "mcmc.run()\n"
        "print(mcmc.get_samples()['w'].shape)\n")
    environment = {**os.environ, "PYRO_FLAT_CACHE_DIR": str(tmp_path), **env}
    done = subprocess.run([sys.executable, "-c", script], env=environment, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    status, shape = done.stdout.strip().splitlines()[-2:]
    assert status.startswith(reason)
    assert shape == "torch.Size([3, 40])"
