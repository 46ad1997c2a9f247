"""The settings gpufeed hands a training process, and their one codec.

``LoaderSettings`` (the DataLoader knobs) and ``PipelineSettings`` (tf.data's) are the one
vocabulary of tune, batch-size, the overrides applied inside the training process, ``gpufeed run
--config`` and the report. What the runner hands the training process rides in one environment
variable per kind, JSON each, written by ``env_of`` and read by ``read_env``: ``Overrides`` (the
DataLoader settings and the loader they are for), ``AutotuneSettings`` (``--autotune``) and
``OffloadSettings`` (``--offload``). The probe's own settings are ``ProbeConfig``'s
(``measure/inside/probe_config.py``).

At the bottom of the package (it imports nothing of gpufeed), so every layer may use it; standard
library only, because the probe imports it inside the user's process.
"""
from __future__ import annotations

import dataclasses
import json
import os
from dataclasses import asdict, dataclass, fields
from typing import Any, ClassVar, Mapping, Protocol, TypeVar

# The environment variables that carry each kind of settings to the training process.
ENV_LOADER_OVERRIDES = "GPUFEED_LOADER_OVERRIDES"
ENV_AUTOTUNE = "GPUFEED_AUTOTUNE"  # "1", or a JSON object of AutotuneSettings ({"period_s": 2})
ENV_OFFLOAD = "GPUFEED_OFFLOAD"
CONFIG_FORMAT = "gpufeed.loader-settings/1"  # the format of best-config.json (gpufeed tune) and --config files
# A DataLoader's roles (measure/inside/roles.py tells them apart).
TRAIN = "train"
EVAL = "eval"
# --offload's engines, and what installs them.
ENGINES = ("ray",)
INSTALL_HINT = "pip install 'gpufeed[ray]'"


class Carried(Protocol):
    """Settings carried in one environment variable (``ENV``) as JSON."""

    ENV: ClassVar[str]

    def to_json(self) -> str: ...


_C = TypeVar("_C")


def env_of(settings: Carried) -> dict[str, str]:
    """The environment that carries ``settings`` to the command."""
    return {settings.ENV: settings.to_json()}


def read_env(cls: type[_C], environ: Mapping[str, str] | None = None) -> _C | None:
    """The settings of kind ``cls`` in the environment; None when unset. ``ValueError`` names the variable."""
    text = (os.environ if environ is None else environ).get(cls.ENV)  # type: ignore[attr-defined]
    if not text or not text.strip():
        return None
    return cls.from_json(text, cls.ENV)  # type: ignore[attr-defined]


def parse_json(text: str, where: str) -> Any:
    """A settings file's JSON; ValueError saying where it is not valid."""
    try:
        return json.loads(text)
    except json.JSONDecodeError as error:
        raise ValueError(f"{where} is not valid JSON ({error})") from None


def random_stream_note(workers_before: int | None, workers_after: int | None) -> str | None:
    """What a change of ``num_workers`` does beyond speed, or None when it changes none.

    DataLoader seeds worker k with base_seed + k and hands batch b to worker b mod num_workers (without
    workers, the training process's own stream makes every batch): with another count, each batch's
    random augmentation draws from another stream. The samples and their order are kept (the sampler
    runs in the training process); a seeded run's augmented batches, and so its loss curve, differ
    from batch min(before, after) + 1 on: the batches before it are each their worker's first under
    both counts, the next one is not (with no workers on one side, from the first batch). Keeping
    them would need each worker to replay the streams of the count it replaces, one batch after
    another, which no parallel loader can do (tests/real/test_seeded_augment.py: 2 -> 3 workers)."""
    if workers_before is None or workers_after is None or workers_before == workers_after:
        return None
    first = min(workers_before, workers_after) + 1
    return (f"num_workers {workers_before} -> {workers_after} keeps every sample and its order, but each batch's "
            "random augmentation draws from another worker's random stream: a seeded run (torch.manual_seed) "
            f"gets other augmented batches than your settings give, and its loss curve differs from batch {first} "
            "on")


def epoch_order_note(persistent_before: bool, persistent_after: bool, sampler: str | None) -> str | None:
    """What turning persistent workers on or off does beyond speed, or None when it changes nothing
    (``persistent_*``: whether the loader keeps workers between epochs, ``LoaderSettings.keeps_workers``).

    Each new DataLoader iterator draws its workers' base seed from torch's generator (the global one,
    or the loader's ``generator``), and ``RandomSampler`` draws each epoch's shuffle from the same one: a
    persistent iterator draws the base seed once, not every epoch, so from the second epoch on a seeded
    run's shuffle is another (every sample still once an epoch). Measured with torch itself in
    tests/real/test_seeded_shuffle.py; ``--autotune`` replays the plain run's draws and keeps its order.
    ``sampler``: the training loader's (``RandomSampler`` where it shuffles; None: not known, said on
    that condition)."""
    if persistent_before == persistent_after or (sampler is not None and sampler != "RandomSampler"):
        return None
    how = "once, not every epoch" if persistent_after else "every epoch, not once"
    condition = "" if sampler else " with shuffle=True"
    return (f"persistent_workers={persistent_after} keeps every sample of each epoch, but a seeded run "
            f"(torch.manual_seed){condition} shuffles them in another order from its second epoch on: the "
            f"loader then draws its workers' seed from torch's generator {how}, and the shuffle draws from "
            "the same generator")


def shuffling_sampler(config: dict[str, Any]) -> str | None:
    """The sampler a loader's record says draws its order: a script's own ``batch_sampler``'s inner one
    (then ``batch_size`` is None; None where it has none we know), else the loader's ``sampler``."""
    if config.get("batch_size") is None and config.get("batch_sampler"):
        return config.get("inner_sampler")
    return config.get("sampler")


@dataclass(frozen=True)
class LoaderSettings:
    """DataLoader keywords gpufeed can set. ``None`` leaves the user's value as it is."""

    num_workers: int | None = None
    prefetch_factor: int | None = None
    persistent_workers: bool | None = None
    pin_memory: bool | None = None
    batch_size: int | None = None
    worker_threads: int | None = None   # cap on threads inside each worker (torch and thread pools)
    # False: batches handed over as soon as any worker has one (torch >= 2.6); tried only where the user
    # allows reordering (tune --allow-reorder): the order of batches is given up (REORDER_NOTE)
    in_order: bool | None = None

    @property
    def keeps_workers(self) -> bool:
        """Workers kept between epochs: persistent_workers with workers (without, it means nothing)."""
        return bool(self.persistent_workers) and bool(self.num_workers)

    def to_dict(self) -> dict[str, Any]:
        return {k: v for k, v in asdict(self).items() if v is not None}

    @classmethod
    def from_dict(cls, data: dict[str, Any], where: str = "settings") -> "LoaderSettings":
        """Build from JSON; raises ``ValueError`` naming an unknown key or a wrong type."""
        if not isinstance(data, dict):
            raise ValueError(f"{where} must be a JSON object, got {type(data).__name__}")
        types = {f.name: (bool if f.name in ("persistent_workers", "pin_memory", "in_order") else int)
                 for f in fields(cls)}
        for key, value in data.items():
            if key not in types:
                raise ValueError(f"unknown DataLoader setting {key!r} in {where} "
                                 f"(known: {', '.join(sorted(types))})")
            wanted = types[key]
            # bool is an int in Python: refuse it where a number is meant, and the reverse.
            if value is not None and (type(value) is not wanted):
                raise ValueError(f"{where}.{key} must be {'true or false' if wanted is bool else 'a whole number'}, "
                                 f"got {value!r}")
            if wanted is int and value is not None and value < (0 if key == "num_workers" else 1):
                raise ValueError(f"{where}.{key} must be at least {0 if key == 'num_workers' else 1}, got {value}")
        return cls(**data)

    def label(self) -> str:
        """A short name for tables and directories, e.g. ``w8 p4 persistent t1``. Settings that act only
        in workers (prefetch, persistence, the thread cap) are named with ``num_workers`` above 0, left
        out with 0, and without it (the script's own count) named as acting only with workers:
        ``p4 (only with workers)``."""
        parts = []
        if self.num_workers is not None:
            parts.append(f"w{self.num_workers}")
        queue = [p for p in (f"p{self.prefetch_factor}" if self.prefetch_factor is not None else None,
                             "persistent" if self.persistent_workers else None) if p]
        threads = [f"t{self.worker_threads}"] if self.worker_threads is not None else []
        workers = (self.num_workers or 0) > 0
        if workers:
            parts += queue
        elif self.num_workers is None and queue + threads:
            parts.append(" ".join(queue + threads) + " (only with workers)")
        if self.pin_memory:
            parts.append("pinned")
        if workers:
            parts += threads
        if self.in_order is False:
            parts.append("unordered")
        if self.batch_size is not None:
            parts.append(f"b{self.batch_size}")
        return " ".join(parts) or "as is"

    def label_beside_workers(self) -> str:
        """The settings other than num_workers, in words, naming a line of trials plotted against
        num_workers: ``prefetch 4 · persistent``, or ``the script's own`` when none is set."""
        parts = [f"prefetch {self.prefetch_factor}" if self.prefetch_factor is not None else None,
                 "persistent" if self.persistent_workers else None,
                 "pin_memory" if self.pin_memory else None,
                 f"{self.worker_threads} threads/worker" if self.worker_threads is not None else None,
                 "out of order" if self.in_order is False else None]
        return " · ".join(p for p in parts if p) or "the script's own"


# What in_order=False gives up, said wherever gpufeed tries or applies it (tune, best-config.json, --autotune).
REORDER_NOTE = ("in_order=False (reordering allowed by --allow-reorder): batches arrive in a different order than "
                "the sampler's (each epoch still delivers the same set of samples, each once), and runs are no "
                "longer bit-for-bit reproducible")


AUTOTUNE = -1  # tf.data.AUTOTUNE: TensorFlow picks the value itself, and keeps adjusting it


@dataclass(frozen=True)
class PipelineSettings:
    """The ``tf.data`` knobs gpufeed can set on the training pipeline. ``None`` leaves the script's
    own value; ``AUTOTUNE`` (-1) is ``tf.data.AUTOTUNE``.

    - ``parallel_calls``: ``num_parallel_calls`` of every ``map`` and ``interleave`` of the pipeline
      (an interleave's capped at the ``cycle_length`` the script gives it), and of a ``batch`` that
      sets its own;
    - ``prefetch``: ``buffer_size`` of the ``prefetch`` that ends the pipeline (one is added at the
      end when it has none);
    - ``deterministic``, ``private_threadpool_size``, ``max_intra_op_parallelism``: the pipeline's
      ``tf.data.Options`` (``options.deterministic``, ``options.threading.*``).
    """

    parallel_calls: int | None = None
    prefetch: int | None = None
    deterministic: bool | None = None
    private_threadpool_size: int | None = None
    max_intra_op_parallelism: int | None = None

    framework = "tensorflow"

    def to_dict(self) -> dict[str, Any]:
        return {k: v for k, v in asdict(self).items() if v is not None}

    def config_dict(self) -> dict[str, Any]:
        """Every knob, ``None`` for the script's own: ``tune.json``'s ``config``."""
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any], where: str = "settings") -> "PipelineSettings":
        """Build from JSON; raises ``ValueError`` naming an unknown key or a wrong value."""
        if not isinstance(data, dict):
            raise ValueError(f"{where} must be a JSON object, got {type(data).__name__}")
        known = {f.name for f in fields(cls)}
        for key, value in data.items():
            if key not in known:
                raise ValueError(f"unknown tf.data setting {key!r} in {where} (known: {', '.join(sorted(known))})")
            if value is None:
                continue
            if key == "deterministic":
                if type(value) is not bool:
                    raise ValueError(f"{where}.{key} must be true or false, got {value!r}")
                continue
            if type(value) is not int:
                raise ValueError(f"{where}.{key} must be a whole number, got {value!r}")
            lowest = AUTOTUNE if key in ("parallel_calls", "prefetch") else 1
            if value < lowest or value == 0:
                allowed = "at least 1, or -1 for tf.data.AUTOTUNE" if lowest == AUTOTUNE else "at least 1"
                raise ValueError(f"{where}.{key} must be {allowed}, got {value}")
        return cls(**data)

    def label(self) -> str:
        """A short name for tables and directories, e.g. ``parallel 8 prefetch AUTOTUNE unordered``."""
        def value(v: int) -> str:
            return "AUTOTUNE" if v == AUTOTUNE else str(v)
        parts = []
        if self.parallel_calls is not None:
            parts.append(f"parallel {value(self.parallel_calls)}")
        if self.prefetch is not None:
            parts.append(f"prefetch {value(self.prefetch)}")
        if self.deterministic is not None:
            parts.append("ordered" if self.deterministic else "unordered")
        if self.private_threadpool_size is not None:
            parts.append(f"pool {self.private_threadpool_size}")
        if self.max_intra_op_parallelism is not None:
            parts.append(f"intra-op {self.max_intra_op_parallelism}")
        return " ".join(parts) or "as is"

    def label_beside_workers(self) -> str:
        """The settings other than num_parallel_calls (the report's axis), naming a line of trials."""
        return dataclasses.replace(self, parallel_calls=None).label().replace("as is", "the script's own")


@dataclass(frozen=True)
class Overrides:
    """Settings for the loader(s) built at ``site`` (every loader when ``site`` is None).

    Where the training loader shares its ``site`` with another loader (a framework builds both at
    one line; a helper builds both), ``stack`` (the user's frames, innermost first) or ``role``
    (``"train"``: not a loader built as an evaluation one) tells it apart.
    """

    settings: LoaderSettings
    site: str | None = None
    stack: tuple[str, ...] | None = None
    role: str | None = None
    # The user's own DataLoader(...) call a framework rebuilt the loader from, where the framework
    # rebuilds several at one line of its own (accelerate's prepare(train, eval)).
    origin: str | None = None

    framework = "pytorch"
    ENV: ClassVar[str] = ENV_LOADER_OVERRIDES

    def to_json(self) -> str:
        return json.dumps(self.to_dict())

    def to_env(self) -> dict[str, str]:
        """The environment that carries these settings to the command."""
        return env_of(self)

    def to_dict(self) -> dict[str, Any]:
        data = {"format": CONFIG_FORMAT, "site": self.site, "settings": self.settings.to_dict()}
        if self.stack is not None:
            data["stack"] = list(self.stack)
        if self.role is not None:
            data["role"] = self.role
        if self.origin is not None:
            data["origin"] = self.origin
        return data

    def matches(self, site: str | None, stack: list[str], built_as: str | None,
                origin_site: str | None = None) -> bool:
        """Whether the loader being built at ``site`` is the one these settings are for."""
        if self.site is not None and site != self.site:
            return False
        if self.origin is not None and origin_site != self.origin:
            return False
        if self.stack is not None and tuple(stack) != self.stack:
            return False
        return self.role is None or built_as is None or built_as == self.role

    def target(self) -> str:
        """The loader these settings are for, in words."""
        if self.site is None:
            return "every DataLoader"
        which = " (the training one)" if self.role == TRAIN else ""
        called = f", called from {self.stack[0]}" if self.stack else ""
        rebuilt = f", rebuilt from the one built at {self.origin}" if self.origin else ""
        return f"the DataLoader built at {self.site}{called}{rebuilt}{which}"

    @classmethod
    def from_json(cls, text: str, where: str = "the config") -> "Overrides":
        data = parse_json(text, where)
        if not isinstance(data, dict):
            raise ValueError(f"{where} must be a JSON object")
        unknown = set(data) - {"format", "framework", "site", "stack", "role", "origin", "settings", "samples_per_s",
                               "speedup", "command", "note"}
        if unknown:
            raise ValueError(f"unknown key {sorted(unknown)[0]!r} in {where} (known: format, site, stack, role, settings)")
        if data.get("framework", "pytorch") != "pytorch":
            raise ValueError(f"{where} is for framework {data.get('framework')!r}; known: 'pytorch' (a DataLoader's "
                             "settings), 'tensorflow' (a tf.data pipeline's)")
        if data.get("format", CONFIG_FORMAT) != CONFIG_FORMAT:
            raise ValueError(f"{where} has format {data.get('format')!r}; this gpufeed reads {CONFIG_FORMAT!r}")
        site = data.get("site")
        if site is not None and not isinstance(site, str):
            raise ValueError(f"site in {where} must be a string like 'train.py:42' or null")
        stack = data.get("stack")
        if stack is not None and not (isinstance(stack, list) and all(isinstance(f, str) for f in stack)):
            raise ValueError(f"stack in {where} must be a list of 'file:line' strings")
        role = data.get("role")
        if role not in (None, TRAIN, EVAL):
            raise ValueError(f"role in {where} must be {TRAIN!r}, {EVAL!r} or null")
        origin = data.get("origin")
        if origin is not None and not isinstance(origin, str):
            raise ValueError(f"origin in {where} must be a string like 'train.py:42' or null")
        return cls(LoaderSettings.from_dict(data.get("settings", {}), f"{where}: settings"), site,
                   None if stack is None else tuple(stack), role, origin)


@dataclass(frozen=True)
class AutotuneSettings:
    """``--autotune``'s options for the controller in the training process (``autotune/controller.py``);
    None leaves its default."""

    ENV: ClassVar[str] = ENV_AUTOTUNE

    period_s: float | None = None
    min_batches: int | None = None
    max_workers: int | None = None
    # Under several ranks: how long a rank waits for the others at a decision's exchange before it
    # goes back to your settings (``autotune/ranks.py``)
    sync_timeout_s: float | None = None
    # --allow-reorder: the search may try in_order=False (where it measures in-order delivery's cost)
    allow_reorder: bool | None = None

    def options(self) -> dict[str, Any]:
        """The controller's keyword options that are set."""
        return {f.name: getattr(self, f.name) for f in fields(self) if getattr(self, f.name) is not None}

    def to_json(self) -> str:
        return json.dumps(self.options()) if self.options() else "1"

    @classmethod
    def from_json(cls, text: str, where: str = ENV_AUTOTUNE) -> "AutotuneSettings | None":
        """``1``: on with the defaults; ``0``: off (None); else a JSON object of the options."""
        text = text.strip()
        if text == "0":
            return None
        if text == "1":
            return cls()
        data = parse_json(text, where)
        known = [f.name for f in fields(cls)]
        if not isinstance(data, dict) or set(data) - set(known):
            raise ValueError(f"{where}: known options: {', '.join(known)}")
        return cls(**data)


@dataclass(frozen=True)
class OffloadSettings:
    """Offload the training DataLoader's batches to ``engine``.

    ``address``: the cluster to join (``ray.init(address=...)``: ``auto``, ``HOST:PORT`` of a node of
    it, or ``ray://HOST:PORT`` for Ray Client); None starts a local Ray for the run (the embedded
    default). ``workers``: Ray workers making batches (default: one per CPU of the cluster).
    ``lost_after_s``: with every Ray worker lost, how long to wait for one before going on locally.
    """

    ENV: ClassVar[str] = ENV_OFFLOAD

    engine: str = "ray"
    address: str | None = None
    workers: int | None = None
    lost_after_s: float | None = None  # default th.OFFLOAD_LOST_AFTER_S; tests shorten it

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    def to_env(self) -> dict[str, str]:
        return env_of(self)

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> "OffloadSettings | None":
        """The settings in the environment; None when there are none. Raises ``ValueError``."""
        return read_env(cls, environ)

    @classmethod
    def from_json(cls, text: str, where: str = ENV_OFFLOAD) -> "OffloadSettings":
        data = parse_json(text, where)
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
