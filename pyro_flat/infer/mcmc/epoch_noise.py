r"""How much of the minibatch noise heats a chain whose minibatches are drawn epoch-wise.

Target: the share :math:`h \ge 0` of the heat that independent minibatch noise would give
a coordinate's position that the kernel's epoch-wise batches give it.

The kernels draw minibatches epoch-wise (:mod:`pyro_flat.target.minibatch`): an epoch's
:math:`m = \lfloor N/B \rfloor` batches together hold each datum at most once, so at a fixed
position their gradient noises :math:`\eta_1, \dots, \eta_m` sum to zero (for :math:`mB = N`
exactly; nearly so otherwise), with variance :math:`v` each and covariance
:math:`-v/(m-1)` between two batches of an epoch. A linear chain on a quadratic of curvature
:math:`\lambda` responds to the noise :math:`j` steps back with :math:`h_j`, so independent
noise gives the position the variance :math:`v \sum_j h_j^2` and epoch-wise noise
(phase-averaged over the epoch)

.. math:: v \Big[\sum_j h_j^2 - \frac{1}{m-1}\,\frac1m \sum_{p=0}^{m-1}
          \sum_{g \in G_p} \Big( \big(\textstyle\sum_{j \in g} h_j\big)^2
          - \textstyle\sum_{j \in g} h_j^2 \Big) \Big],

:math:`G_p` the lags cut into epochs when the current step is at phase :math:`p` of its
epoch. :func:`epoch_share` is their ratio. When the chain moves slowly against an epoch
(:math:`\epsilon C` and :math:`\epsilon\lambda/C` small against :math:`1/m`) the noise of an
epoch cancels in the position and :math:`h \ll 1`; a chain that turns within an epoch feels
all of it (:math:`h \approx 1`), and one whose response alternates in sign from step to
step can feel more (:math:`h > 1`). The response :math:`h_j` is that of SGHMC's update
(:func:`~pyro_flat.infer.mcmc.integrators.underdamped_step_`): position and momentum with
:math:`A = \begin{pmatrix} 1 - \epsilon^2\lambda/M & \epsilon d/M \\ -\epsilon\lambda & d
\end{pmatrix}`, :math:`d = 1 - \epsilon C/M`, the noise entering as
:math:`(-\epsilon^2/M, -\epsilon)`; or of the Langevin update, :math:`h_j = -\epsilon (1 -
\epsilon\lambda)^j`. It is computed as an IIR filter (SciPy's ``lfilter``).

Examples
--------
>>> from pyro_flat.infer.mcmc.epoch_noise import epoch_share
>>> epoch_share(2000.0, 0.0177, friction=1.0, batches_per_epoch=5) > 0.9  # turns in an epoch
True
>>> epoch_share(2000.0, 0.0026, friction=300.0, batches_per_epoch=5) < 0.05  # slow
True
>>> epoch_share(2000.0, 0.0026, friction=300.0, batches_per_epoch=1)  # one batch an epoch
1.0

References
----------
Chen, T., Fox, E. & Guestrin, C. (2014). Stochastic gradient Hamiltonian Monte Carlo. ICML.
"""

from __future__ import annotations

import math

import numpy as np
import scipy.signal

#: The impulse response is summed until it has decayed by this factor.
DECAY = 1e-12
#: The most lags summed (a chain slower than this is treated as having decayed).
MAX_LAGS = 4_000_000


def epoch_share(curvature: float, step_size: float, friction: float | None = None,
                mass: float = 1.0, *, batches_per_epoch: int) -> float:
    r"""The share :math:`h` of independent minibatch noise's heat that epoch-wise noise gives
    the position (see the module).

    Parameters
    ----------
    curvature : float
        :math:`\lambda > 0`, the coordinate's curvature (in the metric's units).
    step_size : float
        :math:`\epsilon`, inside the update's stability limit at ``curvature``.
    friction : float or None
        :math:`C` of the underdamped update; ``None`` for the Langevin update.
    mass : float
        :math:`M` of the underdamped update.
    batches_per_epoch : int
        :math:`m = \lfloor N/B \rfloor`; 1 when each step takes a fresh batch.

    Returns
    -------
    float
        :math:`h` (1.0 for ``batches_per_epoch = 1``).
    """
    m = int(batches_per_epoch)
    if m <= 1:
        return 1.0
    eps = float(step_size)
    if friction is None:
        decay = 1.0 - eps * curvature
        numerator, denominator = [-eps], [1.0, -decay]
        radius = abs(decay)
    else:
        d = 1.0 - eps * friction / mass
        a11, a12, a21, a22 = 1.0 - eps**2 * curvature / mass, eps * d / mass, -eps * curvature, d
        g0, g1 = -(eps**2) / mass, -eps
        trace, det = a11 + a22, a11 * a22 - a12 * a21
        numerator, denominator = [g0, a12 * g1 - a22 * g0], [1.0, -trace, det]
        radius = float(np.max(np.abs(np.roots(denominator))))
    if not radius < 1.0:
        raise ValueError(f"step_size={step_size} is not stable at curvature {curvature}")
    lags = min(MAX_LAGS, max(4 * m, math.ceil(math.log(DECAY) / math.log(max(radius, 1e-300)))))
    impulse = np.zeros(lags)
    impulse[0] = 1.0
    h = scipy.signal.lfilter(numerator, denominator, impulse)
    own = float(np.dot(h, h))
    cumulative = np.concatenate([[0.0], np.cumsum(h)])
    # at phase p the lags [0, p] are this epoch, then whole epochs of m: their bounds
    starts = np.arange(m)[:, None] + 1 + np.arange(lags // m + 2)[None, :] * m
    bounds = np.concatenate([np.zeros((m, 1), dtype=np.int64), np.minimum(starts, lags)], 1)
    sums = cumulative[bounds[:, 1:]] - cumulative[bounds[:, :-1]]
    cross = float(np.mean(np.sum(sums * sums, axis=1))) - own
    return max(0.0, (own - cross / (m - 1)) / own)
