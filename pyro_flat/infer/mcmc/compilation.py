r"""Whether a run's potential is compiled: the kernels' ``compile=`` argument.

``compile=True`` compiles the potential and gradient of a model whose structure pyro_flat can
read (:func:`~pyro_flat.target.network_potential.read_network`: a ``BNN`` with a built-in
likelihood and constant Normal priors) into one function of the flat position and the
minibatch (:class:`~pyro_flat.target.compiled.CompiledPotential`), and is an error for any
other model; ``"auto"`` compiles when it can and keeps the compiled path only if a short
measured trial at the start of the run finds it faster than the eager one; ``False`` (the
default) keeps the eager path. Either way the update of the chain is the same code, and the
compiled potential is checked once against the eager one at the chain's start (to
:data:`RELATIVE_TOLERANCE`), so the draws equal the eager path's to float rounding.

The trial: :data:`TRIAL_ROUNDS` rounds, each timing the eager and the compiled evaluation
(alternately, about :data:`TRIAL_SECONDS` each); the compiled path is kept when its median
time is below :data:`KEEP_BELOW` of the eager one. The trial runs once per compiled function
in the process (a later run of the same shapes takes its verdict). What was chosen and why, the
compile time and the two timings are in ``diagnostics()["compile"]``.
"""

from __future__ import annotations

import statistics
import time
import warnings
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

import torch

from pyro_flat.target.compiled import CompiledPotential
from pyro_flat.target.target import Target

__all__ = ["COMPILE_CHOICES", "Compilation", "check_compile", "forget_trials",
           "set_up_compilation"]

#: The accepted values of ``compile=``.
COMPILE_CHOICES = (False, True, "auto")
#: The rounds of the ``"auto"`` trial.
TRIAL_ROUNDS = 3
#: About how long each side of a trial round runs, in seconds.
TRIAL_SECONDS = 0.05
#: ``"auto"`` keeps the compiled path when it takes less than this fraction of the eager time.
KEEP_BELOW = 0.95
#: The ``"auto"`` trials' timings (eager, compiled seconds) by compiled function.
_trials: dict[tuple, tuple[float, float]] = {}
#: The largest relative difference between the compiled and the eager potential (and
#: gradient, in norm) at the chain's start, by dtype.
RELATIVE_TOLERANCE = {torch.float16: 1e-2, torch.bfloat16: 1e-1, torch.float32: 1e-3,
                      torch.float64: 1e-8}


def forget_trials() -> None:
    """Forget the ``"auto"`` trials' verdicts (the next run of each shape measures again)."""
    _trials.clear()


def check_compile(value: Any) -> bool | str:
    """``compile`` must be ``False``, ``True`` or ``"auto"``."""
    if not any(value is c or (isinstance(c, str) and value == c) for c in COMPILE_CHOICES):
        raise ValueError(f"compile must be one of {COMPILE_CHOICES} (False: the eager path; "
                         f"True: compiled, an error where it cannot be; 'auto': compiled where "
                         f"a trial finds it faster), got {value!r}")
    return value


@dataclass
class Compilation:
    """What ``compile=`` chose for a run (``diagnostics()["compile"]``).

    Attributes
    ----------
    requested : bool or str
        The kernel's ``compile``.
    used : bool
        Whether the run's steps evaluate the compiled potential.
    reason : str
        Why (or why not).
    compile_seconds : float or None
        The first compiled call's wall time (the compilation, unless ``cached``).
    cached : bool or None
        Whether the compiled function came from an earlier run of the same shapes.
    eager_ms, compiled_ms : float or None
        The ``"auto"`` trial's median time of one evaluation on each path.
    """

    requested: bool | str
    used: bool
    reason: str
    compile_seconds: float | None = None
    cached: bool | None = None
    eager_ms: float | None = None
    compiled_ms: float | None = None

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def set_up_compilation(requested: bool | str, target: Target, readable: Callable[[], Any],
                       chains: int | None, minibatched: bool, peek: Callable[[], Any]
                       ) -> Compilation:
    """Compile the run's potential as ``requested`` and install it on ``target``.

    ``readable()`` gives the model's :class:`~pyro_flat.target.network_potential.NetworkPotential`
    or a sentence saying why there is none; ``peek()`` the next minibatch without drawing it.
    """
    if requested is False:
        return Compilation(False, False, "compile=False")
    network = readable()
    if isinstance(network, str):
        if requested is True:
            raise ValueError(f"compile=True, but pyro_flat cannot compile this model's "
                             f"potential: {network}. Use compile='auto' (compiled where it "
                             f"can be) or compile=False")
        return Compilation(requested, False, network)
    z, batch = target.position, peek()
    u_eager, grad = target.value_and_grad(z, batch)
    u_eager, g_eager = u_eager.clone(), grad.clone()
    compiled = CompiledPotential(network, chains, minibatched)
    try:
        u, g = compiled.warm_up(z, batch)
    except Exception as error:  # torch.compile's errors have no common base class
        if requested is True:
            raise RuntimeError(f"compile=True: torch.compile failed on this model's "
                               f"potential: {error}") from error
        return Compilation(requested, False, f"torch.compile failed: {type(error).__name__}: "
                           f"{str(error).splitlines()[0] if str(error) else ''}")
    report = Compilation(requested, True, "", compiled.compile_seconds, compiled.cached)
    mismatch = _mismatch(u_eager, g_eager, u, g)
    if mismatch is not None:
        message = (f"the compiled potential differs from the eager one at the chain's start "
                   f"({mismatch}); please report this model")
        if requested is True:
            raise RuntimeError(f"compile=True: {message}")
        warnings.warn(f"compile='auto': {message}; running eagerly", RuntimeWarning,
                      stacklevel=3)
        report.used, report.reason = False, message
        return report
    if requested == "auto":
        if compiled.key not in _trials:
            _trials[compiled.key] = _trial(lambda: target.value_and_grad(z, batch),
                                           lambda: compiled(z, batch))
        eager_s, compiled_s = _trials[compiled.key]
        report.eager_ms, report.compiled_ms = 1e3 * eager_s, 1e3 * compiled_s
        report.used = compiled_s < KEEP_BELOW * eager_s
        report.reason = (f"the trial's compiled evaluation took {compiled_s / eager_s:.2f} of "
                         f"the eager one's time ({'below' if report.used else 'not below'} "
                         f"{KEEP_BELOW})")
    else:
        report.reason = "compile=True"
    if report.used:
        target.compiled = compiled
    return report


def _mismatch(u0: torch.Tensor, g0: torch.Tensor, u1: torch.Tensor, g1: torch.Tensor
              ) -> str | None:
    """How the compiled ``(u1, g1)`` differs from the eager ``(u0, g0)`` beyond rounding."""
    tol = RELATIVE_TOLERANCE.get(g0.dtype, 1e-3)
    du = float((u1 - u0).abs().max()) / (1.0 + float(u0.abs().max()))
    dg = float(torch.linalg.vector_norm(g1 - g0)) / (1.0 + float(torch.linalg.vector_norm(g0)))
    if du <= tol and dg <= tol:  # (NaN compares False: reported)
        return None
    return f"relative differences {du:.2g} in U and {dg:.2g} in its gradient, above {tol:g}"


def _trial(eager: Callable[[], Any], compiled: Callable[[], Any]) -> tuple[float, float]:
    """Median seconds per call of each side over :data:`TRIAL_ROUNDS` alternating rounds."""
    def timed(fn: Callable[[], Any], calls: int) -> float:
        start = time.perf_counter()
        for _ in range(calls):
            out = fn()
        if out[1].is_cuda:  # the launches are asynchronous: wait for them
            torch.cuda.synchronize(out[1].device)
        return (time.perf_counter() - start) / calls

    calls = max(2, min(50, int(TRIAL_SECONDS / max(timed(eager, 1), 1e-6))))
    times: tuple[list[float], list[float]] = ([], [])
    for _ in range(TRIAL_ROUNDS):
        for side, fn in zip(times, (eager, compiled), strict=True):
            side.append(timed(fn, calls))
    return statistics.median(times[0]), statistics.median(times[1])
