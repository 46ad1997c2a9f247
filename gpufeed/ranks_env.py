"""Who this process is in a job of several: its rank, its rank on this node and the job's size, as
its launcher put them in the environment. The one place that reads them (the probe's ``process``
event, the overrides' messages, autotune's and offload's refusals, the framework callbacks).

torchrun (and Lightning, accelerate, DeepSpeed, which set the same variables) first, then SLURM's
srun, Open MPI's mpirun and MPICH/Intel MPI's PMI, for jobs launched without torchrun: under srun
running torchrun, torchrun's own numbers win.

Standard library only: it runs inside the user's training process.
"""
from __future__ import annotations

import os
from typing import Mapping

RANK_ENV = ("RANK", "SLURM_PROCID", "OMPI_COMM_WORLD_RANK", "PMI_RANK")
LOCAL_RANK_ENV = ("LOCAL_RANK", "SLURM_LOCALID", "OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID")
WORLD_SIZE_ENV = ("WORLD_SIZE", "SLURM_NTASKS", "OMPI_COMM_WORLD_SIZE", "PMI_SIZE")
LOCAL_WORLD_SIZE_ENV = ("LOCAL_WORLD_SIZE", "SLURM_NTASKS_PER_NODE", "OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS")


def env_var(*names: str, environ: Mapping[str, str] | None = None) -> tuple[str, int] | None:
    """The first of these environment variables that holds a whole number, and its value."""
    environ = os.environ if environ is None else environ
    for name in names:
        value = environ.get(name)
        if value and value.lstrip("-").isdigit():
            return name, int(value)
    return None


def env_int(*names: str, environ: Mapping[str, str] | None = None) -> int | None:
    """The value of the first of these environment variables that holds a whole number."""
    found = env_var(*names, environ=environ)
    return None if found is None else found[1]


def rank(environ: Mapping[str, str] | None = None) -> int | None:
    """This process's rank in the job; None when no launcher set one."""
    return env_int(*RANK_ENV, environ=environ)


def local_rank(environ: Mapping[str, str] | None = None) -> int | None:
    """This process's rank among the job's processes on this node; None when no launcher set one."""
    return env_int(*LOCAL_RANK_ENV, environ=environ)


def world_size(environ: Mapping[str, str] | None = None) -> int | None:
    """The job's number of ranks; None when no launcher set it."""
    return env_int(*WORLD_SIZE_ENV, environ=environ)


def local_world_size(environ: Mapping[str, str] | None = None) -> int | None:
    """The job's number of ranks on this node; None when no launcher set it."""
    return env_int(*LOCAL_WORLD_SIZE_ENV, environ=environ)


def world_size_var(environ: Mapping[str, str] | None = None) -> tuple[str, int] | None:
    """The job's number of ranks and the variable it was read from (for a message that names it)."""
    return env_var(*WORLD_SIZE_ENV, environ=environ)


def lead_process(environ: Mapping[str, str] | None = None) -> bool:
    """Rank 0, or no rank at all (the rank on this node where only that was set): the process that
    speaks for the job, so that a message is said once and not once per rank."""
    r = rank(environ)
    if r is None:
        r = local_rank(environ)
    return r in (None, 0)
