"""The machinery of ``pyro-flat compare`` (the command line is :mod:`pyro_flat.cli`).

* :mod:`~pyro_flat.compare.config`: the shared settings, budgets and the budget plan;
* :mod:`~pyro_flat.compare.models`: the networks;
* :mod:`~pyro_flat.compare.task`: what depends on the task (classification or regression): the
  network's outputs, the Pyro likelihood, the plain network's loss, the settings;
* :mod:`~pyro_flat.compare.common`: what a runner receives and returns, how a method is declared;
* runners, one file per family: :mod:`~pyro_flat.compare.mcmc` (SG-MCMC kernels),
  :mod:`~pyro_flat.compare.svi` (Bayes by Backprop, HWA, sharpness-aware SVI),
  :mod:`~pyro_flat.compare.swag` (SWAG, F-SWAG), :mod:`~pyro_flat.compare.ensemble` (deep
  ensembles with and without SAM), :mod:`~pyro_flat.compare.sgd` (the SGD/MAP reference);
* :mod:`~pyro_flat.compare.registry`: every method;
* :mod:`~pyro_flat.compare.evaluation`, :mod:`~pyro_flat.compare.figures`,
  :mod:`~pyro_flat.compare.output`: the shared metrics, figures and output folder; for
  regression, :mod:`~pyro_flat.compare.mixture` (the Gaussian-mixture predictive and its
  scores) and :mod:`~pyro_flat.compare.regression_figures`;
* :mod:`~pyro_flat.compare.tuning`: ``--tune``, the validation split and the declared searches;
* :mod:`~pyro_flat.compare.reference`: ``--reference hmc``, the NUTS reference and the scores
  against it;
* :mod:`~pyro_flat.compare.run`: the loop over the methods (and the tuning runs).
"""
