"""The one reader of a launcher's rank variables (gpufeed/ranks_env.py): torchrun's first, then
SLURM's, Open MPI's and PMI's."""
from __future__ import annotations

import pytest

from gpufeed import ranks_env


@pytest.mark.parametrize("env, rank, local_rank, world_size", [
    ({}, None, None, None),                                                       # no launcher
    ({"RANK": "3", "LOCAL_RANK": "1", "WORLD_SIZE": "8"}, 3, 1, 8),               # torchrun
    ({"SLURM_PROCID": "5", "SLURM_LOCALID": "1", "SLURM_NTASKS": "16"}, 5, 1, 16),  # srun
    ({"OMPI_COMM_WORLD_RANK": "2", "OMPI_COMM_WORLD_LOCAL_RANK": "0", "OMPI_COMM_WORLD_SIZE": "4"}, 2, 0, 4),
    ({"PMI_RANK": "7", "MPI_LOCALRANKID": "3", "PMI_SIZE": "12"}, 7, 3, 12),      # MPICH, Intel MPI
    # torchrun under srun: torchrun's numbers, each variable on its own
    ({"RANK": "1", "WORLD_SIZE": "2", "SLURM_PROCID": "9", "SLURM_LOCALID": "4", "SLURM_NTASKS": "32"}, 1, 4, 2),
    ({"RANK": "", "SLURM_PROCID": "6", "WORLD_SIZE": "x", "SLURM_NTASKS": "8"}, 6, None, 8),  # not numbers: skipped
])
def test_rank_local_rank_and_world_size_from_each_launcher(env, rank, local_rank, world_size):
    assert ranks_env.rank(env) == rank
    assert ranks_env.local_rank(env) == local_rank
    assert ranks_env.world_size(env) == world_size


def test_the_world_size_names_its_variable():
    assert ranks_env.world_size_var({"SLURM_NTASKS": "4"}) == ("SLURM_NTASKS", 4)
    assert ranks_env.world_size_var({"WORLD_SIZE": "2", "SLURM_NTASKS": "4"}) == ("WORLD_SIZE", 2)
    assert ranks_env.world_size_var({}) is None


@pytest.mark.parametrize("env, lead", [
    ({}, True),
    ({"RANK": "0", "LOCAL_RANK": "0"}, True),
    ({"RANK": "2", "LOCAL_RANK": "0"}, False),      # rank 2 of the job, first on its node: not the lead
    ({"LOCAL_RANK": "1"}, False),                   # only a local rank: that decides
    ({"SLURM_PROCID": "3"}, False),                 # srun without torchrun: said once, by rank 0
    ({"SLURM_PROCID": "0"}, True),
])
def test_the_lead_process_speaks_for_the_job(env, lead):
    assert ranks_env.lead_process(env) is lead


def test_the_process_environment_is_read_by_default(monkeypatch):
    for name in ranks_env.RANK_ENV + ranks_env.LOCAL_RANK_ENV + ranks_env.WORLD_SIZE_ENV:
        monkeypatch.delenv(name, raising=False)
    assert (ranks_env.rank(), ranks_env.world_size(), ranks_env.lead_process()) == (None, None, True)
    monkeypatch.setenv("PMI_RANK", "4")
    monkeypatch.setenv("PMI_SIZE", "6")
    assert (ranks_env.rank(), ranks_env.world_size(), ranks_env.lead_process()) == (4, 6, False)
