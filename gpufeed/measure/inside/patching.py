"""Replacing a class's or module's attribute with a wrapper, and putting the original back.

Every patch gpufeed makes inside the training process goes through here, so each wrapper knows its
original (``_gpufeed_original``) and patching twice is a no-op.
"""
from __future__ import annotations

from typing import Callable


def patch(cls: type, name: str, make: Callable[[Callable], Callable]) -> None:
    """``cls.name = make(original)``, unless it is already one of ours."""
    current = getattr(cls, name)
    if getattr(current, "_gpufeed_original", None) is not None:
        return  # already patched
    wrapper = make(current)
    wrapper._gpufeed_original = current
    if not isinstance(wrapper, classmethod):  # a classmethod's __wrapped__ is its function, read-only
        wrapper.__wrapped__ = current  # inspect.signature reads the original's parameters
    # Tensor.to lives on a C base class: restoring means deleting our override, not setting it back.
    wrapper._gpufeed_inherited = name not in cls.__dict__
    if not isinstance(wrapper, classmethod):
        wrapper.__name__ = getattr(current, "__name__", name)
        wrapper.__doc__ = current.__doc__
    setattr(cls, name, wrapper)


def unpatch(cls: type, name: str) -> None:
    """Put the original back (nothing if ``cls.name`` is not ours)."""
    wrapper = cls.__dict__.get(name)
    original = getattr(wrapper, "_gpufeed_original", None)
    if original is None:
        return
    if wrapper._gpufeed_inherited:
        delattr(cls, name)
    else:
        setattr(cls, name, original)
