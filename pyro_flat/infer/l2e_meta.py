"""Deprecated: moved to :mod:`pyro_flat.l2e_training.meta` (importing this emits a
``FutureWarning``)."""

import warnings

from pyro_flat.l2e_training.meta import (
    MetaTrainConfig,
    MetaTrainer,
    bma_nll,
    inner_run,
    meta_loss,
)

__all__ = ["MetaTrainConfig", "MetaTrainer", "bma_nll", "inner_run", "meta_loss"]

warnings.warn("pyro_flat.infer.l2e_meta is deprecated and will be removed: import from "
              "pyro_flat.l2e_training (or pyro_flat.l2e_training.meta) instead",
              FutureWarning, stacklevel=2)
