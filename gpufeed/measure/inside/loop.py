"""Training loops that take no batch from a DataLoader (a GPT fed by its own ``get_batch``, a language
model slicing one long tensor per step, a loop fed by a generator): their steps, from the training.

- torch.optim's global step hooks: one step of the first optimizer that steps ends one step of the
  loop (a GAN's second optimizer steps inside the same loop step);
- ``nn.Module.__call__``, outermost call only: the model's forward pass, and its samples (the
  leading dimension of its first tensor argument; the second for a sequence-first RNN, whose
  batch is its second dimension). A module is the model when it has parameters that train; a
  module without any called on a tensor that requires grad is the loss, counted with the forward;
  one called on data (a transform) is the loop's own work;
- ``torch.autograd.backward``, ``torch.nn.utils.clip_grad_norm_`` and ``zero_grad`` (of an
  optimizer or a module): the backward pass, and the clipping and clearing that belong to the update.
What is left of a step, from one optimizer step's end to the next's, is the loop's own work: taking
and preparing the batch (``get_batch``, slicing, a generator's ``next()``), copying it to the device,
logging. Recorded as ``loop`` rows (``schema.LOOP_COLUMNS``); the analysis makes steps of them only in
a process that iterated no training DataLoader (``analysis/loop.py``). A loop without an optimizer
(an update written by hand) is stepped by its backward passes.

Standard library only, plus the user's torch: this runs in the user's process. Each hook costs a
clock read and an append; ``nn.Module.__call__`` costs one attribute read for every inner call.
"""
from __future__ import annotations

import time
from typing import Any, Callable

from gpufeed.measure.inside.patching import patch, unpatch
from gpufeed.record import schema

# What a loop row times (schema.LOOP_COLUMNS "part").
FORWARD, EVAL_FORWARD, BACKWARD, OPTIMIZER = (schema.LOOP_FORWARD, schema.LOOP_EVAL_FORWARD, schema.LOOP_BACKWARD,
                                             schema.LOOP_OPTIMIZER)

_clock = time.perf_counter
_hooks: "LoopHooks | None" = None
_grad_enabled: Callable[[], bool] = lambda: True  # torch.is_grad_enabled, bound at install


class LoopHooks:
    """One process's loop rows and step count."""

    def __init__(self, probe: Any) -> None:
        self.probe = probe
        self.rows: list[tuple] = []
        self.depth = 0                 # inside the model's forward: inner module calls pass through
        self.models: dict[int, int | None] = {}  # id(module) -> its batch dimension; None: not a model
        self.optimizers: dict[int, int] = {}  # id(optimizer) -> its index, in the order they first stepped
        self.optimizer_steps = 0       # of the first optimizer
        self.backward_steps = 0        # counted as the loop's steps until an optimizer step is seen
        self.counted = 0               # steps counted into probe.total_steps
        self.step_started: dict[int, float] = {}
        self.removers: list[Any] = []

    def count_step(self, t: float) -> None:
        probe = self.probe
        probe.total_steps += 1
        self.counted += 1
        if probe.total_steps >= probe.check_limits_at:
            probe.check_limits(t)

    def batch_dim(self, module: Any) -> int | None:
        key = id(module)
        if key not in self.models:
            self.models[key] = _batch_dim(module)
        return self.models[key]


def _batch_dim(module: Any) -> int | None:
    """0 for a model whose parameters train (1 if it holds a sequence-first RNN); None for a module
    with none that trains (a transform, a loss)."""
    import torch
    try:
        if not any(p.requires_grad for p in module.parameters()):
            return None
        rnns = [m for m in module.modules() if isinstance(m, torch.nn.RNNBase)]
    except Exception:
        return None
    return 1 if rnns and not any(m.batch_first for m in rnns) else 0


def _samples(args: tuple, dim: int) -> int | None:
    for value in args:
        shape = getattr(value, "shape", None)
        if shape is not None:
            return int(shape[dim]) if len(shape) > dim else None
    return None


def _on_grad(args: tuple) -> bool:
    return any(getattr(value, "requires_grad", False) for value in args)


def _zero_grad_owners(torch: Any) -> tuple:
    # Clearing the gradients is the update's work, wherever the loop calls it: left untimed, a small
    # model's zero_grad read as the loop's own work (batch preparation) in every step.
    from torch.optim.optimizer import Optimizer  # an import: torch may still be importing itself
    return (Optimizer, torch.nn.Module)


def install(probe: Any) -> None:
    """Hook the training into ``probe`` (idempotent)."""
    global _hooks, _grad_enabled
    import torch
    if _hooks is not None:
        _hooks.probe = probe
        return
    from torch.optim import optimizer  # imports first: torch may still be importing itself
    owners = _zero_grad_owners(torch)
    _grad_enabled = torch.is_grad_enabled
    hooks = _hooks = LoopHooks(probe)
    patch(torch.nn.Module, "__call__", _make_call)
    patch(torch.autograd, "backward", _make_timed(BACKWARD, steps=True))
    patch(torch.nn.utils, "clip_grad_norm_", _make_timed(OPTIMIZER, steps=False))
    for owner in owners:
        patch(owner, "zero_grad", _make_timed(OPTIMIZER, steps=False))
    hooks.removers = [optimizer.register_optimizer_step_pre_hook(_before_step),
                      optimizer.register_optimizer_step_post_hook(_after_step)]


def paced_by_dataloader() -> None:
    """A training DataLoader paces this loop: its batches are the steps. The steps counted here are
    given back, and the hooks taken out (the loop rows so far stay in the record)."""
    hooks = _hooks
    if hooks is None:
        return
    hooks.probe.total_steps = max(0, hooks.probe.total_steps - hooks.counted)
    uninstall(keep_rows=True)


_left_rows: list[tuple] = []


def uninstall(keep_rows: bool = False) -> None:
    global _hooks
    import torch
    hooks, _hooks = _hooks, None
    if keep_rows and hooks is not None:
        _left_rows.extend(hooks.rows)
    unpatch(torch.nn.Module, "__call__")
    unpatch(torch.autograd, "backward")
    unpatch(torch.nn.utils, "clip_grad_norm_")
    for owner in _zero_grad_owners(torch):
        unpatch(owner, "zero_grad")
    for remover in (hooks.removers if hooks is not None else []):
        remover.remove()


def take_rows() -> list[tuple]:
    """The rows recorded since the last call (the probe's flush)."""
    hooks = _hooks
    left = _left_rows[:]
    del _left_rows[:len(left)]
    if hooks is None:
        return left
    rows, hooks.rows = hooks.rows, []  # list.append and this swap are atomic under the GIL
    return left + rows


def _make_call(original: Callable) -> Callable:
    def __call__(self, *args, **kwargs):
        hooks = _hooks
        if hooks is None or hooks.depth:
            return original(self, *args, **kwargs)
        dim = hooks.batch_dim(self)
        grad = _grad_enabled()
        if dim is None and not (grad and _on_grad(args)):
            return original(self, *args, **kwargs)  # a transform on data: the loop's own work
        hooks.depth = 1
        t0 = _clock()
        try:
            return original(self, *args, **kwargs)
        finally:
            hooks.depth = 0
            try:
                if dim is None:  # a loss module on the model's output: part of the forward
                    hooks.rows.append((FORWARD, t0, _clock(), None, None))
                else:
                    hooks.rows.append((FORWARD if grad else EVAL_FORWARD, t0, _clock(),
                                       _samples(args, dim) if grad else None, None))
            except Exception:
                pass  # a measurement never breaks the user's forward
    return __call__


def _make_timed(part: int, steps: bool) -> Callable[[Callable], Callable]:
    def make(original: Callable) -> Callable:
        def timed(*args, **kwargs):
            hooks = _hooks
            if hooks is None:
                return original(*args, **kwargs)
            t0 = _clock()
            result = original(*args, **kwargs)
            t1 = _clock()
            hooks.rows.append((part, t0, t1, None, None))
            if steps and not hooks.optimizer_steps:  # no optimizer yet: each backward is a step
                hooks.backward_steps += 1
                hooks.count_step(t1)
            return result
        return timed
    return make


def _before_step(optimizer: Any, args: Any, kwargs: Any) -> None:
    hooks = _hooks
    if hooks is not None:
        hooks.step_started[id(optimizer)] = _clock()


def _after_step(optimizer: Any, args: Any, kwargs: Any) -> None:
    hooks = _hooks
    if hooks is None:
        return
    t1 = _clock()
    t0 = hooks.step_started.pop(id(optimizer), t1)
    which = hooks.optimizers.setdefault(id(optimizer), len(hooks.optimizers))
    hooks.rows.append((OPTIMIZER, t0, t1, None, which))
    if which:
        return  # another optimizer inside the same loop step
    if not hooks.optimizer_steps and hooks.backward_steps:
        # The first optimizer step: its backward passes were counted as steps until now.
        hooks.probe.total_steps = max(0, hooks.probe.total_steps - hooks.backward_steps)
        hooks.counted -= hooks.backward_steps
    hooks.optimizer_steps += 1
    hooks.count_step(t1)
