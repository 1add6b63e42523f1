"""Time and peak memory of ``pyro_flat.to_arviz`` on a large BNN run.

100 draws x 2 chains of the MLP 784-100-100-10 (89,610 parameters) from SGLD through
``pyro.infer.MCMC``, then one ``to_arviz(mcmc)``: wall time and the rise of the peak resident
memory during the export (``benchmarks/step_overhead.py``'s measurement), against the bytes of the
draws. Issue target: under 10 s and below 2x the bytes of the draws.

Run::

    .venv/bin/python benchmarks/to_arviz_export.py

It prints one line and writes ``benchmarks/results/to_arviz_export.json``.
"""

from __future__ import annotations

import json
import sys
import time
import warnings
from pathlib import Path

import pyro
import torch
from pyro.infer import MCMC

sys.path.insert(0, str(Path(__file__).parent))
import step_overhead as so  # noqa: E402

import pyro_flat  # noqa: E402
from pyro_flat.infer import SGLD  # noqa: E402


def main() -> None:
    torch.set_num_threads(1)
    pyro.set_rng_seed(0)
    net, _ = so.bayesian(so.make_mlp())
    model, data = so.SubsampledModel(net), so.random_data((784,))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "chains drawn sequentially" on 2 cores
        mcmc = MCMC(SGLD(model, step_size=1e-6), num_samples=100, warmup_steps=0, num_chains=2,
                    disable_progbar=True)
        mcmc.run(*data)
        import arviz  # noqa: F401  (its import time is not the export's)
    draws = mcmc.get_samples(group_by_chain=True)
    draw_mb = sum(v.numel() * v.element_size() for v in draws.values()) / 1e6
    start = time.perf_counter()
    rise_mb, idata, _ = so.peak_rss_rise_mb(lambda: pyro_flat.to_arviz(mcmc))
    seconds = time.perf_counter() - start
    result = {"draws_mb": draw_mb, "seconds": seconds, "peak_rss_rise_mb": rise_mb,
              "groups": list(idata.groups()), "torch": torch.__version__}
    print(f"draws {draw_mb:.1f} MB; to_arviz {seconds:.2f} s; peak RSS rise {rise_mb:.1f} MB")
    out = Path(__file__).parent / "results" / "to_arviz_export.json"
    out.write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
