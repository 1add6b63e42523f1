"""Stream the draws of a BNN to disk, resume the run, and open the draws in ArviZ."""

import tempfile
from pathlib import Path

import arviz as az
import pyro
import torch
from pyro.infer import MCMC

import pyro_flat
from pyro_flat.infer import EntropyMCMC
from pyro_flat.models.bnn import BNN
from pyro_flat.models.likelihoods import Categorical

pyro.set_rng_seed(0)
x, y = torch.randn(500, 20), torch.randint(0, 3, (500,))
net = torch.nn.Sequential(torch.nn.Linear(20, 50), torch.nn.ReLU(), torch.nn.Linear(50, 3))
model = BNN(net, Categorical(), subsample_size=50)
store = Path(tempfile.mkdtemp()) / "draws"

# 1. Stream: every site (the guide's "<site>__guide" too) and every statistic go to disk;
#    the driver keeps only the output bias in memory.
kernel = EntropyMCMC(model, step_size=1e-4, eta=1.0, vectorized_chains=2)
writer = pyro_flat.DrawWriter(store, num_samples=200)
mcmc = MCMC(kernel, num_samples=200, warmup_steps=50, hook_fn=writer,
            save_params=["net.2.bias"], disable_progbar=True)
mcmc.run(x, y)
checkpoint = kernel.state_dict()

# 2. Resume: a new kernel continues from the checkpoint and the writer appends.
kernel = EntropyMCMC(model, step_size=1e-4, eta=1.0, vectorized_chains=2)
kernel.load_state_dict(checkpoint)
writer = pyro_flat.DrawWriter(store, num_samples=100, resume=True)
MCMC(kernel, num_samples=100, warmup_steps=0, hook_fn=writer, save_params=[],
     disable_progbar=True).run(x, y)

# 3. Open: posterior and sample_stats, read from disk as ArviZ needs them.
idata = pyro_flat.open_draws(store)
print(idata.posterior.sizes["chain"], idata.posterior.sizes["draw"])  # 2 300
print(az.summary(idata, var_names=["net.2.bias"]))
print(float(idata.sample_stats["coupling_distance"].mean()))
