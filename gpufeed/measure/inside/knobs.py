"""Where the user's DataLoader settings come from: the script's own command line (an argparse flag such as
``-j/--workers``) or a Hydra/OmegaConf key, so that the advice names the knob the user turns.

Read once per ``DataLoader(...)`` call, from the call's source (``ast``) and the caller's variables: the
keyword ``num_workers=args.workers``, where ``args`` is an ``argparse.Namespace``, is set by the
``add_argument`` in the same file whose destination is ``workers``. Never on the hot path, and never
an error the user sees: what cannot be read is left out.
"""
from __future__ import annotations

import argparse
import ast
import functools
from types import FrameType
from typing import Any

KNOBS = ("num_workers", "batch_size", "pin_memory", "prefetch_factor", "persistent_workers")


def knob_sources(frame: FrameType | None) -> dict[str, dict[str, Any]]:
    """{"num_workers": {"kind": "argparse", "flags": ["-j", "--workers"], "store_true": False}} or
    {"kind": "hydra", "key": "data.num_workers"}, for each setting the call takes from one of them."""
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


def _source_of(tree: ast.AST, root: Any, path: list[str]) -> dict[str, Any] | None:
    if isinstance(root, argparse.Namespace) and len(path) == 1:
        option = _argparse_option(tree, path[0])
        return None if option is None else {"kind": "argparse", **option}
    if type(root).__name__ == "DictConfig" and path:  # omegaconf, as Hydra hands it to the task
        return {"kind": "hydra", "key": ".".join(path)}
    return None


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
