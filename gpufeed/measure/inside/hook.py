"""Run a function right after a module is imported, without importing it early.

``gpufeed diagnose`` must not import torch in processes that never use it, nor change when the
user's script imports it; so the probe waits for ``torch.utils.data.dataloader`` to be imported.
"""
from __future__ import annotations

import importlib.abc
import sys
from typing import Any, Callable


class _AfterImport(importlib.abc.MetaPathFinder):
    def __init__(self, module_name: str, callback: Callable[[Any], None]) -> None:
        self.module_name = module_name
        self.callback = callback

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
        if fullname != self.module_name:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None:
                break
        else:
            return None
        loader = spec.loader
        if loader is None or not hasattr(loader, "exec_module"):
            return spec
        sys.meta_path.remove(self)  # one shot: nothing else to watch for
        original_exec = loader.exec_module

        def exec_module(module: Any) -> None:
            original_exec(module)
            self.callback(module)

        loader.exec_module = exec_module  # on this loader instance only; its type is unchanged
        return spec


def call_after_import(module_name: str, callback: Callable[[Any], None]) -> None:
    """``callback(module)`` once ``module_name`` has been imported (now, if it already is)."""
    module = sys.modules.get(module_name)
    if module is not None:
        callback(module)
    else:
        sys.meta_path.insert(0, _AfterImport(module_name, callback))
