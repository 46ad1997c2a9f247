"""``--offload ray [--ray-address ADDR] [--ray-workers N]`` for ``gpufeed run`` and ``gpufeed diagnose``:
the options, and what is checked before the command starts (Ray installed, the cluster reachable)."""
from __future__ import annotations

import argparse
import importlib.util
import socket

from gpufeed.settings import ENGINES, INSTALL_HINT, OffloadSettings

CONNECT_TIMEOUT_S = 5.0  # a TCP connect to the cluster's address before the command starts


def add_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--offload", choices=ENGINES, metavar="ENGINE",
                   help="make the training DataLoader's batches on a cluster's CPUs: ray (docs/offload.md)")
    p.add_argument("--ray-address", metavar="ADDR",
                   help="the Ray cluster to join (HOST:PORT, auto, or ray://HOST:PORT); default: start a local Ray "
                        "for the run")
    p.add_argument("--ray-workers", type=int, metavar="N",
                   help="Ray workers making batches (default: one per CPU of the cluster)")


class Unavailable(ValueError):
    """The offloading asked for cannot be had here (Ray missing, the cluster unreachable)."""


def settings_from(args: argparse.Namespace) -> OffloadSettings | None:
    """The settings asked for (None: no offloading). Raises ``ValueError`` for options that do not go
    together, ``Unavailable`` when Ray or the cluster is not there: each before anything runs."""
    engine = getattr(args, "offload", None)
    address, workers = getattr(args, "ray_address", None), getattr(args, "ray_workers", None)
    if engine is None:
        if address is not None or workers is not None:
            raise ValueError("--ray-address and --ray-workers go with --offload ray")
        return None
    if workers is not None and workers < 1:
        raise ValueError(f"--ray-workers must be a positive whole number, got {workers}")
    if importlib.util.find_spec("ray") is None:
        raise Unavailable(f"--offload ray needs Ray, which is not installed: {INSTALL_HINT}")
    problem = address and unreachable(address)
    if problem:
        raise Unavailable(problem)
    return OffloadSettings(engine=engine, address=address, workers=workers)


def unreachable(address: str) -> str | None:
    """Why nothing answers at ``address`` (``HOST:PORT`` or ``ray://HOST:PORT``); None if something
    does, or if the address names no port to try (``auto``: Ray finds the cluster itself)."""
    host, _, port = address.removeprefix("ray://").rpartition(":")
    if not host or not port.isdigit():
        return None
    try:
        with socket.create_connection((host, int(port)), timeout=CONNECT_TIMEOUT_S):
            return None
    except OSError as error:
        why = error.strerror or type(error).__name__
        return (f"cannot reach the Ray cluster at {address} ({why}); start it with `ray start --head`, or check "
                "--ray-address")
