r"""The choice between the overdamped (Langevin) and underdamped (SGHMC) update, for kernels
that offer both (EntropyMCMC, SASGLD): the argument, its stability condition and limit.

``dynamics="langevin"`` (the default) moves :math:`\theta` by a Langevin step;
``dynamics="underdamped"`` by an SGHMC step with ``friction`` :math:`C` and ``mass`` :math:`M`,
whose per-step momentum decay :math:`\epsilon C / M` must lie in :math:`(0, 1]`. In SGHMC and
L2E, which are underdamped by definition, ``friction`` is always in force; here it only
applies to the underdamped form.
"""

from __future__ import annotations

from pyro_flat import validation
from pyro_flat.infer.mcmc import adaptation

DYNAMICS = ("langevin", "underdamped")


def resolve_dynamics(kernel: str, dynamics: str | None, friction: float | None
                     ) -> tuple[str, float | None]:
    """The checked ``(dynamics, friction)``: a ``friction`` belongs to the underdamped update,
    so it needs ``dynamics="underdamped"`` (before ``dynamics`` existed, a friction alone
    switched the update). ``None`` stays ``None``: the underdamped form then takes SGHMC's
    default, 1 until warmup sees a step throw the momentum
    (:class:`~pyro_flat.infer.mcmc.friction.NoiseFriction`)."""
    if dynamics is None:
        dynamics = "langevin"
        if friction is not None:
            raise ValueError(f"{kernel}(friction={friction!r}) needs dynamics='underdamped': "
                             "friction is the underdamped update's (the default update is "
                             "Langevin)")
    if dynamics not in DYNAMICS:
        raise ValueError(f"dynamics must be one of {DYNAMICS}, got {dynamics!r}")
    if friction is not None:
        friction = validation.positive("friction", friction)
    return dynamics, friction


def check_underdamped_step(step_size: float, friction: float, mass: float) -> None:
    """The momentum decay ``step_size * friction / mass`` must lie in ``(0, 1]``."""
    validation.in_range("step_size * friction / mass", step_size * friction / mass, 0, 1,
                        closed="(]")


def stability_limit(dynamics: str, curvature: float, friction: float, mass: float) -> float:
    """The largest stable step of either update on a quadratic of the given curvature."""
    if dynamics == "langevin":
        return adaptation.langevin_limit(curvature)
    return adaptation.underdamped_limit(curvature, friction, mass)

