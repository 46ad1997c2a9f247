"""DataLoader settings overridden at construction time, without editing the user's script.

``gpufeed tune``, ``gpufeed batch-size`` and ``gpufeed run --config`` pass settings to the command
in ``GPUFEED_LOADER_OVERRIDES`` (JSON). ``DataLoader.__init__`` is wrapped: when a loader is built
at the target *site* (the ``file:line`` of the user's ``DataLoader(...)`` call, which the run record
keeps for every loader), its keyword arguments are replaced before torch sees them. Loaders built
elsewhere (a validation loader, say) are left alone. Without a site, every loader is overridden.

Each application is reported as an ``override`` event in the run record, so a trial can check that
its settings were really used. Standard library only: this module runs inside the user's process.
"""
from __future__ import annotations

import functools
import inspect
import json
import os
import sys
from dataclasses import dataclass
from typing import Any, Callable

from gpufeed.measure.inside import knobs, roles
from gpufeed.settings import LoaderSettings

ENV_OVERRIDES = "GPUFEED_LOADER_OVERRIDES"
# DataLoader keywords torch refuses with num_workers=0 (torch 2.x DataLoader.__init__ and
# _SingleProcessDataLoaderIter), at the values it accepts there.
WITHOUT_WORKERS = {"prefetch_factor": None, "persistent_workers": False, "multiprocessing_context": None,
                   "timeout": 0}
CONFIG_FORMAT = "gpufeed.loader-settings/1"
# Thread-pool variables read by OpenMP, MKL, OpenBLAS and friends when a library starts its pool.
THREAD_ENV_VARS = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "NUMEXPR_NUM_THREADS",
                   "VECLIB_MAXIMUM_THREADS")


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

    framework = "pytorch"

    def to_json(self) -> str:
        return json.dumps(self.to_dict())

    def to_env(self) -> dict[str, str]:
        """The environment that carries these settings to the command."""
        return {ENV_OVERRIDES: self.to_json()}

    def to_dict(self) -> dict[str, Any]:
        data = {"format": CONFIG_FORMAT, "site": self.site, "settings": self.settings.to_dict()}
        if self.stack is not None:
            data["stack"] = list(self.stack)
        if self.role is not None:
            data["role"] = self.role
        return data

    def matches(self, site: str | None, stack: list[str], built_as: str | None) -> bool:
        """Whether the loader being built at ``site`` is the one these settings are for."""
        if self.site is not None and site != self.site:
            return False
        if self.stack is not None and tuple(stack) != self.stack:
            return False
        return self.role is None or built_as is None or built_as == self.role

    def target(self) -> str:
        """The loader these settings are for, in words."""
        if self.site is None:
            return "every DataLoader"
        which = " (the training one)" if self.role == roles.TRAIN else ""
        called = f", called from {self.stack[0]}" if self.stack else ""
        return f"the DataLoader built at {self.site}{called}{which}"

    @classmethod
    def from_json(cls, text: str, where: str = "the config") -> "Overrides":
        data = parse_json(text, where)
        if not isinstance(data, dict):
            raise ValueError(f"{where} must be a JSON object")
        unknown = set(data) - {"format", "framework", "site", "stack", "role", "settings", "samples_per_s",
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
        if role not in (None, roles.TRAIN, roles.EVAL):
            raise ValueError(f"role in {where} must be {roles.TRAIN!r}, {roles.EVAL!r} or null")
        return cls(LoaderSettings.from_dict(data.get("settings", {}), f"{where}: settings"), site,
                   None if stack is None else tuple(stack), role)


def parse_json(text: str, where: str) -> Any:
    """A settings file's JSON; ValueError saying where it is not valid."""
    try:
        return json.loads(text)
    except json.JSONDecodeError as error:
        raise ValueError(f"{where} is not valid JSON ({error})") from None


def call_site(skip_prefixes: tuple[str, ...], frame=None) -> str | None:
    """``file:line`` of the first frame outside torch's data package and gpufeed: the ``DataLoader(...)`` call."""
    frame = frame or sys._getframe(1)
    while frame is not None:
        filename = os.path.abspath(frame.f_code.co_filename)
        if not filename.startswith(skip_prefixes):
            return f"{portable_path(filename)}:{frame.f_lineno}"
        frame = frame.f_back
    return None


def _site_frame(skip_prefixes: tuple[str, ...], frame):
    """The frame of the ``DataLoader(...)`` call that ``call_site`` names."""
    while frame is not None and os.path.abspath(frame.f_code.co_filename).startswith(skip_prefixes):
        frame = frame.f_back
    return frame


def portable_path(filename: str) -> str:
    """A file's name that holds on another machine, so a config file travels with the project:
    an installed package's file relative to its site-packages (``accelerate/data_loader.py``),
    else relative to the working directory when under it, else to the ``sys.path`` entry holding it."""
    return _portable_path(filename, os.getcwd(), tuple(sys.path))


@functools.lru_cache(maxsize=1024)
def _portable_path(filename: str, cwd: str, search_path: tuple[str, ...]) -> str:
    # Cached: every DataLoader built walks the stack's frames through here (a loader built each
    # epoch paid ~90 µs for the path arithmetic alone).
    filename = os.path.normpath(os.path.join(cwd, filename))
    roots = sorted((os.path.normpath(os.path.join(cwd, p)) for p in search_path if p), key=len, reverse=True)
    for root in roots:
        if os.path.basename(root) in roles.PACKAGE_DIRS and filename.startswith(root + os.sep):
            return os.path.relpath(filename, root)
    try:
        relative = os.path.relpath(filename, cwd)
    except ValueError:
        relative = ".."
    if not relative.startswith(".."):
        return relative
    for root in roots:
        if filename.startswith(root + os.sep):
            return os.path.relpath(filename, root)
    return filename


class WorkerThreadCap:
    """A ``worker_init_fn`` that caps threads in each worker, then runs the user's own.

    A class at module level, not a closure: with the spawn start method it is pickled by name.
    """

    def __init__(self, threads: int, user_init_fn: Callable[[int], Any] | None) -> None:
        self.threads = threads
        self.user_init_fn = user_init_fn

    def __call__(self, worker_id: int) -> None:
        for name in THREAD_ENV_VARS:  # for pools started later in this worker (and its children)
            os.environ[name] = str(self.threads)
        # The user's own init first: it is often what raises the thread count (docs/sources.md).
        if self.user_init_fn is not None:
            self.user_init_fn(worker_id)
        import torch
        torch.set_num_threads(self.threads)
        cv2 = sys.modules.get("cv2")  # OpenCV's own pool (docs/sources.md: a classic 4x slowdown)
        if cv2 is not None and hasattr(cv2, "setNumThreads"):
            cv2.setNumThreads(self.threads)


def apply(kwargs: dict[str, Any], settings: LoaderSettings) -> tuple[dict[str, Any], dict[str, str]]:
    """The DataLoader keywords with ``settings`` applied; a dict of what was refused and why.

    Keeps the combination valid for torch: no prefetch factor or persistent workers without workers.
    """
    refused: dict[str, str] = {}
    out = dict(kwargs)
    if settings.num_workers is not None:
        out["num_workers"] = settings.num_workers
    workers = out.get("num_workers") or 0
    if workers > 0:
        if settings.prefetch_factor is not None:
            out["prefetch_factor"] = settings.prefetch_factor
        if settings.persistent_workers is not None:
            out["persistent_workers"] = settings.persistent_workers
        if settings.worker_threads is not None:
            out["worker_init_fn"] = WorkerThreadCap(settings.worker_threads, out.get("worker_init_fn"))
    else:
        # Without workers torch refuses these (ValueError in DataLoader.__init__, or an
        # AssertionError at the first iteration for timeout): the user's values go.
        out.update(WITHOUT_WORKERS)
    if settings.pin_memory is not None:
        out["pin_memory"] = settings.pin_memory
    if settings.batch_size is not None:
        if out.get("batch_sampler") is not None:
            refused["batch_size"] = "the script passes its own batch_sampler, which fixes the batch size"
        elif out.get("batch_size", 1) is None:
            refused["batch_size"] = "the script turns automatic batching off (batch_size=None)"
        else:
            out["batch_size"] = settings.batch_size
    return out, refused


def patch_dataloader_init(overrides: Overrides | None, report: Callable[..., None] | None) -> None:
    """Wrap ``DataLoader.__init__`` (idempotent): note where each loader is built (its call site,
    the user's frames above it, the framework between, the role its construction shows), and apply
    ``overrides`` to the loader they are for.

    ``report(kind, **fields)`` records each application of the overrides. Without it (``gpufeed
    run --config``), what was applied, or that nothing was, is said on stderr.
    """
    from torch.utils.data import dataloader
    import torch

    init = dataloader.DataLoader.__init__
    if getattr(init, "_gpufeed_original", None) is not None:
        return
    signature = inspect.signature(init)
    # Frames to look past: torch itself, and gpufeed's instrumentation (not its demo script).
    skip = (os.path.dirname(os.path.abspath(torch.__file__)) + os.sep,
            os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep)
    applied = _Applied(overrides, report is None)

    def __init__(self, *args, **kwargs):
        frame = sys._getframe(1)
        site = call_site(skip, frame)
        user = roles.user_code(frame, skip, portable_path, self)
        user["knobs"] = knobs.knob_sources(_site_frame(skip, frame))
        found = roles.role_from_stack(frame)
        built_as = found[0] if found else user.pop("origin_built_as", None)
        user.pop("origin_built_as", None)
        if overrides is not None and overrides.matches(site, user["user_stack"], built_as):
            try:
                bound = signature.bind(self, *args, **kwargs)
            except TypeError:  # arguments torch refuses anyway: let torch say so, in its own words
                bound = None
            if bound is not None:
                given = {k: v for k, v in bound.arguments.items() if k != "self"}
                args, (kwargs, refused) = (), apply(given, overrides.settings)
                applied.note(site, refused)
                if report is not None:
                    report("override", site=site, settings=overrides.settings.to_dict(), refused=refused)
        elif overrides is not None:
            applied.missed(site)
        init(self, *args, **kwargs)
        # DataLoader refuses only a few attributes after __init__; not these.
        self._gpufeed_site = site
        self._gpufeed_built = dict(user, built_as=built_as, site=site)

    __init__._gpufeed_original = init
    __init__.__wrapped__ = init
    dataloader.DataLoader.__init__ = __init__


class _Applied:
    """What ``gpufeed run --config`` did in this process, said on stderr: each loader it changed
    once, and at exit, when it built loaders but changed none, that the settings did nothing."""

    def __init__(self, overrides: Overrides | None, say: bool) -> None:
        self.overrides, self.say = overrides, say and overrides is not None
        self.count = 0
        self.elsewhere: list[str] = []
        if self.say:
            import atexit
            atexit.register(self.at_exit)

    def note(self, site: str | None, refused: dict[str, str]) -> None:
        self.count += 1
        if self.say and self.count == 1 and _lead_process():
            not_applied = "".join(f"; {k} not applied: {why}" for k, why in refused.items())
            sys.stderr.write(f"gpufeed: applied {self.overrides.settings.label()} to the DataLoader built at "
                             f"{site}{not_applied}\n")

    def missed(self, site: str | None) -> None:
        if site not in self.elsewhere:
            self.elsewhere.append(site)

    def at_exit(self) -> None:
        if self.count or not self.elsewhere or not _lead_process():
            return
        sys.stderr.write(f"gpufeed: the settings were NOT applied: no DataLoader matched {self.overrides.target()}; "
                         f"this run built DataLoaders at {', '.join(map(str, self.elsewhere[:5]))}. The script "
                         "changed since the config was made, or runs from another directory: run `gpufeed tune` "
                         "again.\n")


def _lead_process() -> bool:
    """Rank 0 (or no rank): one message for a job, not one per rank."""
    from gpufeed.ranks_env import lead_process
    return lead_process()


def unpatch_dataloader_init() -> None:
    from torch.utils.data import dataloader
    original = getattr(dataloader.DataLoader.__init__, "_gpufeed_original", None)
    if original is not None:
        dataloader.DataLoader.__init__ = original


def from_env() -> Overrides | None:
    text = os.environ.get(ENV_OVERRIDES)
    if not text:
        return None
    try:
        return Overrides.from_json(text, ENV_OVERRIDES)
    except ValueError as error:
        sys.stderr.write(f"gpufeed: DataLoader settings not applied: {error}\n")
        return None
