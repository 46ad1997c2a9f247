"""The one object gpufeed keeps on a user's DataLoader: what it knows of the loader.

Written where the loader is built and iterated (``dataloader_hook.py``), read by the probe, the role
finder and the features acting on the training loader (autotune, offload). Standard library only.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

TAG = "_gpufeed"  # the one attribute gpufeed keeps on a user's DataLoader (in its __dict__)


@dataclass
class LoaderTag:
    """What gpufeed knows of one DataLoader object."""

    site: str | None = None                        # file:line of the call that built it
    built: dict[str, Any] = field(default_factory=dict)  # roles.user_code's findings, built_as, knobs, site
    loader_id: int | None = None                   # the run record's id, given at its first iterator
    # What a provider keeps on this loader (autotune: its switching stand-in, the feed of a child it built).
    held: dict[str, Any] = field(default_factory=dict)
    # Built by gpufeed itself (autotune's children): iterated as torch's own, never substituted.
    gpufeeds_own: bool = False

    @property
    def built_as(self) -> str | None:
        return self.built.get("built_as")


def tag_of(loader: Any) -> LoaderTag | None:
    """The loader's tag, or None (built before gpufeed was armed, or not a DataLoader)."""
    try:
        found = loader.__dict__.get(TAG)
    except AttributeError:  # no __dict__ (slots)
        return None
    return found if isinstance(found, LoaderTag) else None


def tag(loader: Any) -> LoaderTag:
    """The loader's tag, made when it has none."""
    found = tag_of(loader)
    if found is None:
        found = LoaderTag()
        loader.__dict__[TAG] = found
    return found
