"""Whose loader is it: a DataLoader's role (training or evaluation) and the user's own code above it.

Read from the Python stack where a loader is built and where each of its iterators is created
(``iter(loader)``). The evidence, innermost frame first:

1. the frameworks' and the user's own functions that say what they do: Hugging Face Trainer's
   ``get_train_dataloader`` / ``_inner_training_loop`` against ``get_eval_dataloader`` /
   ``evaluation_loop``; Lightning's ``train_dataloader()`` hook and fit loop against its
   ``val_dataloader()`` hook, evaluation loop and sanity check; Keras's ``fit`` against
   ``evaluate``; timm-style ``train_one_epoch`` against ``validate``;
2. at ``iter(loader)``, the grad mode: evaluation loops run under ``torch.no_grad()`` or
   ``torch.inference_mode()`` (Lightning's evaluation loop does so itself); nothing trains there.

A loader nothing says anything about is a training loader, as before; the analysis still picks,
among a process's training loaders, the one its loop iterated most. Standard library only, plus
the user's own torch: this module runs inside the user's process.
"""
from __future__ import annotations

import functools
import os
import sys
from types import FrameType
from typing import Callable

from gpufeed.measure.inside.loader_tag import tag_of
from gpufeed.settings import EVAL, TRAIN  # the role names every layer shares


# Function names that say what a frame is doing, whoever wrote it (innermost match wins).
FUNCTION_ROLES = {
    # Hugging Face transformers Trainer
    "get_train_dataloader": TRAIN, "_inner_training_loop": TRAIN,
    "get_eval_dataloader": EVAL, "get_test_dataloader": EVAL, "evaluation_loop": EVAL, "prediction_loop": EVAL,
    # Lightning's hooks, written by the user in a LightningModule or DataModule
    "train_dataloader": TRAIN,
    "val_dataloader": EVAL, "test_dataloader": EVAL, "predict_dataloader": EVAL, "_run_sanity_check": EVAL,
    # the usual names of hand-written loops (timm's train.py, the PyTorch examples)
    "train_one_epoch": TRAIN, "validate": EVAL, "evaluate": EVAL,
}
# Files of a framework whose loops say it (Lightning: the loader is iterated deep inside them).
FILE_ROLES = {
    ("lightning", "evaluation_loop.py"): EVAL, ("lightning", "prediction_loop.py"): EVAL,
    ("lightning", "fit_loop.py"): TRAIN, ("lightning", "training_epoch_loop.py"): TRAIN,
}
# Keras's own fit / evaluate (its torch backend builds and iterates the loaders inside them).
FRAMEWORK_FUNCTION_ROLES = {"keras": {"fit": TRAIN, "evaluate": EVAL, "predict": EVAL}}

# Top-level packages that build the training loader for the user, under the name the advice uses.
FRAMEWORKS = {"transformers": "transformers", "accelerate": "accelerate", "lightning": "lightning",
              "pytorch_lightning": "lightning", "keras": "keras", "timm": "timm"}
# Outermost wins; transformers builds its loaders through accelerate.
FRAMEWORK_PRIORITY = ("transformers", "lightning", "keras", "timm", "accelerate")
PACKAGE_DIRS = ("site-packages", "dist-packages")
MAX_USER_FRAMES = 6


def package_of(filename: str) -> str | None:
    """The top-level package of a file installed under site-packages / dist-packages, else None."""
    parts = filename.replace("\\", "/").split("/")
    for i in range(len(parts) - 2, -1, -1):
        if parts[i] in PACKAGE_DIRS:
            return parts[i + 1].removesuffix(".py")
    return None


def _stdlib_prefixes() -> tuple[str, ...]:
    import sysconfig
    paths = {sysconfig.get_paths().get(k) for k in ("stdlib", "platstdlib")}
    return tuple(os.path.abspath(p) + os.sep for p in paths if p)


_STDLIB = _stdlib_prefixes()


def is_user_file(filename: str, skip: tuple[str, ...]) -> bool:
    """The user's own code: not installed packages, not the standard library, not torch or gpufeed."""
    if filename.startswith("<"):
        return False  # <frozen ...>, <string>
    filename = os.path.abspath(filename)
    return not filename.startswith(skip + _STDLIB) and package_of(filename) is None


def role_from_stack(frame: FrameType | None) -> tuple[str, str] | None:
    """(role, why) from the innermost frame whose function or file says it, or None."""
    while frame is not None:
        code = frame.f_code
        package = package_of(code.co_filename)
        framework = FRAMEWORKS.get(package or "")
        role = FRAMEWORK_FUNCTION_ROLES.get(framework or "", {}).get(code.co_name)
        if role is None and framework is not None:
            role = FILE_ROLES.get((framework, os.path.basename(code.co_filename)))
        if role is None and code.co_name in FUNCTION_ROLES:
            role = FUNCTION_ROLES[code.co_name]
        if role is not None:
            where = f"{framework} " if framework else ""
            return role, f"called from {where}{code.co_name}()"
        frame = frame.f_back
    return None


def iterator_role(frame: FrameType | None, built_as: str | None) -> tuple[str, str]:
    """The role of an iterator created now (``iter(loader)``), with the evidence in words.

    ``built_as``: the role the loader's construction showed, if any.
    """
    found = role_from_stack(frame)
    grad = sys.modules.get("torch")
    grad_off = grad is not None and not grad.is_grad_enabled()
    if found is not None and found[0] == EVAL:
        return found
    if grad_off:
        return EVAL, "iterated under torch.no_grad() / inference_mode()"
    if found is not None:
        return found
    if built_as is not None:
        return built_as, f"built as a {'training' if built_as == TRAIN else 'evaluation'} loader"
    return TRAIN, "iterated with gradients on"


def user_code(frame: FrameType | None, skip: tuple[str, ...], short: Callable[[str], str], this: object) -> dict:
    """Where the user's own code builds a loader: the user's frames (``file:line``, innermost first),
    the function of the first, the framework between it and the ``DataLoader(...)`` call, and the
    loader it was made from when a framework rebuilds one the user built (Lightning re-creates the
    loader ``train_dataloader()`` returns, accelerate the one given to ``prepare()``)."""
    stack: list[str] = []
    function = None
    packages: list[str] = []
    origin = None
    while frame is not None and len(stack) < MAX_USER_FRAMES:
        filename = frame.f_code.co_filename
        if is_user_file(filename, skip):
            if not stack:
                function = frame.f_code.co_name
            stack.append(f"{short(os.path.abspath(filename))}:{frame.f_lineno}")
        elif not stack:
            package = FRAMEWORKS.get(package_of(filename) or "")
            if package is not None:
                packages.append(package)
                origin = origin or _loader_in(frame, this)
        frame = frame.f_back
    framework = next((f for f in FRAMEWORK_PRIORITY if f in packages), None)
    built = {"user_stack": stack, "user_function": function, "framework": framework, "origin_site": None}
    if origin is not None:
        site, first = origin.get("site"), (origin.get("user_stack") or [None])[0]
        # The user's own DataLoader(...) call, when theirs: where they change its settings.
        built["origin_site"] = site if site is not None and site == first else origin.get("origin_site")
        built["user_function"] = origin.get("user_function") or function
        built["origin_built_as"] = origin.get("built_as")
    return built


def _loader_in(frame: FrameType, this: object) -> dict | None:
    """What gpufeed noted of another DataLoader among a framework frame's local variables."""
    try:
        values = list(frame.f_locals.values())
    except Exception:
        return None
    for value in values:
        if value is this:
            continue
        noted = tag_of(value)
        if noted is not None and noted.built:
            return noted.built
    return None


# -- where a loader is built -------------------------------------------------------------------------------
def call_site(skip_prefixes: tuple[str, ...], frame=None) -> str | None:
    """``file:line`` of the first frame outside torch's data package and gpufeed: the ``DataLoader(...)`` call."""
    frame = frame or sys._getframe(1)
    while frame is not None:
        filename = os.path.abspath(frame.f_code.co_filename)
        if not filename.startswith(skip_prefixes):
            return f"{portable_path(filename)}:{frame.f_lineno}"
        frame = frame.f_back
    return None


def site_frame(skip_prefixes: tuple[str, ...], frame):
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
        if os.path.basename(root) in PACKAGE_DIRS and filename.startswith(root + os.sep):
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
