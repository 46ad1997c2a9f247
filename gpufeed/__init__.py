"""gpufeed: find out why a PyTorch training job leaves its GPU idle, and fix it.

Importing ``gpufeed`` is cheap (the probe runs inside training processes and must stay light):
the Python API is loaded on first use.
"""
from gpufeed._version import __version__

__all__ = ["__version__", "profile", "analyze", "tune_loader", "tuned_loader", "autotune"]


def __getattr__(name: str):
    if name in ("profile", "analyze"):
        from gpufeed import api
        return getattr(api, name)
    if name in ("tune_loader", "tuned_loader"):
        from gpufeed.tune import inprocess
        return getattr(inprocess, name)
    if name == "autotune":  # the package, callable as the function (gpufeed/autotune/__init__.py)
        import importlib
        return importlib.import_module("gpufeed.autotune")
    raise AttributeError(f"module 'gpufeed' has no attribute {name!r}")
