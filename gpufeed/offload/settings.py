"""What ``--offload`` asks for, carried from the CLI to the training process in one environment
variable (``GPUFEED_OFFLOAD``, JSON). Standard library only: read inside the user's process."""
from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass

ENV_OFFLOAD = "GPUFEED_OFFLOAD"
ENGINES = ("ray",)
INSTALL_HINT = "pip install 'gpufeed[ray]'"


@dataclass(frozen=True)
class OffloadSettings:
    """Offload the training DataLoader's batches to ``engine``.

    ``address``: the cluster to join (``ray.init(address=...)``: ``auto``, ``HOST:PORT`` of a node of
    it, or ``ray://HOST:PORT`` for Ray Client); None starts a local Ray for the run (the embedded
    default). ``workers``: Ray workers making batches (default: one per CPU of the cluster).
    ``lost_after_s``: with every Ray worker lost, how long to wait for one before going on locally.
    """

    engine: str = "ray"
    address: str | None = None
    workers: int | None = None
    lost_after_s: float | None = None  # default th.OFFLOAD_LOST_AFTER_S; tests shorten it

    def to_env(self) -> dict[str, str]:
        return {ENV_OFFLOAD: json.dumps(asdict(self))}

    @classmethod
    def from_env(cls, environ: dict[str, str] | None = None) -> "OffloadSettings | None":
        """The settings in the environment; None when there are none. Raises ``ValueError``."""
        text = (os.environ if environ is None else environ).get(ENV_OFFLOAD)
        if not text:
            return None
        try:
            data = json.loads(text)
        except json.JSONDecodeError as error:
            raise ValueError(f"{ENV_OFFLOAD} is not valid JSON ({error})") from None
        if not isinstance(data, dict) or set(data) - {"engine", "address", "workers", "lost_after_s"}:
            raise ValueError(f"{ENV_OFFLOAD} must be a JSON object with engine, address and workers")
        settings = cls(**data)
        if settings.engine not in ENGINES:
            raise ValueError(f"unknown offload engine {settings.engine!r} (known: {', '.join(ENGINES)})")
        if settings.workers is not None and (type(settings.workers) is not int or settings.workers < 1):
            raise ValueError(f"{ENV_OFFLOAD}: workers must be a positive whole number, got {settings.workers!r}")
        return settings

    def where(self) -> str:
        """The cluster, in words."""
        return f"the Ray cluster at {self.address}" if self.address else "a local Ray started for this run"
