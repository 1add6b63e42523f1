"""Figures for BNN analysis (matplotlib); every function returns the Figure it drew.

- :func:`reliability_diagram`: accuracy against confidence, with the ECE.
- :func:`uncertainty_histograms`: predictive entropy in and out of distribution.
- :func:`loss_slice`: a one-dimensional slice of the loss landscape.
- :func:`trace_and_rank`: ArviZ trace and rank plots of chosen sites.
- :func:`energy_pdf`: ContourSGLD's learned energy PDF against the visited energies.
- :func:`predictive_band`: a regression's predictive mean and interval over a 1-D input.
- :func:`coverage_calibration`: a regression's observed against expected interval coverage.
"""

from pyro_flat.plots.calibration import reliability_diagram
from pyro_flat.plots.chains import trace_and_rank
from pyro_flat.plots.energy import energy_pdf
from pyro_flat.plots.landscape import loss_slice
from pyro_flat.plots.regression import coverage_calibration, predictive_band
from pyro_flat.plots.uncertainty import uncertainty_histograms

__all__ = [
    "coverage_calibration",
    "energy_pdf",
    "loss_slice",
    "predictive_band",
    "reliability_diagram",
    "trace_and_rank",
    "uncertainty_histograms",
]
