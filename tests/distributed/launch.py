"""Launch a test job the way a user does: ``torchrun --nproc_per_node=2`` as a subprocess."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

SCENARIOS = Path(__file__).with_name("scenarios.py")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def torchrun(out: Path, *scenarios: str, nproc: int = 2, timeout: float = 120.0
             ) -> subprocess.CompletedProcess:
    """Run ``scenarios.py out *scenarios`` on ``nproc`` gloo ranks of one node."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}
    cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={nproc}",
           "--master_addr=127.0.0.1", f"--master_port={free_port()}",
           str(SCENARIOS), str(out), *scenarios]
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout,
                          cwd=Path(__file__).parents[2])


def separate(out: Path, scenario: str, nproc: int = 2, timeout: float = 60.0
             ) -> list[subprocess.Popen]:
    """Start ``scenarios.py out scenario`` as ``nproc`` separate rank processes, with the
    environment torchrun gives its workers but no agent that ends the job when one of them
    stops: what the ranks that are left do is theirs alone. Each rank's output goes to
    ``out/rank<r>.log``; ``timeout`` is the process group's."""
    port = free_port()
    ranks = []
    for r in range(nproc):
        env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore",
               "RANK": str(r), "LOCAL_RANK": str(r), "WORLD_SIZE": str(nproc),
               "LOCAL_WORLD_SIZE": str(nproc), "MASTER_ADDR": "127.0.0.1",
               "MASTER_PORT": str(port), "PYRO_FLAT_TEST_TIMEOUT": str(timeout)}
        with open(out / f"rank{r}.log", "w") as log:
            ranks.append(subprocess.Popen([sys.executable, str(SCENARIOS), str(out), scenario],
                                          env=env, stdout=log, stderr=subprocess.STDOUT,
                                          cwd=Path(__file__).parents[2]))
    return ranks


def _rank_main(rank: int, port: int, nproc: int, out: Path, scenarios: tuple[str, ...]) -> None:
    import torch

    from tests.distributed import scenarios as job

    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(nproc),
                      LOCAL_WORLD_SIZE=str(nproc), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    job.main(out, list(scenarios))


def forked(out: Path, *scenarios: str, nproc: int = 2) -> None:
    """Run the scenarios on ``nproc`` gloo ranks forked from this process (the environment
    torchrun gives its workers, without the seconds of a fresh ``import torch`` per rank); an
    error of a rank is raised here as ``torch.multiprocessing.ProcessRaisedException``."""
    import arviz  # noqa: F401  (imported once here, not in every rank: the ranks are forks)
    import torch.multiprocessing as mp

    mp.start_processes(_rank_main, args=(free_port(), nproc, out, scenarios), nprocs=nproc,
                       start_method="fork", join=True)
