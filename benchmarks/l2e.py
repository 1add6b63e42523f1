"""L2E against SGLD and cyclical SGLD on held-out tasks at an equal number of gradients; step time.

Held-out tasks (never seen in meta-training, see :mod:`pyro_flat.infer.mcmc.l2e.training.tasks`):

* ``mnist1d / MLP 96x3``: a held-out *architecture* (meta-training used depth <= 2, width <= 64)
  on MNIST-1D (4000 training signals, the 1000 test signals);
* ``synthetic-5 / MLP 64x2``: a held-out *data set*, scikit-learn's ``make_classification``
  (5 classes, 20 features, 2000 training and 1000 test points, 5% flipped labels).

Every network has N(0, 1) priors (``make_bayesian(prior_scale=1.0)``), batch 128, and every method
takes the same number of SG steps (one gradient each) and keeps 10 draws: SGLD and both L2E
variants discard the first half of the steps and then keep a draw every ``steps / 20`` steps;
cyclical SGLD runs 5 cosine cycles and keeps 2 draws at the end of each. Settings: SGLD
``step_size = 0.2 / N`` (the project's SGD learning rate 0.2 on the mean loss), cyclical SGLD
``2 x`` that at the start of each cycle with 80% exploration; L2E (ours) the defaults
(``step_size = sqrt(2 / N)``, temperature 1, the shipped meta-parameters); L2E (authors) their
published meta-parameters with their step and noise (``L2E.authors_settings(N)``), when
``../shared/reference/l2e_official_meta_params.npz`` is present. Scores of the model average on
the test set: accuracy, NLL, ECE, and the diversity of the draws (mean pairwise disagreement of
their predicted classes). Mean and standard deviation over seeds.

Step time: on the MLP 784-100-100-10 of ``benchmarks/step_overhead.py`` (batch 128, one thread),
L2E and SGLD are drawn from in interleaved chunks; the meta-network alone is timed on the
``(n, 9)`` features of all ``n`` parameters in the same rounds. Target: L2E step <= 1.2 x (SGLD
step + two meta-network evaluations). L2E's step time against SGLD through ``MCMC`` in a fresh
process is ``benchmarks/l2e_step_time.py`` (``--timing-only`` here runs it).

Run::

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/l2e.py            # ~15 min
    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/l2e.py --quick    # smoke run
"""

from __future__ import annotations

import argparse
import datetime
import itertools
import json
import statistics
import sys
import time
from pathlib import Path

import pyro
import torch
from pyro.infer import MCMC

from pyro_flat.datasets import load_dataset
from pyro_flat.evaluation import classification
from pyro_flat.evaluation.predictive import bma_probs
from pyro_flat.infer import L2E, SGLD, CyclicalSGLD
from pyro_flat.infer.mcmc.l2e.meta_net import MetaNet
from pyro_flat.models.bnn import BNN
from pyro_flat.models.likelihoods import Categorical

sys.path.insert(0, str(Path(__file__).parent))
import kernel_step_ratio as ksr  # noqa: E402
import step_overhead as so  # noqa: E402

OFFICIAL = Path(__file__).resolve().parents[1] / ".." / "shared" / "reference" / (
    "l2e_official_meta_params.npz")
KEPT, CYCLES = 10, 5
BATCH = 128
SGLD_LR = 0.2


def mlp(d_in: int, d_out: int, hidden: tuple[int, ...]) -> torch.nn.Sequential:
    layers: list[torch.nn.Module] = []
    for h in hidden:
        layers += [torch.nn.Linear(d_in, h), torch.nn.ReLU()]
        d_in = h
    return torch.nn.Sequential(*layers, torch.nn.Linear(d_in, d_out))


def synthetic5():
    from sklearn.datasets import make_classification

    x, y = make_classification(n_samples=3000, n_features=20, n_informative=8, n_redundant=4,
                               n_classes=5, n_clusters_per_class=2, class_sep=1.0, flip_y=0.05,
                               random_state=0)
    x = torch.tensor(x, dtype=torch.float32)
    x = (x - x[:2000].mean(0)) / x[:2000].std(0)
    y = torch.tensor(y)
    return x[:2000], y[:2000], x[2000:], y[2000:]


def task_data(name: str):
    if name == "mnist1d":
        d = load_dataset("mnist1d", seed=0)
        return d.x_train, d.y_train, d.x_test, d.y_test
    return synthetic5()


TASKS = {  # name: (data, hidden layers, SG steps per method)
    "mnist1d / MLP 96x3 (held-out architecture)": ("mnist1d", (96, 96, 96), 2000),
    "synthetic-5 / MLP 64x2 (held-out data set)": ("synthetic5", (64, 64), 2000),
}


def make_kernel(method: str, model, n: int, steps: int):
    thin = steps // (2 * KEPT)
    if method == "SGLD":
        return SGLD(model, step_size=SGLD_LR / n, num_steps_per_sample=thin), KEPT
    if method == "CyclicalSGLD":
        return CyclicalSGLD(model, step_size=2 * SGLD_LR / n, cycle_length=steps // CYCLES,
                            exploration_fraction=0.8, draws_per_cycle=KEPT // CYCLES), 0
    if method == "L2E (ours)":
        return L2E(model, num_steps_per_sample=thin), KEPT
    return L2E(model, meta_params=str(OFFICIAL), num_steps_per_sample=thin,
               **L2E.authors_settings(n)), KEPT


def run(method: str, task: str, seed: int, scale: float) -> dict:
    data_name, hidden, steps = TASKS[task]
    steps = max(int(steps * scale), 2 * KEPT * CYCLES)
    x, y, xt, yt = task_data(data_name)
    pyro.clear_param_store()
    pyro.set_rng_seed(seed)
    model = BNN(mlp(x.shape[1], int(y.max()) + 1, hidden), Categorical(), prior_scale=1.0,
                subsample_size=BATCH)
    net = model.net
    kernel, warmup = make_kernel(method, model, x.shape[0], steps)
    start = time.perf_counter()
    mcmc = MCMC(kernel, num_samples=KEPT, warmup_steps=warmup, disable_progbar=True)
    mcmc.run(x, y)
    seconds = time.perf_counter() - start
    probs, per_draw = bma_probs(net, mcmc.get_samples(), xt, return_per_draw=True)
    labels = per_draw.argmax(-1)
    pairs = list(itertools.combinations(range(len(labels)), 2))
    disagreement = statistics.fmean(float((labels[i] != labels[j]).float().mean())
                                    for i, j in pairs)
    single = statistics.fmean(classification.nll(p, yt) for p in per_draw)
    return {"method": method, "task": task, "seed": seed, "grad_evals": kernel.num_steps,
            "accuracy": classification.accuracy(probs, yt), "nll": classification.nll(probs, yt),
            "ece": classification.ece(probs, yt), "disagreement": disagreement,
            "single_draw_nll": single, "wall_time_s": seconds}


def summarise(rows: list[dict]) -> list[dict]:
    out = []
    for (task, method), group in itertools.groupby(rows, key=lambda r: (r["task"], r["method"])):
        group = list(group)
        entry = {"task": task, "method": method, "seeds": len(group),
                 "grad_evals": group[0]["grad_evals"]}
        for key in ("accuracy", "nll", "ece", "disagreement", "single_draw_nll", "wall_time_s"):
            values = [r[key] for r in group]
            entry[key] = statistics.fmean(values)
            entry[key + "_sd"] = statistics.stdev(values) if len(values) > 1 else 0.0
        out.append(entry)
    return out


def quality_table(summary: list[dict]) -> str:
    lines = ["| task | method | accuracy | BMA NLL | ECE | disagreement | mean single-draw NLL "
             "| grad evals | wall s |", "|---|---|---|---|---|---|---|---:|---:|"]
    for e in summary:
        cells = [f"{e[k]:.4f} ± {e[k + '_sd']:.4f}"
                 for k in ("accuracy", "nll", "ece", "disagreement", "single_draw_nll")]
        lines.append(f"| {e['task']} | {e['method']} | " + " | ".join(cells)
                     + f" | {e['grad_evals']} | {e['wall_time_s']:.1f} |")
    return "\n".join(lines)


def step_time(rounds: int, chunk: int) -> dict:
    """Interleaved chunks of SGLD and L2E draws (10 steps each) and of two meta-net calls."""
    pyro.set_rng_seed(0)
    net, _ = so.bayesian(so.make_mlp())
    model, data = so.subsampled_model(net), so.random_data((784,))
    chains = {"SGLD": ksr.Chain(SGLD(model, step_size=so.STEP_SIZE,
                                     num_steps_per_sample=so.STEPS_PER_DRAW), data),
              "L2E": ksr.Chain(L2E(model, step_size=so.STEP_SIZE,
                                   num_steps_per_sample=so.STEPS_PER_DRAW), data)}
    n = chains["L2E"].kernel.layout.size
    meta_net = MetaNet.shipped()
    features = torch.randn(n, 9)
    steps = chunk * so.STEPS_PER_DRAW

    def two_net_calls() -> None:
        for _ in range(steps):
            meta_net(features)
            meta_net(features)

    jobs = {"SGLD": lambda: chains["SGLD"].advance(chunk),
            "L2E": lambda: chains["L2E"].advance(chunk), "2 x meta-net": two_net_calls}
    for job in jobs.values():
        job()
    names = list(jobs)
    times: dict[str, list[tuple[float, float, float]]] = {k: [] for k in names}
    for r in range(rounds):
        for name in names[r % 3:] + names[:r % 3]:
            times[name].append(tuple(t / steps for t in ksr.timed(jobs[name])))
    out: dict = {"num_params": n, "rounds": rounds, "steps_per_chunk": steps}
    for i, clock in enumerate(("wall", "cpu", "thread_cpu")):
        series = {k: [t[i] for t in v] for k, v in times.items()}
        ratios = [lt / (st + mt) for lt, st, mt in
                  zip(series["L2E"], series["SGLD"], series["2 x meta-net"], strict=True)]
        q1, _, q3 = statistics.quantiles(ratios, n=4)
        out[clock] = {**{f"ms_{k}": 1e3 * statistics.median(v) for k, v in series.items()},
                      "ratio": statistics.median(ratios), "ratio_q1": q1, "ratio_q3": q3,
                      "ratio_to_sgld": statistics.median(
                          [a / b for a, b in zip(series["L2E"], series["SGLD"], strict=True)])}
    return out


TIMING_HEADER = (
    "\n\n## Step time (MLP 784-100-100-10, batch 128, one thread)\n\n"
    "| clock | parameters | SGLD ms/step | 2 meta-net evaluations ms | L2E ms/step | "
    "L2E / (SGLD + 2 meta-net), median [quartiles] | L2E / SGLD |\n"
    "|---|---:|---:|---:|---:|---|---:|\n")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--seeds", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--scale", type=float, default=1.0,
                        help="multiply every task's SG steps (e.g. 0.2: the meta-training horizon)")
    parser.add_argument("--no-timing", action="store_true", help="skip the step-time rounds")
    parser.add_argument("--timing-only", action="store_true",
                        help="only L2E's step time against SGLD, measured in a fresh process "
                             "by l2e_step_time.py (writes l2e_step_time.json/.md)")
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results")
    args = parser.parse_args(argv)
    if args.timing_only:
        import l2e_step_time

        l2e_step_time.main(["--out", str(args.out)] + (["--quick"] if args.quick else []))
        return
    torch.set_num_threads(1)
    scale, seeds, rounds = (0.05, 1, 4) if args.quick else (args.scale, args.seeds, args.rounds)
    methods = ["SGLD", "CyclicalSGLD", "L2E (ours)"] + (
        ["L2E (authors)"] if OFFICIAL.exists() else [])
    timing = None if args.no_timing else step_time(rounds, 1)
    timing_md = "" if timing is None else "\n".join(
        f"| {clock} | {timing['num_params']} | {t['ms_SGLD']:.2f} | {t['ms_2 x meta-net']:.2f} | "
        f"{t['ms_L2E']:.2f} | {t['ratio']:.2f} [{t['ratio_q1']:.2f}, {t['ratio_q3']:.2f}] | "
        f"{t['ratio_to_sgld']:.2f} |"
        for clock, t in ((c, timing[c]) for c in ("wall", "cpu", "thread_cpu")))
    print(timing_md, flush=True)
    rows = []
    for task in TASKS:
        for method in methods:
            for seed in range(seeds):
                rows.append(run(method, task, seed, scale))
                r = rows[-1]
                print(f"{task} {method} seed {seed}: acc {r['accuracy']:.4f} nll {r['nll']:.4f} "
                      f"ece {r['ece']:.4f} dis {r['disagreement']:.3f} {r['wall_time_s']:.0f}s",
                      flush=True)
    summary = summarise(rows)
    table = quality_table(summary)
    print(table)
    meta = {"command": " ".join(["python", *sys.argv]), "torch": torch.__version__,
            "pyro": pyro.__version__, "cpu": so.cpu_model(),
            "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
            "shipped_meta_params": MetaNet.shipped().info}
    suffix = "_quick" if args.quick else ("" if args.scale == 1.0 else f"_scale{args.scale:g}")
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"l2e{suffix}.json").write_text(json.dumps(
        {"meta": meta, "step_time": timing, "runs": rows, "summary": summary}, indent=1,
        default=str))
    (args.out / f"l2e{suffix}.md").write_text(
        "# L2E vs SGLD and cyclical SGLD on held-out tasks\n\n"
        f"- command: `{meta['command']}`; {meta['cpu']}; torch {meta['torch']}; {meta['date']}\n"
        f"- mean ± sd over {seeds} seeds; 10 draws per method; equal SG steps (gradients)\n\n"
        + table + ("" if timing is None else TIMING_HEADER + timing_md) + "\n")


if __name__ == "__main__":
    main()
