"""The settings every method of ``pyro-flat compare`` shares, how a budget is spent, and the
checked options of the command (:class:`Options`).

A budget is a number of SG steps per method (``unit="steps"``, the default: equal epochs, as
the papers compare), or of *gradient evaluations* (``unit="grads"``): one SG-MCMC step, one SGD
step and one SVI step with one particle each cost one; a SAM or sharpness-aware step costs two,
so at equal gradient evaluations such methods take half the steps. An ensemble splits the
budget among its members either way.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import torch

#: The radius of the measured sharpness, and the default radius of the sharpness-aware ascent
#: steps (SASGLD, SAM, SharpnessAwareELBO: ``Settings.rho``).
RHO = 0.05
#: Training points on which the sharpness and the loss slices are measured (the first ones).
SHARPNESS_POINTS = 1000
#: The kernel Stein discrepancy is reported for networks of at most this many parameters
#: (``nan`` above: its kernel matrix costs draws^2 x parameters, and in more dimensions the IMQ
#: kernel of unit scale sees little but the diagonal).
KSD_MAX_PARAMETERS = 20_000
#: The minibatch of each draw's score in the kernel Stein discrepancy (all points if fewer).
KSD_BATCH = 256
#: EntropyMCMC's default step_size / eta, the authors' CIFAR-10 ratio (lr 0.5 over 50,000,
#: eta 4e-4): ``Settings.entropy_step_over_eta``.
ENTROPY_STEP_OVER_ETA = 0.025
#: ``protocol="authors"``: EntropyMCMC's temperature and the draws it keeps at the end of each
#: cosine cycle (the authors' CIFAR-10 run: T = 1e-4, 4 cycles, 2 draws of theta and theta_a).
ENTROPY_AUTHORS_TEMPERATURE = 1e-4
ENTROPY_AUTHORS_DRAWS_PER_CYCLE = 2
#: ``--protocol`` choices: every method under the shared schedule, the authors' protocols
#: where they differ from it, or every method on the last layer of a network trained first
#: (:mod:`pyro_flat.compare.finetune`).
PROTOCOLS = ("shared", "authors", "finetune")


@dataclass(frozen=True)
class Budget:
    """Gradient evaluations per method and the shape of the run.

    ``steps`` SG steps (``unit="steps"``) or gradient evaluations (``unit="grads"``);
    SGLD-like kernels take ``num_cycles * draws_per_cycle``
    evenly spaced draws, of which the first ``warmup_cycles * draws_per_cycle`` are warmup;
    cyclical SGLD runs ``num_cycles`` cosine cycles, the first ``warmup_cycles`` of them
    discarded; deep ensembles train ``ensemble_size`` members.
    """

    steps: int
    unit: str = "steps"
    num_cycles: int = 4
    warmup_cycles: int = 1
    draws_per_cycle: int = 4
    ensemble_size: int = 4


#: The named budgets of ``--budget``.
BUDGETS = {
    "quick": Budget(steps=4_000),
    # the budget of the committed benchmark (benchmarks/compare_full.py)
    "full": Budget(steps=20_000, num_cycles=8, warmup_cycles=2, draws_per_cycle=4,
                   ensemble_size=5),
}
#: The smallest integer budget: 4 cycles of 5 steps, each with one step of sampling stage.
MIN_STEPS = 20


@dataclass(frozen=True)
class Settings:
    """The hyperparameters of every method (see :mod:`pyro_flat.compare`); ``--tune`` chooses
    some of them per method on a validation split (:mod:`pyro_flat.compare.tuning`)."""

    hidden: tuple[int, ...] = (100, 100)
    channels: tuple[int, ...] = (16, 32)
    prior_scale: float = 3.0
    scale_rule: str = "fan_in"
    batch_size: int = 128
    lr: float = 0.2
    momentum: float = 0.9
    temperature: float = 1.0
    exploration_fraction: float = 0.8
    svi_lr: float = 1e-3
    svi_init_scale: float = 0.01
    swag_scale: float = 0.5
    swag_max_rank: int = 20
    protocol: str = "shared"
    #: the radius of the sharpness-aware steps (SASGLD, F-SWAG, F-ensembles, F-SGVB)
    rho: float = RHO
    #: EntropyMCMC's step size over its coupling variance eta
    entropy_step_over_eta: float = ENTROPY_STEP_OVER_ETA
    #: ContourSGLD's flattening exponent
    contour_zeta: float = 0.75
    #: L2E's step size is sqrt(l2e_step_mult / N)
    l2e_step_mult: float = 2.0
    #: ``--protocol finetune``: SGD steps that train the whole network before a part of it
    #: is made Bayesian
    finetune_steps: int = 3000
    #: ``--protocol finetune``: that part, ``"head"`` (the last linear layer, on the frozen
    #: backbone's features) or ``"adapters"`` (low-rank adapters on every linear layer)
    finetune_part: str = "head"
    #: the adapters' rank
    lora_rank: int = 4
    #: ``lr`` is multiplied by this for adapters: at the shared ``lr`` every SG-MCMC kernel's
    #: chain on the digits CNN's adapters diverged within 300-3,200 steps (the factors of a
    #: product drift along its scale symmetry into higher curvature); at a tenth none did
    adapter_lr_factor: float = 0.1


@dataclass(frozen=True)
class Plan:
    """How a budget is spent: SG steps per draw for SGLD-like kernels, cycles for cyclical SGLD."""

    num_draws: int  # kept draws
    warmup_draws: int
    thin: int  # SG steps per draw (SGLD, SGHMC, ...)
    num_cycles: int
    warmup_cycles: int
    cycle_length: int
    draws_per_cycle: int
    ensemble_size: int = 4
    unit: str = "steps"

    @property
    def steps(self) -> int:
        """SG steps (and gradient evaluations) of a method with one gradient per step."""
        return self.thin * (self.num_draws + self.warmup_draws)

    def divisor(self, grads_per_step: int) -> int:
        """What a method with ``grads_per_step`` gradients per step divides its steps by: 1 at
        equal SG steps, ``grads_per_step`` at equal gradient evaluations."""
        return grads_per_step if self.unit == "grads" else 1


def make_plan(budget: Budget, exploration_fraction: float) -> Plan:
    """Spend ``budget.steps`` SG steps or gradient evaluations alike in every method (up to
    rounding down).

    Cycles of ``L`` steps, ``L`` a multiple of the draws per cycle, so that SGLD and SGHMC,
    thinned by ``L / draws_per_cycle``, take exactly the steps of cyclical SGLD. Short budgets
    keep fewer draws per cycle: at most the steps in the sampling stage of a cycle.

    Examples
    --------
    >>> plan = make_plan(BUDGETS["quick"], exploration_fraction=0.8)
    >>> plan.steps, plan.thin, plan.warmup_draws, plan.num_draws, plan.cycle_length
    (4000, 250, 4, 12, 1000)
    """
    per_cycle = budget.draws_per_cycle
    while True:
        cycle_length = budget.steps // (budget.num_cycles * per_cycle) * per_cycle
        sampling = cycle_length - math.ceil(exploration_fraction * cycle_length)
        if cycle_length >= 2 and sampling >= per_cycle:
            break
        per_cycle -= 1
        if per_cycle == 0:
            raise ValueError(f"budget must be at least {MIN_STEPS} SG steps, got {budget.steps}")
    if budget.unit not in ("steps", "grads"):
        raise ValueError(f"budget unit must be 'steps' or 'grads', got {budget.unit!r}")
    return Plan(
        num_draws=(budget.num_cycles - budget.warmup_cycles) * per_cycle,
        warmup_draws=budget.warmup_cycles * per_cycle,
        thin=cycle_length // per_cycle,
        num_cycles=budget.num_cycles,
        warmup_cycles=budget.warmup_cycles,
        cycle_length=cycle_length,
        draws_per_cycle=per_cycle,
        ensemble_size=budget.ensemble_size,
        unit=budget.unit,
    )


@dataclass
class Options:
    """The checked command-line options of ``compare``."""

    methods: list[str]
    dataset: str
    model: str
    budget: str | int
    seed: int
    device: torch.device
    out: Path
    argv: list[str]
    threads: int = 1
    progress: bool | None = None  # None: bars when stderr is a terminal
    jobs: int = 1  # methods run at a time, each in a worker process (CPU only)
    download: bool = False  # let torchvision fetch missing files (mnist, fashion_mnist, cifar10)
    seeds: int = 1  # seeds seed, seed + 1, ..., each running every method
    tune_plan: Plan | None = None  # --tune: the plan of each candidate (tuning.tuning_plan)
    reference: str = "none"  # "hmc": score every method against a NUTS reference
