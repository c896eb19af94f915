"""uopc.jit: capture the kernel launches of a function of Tensors once, then replay them.

    @jit
    def step(x, y):
      opt.zero_grad()
      loss = model(x).cross_entropy(y)
      loss.backward()
      opt.step()
      return loss

    for x, y in batches: print(step(x, y).item())

The first call runs the function normally (it compiles its kernels). The second call captures it: every launch it makes
is recorded, with its Program and its Buffers. Every later call copies the new input tensors into the captured input
buffers and replays the launches, and nothing else: the function's body does not run, no graph is built, nothing is
kernelized or looked up in a cache.

State the function updates with `assign` (parameters, an optimizer's moments and counters: uopc.nn's optimizers keep
all of their state that way) is double-buffered: a captured launch reads the state's buffer from before the call and
writes a new one, so each replay swaps the two and publishes the new one to the tensor. Every call realizes what the
function returns and every tensor it assigned, so no state is left lazy for the next call to compute (state assigned
outside the function must be realized before the capture too: it is refused otherwise). The tensors a replay returns
live in the captured buffers: the next call overwrites them, so read them (or copy them) before calling again. A jit
function called by one being captured runs its body plainly, and its launches become part of the outer capture.

What would make a replay differ from running the function is refused with a JitError at the call that would do it:
inputs whose shape or dtype differ from the captured ones (both are named), other arguments that differ, reading a
value (`.item()`, `.numpy()`) or drawing random numbers inside the captured call (the replay would repeat the
capture's), and an output that aliases an input.
"""
from __future__ import annotations
import functools
from typing import Any, Callable
from uopc.uop import UOp, Ops
from uopc.runtime import Buffer, debug_level
import uopc.tensor as _tensor
from uopc.tensor import Tensor, JitError, _storage


def _buffer_uop(t: Tensor) -> UOp | None:
  """The BUFFER holding realized tensor t's value (None for an empty tensor, which has none)."""
  if t.numel() == 0: return None
  u = t.uop.src[0] if t.uop.op is Ops.RESHAPE else t.uop
  return u if u.op is Ops.BUFFER else None


def _tensors(args: tuple, kwargs: dict) -> tuple[list[Tensor], list]:
  """The Tensor arguments (top level, or inside a list or tuple) and the other arguments, in order."""
  tensors, others = [], []
  for a in list(args) + [kwargs[k] for k in sorted(kwargs)]:
    items = a if isinstance(a, (list, tuple)) and any(isinstance(x, Tensor) for x in a) else [a]
    for x in items: (tensors if isinstance(x, Tensor) else others).append(x)
  return tensors, [(k, kwargs[k]) for k in sorted(kwargs) if not isinstance(kwargs[k], Tensor)] + \
    [a for a in args if not isinstance(a, (Tensor, list, tuple)) or not any(isinstance(x, Tensor) for x in a)]


def _flatten(out: Any) -> list[Tensor]:
  if isinstance(out, Tensor): return [out]
  if isinstance(out, (list, tuple)): return [t for x in out for t in _flatten(x)]
  if isinstance(out, dict): return [t for x in out.values() for t in _flatten(x)]
  return []


class JitFunction:
  """A function of Tensors that runs once, is captured on its second call and replayed on every later one."""

  def __init__(self, fn: Callable):
    if not callable(fn): raise JitError(f"jit takes a function, got {type(fn).__name__}")
    self.fn = fn
    self.calls = 0
    functools.update_wrapper(self, fn)

  def reset(self) -> None:
    """Forget the capture: the next call runs the function again, and the one after captures it anew."""
    self.calls = 0
    self.__dict__.pop("_plan", None)

  def __call__(self, *args, **kwargs):
    if _tensor._capture is not None and _tensor._capture.strict:
      return self._run(args, kwargs, strict=False)[0]    # called by a function being captured: its launches join that one
    if self.calls == 0:
      out, _ = self._run(args, kwargs, strict=False)
      self.calls = 1
      return out
    if self.calls == 1:
      out = self._capture(args, kwargs)
      self.calls = 2
      return out
    return self._replay(args, kwargs)

  def _run(self, args: tuple, kwargs: dict, strict: bool) -> tuple[Any, _tensor._Capture]:
    """Run the function, recording its launches and assigns, and realize what it returns and every tensor it assigned:
    state left lazy would otherwise be computed inside the next call's kernels (and a capture would bake it in)."""
    outer = _tensor._capture
    inputs, _ = _tensors(args, kwargs)
    if inputs: inputs[0].realize(*inputs[1:])
    cap = outer if outer is not None else _tensor._Capture(strict)   # a first call inside a capture is part of it
    start = len(cap.assigned)
    _tensor._capture = cap
    try:
      out = self.fn(*args, **kwargs)
      todo = _flatten(out) + [t for t, _ in cap.assigned[start:]]
      if todo: todo[0].realize(*todo[1:])
    finally: _tensor._capture = outer
    return out, cap

  # ---- capture
  def _capture(self, args: tuple, kwargs: dict):
    inputs, others = _tensors(args, kwargs)
    out, cap = self._run(args, kwargs, strict=True)
    outs = _flatten(out)
    table: list[Buffer] = []
    index: dict[int, int] = {}
    def slot(b: Buffer) -> int:
      if id(b) not in index:
        index[id(b)] = len(table)
        table.append(b)
      return index[id(b)]
    launches = []
    read_first: set[int] = set()      # buffers some launch reads before any launch writes them: the call's inputs
    written: set[int] = set()
    for prog, bufs in cap.launches:
      slots = [slot(b) for b in bufs]
      for p, s in zip(prog.params, slots):
        if not p.written and s not in written: read_first.add(s)
      for p, s in zip(prog.params, slots):
        if p.written: written.add(s)
      launches.append((prog, slots))
    # the inputs: their captured buffers, refilled on every replay
    input_specs = []
    for t in inputs:
      b = _buffer_uop(t)
      input_specs.append((t.shape, t.dtype, slot(_storage[b]) if b is not None else None))
    input_slots = {s for _, _, s in input_specs if s is not None}
    # state: a tensor assigned during the call reads its old buffer and ends in a new one; a replay swaps the two
    rotations, seen = [], set()
    for t, old in cap.assigned:
      if id(t) in seen: continue
      seen.add(id(t))
      new_u, old_u = _buffer_uop(t), old.src[0] if old.op is Ops.RESHAPE else old
      if new_u is None: continue
      if old_u.op is not Ops.BUFFER:
        raise JitError(f"{self.fn.__name__}: a tensor it assigns ({t.dtype.name}{t.shape}) held an unrealized value when the "
                       "capture began, so every replay would recompute that value instead of updating the state: "
                       "realize it (t.realize()) before calling the function")
      if old_u not in _storage: continue
      new_s, old_s = slot(_storage[new_u]), slot(_storage[old_u])
      if new_s != old_s and new_s in written: rotations.append((new_u, old_s, new_s) if old_s in read_first else (new_u, None, new_s))
    # outputs: they may not be an input (a replay would hand back the buffer it is about to refill)
    out_specs = []
    for t in outs:
      b = _buffer_uop(t)
      if b is None: out_specs.append(None); continue
      s = slot(_storage[b])
      if s in input_slots: raise JitError(f"{self.fn.__name__}: an output aliases an input (shape {t.shape}): return a new tensor")
      out_specs.append((b, s))
    # every other buffer a launch reads first is state the call doesn't own (another jit's parameters, rotated by that
    # jit): a replay reads it through the tensor store, where its owner publishes the current one
    owned = input_slots | {s for _, old_s, new_s in rotations for s in (old_s, new_s)}
    external = {index[id(b)]: u for u, b in list(_storage.items()) if id(b) in index and index[id(b)] in read_first - owned}
    # index checks (an embedding's tokens, cross_entropy's targets) run again on every replay, after the same launches
    checks = [(at, slot(c.buffer), c) for at, c in cap.index_checks]
    self._plan = (launches, table, input_specs, others, rotations, out, out_specs, external, checks)
    return out

  # ---- replay
  def _replay(self, args: tuple, kwargs: dict):
    launches, table, input_specs, others, rotations, out, out_specs, external, checks = self._plan
    inputs, got_others = _tensors(args, kwargs)
    name = self.fn.__name__
    if len(inputs) != len(input_specs):
      raise JitError(f"{name}: captured with {len(input_specs)} tensor arguments, called with {len(inputs)}")
    for k, (t, (shape, dtype, _)) in enumerate(zip(inputs, input_specs)):
      if t.shape != shape or t.dtype is not dtype:
        raise JitError(f"{name}: tensor argument {k} is {t.dtype.name}{t.shape}, but the function was captured with {dtype.name}{shape}")
    if got_others != others:
      raise JitError(f"{name}: the other arguments {got_others!r} differ from the captured {others!r} (a replay can't see them)")
    for t, (_, _, s) in zip(inputs, input_specs):
      if s is None: continue
      b = _buffer_uop(t.realize())
      if b is None or _storage[b] is not table[s]: table[s].copyin(t.numpy())
    for s, u in external.items():
      if (b := _storage.get(u)) is not None: table[s] = b
    for _, old_s, new_s in rotations:
      if old_s is not None: table[old_s], table[new_s] = table[new_s], table[old_s]
    done = 0
    try:
      for at, s, check in checks:   # each check where the capture made it, on the buffer its slot holds now
        self._launch(launches[done:at], table)
        done = at
        check._replace(buffer=table[s]).run()
    except BaseException:           # a refused call changes no state: the next one must read the state this one read
      for _, old_s, new_s in reversed(rotations):
        if old_s is not None: table[old_s], table[new_s] = table[new_s], table[old_s]
      raise
    self._launch(launches[done:], table)
    for new_u, _, new_s in rotations: _storage[new_u] = table[new_s]
    for spec in out_specs:
      if spec is not None: _storage[spec[0]] = table[spec[1]]
    return out                      # the capture's own return value: its tensors now view the replay's buffers


  @staticmethod
  def _launch(launches: list, table: list[Buffer]) -> None:
    if debug_level():
      for prog, slots in launches: prog([table[s] for s in slots])
    else:
      for prog, slots in launches: prog.backend.launch(prog.handle, [table[s].handle for s in slots], prog.global_size, prog.local_size)


def jit(fn: Callable) -> JitFunction:
  """Capture fn's kernel launches on its second call and replay them on every later one (see the module docstring)."""
  return JitFunction(fn)


__all__ = ["jit", "JitFunction", "JitError"]
