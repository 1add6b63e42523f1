"""The SG step as an object (:class:`pyro_flat.infer.mcmc.stepper.SGStepper`) on chains of one
row each (:class:`pyro_flat.infer.mcmc.chain.Chains`), driven by hand: the chains whose potential
is not finite skip the update and fall back, the others take it, and a chain that keeps failing
stops with its site and step."""

from __future__ import annotations

import math

import pytest
import torch

from pyro_flat.infer.mcmc.chain import Chains
from pyro_flat.infer.mcmc.divergence import DivergencePolicy
from pyro_flat.infer.mcmc.estimators import MinibatchGradient
from pyro_flat.infer.mcmc.state import KernelState, StateField
from pyro_flat.infer.mcmc.stepper import SGStepper
from pyro_flat.target.layout import FlatLayout

MOMENTUM = StateField("momentum", "r", reset=True)
COUNT = StateField("count", "updates taken, per chain")
LAYOUT = FlatLayout.from_shapes({"a": torch.Size([2]), "b": torch.Size([1])})


def make(num_chains: int, bad_chains: set[int], vectorized: bool = True,
         max_nonfinite_steps: int = 5) -> tuple[SGStepper, Chains, list]:
    """A stepper whose potential is 0.5 |z|^2 except at the chains ``bad_chains`` (NaN), and whose
    update is a gradient step that also adds 1 to the momentum and the count of the chains that
    take it."""
    state = KernelState.create(torch.arange(3.0 * num_chains).reshape(num_chains, 3),
                               (MOMENTUM, COUNT))
    chains = Chains(state, vectorized)
    seen = []

    def evaluate(batch):
        u = 0.5 * chains.position.square().sum(-1)
        grad = chains.position.clone()
        for c in bad_chains:
            u[c] = math.nan
            grad[c, 2] = math.nan  # site "b"
        return u, grad

    def update(state, estimate, step_size):
        active = stepper.active_chains
        seen.append(None if active is None else active.tolist())
        state.position.sub_(step_size * estimate.step_grad)
        state.momentum.add_(1.0)
        state.count.add_(1.0)

    stepper = SGStepper(chains, evaluate, MinibatchGradient(), update,
                        DivergencePolicy(num_chains, max_nonfinite_steps), LAYOUT)
    return stepper, chains, seen


def test_every_chain_finite_takes_the_update():
    stepper, chains, seen = make(3, set())
    before = chains.position.clone()
    result = stepper.step(0.5, None)
    assert result.finite is None and seen == [None]
    torch.testing.assert_close(chains.position, 0.5 * before)
    assert chains.state.num_steps == 1
    torch.testing.assert_close(chains.last_finite, before)  # where the step started


def test_a_non_finite_chain_falls_back_and_keeps_its_rows():
    stepper, chains, seen = make(3, {1})
    stepper.step(0.5, None)  # chain 1 fails at once: it stays where it is
    start = torch.arange(9.0).reshape(3, 3)
    assert seen == [[True, False, True]]
    torch.testing.assert_close(chains.position[[0, 2]], 0.5 * start[[0, 2]])
    torch.testing.assert_close(chains.position[1], start[1])
    # its momentum is reset (reset=True), its count kept as it was (persistent, not reset)
    assert chains.state.momentum[:, 0].tolist() == [1.0, 0.0, 1.0]
    assert chains.state.count[:, 0].tolist() == [1.0, 0.0, 1.0]
    assert stepper.divergence.diverged.tolist() == [False, True, False]


def test_a_chain_returns_to_the_last_position_whose_potential_was_finite():
    stepper, chains, _ = make(2, set())
    start = chains.position.clone()
    stepper.step(0.5, None)  # evaluated finite at the start; moved to 0.5 * start
    chains.position[1, 0] = math.inf  # e.g. the update overflowed
    result = stepper.step(0.5, None)
    assert result.finite.tolist() == [True, False]
    torch.testing.assert_close(chains.position[1], start[1])
    torch.testing.assert_close(chains.position[0], 0.25 * start[0])
    torch.testing.assert_close(chains.last_finite[0], 0.5 * start[0])


def test_the_draw_statistics_are_taken_before_the_update():
    stepper, chains, _ = make(2, {0})
    positions = []
    result = stepper.step(0.5, None, evaluated=lambda r: positions.append(
        chains.position.clone()))
    torch.testing.assert_close(positions[0], torch.arange(6.0).reshape(2, 3))
    assert result.finite.tolist() == [False, True] and result.step_size == 0.5


def test_the_metric_moments_count_only_the_chains_that_stepped():
    stepper, _, _ = make(3, {2})
    calls = []
    stepper.step(0.5, None, moments=lambda grad, rows: calls.append(rows.tolist()))
    assert calls == [[True, True, False]]


@pytest.mark.parametrize("vectorized", [True, False])
def test_a_chain_that_keeps_failing_stops_with_its_site_and_step(vectorized):
    num_chains = 2 if vectorized else 1
    stepper, _, _ = make(num_chains, {num_chains - 1}, vectorized, max_nonfinite_steps=3)
    stepper.step(0.5, None)
    stepper.step(0.5, None)
    which = "chain 1 of 2" if vectorized else "the chain"
    expected = (rf"{which} diverged.*3 of the last 3 SG steps \(3 in a row\).*last at step 2"
                r".*sites \['b'\]")
    with pytest.raises(RuntimeError, match=expected):
        stepper.step(0.5, None)


def test_a_deferred_step_keeps_and_restores_the_rows_as_the_synchronous_one():
    """The step that never waits for the host (``deferred=True``) updates every chain and puts
    the non-finite one's rows back with a select: the same state as skipping it."""
    seen_by_path = []
    for deferred in (False, True):
        stepper, chains, _ = make(3, {1})
        for _ in range(2):
            stepper.step(0.5, None, deferred=deferred)
        state = chains.state
        seen_by_path.append([chains.position.clone(), state.momentum.clone(),
                             state.count.clone(), chains.last_finite.clone(),
                             stepper.divergence.diverged.clone(),
                             stepper.divergence.num_recent.clone(),
                             stepper.divergence.num_diverging])
    for now, deferred in zip(*seen_by_path, strict=True):
        assert (torch.equal(now, deferred) if torch.is_tensor(now) else now == deferred)


@pytest.mark.parametrize("vectorized", [True, False])
def test_a_deferred_stop_is_raised_once_the_draw_s_steps_end(vectorized):
    num_chains = 2 if vectorized else 1
    stepper, _, _ = make(num_chains, {num_chains - 1}, vectorized, max_nonfinite_steps=3)
    for _ in range(5):  # the chain must stop at step 2; the steps go on until the draw ends
        stepper.step(0.5, None, deferred=True)
    which = "chain 1 of 2" if vectorized else "the chain"
    expected = (rf"{which} diverged.*3 of the last 3 SG steps \(3 in a row\).*last at step 2"
                r".*sites \['b'\]")
    with pytest.raises(RuntimeError, match=expected):
        stepper.raise_if_stopped()


def test_chains_need_one_row_per_chain():
    with pytest.raises(ValueError, match=r"one row per chain, \(K, d\); got shape \(3,\)"):
        Chains(KernelState.create(torch.zeros(3), ()), vectorized=False)
