"""Every bad input to what the last two turns added is answered: a clear error naming the argument
and the accepted range, or a warning that says what it costs.

The table holds one or more cases per parameter of each public function and class added then
(draws on disk, distributed runs, warmup adaptation, ``LeanELBO``, ``BNN`` and its likelihoods,
the regression metrics, the reference predictive) and per option of ``pyro-flat compare``;
:func:`test_every_parameter_has_a_case` reads their signatures and the command's parser, so a
parameter added later without a case fails. A parameter that takes any value is listed in
:data:`ANY_VALUE` with the reason. Issue 32's sweep found 28 of pyro_flat's own bad inputs silent,
obscure or crashing; each is a case here (marked "was: ...").
"""

from __future__ import annotations

import contextlib
import inspect
import io
import math
from collections.abc import Callable

import numpy as np
import pyro
import pyro.distributions as dist
import pytest
import torch
from pyro.infer import MCMC, NUTS

from pyro_flat import DrawWriter, LeanMCMC, cli, open_draws
from pyro_flat.distributed import (
    DistributedMCMC,
    data_parallel,
    process_group,
    rank,
    shard_bounds,
    shard_rows,
    world_size,
)
from pyro_flat.evaluation.hmc_reference import reference_predictive
from pyro_flat.evaluation.regression import (
    calibration_curve,
    crps,
    crps_gaussian,
    gaussian_nll,
    interval_coverage,
    predictive_summary,
    rmse,
    wasserstein2,
)
from pyro_flat.evaluation.stein import kernel_stein_discrepancy
from pyro_flat.infer import SGHMC, SGLD, LeanELBO, SGMCMCKernel
from pyro_flat.infer.laplace import LastLayerLaplace, SubnetworkLaplace
from pyro_flat.models.bnn import BNN
from pyro_flat.models.finetune import TrainedNetwork, add_lora
from pyro_flat.models.likelihoods import HeteroskedasticGaussian, HomoskedasticGaussian
from pyro_flat.target import tracing

Y = torch.tensor([0.0, 1.0, 2.0])
NAN_Y = torch.tensor([0.0, math.nan, 2.0])
INF_Y = torch.tensor([0.0, math.inf, 2.0])
DRAWS = torch.randn(50, 3, generator=torch.Generator().manual_seed(0))
ONES = torch.ones(3)


def model(y):
    mu = pyro.sample("mu", dist.Normal(0.0, 1.0))
    with pyro.plate("data", len(y)):
        pyro.sample("y", dist.Normal(mu, 1.0), obs=y)


def regression(x):
    w = pyro.sample("w", dist.Normal(0.0, 1.0).expand([2]).to_event(1))
    with pyro.plate("data", len(x)):
        return pyro.sample("obs", dist.Normal(x @ w, 1.0))


def kernel(**kwargs):
    return SGLD(model, **{"step_size": 1e-2, **kwargs})


def sample(kernel, num_samples=2, warmup_steps=0, data=Y, **kwargs):
    MCMC(kernel, num_samples=num_samples, warmup_steps=warmup_steps, disable_progbar=True,
         **kwargs).run(data)


def net():
    return torch.nn.Linear(2, 1)


def pyro_net():
    return BNN(net(), HomoskedasticGaussian()).net


def store(path):
    """A store of 3 draws of ``model``, written into ``path``."""
    writer = DrawWriter(path, num_samples=3)
    sample(kernel(), num_samples=3, hook_fn=writer, save_params=[])
    return path


def predictive(samples=None, **kwargs):
    """``reference_predictive`` of :func:`regression` at 5 points, 4 draws of ``w`` by default."""
    samples = {"w": torch.ones(4, 2)} if samples is None else samples
    return reference_predictive(regression, samples, torch.ones(5, 2), **kwargs)


def lean_elbo_loss(**kwargs):
    guide = pyro.infer.autoguide.AutoNormal(model)
    return LeanELBO(**kwargs).loss(model, guide, Y)


#: ``"Owner.parameter: what"`` -> (call, exception or warning class, pattern). A call taking
#: ``tmp`` gets a fresh temporary folder.
def small_net() -> torch.nn.Module:
    return torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Tanh(), torch.nn.Linear(4, 2))


KSD_X = torch.randn(6, 2)

CASES: dict[str, tuple[Callable, type, str]] = {
    # ---------------------------------------------------------------- fine-tuning, Laplace, KSD
    "LastLayerLaplace.net: not a module": (lambda: LastLayerLaplace(5), ValueError,
                                           "net must be a torch.nn.Module"),
    "LastLayerLaplace.likelihood: unknown": (
        lambda: LastLayerLaplace(small_net(), "poisson"), ValueError,
        "likelihood must be 'classification' or 'regression'"),
    "LastLayerLaplace.structure: unknown": (
        lambda: LastLayerLaplace(small_net(), structure="lowrank"), ValueError,
        r"structure must be one of \['diag', 'full', 'kron'\]"),
    "LastLayerLaplace.sigma_noise: 0": (
        lambda: LastLayerLaplace(small_net(), "regression", sigma_noise=0.0), ValueError,
        r"sigma_noise must be a finite number in \(0, inf\)"),
    "LastLayerLaplace.prior_precision: negative": (
        lambda: LastLayerLaplace(small_net(), prior_precision=-1.0), ValueError,
        "prior_precision must be a finite number"),
    "LastLayerLaplace.temperature: NaN": (
        lambda: LastLayerLaplace(small_net(), temperature=math.nan), ValueError,
        "temperature must be a finite number"),
    "SubnetworkLaplace.net: not a module": (lambda: SubnetworkLaplace("net", "0"), ValueError,
                                            "net must be a torch.nn.Module"),
    "SubnetworkLaplace.indices: repeated": (
        lambda: SubnetworkLaplace(small_net(), torch.tensor([1, 1])), ValueError,
        r"indices must be distinct positions in \[0, 26\)"),
    "SubnetworkLaplace.indices: no such parameter": (
        lambda: SubnetworkLaplace(small_net(), "5"), ValueError,
        r"indices must name parameters or modules of the network; not found: \['5'\]"),
    "SubnetworkLaplace.likelihood: unknown": (
        lambda: SubnetworkLaplace(small_net(), "0", "ordinal"), ValueError,
        "likelihood must be"),
    "SubnetworkLaplace.structure: kron": (
        lambda: SubnetworkLaplace(small_net(), "0", structure="kron"), ValueError,
        "structure must be 'full' or 'diag'"),
    "SubnetworkLaplace.sigma_noise: negative": (
        lambda: SubnetworkLaplace(small_net(), "0", "regression", sigma_noise=-2.0),
        ValueError, "sigma_noise must be a finite number"),
    "SubnetworkLaplace.prior_precision: 0": (
        lambda: SubnetworkLaplace(small_net(), "0", prior_precision=0.0), ValueError,
        "prior_precision must be a finite number"),
    "SubnetworkLaplace.temperature: infinite": (
        lambda: SubnetworkLaplace(small_net(), "0", temperature=math.inf), ValueError,
        "temperature must be a finite number"),
    "TrainedNetwork.net: not a module": (lambda: TrainedNetwork([1, 2]), ValueError,
                                         "net must be a torch.nn.Module"),
    "TrainedNetwork.head: no such module": (lambda: TrainedNetwork(small_net(), head="fc"),
                                            ValueError, "head must name a submodule"),
    "add_lora.net: not a module": (lambda: add_lora(None, ["0"]), ValueError,
                                   "net must be a torch.nn.Module"),
    "add_lora.layers: not a Linear": (lambda: add_lora(small_net(), ["1"]), ValueError,
                                      "layers must name nn.Linear modules of the network"),
    "add_lora.layers: none": (lambda: add_lora(small_net(), []), ValueError,
                              "layers must name at least one"),
    "add_lora.rank: 0": (lambda: add_lora(small_net(), "0", rank=0), ValueError, "rank"),
    "add_lora.alpha: negative": (lambda: add_lora(small_net(), "0", alpha=-1.0), ValueError,
                                 "alpha must be a finite number"),
    "kernel_stein_discrepancy.draws: one dimension": (
        lambda: kernel_stein_discrepancy(torch.randn(6), torch.randn(6)), ValueError,
        r"draws and scores must both be \(n, d\)"),
    "kernel_stein_discrepancy.scores: another shape": (
        lambda: kernel_stein_discrepancy(KSD_X, KSD_X[:, :1]), ValueError,
        r"draws and scores must both be \(n, d\)"),
    "kernel_stein_discrepancy.log_weights: another length": (
        lambda: kernel_stein_discrepancy(KSD_X, -KSD_X, log_weights=torch.zeros(2)),
        ValueError, r"log_weights must be \(6,\)"),
    "kernel_stein_discrepancy.estimator: unknown": (
        lambda: kernel_stein_discrepancy(KSD_X, -KSD_X, estimator="w"), ValueError,
        "estimator must be 'v' or 'u'"),
    "kernel_stein_discrepancy.c: 0": (
        lambda: kernel_stein_discrepancy(KSD_X, -KSD_X, c=0.0), ValueError, "c must be"),
    "kernel_stein_discrepancy.beta: -1": (
        lambda: kernel_stein_discrepancy(KSD_X, -KSD_X, beta=-1.0), ValueError,
        r"beta must be in \(-1, 0\)"),
    "kernel_stein_discrepancy.lengthscale: NaN": (
        lambda: kernel_stein_discrepancy(KSD_X, -KSD_X, lengthscale=math.nan), ValueError,
        "lengthscale must be"),
    "kernel_stein_discrepancy.block_size: 0": (
        lambda: kernel_stein_discrepancy(KSD_X, -KSD_X, block_size=0), ValueError,
        "block_size"),
    # ---------------------------------------------------------------- regression metrics
    "crps.draws: one draw": (lambda: crps(DRAWS[:1], Y), ValueError,
                             r"draws must have shape \(num_draws >= 2, num_data >= 1\)"),
    "crps.y: NaN (was: nan)": (lambda: crps(DRAWS, NAN_Y), ValueError, "y must be finite"),
    "crps.y: another length": (lambda: crps(DRAWS, torch.ones(4)), ValueError,
                               r"y must hold one value per data point, shape \(3,\)"),
    "crps_gaussian.mean: NaN": (lambda: crps_gaussian(NAN_Y, ONES, Y), ValueError,
                                "mean must be finite"),
    "crps_gaussian.sd: negative": (lambda: crps_gaussian(Y, -ONES, Y), ValueError,
                                   "sd must be positive at every point"),
    "crps_gaussian.y: infinite": (lambda: crps_gaussian(Y, ONES, INF_Y), ValueError,
                                  "y must be finite at every point: 1 NaN or infinite"),
    "gaussian_nll.mean: NaN (was: nan)": (lambda: gaussian_nll(NAN_Y, ONES, Y), ValueError,
                                          "mean must be finite"),
    "gaussian_nll.sd: zero": (lambda: gaussian_nll(Y, torch.zeros(3), Y), ValueError,
                              "sd must be positive at every point"),
    "gaussian_nll.y: infinite (was: inf)": (lambda: gaussian_nll(Y, ONES, INF_Y), ValueError,
                                            "y must be finite"),
    "rmse.mean: NaN": (lambda: rmse(NAN_Y, Y), ValueError, "mean must be finite"),
    "rmse.y: NaN": (lambda: rmse(Y, NAN_Y), ValueError, "y must be finite"),
    "interval_coverage.lower: above upper (was: 0.0)": (
        lambda: interval_coverage(Y + 1, Y - 1, Y), ValueError,
        r"lower must be <= upper at every point: 3 reversed"),
    "interval_coverage.upper: another length": (
        lambda: interval_coverage(Y, torch.ones(4), Y), ValueError,
        r"upper must have the shape of y, \(3,\), got \(4,\)"),
    "interval_coverage.y: NaN (was: coverage 0.95)": (
        lambda: interval_coverage(Y - 1, Y + 1, NAN_Y), ValueError, "y must be finite"),
    "calibration_curve.draws: NaN": (
        lambda: calibration_curve(torch.full((5, 3), math.nan), Y), ValueError,
        "draws hold NaN or inf"),
    "calibration_curve.y: NaN": (lambda: calibration_curve(DRAWS, NAN_Y), ValueError,
                                 "y must be finite"),
    "calibration_curve.levels: 1.5": (lambda: calibration_curve(DRAWS, Y, levels=[1.5]),
                                      ValueError, r"levels must be a number in \(0.0, 1.0\)"),
    "predictive_summary.draws: one draw": (
        lambda: predictive_summary(torch.ones(1, 3)), ValueError,
        r"draws must have shape \(num_draws >= 2"),
    "predictive_summary.level: 1": (lambda: predictive_summary(DRAWS, level=1.0), ValueError,
                                    r"level must be a number in \(0.0, 1.0\), got 1.0"),
    "wasserstein2.draws: NaN": (lambda: wasserstein2(torch.full((5, 3), math.nan), DRAWS),
                                ValueError, "draws hold NaN or inf"),
    "wasserstein2.reference_draws: other points": (
        lambda: wasserstein2(DRAWS, torch.randn(50, 4)), ValueError,
        r"reference_draws must have shape \(num_reference_draws >= 2, num_data = 3\)"),
    "wasserstein2.reduction: 'sum'": (lambda: wasserstein2(DRAWS, DRAWS, reduction="sum"),
                                      ValueError, "reduction must be 'mean' or 'none'"),
    # ---------------------------------------------------------------- draws on disk
    "LeanMCMC.kernel: not a kernel": (lambda: LeanMCMC(model, num_samples=5), ValueError,
                                      "kernel must be a pyro MCMCKernel .* got function"),
    "LeanMCMC.num_samples: 0 (was: TypeError)": (
        lambda: LeanMCMC(kernel(), num_samples=0), ValueError,
        "num_samples must be an integer >= 1, got 0"),
    "LeanMCMC.num_samples: -3 (was: AttributeError)": (
        lambda: LeanMCMC(kernel(), num_samples=-3), ValueError,
        "num_samples must be an integer >= 1, got -3"),
    "LeanMCMC.warmup_steps: -1": (lambda: LeanMCMC(kernel(), 5, warmup_steps=-1), ValueError,
                                  "warmup_steps must be an integer >= 0, got -1"),
    "LeanMCMC.num_chains: 0": (lambda: LeanMCMC(kernel(), 5, num_chains=0), ValueError,
                               "num_chains must be an integer >= 1, got 0"),
    "LeanMCMC.hook_fn: not callable": (lambda: LeanMCMC(kernel(), 5, hook_fn="print"),
                                       ValueError, "hook_fn must be callable"),
    "LeanMCMC.save_params: a number": (lambda: LeanMCMC(kernel(), 5, save_params=5), ValueError,
                                       "save_params must be a list of site names, got 5"),
    "LeanMCMC.save_params: no such site (was: KeyError)": (
        lambda: LeanMCMC(kernel(), 2, save_params=["nope"], disable_progbar=True).run(Y),
        ValueError, r"save_params names 'nope', which is not a latent site .* \['mu'\]"),
    "DrawWriter.path: a number": (lambda: DrawWriter(5, num_samples=10), ValueError,
                                  "path must be a directory path"),
    "DrawWriter.num_samples: 2.5": (lambda tmp: DrawWriter(tmp / "d", num_samples=2.5),
                                    ValueError, "num_samples must be an integer >= 1, got 2.5"),
    "DrawWriter.num_samples: more than the run's (was: 0 of 20 written)": (
        lambda tmp: sample(kernel(), num_samples=20,
                           hook_fn=DrawWriter(tmp / "d", num_samples=30)),
        ValueError, r"DrawWriter\(num_samples=30\), but the run drew 20 draws per chain: give it "
                    "MCMC's num_samples"),
    "DrawWriter.sites: a number": (lambda tmp: DrawWriter(tmp / "d", 5, sites=5), ValueError,
                                   "sites must be a list of site names, got 5"),
    "DrawWriter.sites: one string": (lambda tmp: DrawWriter(tmp / "d", 5, sites="mu"),
                                     ValueError, "sites must be a list of site names, got the "
                                                 "string 'mu'"),
    "DrawWriter.stats: a number": (lambda tmp: DrawWriter(tmp / "d", 5, stats=3), ValueError,
                                   r"stats must be a list of statistic names \(or True or False"),
    "DrawWriter.thin: 0": (lambda tmp: DrawWriter(tmp / "d", 5, thin=0), ValueError,
                           "thin must be an integer >= 1, got 0"),
    "DrawWriter.block_size: 0": (lambda tmp: DrawWriter(tmp / "d", 5, block_size=0),
                                 ValueError, "block_size must be an integer >= 1, got 0"),
    "DrawWriter.block_size: too large to allocate (was: MemoryError)": (
        lambda tmp: sample(kernel(), num_samples=5,
                           hook_fn=DrawWriter(tmp / "d", 5, block_size=10**15)),
        ValueError, r"DrawWriter\(block_size=1000000000000000\) needs a block of [\d,]+ bytes"),
    "DrawWriter.resume: a string": (lambda tmp: DrawWriter(tmp / "d", 5, resume="yes"),
                                    ValueError, "resume must be True or False, got 'yes'"),
    "DrawWriter.resume: no store": (lambda tmp: DrawWriter(tmp / "d", 5, resume=True),
                                    ValueError, "resume=True, but path .* holds no draw store"),
    "DrawWriter.resume: a fresh kernel (was: duplicated draws)": (
        lambda tmp: sample(kernel(), num_samples=3,
                           hook_fn=DrawWriter(store(tmp / "d"), 3, resume=True)),
        ValueError, "resume=True: .* does not continue with this kernel"),
    "DrawWriter.chain_offset: -1": (lambda tmp: DrawWriter(tmp / "d", 5, chain_offset=-1),
                                    ValueError, "chain_offset must be an integer >= 0, got -1"),
    "DrawWriter.hook_fn: not callable": (lambda tmp: DrawWriter(tmp / "d", 5, hook_fn=3),
                                         ValueError, r"hook_fn must be callable as hook_fn"),
    "open_draws.path: a number (was: TypeError)": (
        lambda: open_draws(5), ValueError, "path must be a directory path"),
    "open_draws.path: no parts": (lambda tmp: open_draws(tmp), ValueError,
                                  r"path .* holds no draws \(no part-\*.nc files\)"),
    "open_draws.path: an empty part (was: no file named)": (
        lambda tmp: (tmp.joinpath("part-0000.nc").write_bytes(b""), open_draws(tmp)),
        ValueError, r"cannot read any part of the draw store .* \(truncated, corrupt, or not "
                    r"written by pyro_flat.DrawWriter\): .*part-0000.nc"),
    # ---------------------------------------------------------------- distributed
    "DistributedMCMC.kernel: not a kernel": (lambda: DistributedMCMC(model, 5), ValueError,
                                             "kernel must be a pyro MCMCKernel"),
    "DistributedMCMC.num_samples: 0": (lambda: DistributedMCMC(kernel(), 0), ValueError,
                                       "num_samples must be an integer >= 1, got 0"),
    "DistributedMCMC.warmup_steps: 2.5 (was: unchecked)": (
        lambda: DistributedMCMC(kernel(), 5, warmup_steps=2.5), ValueError,
        "warmup_steps must be an integer >= 0, got 2.5"),
    "DistributedMCMC.warmup_steps: a string": (
        lambda: DistributedMCMC(kernel(), 5, warmup_steps="10"), ValueError,
        "warmup_steps must be an integer >= 0"),
    "DistributedMCMC.seed: -1": (lambda: DistributedMCMC(kernel(), 5, seed=-1), ValueError,
                                 "seed must be an integer >= 0, got -1"),
    "DistributedMCMC.group: not a group": (lambda: DistributedMCMC(kernel(), 5, group=5),
                                           ValueError, "group must be a torch.distributed"),
    "DistributedMCMC.check_every: 0": (lambda: DistributedMCMC(kernel(), 5, check_every=0),
                                       ValueError, "check_every must be an integer >= 1"),
    "DistributedMCMC.hook_fn: not callable": (lambda: DistributedMCMC(kernel(), 5, hook_fn=3),
                                              ValueError, "hook_fn must be callable"),
    "DistributedMCMC.draws_path: a number": (
        lambda: DistributedMCMC(kernel(), 5, draws_path=3), ValueError,
        "draws_path must be a directory path"),
    "DistributedMCMC.draw_options: without draws_path": (
        lambda: DistributedMCMC(kernel(), 5, draw_options={"thin": 2}), ValueError,
        "draw_options is given but draws_path is not"),
    "DistributedMCMC.draw_options: an unknown option": (
        lambda tmp: DistributedMCMC(kernel(), 5, draws_path=tmp / "d",
                                    draw_options={"resume": True}), ValueError,
        r"draw_options may set \['sites', 'stats', 'thin', 'block_size'\]"),
    "DistributedMCMC.save_params: a number": (
        lambda: DistributedMCMC(kernel(), 5, save_params=5), ValueError,
        "save_params must be a list of site names, got 5"),
    "DistributedMCMC.disable_progbar: a string": (
        lambda: DistributedMCMC(kernel(), 5, disable_progbar="no"), ValueError,
        "disable_progbar must be True or False, got 'no'"),
    "data_parallel.kernel: NUTS": (lambda: data_parallel(NUTS(model), 10), TypeError,
                                   "data_parallel needs a pyro_flat kernel, got NUTS"),
    "data_parallel.num_data: 0": (lambda: data_parallel(kernel(subsample_size=2), 0),
                                  ValueError, "num_data must be an integer >= 1, got 0"),
    "data_parallel.group: not a group": (
        lambda: data_parallel(kernel(subsample_size=2), 10, group="all"), ValueError,
        "group must be a torch.distributed.ProcessGroup"),
    "process_group.backend: 'mpi'": (lambda: process_group("mpi").__enter__(), ValueError,
                                     r"backend must be one of \('gloo', 'nccl'\)"),
    "process_group.timeout: 0": (lambda: process_group(timeout=0).__enter__(), ValueError,
                                 "timeout must be a positive number of seconds"),
    "rank.group: not a group": (lambda: rank(5), ValueError, "group must be a torch"),
    "world_size.group: not a group": (lambda: world_size(5), ValueError,
                                      "group must be a torch"),
    "shard_bounds.num_data: -1": (lambda: shard_bounds(-1, 0, 2), ValueError,
                                  "num_data must be an integer >= 0, got -1"),
    "shard_bounds.rank: the world size": (lambda: shard_bounds(10, 2, 2), ValueError,
                                          r"rank must be an integer in \[0, world_size - 1\] = "
                                          r"\[0, 1\], got 2"),
    "shard_bounds.world_size: 0 (was: ZeroDivisionError)": (
        lambda: shard_bounds(10, 0, 0), ValueError, "world_size must be an integer >= 1"),
    "shard_rows.tensors: a scalar (was: IndexError)": (
        lambda: shard_rows(torch.tensor(1.0)), ValueError,
        "shard_rows needs tensors of one or more dimensions"),
    "shard_rows.tensors: different lengths": (
        lambda: shard_rows(torch.ones(3), torch.ones(4)), ValueError,
        r"one leading size N, got sizes \[3, 4\]"),
    "shard_rows.group: not a group": (lambda: shard_rows(ONES, group=5), ValueError,
                                      "group must be a torch"),
    # ---------------------------------------------------------------- kernels' arguments
    "SGMCMCKernel.model: with a potential_fn too": (
        lambda: SGLD(model, potential_fn=lambda z: 0), ValueError,
        "give exactly one of model and potential_fn"),
    "SGMCMCKernel.potential_fn: without initial_params": (
        lambda: sample(SGLD(potential_fn=lambda z: (z["x"] ** 2).sum() / 2, step_size=0.1)),
        ValueError, "a potential_fn needs initial_params"),
    "SGMCMCKernel.step_size: -1": (lambda: SGLD(model, step_size=-1), ValueError,
                                   r"step_size must be a finite number in \(0, inf\)"),
    "SGMCMCKernel.initial_params: a number (was: silent)": (
        lambda: SGLD(model, initial_params=3), ValueError,
        "initial_params must be a dict of site name"),
    "SGMCMCKernel.initial_params: a missing site": (
        lambda: sample(kernel(initial_params={"m": torch.zeros(())})), ValueError,
        r"initial_params is missing the sites \['mu'\]"),
    "SGMCMCKernel.temperature: -1": (lambda: SGLD(model, temperature=-1), ValueError,
                                     r"temperature must be a finite number in \[0, inf\)"),
    "SGMCMCKernel.subsample_size: 2.5": (lambda: SGLD(model, subsample_size=2.5), ValueError,
                                         "subsample_size must be an integer >= 1, got 2.5"),
    "SGMCMCKernel.subsample_size: NumPy data (was: told to pass the data as arguments)": (
        lambda: MCMC(SGLD(regression_xy, step_size=1e-3, subsample_size=8), num_samples=2,
                     disable_progbar=True).run(NP_X, NP_X[:, 0]),
        ValueError, r"subsample_size slices torch tensors, but the model's data arguments are "
                    r"\['ndarray', 'ndarray'\]: convert them with torch.as_tensor"),
    "SGMCMCKernel.subsample_size: left out on 10,000 points": (
        lambda: sample(kernel(), data=torch.zeros(tracing.FULL_BATCH_HINT_POINTS)),
        UserWarning, r"every SG step evaluates the model on all 10,000 points of plate 'data' "
                     r"\(full batch: no subsample_size\), about 78 times the cost"),
    "SGMCMCKernel.num_steps_per_sample: 0": (
        lambda: SGLD(model, num_steps_per_sample=0), ValueError,
        "num_steps_per_sample must be an integer >= 1, got 0"),
    "SGMCMCKernel.num_steps_per_sample: 'Auto'": (
        lambda: SGLD(model, num_steps_per_sample="Auto"), ValueError,
        "num_steps_per_sample must be an integer >= 1 or 'auto'"),
    "SGMCMCKernel.step_size_schedule: a number": (
        lambda: SGLD(model, step_size_schedule=0.1), ValueError,
        "step_size_schedule must be a callable of the step index"),
    "SGMCMCKernel.init_strategy: a string": (
        lambda: SGLD(model, init_strategy="median"), TypeError,
        "init_strategy must be a callable Pyro init strategy"),
    "SGMCMCKernel.data_plate: no such plate": (
        lambda: sample(kernel(data_plate="rows")), ValueError,
        r"data_plate='rows' is not a plate enclosing every observed site; candidates: "
        r"\['data'\]"),
    "SGMCMCKernel.max_nonfinite_steps: 0": (
        lambda: SGLD(model, max_nonfinite_steps=0), ValueError,
        "max_nonfinite_steps must be an integer >= 1, got 0"),
    "SGMCMCKernel.preconditioner: 'adam'": (
        lambda: SGLD(model, preconditioner="adam"), ValueError,
        r"preconditioner must be one of \(None, 'diag'\), got 'adam'"),
    "SGMCMCKernel.preconditioner: 'diag' with warmup 1 (was: silent, no metric)": (
        lambda: sample(SGLD(model, preconditioner="diag"), warmup_steps=1), ValueError,
        r"preconditioner='diag' .* warmup_steps=1: give .* at least 4"),
    "SGMCMCKernel.stability_fraction: 1.5": (
        lambda: SGLD(model, stability_fraction=1.5), ValueError,
        r"stability_fraction must be a number in \(0.0, 1.0\), got 1.5"),
    "SGMCMCKernel.stability_fraction: with a step_size (was: ignored silently)": (
        lambda: SGLD(model, step_size=1e-2, stability_fraction=0.1), UserWarning,
        "stability_fraction=0.1 is used only when warmup chooses the step size"),
    "SGMCMCKernel.vectorized_chains: 0": (lambda: SGLD(model, vectorized_chains=0), ValueError,
                                          "vectorized_chains must be an integer >= 1, got 0"),
    "SGMCMCKernel.compile: 'yes'": (lambda: SGLD(model, 1e-2, compile="yes"), ValueError,
                                    r"compile must be one of \(False, True, 'auto'\)"),
    "SGHMC.friction: 0": (lambda: SGHMC(model, friction=0), ValueError,
                          r"friction must be a finite number in \(0, inf\)"),
    "SGHMC.mass: 0": (lambda: SGHMC(model, mass=0), ValueError,
                      r"mass must be a finite number in \(0, inf\)"),
    "SGHMC.noise_estimate: -1": (lambda: SGHMC(model, noise_estimate=-1), ValueError,
                                 r"noise_estimate must be a number in \[0.0, 1.0\]"),
    # ---------------------------------------------------------------- SVI, BNN, likelihoods
    "LeanELBO.num_particles: 0": (lambda: LeanELBO(num_particles=0), ValueError,
                                  "num_particles must be an integer >= 1, got 0"),
    "LeanELBO.vectorize_particles: True": (
        lambda: lean_elbo_loss(vectorize_particles=True, max_plate_nesting=1), UserWarning,
        "vectorize_particles=True"),
    "LeanELBO.kwargs: a misspelled keyword": (
        lambda: LeanELBO(max_plate_nestin=1), TypeError,
        "unexpected keyword argument 'max_plate_nestin'"),
    "BNN.net: not a module": (lambda: BNN(5, HomoskedasticGaussian()), ValueError,
                              "net must be a torch.nn.Module, got int"),
    "BNN.likelihood: a distribution": (
        lambda: BNN(net(), dist.Normal(0.0, 1.0)), ValueError,
        "likelihood must be a pyro_flat.models.likelihoods.Likelihood"),
    "BNN.prior_scale: 0": (lambda: BNN(net(), HomoskedasticGaussian(), prior_scale=0),
                           ValueError, r"prior_scale must be a finite number in \(0, inf\)"),
    "BNN.prior_scale: with a PyroModule (was: ignored silently)": (
        lambda: BNN(pyro_net(), HomoskedasticGaussian(), prior_scale=0.1), ValueError,
        "prior_scale apply to a plain torch network, which BNN makes Bayesian; net is a "
        "PyroModule already"),
    "BNN.subsample_size: 0": (lambda: BNN(net(), HomoskedasticGaussian(), subsample_size=0),
                              ValueError, "subsample_size must be an integer >= 1, got 0"),
    "BNN.prior_options: an unknown option": (
        lambda: BNN(net(), HomoskedasticGaussian(), priors="normal"), TypeError,
        "unexpected keyword argument 'priors'"),
    "BNN.prior_options: with a PyroModule (was: ignored silently)": (
        lambda: BNN(pyro_net(), HomoskedasticGaussian(), scale_rule="fan_in"), ValueError,
        "scale_rule apply to a plain torch network"),
    "HeteroskedasticGaussian.min_scale: -1": (
        lambda: HeteroskedasticGaussian(min_scale=-1), ValueError,
        r"min_scale must be a finite number in \[0, inf\)"),
    "HomoskedasticGaussian.scale: 0": (lambda: HomoskedasticGaussian(scale=0), ValueError,
                                       r"scale must be a finite number in \(0, inf\)"),
    "HomoskedasticGaussian.prior_scale: -1": (
        lambda: HomoskedasticGaussian(prior_scale=-1), ValueError,
        r"prior_scale must be a finite number in \(0, inf\)"),
    # ---------------------------------------------------------------- reference predictive
    "reference_predictive.model: not callable": (
        lambda: reference_predictive(5, {"w": torch.ones(4, 2)}), ValueError,
        "model must be a Pyro model"),
    "reference_predictive.samples: a site's draws of another shape (was: broadcast)": (
        lambda: predictive({"w": torch.ones(4, 3)}), ValueError,
        r"samples\['w'\] has shape \(4, 3\), but the site's draws must be "
        r"\(num_draws, \*site_shape\) = \(4, 2\)"),
    "reference_predictive.samples: empty": (lambda: predictive({}), ValueError,
                                            "samples must be a non-empty dict"),
    "reference_predictive.kind: 'binary'": (
        lambda: predictive(kind="binary"), ValueError,
        "kind must be 'auto', 'classification' or 'regression'"),
    "reference_predictive.obs_site: not a site": (
        lambda: predictive(obs_site="y"), ValueError, r"obs_site 'y' is not a sampled site"),
    "reference_predictive.seed: -1": (lambda: predictive(seed=-1), ValueError,
                                      "seed must be an integer >= 0"),
    "reference_predictive.batch_size: 0": (lambda: predictive(batch_size=0), ValueError,
                                           "batch_size must be an integer >= 1"),
}

NP_X = np.random.default_rng(0).normal(size=(40, 2))


def regression_xy(x, y):
    w = pyro.sample("w", dist.Normal(0.0, 1.0).expand([2]).to_event(1))
    with pyro.plate("data", len(y)):
        pyro.sample("y", dist.Normal(torch.as_tensor(x, dtype=torch.float32) @ w, 1.0),
                    obs=torch.as_tensor(y, dtype=torch.float32))


#: Bad ``pyro-flat compare`` options: (arguments, the one error line says).
CLI_CASES: dict[str, tuple[list[str], str]] = {
    "--dataset: unknown": (["--dataset", "cifar100"], "argument --dataset: invalid choice"),
    "--download: a generated data set (was: accepted, nothing to download)": (
        ["--dataset", "digits", "--download"],
        "argument --download: only mnist, fashion_mnist, cifar10 are downloaded; 'digits'"),
    "--methods: unknown": (["--methods", "sgld,nuts"], "unknown method(s) nuts"),
    "--methods: only the reference": (["--methods", "sgd"], "name at least one of sgld"),
    "--budget: below 20": (["--budget", "19"], "integer >= 20"),
    "--budget: a word": (["--budget", "fast"], "argument --budget"),
    "--equal: unknown": (["--equal", "flops"], "argument --equal: invalid choice: 'flops'"),
    "--protocol: unknown": (["--protocol", "paper"], "argument --protocol: invalid choice"),
    "--finetune-part: unknown": (["--protocol", "finetune", "--finetune-part", "body"],
                                 "argument --finetune-part: invalid choice: 'body'"),
    "--finetune-part: without --protocol finetune": (
        ["--finetune-part", "adapters"], "argument --finetune-part: only with --protocol finetune"),
    "--tune: with only the reference": (["--tune", "--methods", "sgd"],
                                        "argument --methods: name at least one of"),
    "--seed: negative": (["--seed", "-1"], "argument --seed"),
    "--seeds: 0": (["--seeds", "0"], "argument --seeds"),
    "--seeds: past 2**32": (["--seed", "4294967295", "--seeds", "2"],
                            "the last seed 4294967296 must be below"),
    "--device: unknown type": (["--device", "meta"], "unsupported device type 'meta'"),
    "--threads: 0": (["--threads", "0"], "argument --threads: must be a positive integer"),
    "--out: a file": (["--out", "{tmp}/a-file"], "argument --out"),
    "--model: a CNN for regression": (["--dataset", "diabetes", "--model", "cnn"],
                                      "argument --model: 'cnn' does not fit the regression"),
    "--hidden: too wide (was: failed later, 'see results.json')": (
        ["--hidden", "1000000000"],
        "argument --hidden: must be comma-separated layer widths in [1, 100,000]"),
    "--hidden: an empty width": (["--hidden", "8,,8"], "argument --hidden"),
    "--reference: unknown": (["--reference", "nuts"], "argument --reference: invalid choice"),
    "--jobs: 1.5": (["--jobs", "1.5"], "argument --jobs: must be a positive integer"),
    "--progress: with --no-progress": (["--progress", "--no-progress"],
                                       "not allowed with argument"),
}

#: Parameters that take any value, with the reason.
ANY_VALUE = {
    "LeanMCMC.initial_params": "Pyro's own, checked by the kernel (SGMCMCKernel.initial_params)",
    "LeanMCMC.mp_context": "Pyro's own: passed to multiprocessing",
    "LeanMCMC.disable_progbar": "Pyro's own: any truthy value",
    "LeanMCMC.disable_validation": "Pyro's own: any truthy value",
    "LeanMCMC.transforms": "Pyro's own: a dict of transforms, as MCMC takes",
    "add_lora.generator": "torch's own: the random stream of the adapters' A factors",
}

#: The public functions and classes of the last two turns, by the name the cases use.
SURFACE: dict[str, Callable] = {
    f.__name__: f for f in (
        crps, crps_gaussian, gaussian_nll, rmse, interval_coverage, calibration_curve,
        predictive_summary, wasserstein2, LeanMCMC, DrawWriter, open_draws, DistributedMCMC,
        data_parallel, process_group, rank, world_size, shard_bounds, shard_rows, SGMCMCKernel,
        SGHMC, LeanELBO, BNN, HeteroskedasticGaussian, HomoskedasticGaussian,
        reference_predictive, LastLayerLaplace, SubnetworkLaplace, TrainedNetwork, add_lora,
        kernel_stein_discrepancy)
}


def parameters(owner: str) -> list[str]:
    """The parameters of ``SURFACE[owner]`` a user passes (``*args`` under its own name)."""
    fn = SURFACE[owner]
    if owner == "LeanMCMC":  # takes MCMC's
        fn = MCMC
    skip = {"self", "args", "kwargs"} if owner not in ("LeanELBO",) else {"self"}
    names = [p for p in inspect.signature(fn).parameters if p not in skip]
    if owner == "SGHMC":  # the rest are SGMCMCKernel's
        names = [p for p in names if p not in inspect.signature(SGMCMCKernel).parameters]
    return names


def cli_options() -> list[str]:
    parser = cli._build_parser()
    compare = next(a for a in parser._subparsers._group_actions[0].choices.values()
                   if a.prog.endswith("compare"))
    return [a.option_strings[0] for a in compare._actions if a.option_strings
            and a.option_strings[0] not in ("-h", "--no-progress")]


def test_every_parameter_has_a_case():
    covered = {case.split(":")[0] for case in CASES}
    unknown = covered - {f"{o}.{p}" for o in SURFACE for p in parameters(o)} - {
        "LeanELBO.num_particles", "LeanELBO.vectorize_particles"}
    assert not unknown, f"cases for parameters that do not exist: {sorted(unknown)}"
    missing = [f"{owner}.{p}" for owner in SURFACE for p in parameters(owner)
               if f"{owner}.{p}" not in covered and f"{owner}.{p}" not in ANY_VALUE]
    assert not missing, f"parameters without a bad-input case: {missing}"
    options = {case.split(":")[0] for case in CLI_CASES}
    assert set(cli_options()) <= options, sorted(set(cli_options()) - options)


@pytest.mark.parametrize("case", sorted(CASES))
def test_bad_input_is_answered(case, tmp_path):
    call, kind, pattern = CASES[case]
    run = (lambda: call(tmp_path)) if "tmp" in inspect.signature(call).parameters else call
    if issubclass(kind, Warning):
        with pytest.warns(kind, match=pattern):
            run()
    else:
        with pytest.raises(kind, match=pattern):
            run()


@pytest.mark.parametrize("case", sorted(CLI_CASES))
def test_bad_option_is_a_one_line_usage_error(case, tmp_path):
    """Refused before anything runs or is written, with one line naming the option."""
    args, expected = CLI_CASES[case]
    (tmp_path / "a-file").write_text("")
    args = [a.replace("{tmp}", str(tmp_path)) for a in args]
    err = io.StringIO()
    with contextlib.redirect_stderr(err), pytest.raises(SystemExit) as stop:
        cli.main(["compare", "--budget", "20", "--out", str(tmp_path / "out"), *args])
    assert stop.value.code == 2
    last = err.getvalue().strip().splitlines()[-1]
    assert expected in last, last
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a-file"]


#: Cases whose error names the bad value rather than the parameter, with the reason.
NAMED_BY_VALUE = {
    "open_draws.path: an empty part (was: no file named)": "names the part file in the store",
    "shard_rows.tensors: a scalar (was: IndexError)": "names the argument by its position",
    "shard_rows.tensors: different lengths": "names the tensors' sizes",
    "BNN.prior_options: an unknown option": "names the option (Python's own message)",
    "BNN.prior_options: with a PyroModule (was: ignored silently)": "names the option",
    "LeanELBO.kwargs: a misspelled keyword": "names the keyword (Python's own message)",
}


def test_a_case_pattern_names_its_argument():
    """Each error's expected message names the parameter of its case (a warning: what to
    change), or the bad value where :data:`NAMED_BY_VALUE` says so."""
    unnamed = [case for case, (_, kind, pattern) in CASES.items()
               if not issubclass(kind, Warning) and case not in NAMED_BY_VALUE
               and case.split(":")[0].split(".")[1] not in pattern.replace("\\", "")]
    assert not unnamed, unnamed
    assert set(NAMED_BY_VALUE) <= set(CASES)
