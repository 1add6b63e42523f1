"""One job of two gloo ranks runs the chains, data-parallel and checkpoint scenarios that the
tests here compare with single-process runs (``scenarios.py``)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from tests.distributed.launch import forked

JOB_SCENARIOS = ("chains:chains_single", "chains:chains_vectorized", "dp:SGLD", "dp:SGHMC",
                 "dp:EntropyMCMC", "dp:SASGLD", "resume:first",
                 "stream:gathered", "stream:segments", "stream:dp")


@pytest.fixture(scope="session")
def two_rank_job(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The directory of the results of one two-rank job of every scenario."""
    out = tmp_path_factory.mktemp("two_rank_job")
    forked(out, *JOB_SCENARIOS)
    return out


@pytest.fixture
def float64() -> Iterator[None]:
    """The dtype the jobs run in (so that float tolerances are tight)."""
    dtype = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        yield
    finally:
        torch.set_default_dtype(dtype)
