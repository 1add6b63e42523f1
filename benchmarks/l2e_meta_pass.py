"""L2E's meta-network pass three ways: the native kernel, torch's kernels (chunked), torch.compile.

What is measured
----------------
One pass of L2E's per-element meta-network (9 -> 32 -> 32 -> 2, ReLU, the two outputs combined)
over the 89,610 rows of the MLP 784-100-100-10, one torch thread, float32, in interleaved
rounds: the native AVX2 kernel that pyro_flat builds (:mod:`pyro_flat.infer.mcmc.l2e.native`),
the chunked torch path (:class:`~pyro_flat.infer.mcmc.l2e.chunked.ChunkedMetaNet`,
``native=False``), and the same three layers compiled by ``torch.compile`` (default mode and
``max-autotune-no-cudagraphs``) on the features in both layouts: row-major ``(n, 9)`` and the
feature-major layout the sampler keeps (a transposed view of ``(9, n)``). This is the evidence
for keeping the native kernel: issue 34 asks to keep it only where ``torch.compile`` or torch's
own kernels cannot reach it.

Run
---
    .venv/bin/python benchmarks/l2e_meta_pass.py     # about a minute

Results: ``benchmarks/results/l2e_meta_pass.{json,md}``.
"""

from __future__ import annotations

import json
import platform
import statistics
import time
import types
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

import torch

from pyro_flat.infer.mcmc.l2e import native
from pyro_flat.infer.mcmc.l2e.chunked import ChunkedMetaNet
from pyro_flat.infer.mcmc.l2e.meta_net import MetaNet

RESULTS = Path(__file__).parent / "results"
ROWS = 89_610
A, B = 0.7, -0.3
ROUNDS, CALLS = 5, 40


def three_layers(x: torch.Tensor, w0: torch.Tensor, b0: torch.Tensor, w1: torch.Tensor,
                 b1: torch.Tensor, w_out: torch.Tensor, b_out: torch.Tensor) -> torch.Tensor:
    """The pass with the two outputs' combination folded into the last layer, as the chunked
    path and the native kernel fold it."""
    h = torch.addmm(b0, x, w0).relu()
    h = torch.addmm(b1, h, w1).relu()
    return torch.mv(h, w_out) + b_out


def own_copy(fn: Callable, name: str) -> Callable:
    """``fn`` with a code object of its own: torch.compile caches graphs per code object, so a
    second ``torch.compile(fn, mode=...)`` of the same function would reuse the first graph."""
    code = fn.__code__.replace(co_name=name)
    return types.FunctionType(code, fn.__globals__, name, fn.__defaults__, fn.__closure__)


def main() -> None:
    torch.set_num_threads(1)
    net = MetaNet.init(torch.Generator().manual_seed(0), planted=3.0, descent=30.0)
    (w0, b0), (w1, b1), (w2, b2) = [(w.detach(), b.detach()) for w, b in net.weights]
    weights = [w0, b0, w1, b1, A * w2[:, 0] + B * w2[:, 1], A * b2[0] + B * b2[1]]
    g = torch.Generator().manual_seed(1)
    feature_major = torch.randn(9, ROWS, generator=g).T
    row_major = feature_major.contiguous()
    sides: dict[str, Callable[[], torch.Tensor]] = {}
    if native.status() == "available":
        kernel = ChunkedMetaNet(net, native=True)
        sides["native kernel (feature-major)"] = lambda: kernel(feature_major, A, B)
    chunked = ChunkedMetaNet(net, native=False)
    sides["torch, chunked (feature-major)"] = lambda: chunked(feature_major, A, B)
    compile_seconds = {}
    for mode in ("default", "max-autotune-no-cudagraphs"):
        for layout, x in (("row-major", row_major), ("feature-major", feature_major)):
            name = f"torch.compile {mode} ({layout})"
            fn = torch.compile(own_copy(three_layers, f"pass_{len(sides)}"), dynamic=False,
                               mode=mode)
            start = time.perf_counter()
            fn(x, *weights)
            compile_seconds[name] = time.perf_counter() - start
            sides[name] = lambda fn=fn, x=x: fn(x, *weights)
    reference = chunked(feature_major, A, B).clone()
    differences = {name: float((fn() - reference).abs().max()) for name, fn in sides.items()}
    times: dict[str, list[float]] = {name: [] for name in sides}
    for _ in range(ROUNDS):
        for name, fn in sides.items():
            start = time.perf_counter()
            for _ in range(CALLS):
                fn()
            times[name].append((time.perf_counter() - start) / CALLS)
    base = statistics.median(times["torch, chunked (feature-major)"])
    rows = []
    lines = ["| pass | ms | / torch chunked | largest difference | compile s |",
             "|---|---:|---:|---:|---:|"]
    for name, ts in times.items():
        ms = 1e3 * statistics.median(ts)
        rows.append({"pass": name, "ms": ms, "ratio": ms / (1e3 * base),
                     "difference": differences[name],
                     "compile_seconds": compile_seconds.get(name)})
        compiled = compile_seconds.get(name)
        lines.append(f"| {name} | {ms:.2f} | {ms / (1e3 * base):.2f} | "
                     f"{differences[name]:.1e} | {'' if compiled is None else f'{compiled:.1f}'} |")
    text = "\n".join(lines)
    print(text)
    head = (f"# L2E's meta-network pass\n\n{platform.processor() or platform.machine()}, one "
            f"torch thread, torch {torch.__version__}, {datetime.now(UTC):%Y-%m-%d}; {ROWS} rows, "
            f"median of {ROUNDS} rounds of {CALLS} passes. Native kernel: {native.status()}."
            f"\n\nCommand: `python benchmarks/l2e_meta_pass.py`\n\n")
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "l2e_meta_pass.md").write_text(head + text + "\n")
    (RESULTS / "l2e_meta_pass.json").write_text(json.dumps(rows, indent=1) + "\n")


if __name__ == "__main__":
    main()
