r"""The target a sampler or a variational fit works on: a Pyro model seen as a potential on one
flat vector of unconstrained parameters, with its minibatches.

Shared by the SG-MCMC kernels (:mod:`pyro_flat.infer.mcmc`) and SVI's lean losses and guides
(:mod:`pyro_flat.infer.svi`):

* :func:`trace_model` runs a model once: its latent sites (:func:`latent_sites`), their
  transforms and initial values, packed by :class:`FlatLayout`, and the :class:`DataPlate`
  that is subsampled at every step; every observed site's shapes are checked there
  (:func:`check_observed_site`);
* :class:`LogJoint` is the messenger a model runs under to give its scaled log-density, and
  :class:`ModelPotential` the potential :math:`\hat U(z, \text{batch})` built on it;
* :class:`FlatNormalPrior` sums constant Normal priors in closed form on the flat vector;
* :class:`Target` evaluates :math:`\hat U` and its gradient on a chain's flat position (the
  model's part plus the closed-form prior, in one place);
* :class:`MinibatchStream` draws the minibatches (epoch-wise shuffling;
  :class:`ChainMinibatches` for one or ``K`` vectorised chains) and :class:`InjectIndices`
  hands them to a model's plates.
"""

from pyro_flat.target.flat_prior import FlatNormalPrior
from pyro_flat.target.layout import FlatLayout, Site, is_identity_transform
from pyro_flat.target.log_joint import LogJoint, UnknownLatentSite
from pyro_flat.target.minibatch import ChainMinibatches, MinibatchStream
from pyro_flat.target.observed_shapes import check_observed_site, observed_shape_error
from pyro_flat.target.potential import ModelPotential
from pyro_flat.target.sites import latent_sites
from pyro_flat.target.subsample import InjectIndices
from pyro_flat.target.target import Potential, Target, as_scalar_energy
from pyro_flat.target.tracing import DataPlate, TracedModel, trace_model
from pyro_flat.target.user_potential import UserPotential, per_chain_shapes

__all__ = [
    "ChainMinibatches",
    "DataPlate",
    "FlatLayout",
    "FlatNormalPrior",
    "InjectIndices",
    "LogJoint",
    "MinibatchStream",
    "ModelPotential",
    "Potential",
    "Site",
    "Target",
    "TracedModel",
    "UnknownLatentSite",
    "UserPotential",
    "as_scalar_energy",
    "check_observed_site",
    "is_identity_transform",
    "latent_sites",
    "observed_shape_error",
    "per_chain_shapes",
    "trace_model",
]
