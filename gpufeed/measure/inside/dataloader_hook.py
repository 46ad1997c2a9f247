"""The one hook into torch's ``DataLoader``: every feature that acts on a loader goes through here.

Three moments of a loader's life are patched, here and nowhere else (``patching.patch``):

- **built** (``DataLoader.__init__``, and the own ``__init__`` of every subclass, which need not
  call torch's: torchdata's ``StatefulDataLoader`` re-implements it): where the user's code builds
  it (its call site, the user's frames, the framework between, the role its construction shows)
  goes into the loader's one ``LoaderTag``; providers may change the keyword arguments first
  (``gpufeed tune``'s and ``run --config``'s settings).
- **iterated** (``DataLoader.__iter__``): the training role is decided once, from the stack of
  ``iter(loader)``; a provider may iterate something else in the loader's place (``--autotune``).
- **an iterator made** (``DataLoader._get_iterator``): a provider may make it instead of torch
  (``--offload``), then providers see the new iterator (the probe measures it).

Providers run in their ``order``; each implements only the moments it needs (``Provider``'s are
no-ops). Iterators a subclass makes without these methods are the probe's (``patches._adopt``).
Standard library only, plus the user's own torch: this module runs inside the user's process.
"""
from __future__ import annotations

import inspect
import os
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from gpufeed.measure.inside import knobs, roles
from gpufeed.measure.inside.loader_tag import LoaderTag, tag
from gpufeed.measure.inside.patching import patch, unpatch

@dataclass
class Building:
    """One DataLoader being built: where, by whom, and with which arguments."""

    loader: Any
    site: str | None
    user_stack: list[str]
    built_as: str | None
    arguments: dict[str, Any]         # the keyword arguments, as bound to this ``__init__``
    origin_site: str | None = None    # the user's loader a framework rebuilds this one from (roles.user_code)
    # Run once the new arguments are the ones the loader is built with (a provider's report of them).
    on_given: list[Callable[[], None]] = field(default_factory=list)


class Provider:
    """A feature acting on DataLoaders. Every moment is a no-op here; a provider overrides its own."""

    order = 50  # lower runs first

    def building(self, building: Building) -> dict[str, Any] | None:
        """New keyword arguments for the loader being built, or None to leave them."""
        return None

    def iterable(self, loader: Any, tag: LoaderTag, role: str) -> Any:
        """What to iterate in the loader's place, or None."""
        return None

    def iterator(self, loader: Any, tag: LoaderTag, role: str) -> Any:
        """An iterator made instead of torch's, or None."""
        return None

    def made(self, loader: Any, iterator: Any, t_created: float, role: tuple[str, str]) -> None:
        """A new iterator of ``loader``, made by torch or a provider; ``role``: (role, why)."""


_providers: list[Provider] = []
_patched_inits: list[type] = []
_role_now = threading.local()  # the role decided in __iter__, read by the _get_iterator it calls
_building = threading.local()  # the loaders whose outermost __init__ is running on this thread


def add(provider: Provider) -> None:
    """Arm a provider (the hook is installed with the first)."""
    if provider not in _providers:
        _providers.append(provider)
        _providers.sort(key=lambda p: p.order)
    install()


def remove(provider: Provider) -> None:
    if provider in _providers:
        _providers.remove(provider)


def providers() -> list[Provider]:
    return list(_providers)


def install() -> None:
    """Patch torch's DataLoader (idempotent)."""
    from torch.utils.data import dataloader
    cls = dataloader.DataLoader
    if getattr(cls.__dict__.get("_get_iterator"), "_gpufeed_original", None) is not None:
        return
    _patch_init(cls)
    for sub in _subclasses(cls):  # defined before gpufeed was armed
        _patch_init(sub)
    # Subclasses defined later get the same hook as they are made.
    patch(cls, "__init_subclass__", lambda _original: classmethod(_on_subclass))
    patch(cls, "__iter__", _make_iter)
    patch(cls, "_get_iterator", _make_get_iterator)


def uninstall() -> None:
    from torch.utils.data import dataloader
    cls = dataloader.DataLoader
    unpatch(cls, "__init_subclass__")
    for patched in _patched_inits:
        unpatch(patched, "__init__")
    _patched_inits.clear()
    unpatch(cls, "__iter__")
    unpatch(cls, "_get_iterator")
    _providers.clear()


def build_plain(cls: type, *args: Any, **kwargs: Any) -> Any:
    """A loader built by gpufeed itself: past the providers (no settings overridden), tagged as gpufeed's."""
    loader = cls.__new__(cls)
    _begin(loader)  # as if an outer __init__ were running: ours pass through, under any wrapper of another's
    try:
        cls.__init__(loader, *args, **kwargs)
    finally:
        _end(loader)
    tag(loader).gpufeeds_own = True
    return loader


# -- built ---------------------------------------------------------------------------------------------
def _subclasses(cls: type) -> list[type]:
    found, todo = [], list(cls.__subclasses__())
    while todo:
        sub = todo.pop()
        found.append(sub)
        todo.extend(sub.__subclasses__())
    return found


def _on_subclass(cls: type, **kwargs: Any) -> None:
    super(_dataloader_class(), cls).__init_subclass__(**kwargs)
    _patch_init(cls)


def _dataloader_class() -> type:
    from torch.utils.data import dataloader
    return dataloader.DataLoader


def _patch_init(cls: type) -> None:
    """Hook a class's own ``__init__`` (one it inherits is hooked where it is defined)."""
    if "__init__" in cls.__dict__ and getattr(cls.__dict__["__init__"], "_gpufeed_original", None) is None:
        patch(cls, "__init__", _make_init)
        _patched_inits.append(cls)


def _skip_prefixes() -> tuple[str, ...]:
    """Frames to look past for the call site: torch itself, and gpufeed's instrumentation (not its demo)."""
    import torch
    return (os.path.dirname(os.path.abspath(torch.__file__)) + os.sep,
            os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep)


def _make_init(original: Callable) -> Callable:
    signature = inspect.signature(original)
    parameters = signature.parameters
    var_keyword = next((p.name for p in parameters.values() if p.kind is p.VAR_KEYWORD), None)
    var_positional = next((p.name for p in parameters.values() if p.kind is p.VAR_POSITIONAL), None)

    def accepts(name: str) -> bool:
        p = parameters.get(name)
        return var_keyword is not None or (p is not None and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY))

    def __init__(self, *args, **kwargs):
        outermost = _begin(self)
        try:
            if outermost or _pending(self):
                args, kwargs = _built(self, signature, accepts, var_keyword, var_positional, outermost, args, kwargs)
            original(self, *args, **kwargs)
        finally:
            if outermost:
                _end(self)
    return __init__


def _begin(loader: Any) -> bool:
    """Whether this is the outermost ``__init__`` of ``loader`` (a subclass's calls torch's inside it)."""
    active = getattr(_building, "ids", None)
    if active is None:
        active = _building.ids = {}
    if id(loader) in active:
        return False
    active[id(loader)] = None  # the arguments not yet given to a provider that wants them: see _built
    return True


def _pending(loader: Any) -> bool:
    return _building.ids.get(id(loader)) is not None


def _end(loader: Any) -> None:
    _building.ids.pop(id(loader), None)


def _built(loader, signature, accepts, var_keyword, var_positional, outermost, args, kwargs):
    """Note the loader (at its outermost ``__init__``) and let the providers change its arguments, at
    the outermost ``__init__`` whose signature takes them."""
    if outermost:
        skip = _skip_prefixes()
        frame = sys._getframe(2)
        site = roles.call_site(skip, frame)
        user = roles.user_code(frame, skip, roles.portable_path, loader)
        user["knobs"] = knobs.knob_sources(roles.site_frame(skip, frame))
        found = roles.role_from_stack(frame)
        origin = user.pop("origin_built_as", None)
        built_as = found[0] if found else origin
        t = tag(loader)
        t.site, t.built = site, dict(user, built_as=built_as, site=site)
        wanting = [p for p in _providers if type(p).building is not Provider.building]
        if not wanting:
            return args, kwargs
        _building.ids[id(loader)] = (site, user["user_stack"], built_as, user.get("origin_site"))
    site, user_stack, built_as, origin_site = _building.ids[id(loader)]
    try:
        bound = signature.bind(loader, *args, **kwargs)
    except TypeError:  # arguments the class refuses anyway: let it say so, in its own words
        return args, kwargs
    arguments = {k: v for k, v in bound.arguments.items() if k not in ("self", var_keyword, var_positional)}
    if var_keyword is not None:
        arguments.update(bound.arguments.get(var_keyword, {}))
    if bound.arguments.get(var_positional) or any(
            p.kind is p.POSITIONAL_ONLY for p in signature.parameters.values() if p.name in bound.arguments
            and p.name != "self"):
        return args, kwargs  # not callable by keyword: a deeper __init__ gets the chance
    building = Building(loader, site, user_stack, built_as, arguments, origin_site)
    changed = False
    for provider in _providers:
        new = provider.building(building)
        if new is not None:
            building.arguments, changed = new, True
    if changed and not all(accepts(k) for k in building.arguments):
        return args, kwargs  # this class's __init__ does not take them all: a deeper one may
    _building.ids[id(loader)] = None  # decided here: deeper __init__s pass through
    for given in building.on_given:
        given()
    return ((), building.arguments) if changed else (args, kwargs)


# -- iterated ------------------------------------------------------------------------------------------------
def _make_iter(original: Callable) -> Callable:
    def __iter__(self):
        if not _providers:
            return original(self)
        t = tag(self)  # a loader built before gpufeed was armed (gpufeed.profile()) gets one now
        role = roles.iterator_role(sys._getframe(1), t.built_as)  # decided once, for every provider
        if not t.gpufeeds_own:
            for provider in _providers:
                stand_in = provider.iterable(self, t, role[0])
                if stand_in is not None:
                    return iter(stand_in)
        _role_now.value = role
        try:
            return original(self)
        finally:
            _role_now.value = None
    return __iter__


def _make_get_iterator(original: Callable) -> Callable:
    def _get_iterator(self, *args, **kwargs):
        t_created = time.perf_counter()  # worker start-up runs from here to the first batch
        if not _providers:
            return original(self, *args, **kwargs)
        t = tag(self)
        role = getattr(_role_now, "value", None) or roles.iterator_role(sys._getframe(1), t.built_as)
        _role_now.value = None
        iterator = None
        if not t.gpufeeds_own:
            for provider in _providers:
                iterator = provider.iterator(self, t, role[0])
                if iterator is not None:
                    break
        if iterator is None:
            iterator = original(self, *args, **kwargs)
        for provider in _providers:
            provider.made(self, iterator, t_created, role)
        return iterator
    return _get_iterator
