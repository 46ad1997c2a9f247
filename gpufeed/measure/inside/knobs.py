"""Where the user's DataLoader settings come from: the script's own command line (an argparse flag such as
``-j/--workers``), a Hydra/OmegaConf key, or an argument of a Lightning DataModule (or module), so
that the advice names the knob the user turns.

Read once per ``DataLoader(...)`` call, from the call's source (``ast``) and the caller's variables: the
keyword ``num_workers=args.workers``, where ``args`` is an ``argparse.Namespace``, is set by the
``add_argument`` in the same file whose destination is ``workers``. Never on the hot path, and never
an error the user sees: what cannot be read is left out.
"""
from __future__ import annotations

import argparse
import ast
import functools
import os
import sys
from types import FrameType
from typing import Any

KNOBS = ("num_workers", "batch_size", "pin_memory", "prefetch_factor", "persistent_workers")
MAX_PACKAGE_FRAMES = 8  # a framework's frames between its DataLoader wrapper and the user's call


def knob_sources(frame: FrameType | None) -> dict[str, dict[str, Any]]:
    """{"num_workers": {"kind": "argparse", "flags": ["-j", "--workers"], "store_true": False}} or
    {"kind": "hydra", "key": "data.num_workers"}, for each setting the call takes from one of them."""
    frame = _user_frame(frame)
    if frame is None:
        return {}
    try:
        tree = _tree(frame.f_code.co_filename)
        call = _call_at(tree, frame.f_lineno) if tree is not None else None
        if call is None:
            return {}
        found = {}
        for keyword in call.keywords:
            chain = _attribute_chain(keyword.value) if keyword.arg in KNOBS else None
            if not chain:
                continue
            root = frame.f_locals.get(chain[0], frame.f_globals.get(chain[0]))
            source = _source_of(tree, root, chain[1:])
            if source is not None:
                found[keyword.arg] = source
        return found
    except Exception:  # a measurement never breaks the user's loop
        return {}


def _user_frame(frame: FrameType | None) -> FrameType | None:
    """The frame of the user's ``DataLoader(...)`` call: Lightning wraps ``DataLoader.__init__`` while
    its hooks run, so the frame given may be Lightning's wrapper, an installed package's; the
    user's call is the first frame outside the installed packages above it."""
    for _ in range(MAX_PACKAGE_FRAMES):
        if frame is None or not _installed(frame.f_code.co_filename):
            return frame
        frame = frame.f_back
    return None


def _installed(filename: str) -> bool:
    parts = filename.replace("\\", "/").split("/")
    return "site-packages" in parts or "dist-packages" in parts


def _source_of(tree: ast.AST, root: Any, path: list[str]) -> dict[str, Any] | None:
    if isinstance(root, argparse.Namespace) and len(path) == 1:
        option = _argparse_option(tree, path[0])
        return None if option is None else {"kind": "argparse", **option}
    if type(root).__name__ == "DictConfig" and path:  # omegaconf, as Hydra hands it to the task
        return {"kind": "hydra", "key": ".".join(path)}
    if _lightning(root) is not None and path:
        return _lightning_argument(root, path)
    return None


def _lightning(obj: Any) -> str | None:
    """"data" for a LightningDataModule, "model" for a LightningModule (LightningCLI's groups), else
    None; by the names in the class's MRO, so that nothing is imported for it."""
    names = {c.__name__ for c in type(obj).__mro__}
    if "LightningDataModule" in names:
        return "data"
    if "LightningModule" in names:
        return "model"
    return None


def _lightning_argument(module: Any, path: list[str]) -> dict[str, Any] | None:
    """The ``__init__`` argument of a LightningDataModule (or LightningModule) that the setting reads:
    ``self.hparams.num_workers`` (``save_hyperparameters()`` keeps them by their argument names) or
    ``self.num_workers`` where ``__init__`` did ``self.num_workers = num_workers``; with where the
    module is constructed in the script, or LightningCLI's flag when the script runs one."""
    cls = type(module)
    if len(path) == 2 and path[0] == "hparams":
        hparams = getattr(module, "hparams", None)
        argument = path[1] if hparams is not None and path[1] in hparams else None
    elif len(path) == 1:
        argument = _init_argument(cls, path[0])
    else:
        argument = None
    if argument is None:
        return None
    group = _lightning(module)
    files = [f for f in (_main_file(), _class_file(cls)) if f]
    cli = any(_calls(f, "LightningCLI") for f in files[:1])
    constructed = next((site for f in files for site in _calls(f, cls.__name__)), None)
    return {"kind": "lightning", "class": cls.__name__, "group": group, "argument": argument,
            "constructed": constructed, "cli": f"--{group}.{argument}" if cli else None}


def _init_argument(cls: type, attribute: str) -> str | None:
    """The ``__init__`` parameter that ``self.<attribute> = <parameter>`` stores, in the class or a
    base of the user's."""
    for klass in cls.__mro__:
        filename = _class_file(klass)
        tree = _tree(filename) if filename else None
        if tree is None:
            continue
        for node in ast.walk(tree):
            if not (isinstance(node, ast.ClassDef) and node.name == klass.__name__):
                continue
            for init in node.body:
                if not (isinstance(init, ast.FunctionDef) and init.name == "__init__"):
                    continue
                params = {a.arg for a in init.args.args + init.args.kwonlyargs}
                for stmt in ast.walk(init):
                    if (isinstance(stmt, ast.Assign) and isinstance(stmt.value, ast.Name)
                            and stmt.value.id in params
                            and any(isinstance(t, ast.Attribute) and t.attr == attribute
                                    and isinstance(t.value, ast.Name) and t.value.id == "self"
                                    for t in stmt.targets)):
                        return stmt.value.id
    return None


def _class_file(cls: type) -> str | None:
    module = sys.modules.get(cls.__module__)
    filename = getattr(module, "__file__", None)
    return filename if filename and not _installed(filename) else None


def _main_file() -> str | None:
    return getattr(sys.modules.get("__main__"), "__file__", None)


def _calls(filename: str, name: str) -> list[str]:
    """``file:line`` of each call of ``name`` (``Name(...)`` or ``x.Name(...)``) in the file."""
    tree = _tree(filename)
    if tree is None:
        return []
    lines = sorted(node.lineno for node in ast.walk(tree) if isinstance(node, ast.Call)
                   and ((isinstance(node.func, ast.Name) and node.func.id == name)
                        or (isinstance(node.func, ast.Attribute) and node.func.attr == name)))
    return [f"{_short(filename)}:{line}" for line in lines]


def _short(filename: str) -> str:
    """The file as the DataLoader's site names it (``overrides.portable_path``): relative to the working
    directory when under it, else to the ``sys.path`` entry holding it (the script's own folder)."""
    filename = os.path.abspath(filename)
    relative = os.path.relpath(filename)
    if not relative.startswith(".."):
        return relative
    roots = sorted((os.path.abspath(p) for p in sys.path if p), key=len, reverse=True)
    return next((os.path.relpath(filename, r) for r in roots if filename.startswith(r + os.sep)), filename)


@functools.lru_cache(maxsize=64)
def _tree(filename: str) -> ast.AST | None:
    try:
        with open(filename, "rb") as f:
            return ast.parse(f.read(), filename)
    except (OSError, SyntaxError, ValueError):
        return None


def _call_at(tree: ast.AST, line: int) -> ast.Call | None:
    """The innermost call spanning ``line`` with a DataLoader keyword (the ``DataLoader(...)`` call)."""
    best = None
    for node in ast.walk(tree):
        if (isinstance(node, ast.Call) and node.lineno <= line <= (node.end_lineno or node.lineno)
                and any(k.arg in KNOBS for k in node.keywords)):
            if best is None or node.lineno >= best.lineno:
                best = node
    return best


def _attribute_chain(node: ast.AST) -> list[str] | None:
    """``args.workers`` -> ["args", "workers"]; ``cfg.data.num_workers`` -> ["cfg", "data", "num_workers"];
    through a conversion, ``int(opt.workers)`` (pytorch/examples' dcgan) -> ["opt", "workers"]."""
    if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("int", "bool")
            and len(node.args) == 1 and not node.keywords):
        node = node.args[0]
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name) or not parts:
        return None
    return [node.id] + parts[::-1]


def _argparse_option(tree: ast.AST, dest: str) -> dict[str, Any] | None:
    """The ``add_argument`` call of this file whose destination is ``dest``: its option strings."""
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                and node.func.attr == "add_argument"):
            continue
        flags = [a.value for a in node.args if isinstance(a, ast.Constant) and isinstance(a.value, str)]
        given = {k.arg: k.value.value for k in node.keywords if isinstance(k.value, ast.Constant)}
        if not flags or _dest(flags, given.get("dest")) != dest:
            continue
        if not flags[0].startswith("-"):
            return None  # a positional argument: no flag to name
        return {"flags": flags, "store_true": given.get("action") == "store_true"}
    return None


def _dest(flags: list[str], dest: Any) -> str:
    if isinstance(dest, str):
        return dest
    long = next((f for f in flags if f.startswith("--")), flags[0])
    return long.lstrip("-").replace("-", "_")
