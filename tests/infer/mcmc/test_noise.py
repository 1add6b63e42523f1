"""PrefetchedNormal: the values of synchronous draws, in blocks or not, and a checkpoint state
that resumes the sequence at every position (inside a block and at its boundaries)."""

from concurrent.futures import Future

import pytest
import torch

from pyro_flat.infer.mcmc import noise
from pyro_flat.infer.mcmc.noise import PrefetchedNormal


def synchronous(seed: int, count: int, shape) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [torch.empty(shape).normal_(generator=g) for _ in range(count)]


@pytest.mark.parametrize("prefetch", [True, False])
def test_values_and_checkpoint_states(prefetch):
    shape = (37,)  # 8 rows per block: 20 draws cross two block boundaries
    g = torch.Generator().manual_seed(5)
    stream = PrefetchedNormal(torch.empty(shape), g, prefetch=prefetch)
    expected = synchronous(5, 21, shape)
    assert len(stream._blocks[0]) == (noise.MAX_BLOCK_ROWS if prefetch else 1)
    for i in range(20):
        assert torch.equal(stream.next(), expected[i]), i
        resumed = torch.Generator()
        resumed.set_state(stream.generator_state())
        assert torch.equal(torch.empty(shape).normal_(generator=resumed), expected[i + 1]), i
    stream.close()


def test_a_block_the_worker_has_not_started_is_drawn_in_line():
    shape = (5,)
    stream = PrefetchedNormal(torch.empty(shape), torch.Generator().manual_seed(1), prefetch=True)
    expected = synchronous(1, 2 * noise.MAX_BLOCK_ROWS + 1, shape)
    rows = noise.MAX_BLOCK_ROWS
    for i in range(rows):
        assert torch.equal(stream.next(), expected[i])
    stream.close()
    never_run = Future()  # a worker that never gets a core: the pending block is not started

    class Stalled:
        def submit(self, *args, **kwargs):
            return never_run

        def shutdown(self, wait=True):
            pass

    stream._pending = never_run
    stream._generator.set_state(stream._state_before_pending)  # as if the block was not drawn
    stream._pool = Stalled()
    for i in range(rows, 2 * rows + 1):
        assert torch.equal(stream.next(), expected[i]), i
    assert never_run.cancelled()


def test_block_memory_is_bounded():
    big = torch.empty(noise.MAX_BLOCK_BYTES // 4 + 1)  # float32: one vector over the budget
    stream = PrefetchedNormal(big, torch.Generator(), prefetch=True)
    assert [len(b) for b in stream._blocks] == [1, 1]
    small = PrefetchedNormal(torch.empty(1000), torch.Generator(), prefetch=True)
    assert len(small._blocks[0]) == noise.MAX_BLOCK_ROWS


def test_not_picklable():
    import pickle

    with pytest.raises(TypeError, match="not picklable"):
        pickle.dumps(PrefetchedNormal(torch.empty(3), torch.Generator()))
