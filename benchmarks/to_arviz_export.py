"""Time and peak memory of ``pyro_flat.to_arviz`` on a large BNN run.

100 draws x 2 chains of the MLP 784-100-100-10 (89,610 parameters) from SGLD through
``pyro.infer.MCMC``, then ``to_arviz(mcmc)`` twice: as it is by default (with the per-observation
log-likelihood, the posterior predictive and the observed data, which replay the model once per
draw on all the data) and with ``log_likelihood=False, posterior_predictive=False,
observed_data=False`` (the draws and statistics only, shared with the run's tensors). For each:
wall time and the rise of the peak resident memory during the export
(``benchmarks/step_overhead.py``'s measurement), against the bytes of the draws.

Run::

    .venv/bin/python benchmarks/to_arviz_export.py

It prints one line per mode and writes ``benchmarks/results/to_arviz_export.json`` and ``.md``.
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
    model, data = so.subsampled_model(net), so.random_data((784,))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "chains drawn sequentially" on 2 cores
        mcmc = MCMC(SGLD(model, step_size=1e-6), num_samples=100, warmup_steps=0, num_chains=2,
                    disable_progbar=True)
        mcmc.run(*data)
        import arviz  # noqa: F401  (its import time is not the export's)
    draws = mcmc.get_samples(group_by_chain=True)
    draw_mb = sum(v.numel() * v.element_size() for v in draws.values()) / 1e6
    num_data = len(data[0])
    rows = []
    for mode, kwargs in (("draws and statistics only",
                          {"log_likelihood": False, "posterior_predictive": False,
                           "observed_data": False}),
                         ("default (+ log-likelihood, predictive, observed data)", {})):
        start = time.perf_counter()
        rise_mb, idata, _ = so.peak_rss_rise_mb(lambda kw=kwargs: pyro_flat.to_arviz(mcmc, **kw))
        seconds = time.perf_counter() - start
        rows.append({"mode": mode, "seconds": seconds, "peak_rss_rise_mb": rise_mb,
                     "groups": list(idata.groups())})
        print(f"{mode}: draws {draw_mb:.1f} MB; to_arviz {seconds:.2f} s; peak RSS rise "
              f"{rise_mb:.1f} MB")
    result = {"draws_mb": draw_mb, "num_draws": 200, "num_data": num_data, "rows": rows,
              "torch": torch.__version__}
    out = Path(__file__).parent / "results" / "to_arviz_export"
    out.with_suffix(".json").write_text(json.dumps(result, indent=1))
    lines = [f"# to_arviz export: 100 draws x 2 chains of the 784-100-100-10 MLP "
             f"({draw_mb:.1f} MB of draws), {num_data} data points, one thread",
             "", "Command: `.venv/bin/python benchmarks/to_arviz_export.py`", "",
             "| export | wall time (s) | peak RSS rise (MB) | groups |", "|---|---:|---:|---|"]
    lines += [f"| {r['mode']} | {r['seconds']:.2f} | {r['peak_rss_rise_mb']:.1f} | "
              f"{', '.join(r['groups'])} |" for r in rows]
    out.with_suffix(".md").write_text("\n".join(lines) + "\n")

if __name__ == "__main__":
    main()
