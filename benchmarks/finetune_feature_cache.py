"""What caching a frozen backbone's features saves a Bayesian head (``TrainedNetwork``).

SGLD on the last layer of a network, minibatch 128, two ways: on the features computed once
(``head_model``, run on ``trained.features(x)``) and with the frozen backbone run at every step
(``network_model``, run on ``x``). Two networks: the CNN of the conformance tests' size class
on 8x8 digits-shaped inputs, and a torchvision ResNet-18 (random weights: the cost does not
depend on them) on CIFAR-shaped random images (3 x 32 x 32). The runs alternate, ``--rounds``
times, on one torch thread; the table gives the median seconds per SG step, their ratio, the
one-time cost of computing the features and their memory. Results:
``benchmarks/results/finetune_feature_cache.{json,md}``.

Usage::

    python benchmarks/finetune_feature_cache.py [--rounds 3] [--steps 40]
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from pathlib import Path

import pyro
import torch
from pyro.infer import MCMC

from pyro_flat.infer import SGLD
from pyro_flat.models.finetune import TrainedNetwork
from pyro_flat.models.likelihoods import Categorical

RESULTS = Path(__file__).parent / "results"


def small_cnn() -> tuple[torch.nn.Module, torch.Tensor]:
    net = torch.nn.Sequential(
        torch.nn.Conv2d(1, 16, 3, padding=1), torch.nn.ReLU(), torch.nn.MaxPool2d(2),
        torch.nn.Conv2d(16, 32, 3, padding=1), torch.nn.ReLU(), torch.nn.Flatten(),
        torch.nn.Linear(32 * 16, 100), torch.nn.ReLU(), torch.nn.Linear(100, 10))
    return net.eval(), torch.randn(1024, 1, 8, 8)


def resnet18() -> tuple[torch.nn.Module, torch.Tensor]:
    from torchvision.models import resnet18 as build

    return build(num_classes=10).eval(), torch.randn(512, 3, 32, 32)


def seconds_per_step(model, x, y, steps: int) -> float:
    pyro.set_rng_seed(0)
    mcmc = MCMC(SGLD(model, step_size=1e-4, num_steps_per_sample=steps), num_samples=2,
                warmup_steps=0, disable_progbar=True)
    start = time.perf_counter()
    mcmc.run(x, y)
    return (time.perf_counter() - start) / (2 * steps)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=40)
    args = parser.parse_args()
    torch.set_num_threads(1)
    rows = []
    for name, build in (("CNN 8x8", small_cnn), ("ResNet-18 32x32", resnet18)):
        net, x = build()
        y = torch.randint(0, 10, (len(x),), generator=torch.Generator().manual_seed(0))
        trained = TrainedNetwork(net)
        start = time.perf_counter()
        features = trained.features(x, batch_size=256)
        feature_seconds = time.perf_counter() - start
        cached = trained.head_model(Categorical(), subsample_size=128)
        full = trained.network_model(Categorical(), subsample_size=128)
        times: dict[str, list[float]] = {"cached": [], "recomputed": []}
        for _ in range(args.rounds):
            times["cached"].append(seconds_per_step(cached, features, y, args.steps))
            times["recomputed"].append(seconds_per_step(full, x, y, args.steps))
        c, r = (statistics.median(times[k]) for k in ("cached", "recomputed"))
        rows.append({"network": name, "num_data": len(x), "features": features.shape[1],
                     "cached_ms": 1e3 * c, "recomputed_ms": 1e3 * r, "speedup": r / c,
                     "feature_seconds": feature_seconds,
                     "feature_mib": features.numel() * features.element_size() / 2**20,
                     "rounds": times})
        print(f"{name}: cached {1e3 * c:.3f} ms/step, recomputed {1e3 * r:.3f} ms/step, "
              f"speed-up {r / c:.1f}x; features once {feature_seconds:.2f} s, "
              f"{rows[-1]['feature_mib']:.2f} MiB", flush=True)
    meta = {"command": "python benchmarks/finetune_feature_cache.py "
                       f"--rounds {args.rounds} --steps {args.steps}",
            "cpu": platform.processor() or platform.machine(), "torch": torch.__version__,
            "threads": 1, "date": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "finetune_feature_cache.json").write_text(
        json.dumps({"meta": meta, "rows": rows}, indent=1) + "\n")
    lines = ["# Feature caching of a Bayesian head (SGLD, minibatch 128)", "",
             f"- command: `{meta['command']}`; {meta['cpu']}; torch {meta['torch']}; one "
             f"thread; {meta['date']}", "",
             "| network | N | features | cached ms/step | recomputed ms/step | speed-up | "
             "features once (s) | feature memory (MiB) |",
             "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        lines.append(f"| {r['network']} | {r['num_data']} | {r['features']} | "
                     f"{r['cached_ms']:.3f} | {r['recomputed_ms']:.3f} | {r['speedup']:.1f} | "
                     f"{r['feature_seconds']:.2f} | {r['feature_mib']:.2f} |")
    (RESULTS / "finetune_feature_cache.md").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
