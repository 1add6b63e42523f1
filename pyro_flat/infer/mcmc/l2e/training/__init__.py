"""Meta-training of L2E's sampler: the task distribution and antithetic evolution strategies.

This is how the meta-parameters shipped with :class:`pyro_flat.infer.L2E` were trained. Sampling
never imports it: its tasks need the data sets of :mod:`pyro_flat.datasets`, which sampling
does not.

* :mod:`~pyro_flat.infer.mcmc.l2e.training.tasks`: :class:`Task`, :func:`make_task`,
  :func:`sample_task`.
* :mod:`~pyro_flat.infer.mcmc.l2e.training.meta`: :class:`MetaTrainConfig`, :class:`MetaTrainer`,
  :func:`meta_loss`, :func:`inner_run`, :func:`bma_nll`.
"""

from pyro_flat.infer.mcmc.l2e.training.meta import (
    MetaTrainConfig,
    MetaTrainer,
    bma_nll,
    inner_run,
    meta_loss,
)
from pyro_flat.infer.mcmc.l2e.training.tasks import Task, make_task, sample_task

__all__ = ["MetaTrainConfig", "MetaTrainer", "bma_nll", "inner_run", "meta_loss",
           "Task", "make_task", "sample_task"]
