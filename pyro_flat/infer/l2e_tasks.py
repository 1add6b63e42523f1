"""Deprecated: moved to :mod:`pyro_flat.l2e_training.tasks` (importing this emits a
``FutureWarning``)."""

import warnings

from pyro_flat.l2e_training.tasks import (
    CNN_CHANNELS,
    CNN_DEPTHS,
    META_DATASETS,
    MLP_DEPTHS,
    MLP_WIDTHS,
    Task,
    make_task,
    sample_task,
)

__all__ = ["CNN_CHANNELS", "CNN_DEPTHS", "META_DATASETS", "MLP_DEPTHS", "MLP_WIDTHS", "Task",
           "make_task", "sample_task"]

warnings.warn("pyro_flat.infer.l2e_tasks is deprecated and will be removed: import from "
              "pyro_flat.l2e_training (or pyro_flat.l2e_training.tasks) instead",
              FutureWarning, stacklevel=2)
