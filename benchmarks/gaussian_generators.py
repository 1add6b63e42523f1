"""Time per float of exact standard-normal generators on one CPU thread, and of a vector pass.

EntropyMCMC draws a second Gaussian vector per step, as large as the network (89,610 floats for
the MLP 784-100-100-10 of ``benchmarks/step_overhead.py``). This measures which generator fills
such a float32 buffer fastest: torch's ``normal_`` (MT19937 uniforms and a fused, vectorised
Box-Muller transform), NumPy's ziggurat ``Generator(bit generator).standard_normal(dtype=
float32, out=...)`` writing straight into the torch buffer (zero copy), ``erfinv`` of uniforms,
and Box-Muller on NumPy's raw ``SFC64`` bits with NumPy's vectorised ``log``/``sqrt``/``sin``/
``cos`` (24-bit uniforms, as torch uses). The simple vector passes of an update (``add_``,
``lerp_``, ``sub``) are timed for scale. Cases are interleaved in each round (machine load hits
all alike); the table gives the median over rounds and the interquartile range.

Run::

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/gaussian_generators.py [--rounds 41 --quick]

It prints a Markdown table and writes ``benchmarks/results/gaussian_generators.{json,md}``.
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).parent))
import step_overhead as so  # noqa: E402

SIZE = 89_610  # parameters of the MLP 784-100-100-10
REPEATS = 20  # calls per timing


class BoxMullerNumPy:
    """Box-Muller from NumPy ``SFC64`` raw 64-bit words, as torch's ``normal_`` builds it: 24-bit
    uniforms, radius from ``u1`` in (0, 1], angle from ``u2``; preallocated buffers."""

    def __init__(self, size: int, seed: int):
        self.half = (size + 1) // 2
        self.bits = np.random.SFC64(seed)
        self.ints = np.empty(2 * self.half, np.int32)
        self.cos = np.empty(self.half, np.float32)
        self.out = np.empty(2 * self.half, np.float32)

    def fill(self, out: np.ndarray) -> None:
        h = self.half
        words = self.bits.random_raw(h).view(np.int32)  # 2h 32-bit words
        np.right_shift(words, 8, out=self.ints)  # signed 24-bit integers
        radius, angle = self.out[:h], self.out[h:]
        np.add(self.ints[:h], 2**23 + 1, out=self.ints[:h])  # 1 .. 2^24
        radius[...] = self.ints[:h]
        np.multiply(radius, np.float32(2.0**-24), out=radius)  # u1 in (0, 1]
        np.log(radius, out=radius)
        np.multiply(radius, np.float32(-2.0), out=radius)
        np.sqrt(radius, out=radius)
        angle[...] = self.ints[h:]
        np.multiply(angle, np.float32(2 * math.pi * 2.0**-24), out=angle)  # [-pi, pi)
        np.cos(angle, out=self.cos)
        np.sin(angle, out=angle)
        np.multiply(angle, radius, out=angle)
        np.multiply(radius, self.cos, out=radius)
        out[...] = self.out[: len(out)]


def cases() -> tuple[dict[str, Callable[[], object]], torch.Tensor]:
    buf = torch.empty(SIZE)
    arr = buf.numpy()
    other, third = torch.randn(SIZE), torch.randn(SIZE)
    g = torch.Generator().manual_seed(0)
    numpy_gens = {name: np.random.Generator(getattr(np.random, name)(0))
                  for name in ("SFC64", "PCG64", "Philox")}
    box_muller = BoxMullerNumPy(SIZE, 1)
    out = {"torch normal_ (MT19937, fused Box-Muller)": lambda: buf.normal_(generator=g)}
    for name, gen in numpy_gens.items():
        out[f"NumPy {name} standard_normal float32 (ziggurat)"] = (
            lambda gen=gen: gen.standard_normal(dtype=np.float32, out=arr))
    out["torch uniform_ + erfinv_ (inverse CDF)"] = (
        lambda: buf.uniform_(-1.0, 1.0, generator=g).erfinv_().mul_(math.sqrt(2.0)))
    out["NumPy SFC64 raw bits + Box-Muller (NumPy SIMD)"] = lambda: box_muller.fill(arr)
    out["NumPy SFC64 raw bits alone (32 bits per float)"] = (
        lambda: box_muller.bits.random_raw(SIZE // 2))
    out["torch uniform_ alone"] = lambda: buf.uniform_(generator=g)
    out["vector pass: add_(x, alpha)"] = lambda: buf.add_(other, alpha=1e-3)
    out["vector pass: lerp_(x, w)"] = lambda: buf.lerp_(other, 1e-3)
    out["vector pass: sub(x, y, out)"] = lambda: torch.sub(other, third, out=buf)
    return out, buf


def moment_z(fn: Callable[[], object], buf: torch.Tensor, buffers: int = 20) -> float:
    """Largest |z-score| of the mean, the variance and the fourth moment of ``buffers`` filled
    buffers against N(0, 1) (standard errors sqrt(1/n), sqrt(2/n), sqrt(96/n)): a check that
    a generator is standard normal; values below about 3 are consistent."""
    values = []
    for _ in range(buffers):
        fn()
        values.append(buf.double().clone())
    x = torch.cat(values)
    n = len(x)
    z = ((x.mean()) / math.sqrt(1 / n), (x.var() - 1) / math.sqrt(2 / n),
         ((x**4).mean() - 3) / math.sqrt(96 / n))
    return float(max(abs(v) for v in z))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=41)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results")
    args = parser.parse_args(argv)
    if args.quick:
        args.rounds = 3
    torch.set_num_threads(1)
    fns, buf = cases()
    gaussian = {name for name in fns if "alone" not in name and "pass" not in name}
    errors = {name: moment_z(fns[name], buf) for name in gaussian}
    times: dict[str, list[float]] = {name: [] for name in fns}
    for fn in fns.values():  # warm up
        fn()
    names = list(fns)
    for r in range(args.rounds):
        for name in names[r % len(names):] + names[:r % len(names)]:
            start = time.perf_counter()
            for _ in range(REPEATS):
                fns[name]()
            times[name].append((time.perf_counter() - start) / REPEATS)
    ref = times[names[0]]
    lines = ["| operation | ms per call | ns per float | IQR (ns per float) | ratio to torch "
             "normal_ | moment check (max abs z) |", "|---|---:|---:|---|---:|---:|"]
    rows = []
    for name, ts in times.items():
        q1, med, q3 = statistics.quantiles(ts, n=4)
        ratio = statistics.median(t / b for t, b in zip(ts, ref, strict=True))
        error = errors.get(name)
        rows.append({"operation": name, "ms": 1e3 * med, "ns_per_float": 1e9 * med / SIZE,
                     "ns_q1": 1e9 * q1 / SIZE, "ns_q3": 1e9 * q3 / SIZE, "ratio": ratio,
                     "moment_error": error})
        check = "" if error is None else f"{error:.1f}"
        lines.append(f"| {name} | {1e3 * med:.3f} | {1e9 * med / SIZE:.2f} | "
                     f"[{1e9 * q1 / SIZE:.2f}, {1e9 * q3 / SIZE:.2f}] | {ratio:.2f} | {check} |")
    table = "\n".join(lines)
    print(table)
    meta = {"command": " ".join(["python", *sys.argv]), "rounds": args.rounds,
            "floats": SIZE, "repeats": REPEATS, "torch": torch.__version__,
            "numpy": np.__version__, "cpu": so.cpu_model(),
            "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")}
    suffix = "_quick" if args.quick else ""
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"gaussian_generators{suffix}.json").write_text(
        json.dumps({"meta": meta, "rows": rows}, indent=1))
    (args.out / f"gaussian_generators{suffix}.md").write_text(
        f"# Exact Gaussian generators on one CPU thread ({SIZE:,} float32 values)\n\n"
        + f"- command: `{meta['command']}`; {meta['rounds']} interleaved rounds of "
        + f"{REPEATS} calls; {meta['cpu']}; torch {meta['torch']}; NumPy {meta['numpy']}; "
        + f"{meta['date']}. Moment check: largest |z-score| of the mean, variance and fourth "
        + f"moment of 20 buffers ({20 * SIZE:,} values) against N(0, 1); below about 3 is "
        + "consistent.\n\n" + table + "\n")


if __name__ == "__main__":
    main()
