"""Judging a posterior by its predictions: Bayesian model averaging
(:mod:`~pyro_flat.evaluation.predictive`), the metrics of a classifier
(:mod:`~pyro_flat.evaluation.classification`) and of a regression
(:mod:`~pyro_flat.evaluation.regression`), flatness measures
(:mod:`~pyro_flat.evaluation.flatness`), the kernel Stein discrepancy of draws
(:mod:`~pyro_flat.evaluation.stein`) and an HMC reference to compare with
(:mod:`~pyro_flat.evaluation.hmc_reference`)."""
