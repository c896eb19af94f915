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
is recorded, with its Program and its Buffers. Every later call replays the launches and nothing else: the function's
body does not run, no graph is built, nothing is kernelized or looked up in a cache. The launches between index checks
are a uopc.runtime.LaunchGraph each: from the third replay on, on the C backend, one native call runs them all (a C
function calling each kernel), so a replay of a few hundred small kernels pays no Python per kernel. The launches that
compute from state alone (a weight packed into panels for its GEMM) run once and are skipped while that state stays
the very buffers they read, unwritten (Buffer.version): a decode step repacked every weight at every token.

The contract: a replay computes what calling the function now would compute, or raises JitError saying why. So a replay
binds every buffer the capture read to where that value lives *now*, and hands every result out where the function would:
  * a tensor argument is read from the tensor passed in this call (no copy);
  * a tensor the call did not create (a parameter, an optimizer's state, a gradient being accumulated) is read from that
    tensor's current buffer: an assign outside the function, another jitted function's update and an eager step between
    replays are all seen. A call first realizes any state assign() left lazy, so state is always read as a value;
  * what the function makes visible outside (its return value, the tensors it assigns, `.grad` of the tensors backward
    reached, and any tensor it stores elsewhere) holds the replay's results: the same objects re-pointed (state, stored
    tensors), new ones where the function would make new ones (the return value, `.grad`). The values stay: a replay
    writes only into buffers no live tensor or graph names, so a loss kept from an earlier call keeps its value;
  * random numbers (Tensor.rand, randn, uniform, dropout) are drawn again from Tensor's generator at each replay, by the
    same calls in the same order, so a replay's numbers are the ones a plain call would draw;
  * index checks (an embedding's tokens, cross_entropy's targets) run again after the same launches.
Nothing is handed out until every launch and check succeeded: a refused call (an index out of range) changes no state.

What a capture took for granted becomes its guards. Tensor arguments that shared one buffer when captured and don't now,
and `.grad` that was None when captured and isn't now (gradient accumulation: backward inside, zero_grad outside) or the
reverse, make a new capture for the new case (up to MAX_CAPTURES per function); the state a tensor argument or a
parameter shares with another is part of it too. Refused with JitError: tensor arguments of another count, shape or
dtype (both are named), other arguments that differ by value from the captured ones (a list or a NumPy array changed in
place counts), and reading a value (`.item()`, `.numpy()`) inside the captured call (the replay would repeat the capture's).

A capture belongs to its thread: launches, assigns and reads of other threads are their own. A jitted function holds a
lock while it runs, so calls from several threads take turns. A jitted function called while another one runs (in the
same thread) runs its body plainly, and its launches join the outer call's.
"""
from __future__ import annotations
import functools, gc, sys, threading, types, weakref
from dataclasses import dataclass, field
from typing import Any, Callable, NamedTuple
import numpy as np
from uopc.dtype import DType, dtypes
from uopc.runtime import Buffer, LaunchGraph, np_dtype
from uopc.memory import lifetimes, share_buffers
from uopc.tensor import Tensor, JitError
from uopc.tensor.capture import Capture, capturing, name_buffer, named, buffer_of, is_realized, realize_lazy_state, grad_leaves, generator

MAX_CAPTURES = 8   # captures one function keeps (one per aliasing and gradient case); more means the calls differ too much


# ---- the arguments of a call ------------------------------------------------------------------------------------------

def _flatten_args(args: tuple, kwargs: dict) -> tuple[list[Tensor], tuple, list]:
  """The Tensors in args and kwargs (at any depth of lists, tuples and dicts), in order, and everything else as a value
  to compare with a later call's: numbers and strings as themselves, NumPy arrays by their bytes (an array changed in
  place is another value), other objects by identity (they are returned too, so the plan keeps them alive)."""
  tensors: list[Tensor] = []
  spec: list = []
  objects: list = []
  stack: list = [kwargs[k] for k in sorted(kwargs, reverse=True)] + list(reversed(args))
  spec.append(("call", len(args), tuple(sorted(kwargs))))
  on_path: set[int] = set()
  while stack:
    x = stack.pop()
    if isinstance(x, Tensor): tensors.append(x); spec.append("T"); continue
    if isinstance(x, (list, tuple, dict)):
      if id(x) in on_path: raise JitError(f"a jitted function's argument holds itself ({type(x).__name__}): it can't be compared between calls")
      on_path.add(id(x))
      if isinstance(x, dict):
        spec.append((dict, tuple(_value(k) for k in x)))
        stack.extend(reversed(list(x.values())))
      else:
        spec.append((type(x), len(x)))
        stack.extend(reversed(x))
      continue
    spec.append(_value(x))
    if not isinstance(x, (int, float, complex, str, bytes, type(None), np.ndarray, np.generic)): objects.append(x)
  return tensors, tuple(spec), objects


def _value(x) -> Any:
  """x as a value that compares equal exactly when a replay may treat x as the same argument."""
  if isinstance(x, float): return (float, x.hex() if x == x else "nan")   # -0.0 and 0.0 differ; NaN equals NaN
  if isinstance(x, (bool, int, str, bytes, complex, type(None))): return (type(x), x)
  if isinstance(x, (np.ndarray, np.generic)):
    a = np.asarray(x)
    return (type(x), a.dtype.str, a.shape, a.tobytes() if a.dtype != object else id(x))
  return (object, id(x))


def _out_tensors(out: Any, kind: type = Tensor) -> list:
  """The Tensors (or other `kind`) in a function's return value, at any depth of lists, tuples and dicts."""
  found, stack = [], [out]
  while stack:
    x = stack.pop()
    if isinstance(x, kind): found.append(x)
    elif isinstance(x, (list, tuple)): stack.extend(x)
    elif isinstance(x, dict): stack.extend(x.values())
  return found


def _realize_all(ts: list[Tensor]) -> None:
  """Realize the tensors, in one schedule per device (so they share work), each into a buffer of its own."""
  by_device: dict[str, list[Tensor]] = {}
  for t in ts:
    if not is_realized(t.uop): by_device.setdefault(t.device, []).append(t)
  for group in by_device.values(): group[0].realize(*group[1:])


def _live_tensors() -> list[Tensor]:
  """Every Tensor alive in the process. A capture asks twice (when it starts and when it ends) to know who holds the
  buffers it reads and who can see the buffers it writes; a registry kept by every Tensor op would cost every op."""
  # type(o), not isinstance: isinstance reads o.__class__, which some objects compute (a deprecated torch.distributed
  # name warns when touched); hasattr: a Tensor being made has no uop yet
  return [o for o in gc.get_objects() if issubclass(type(o), Tensor) and hasattr(o, "uop")]


# ---- where a value lives --------------------------------------------------------------------------------------------
# A place is ("arg", k): the call's k-th tensor argument; ("obj", ref): a tensor object (weakly); either with ".grad" to
# mean that tensor's gradient. A replay reads and writes places, never the capture's tensors.

def _resolve(place: tuple, tensors: list[Tensor]) -> Tensor | None:
  kind, key, attr = place
  t = tensors[key] if kind == "arg" else key()
  if t is not None and attr == "grad": t = t.grad
  return t


class _Held:
  """A buffer a plan hands out again and again (a state's new value, an output, a .grad), with the BUFFER uop and the
  views that hand it out, made once. The plan may write it again only while nothing else refers to them: a tensor that
  holds it, a graph built on it, a detached alias of it all do, and CPython's reference counts say so exactly."""
  __slots__ = ("buffer", "uop", "views")

  def __init__(self, buffer: Buffer):
    self.buffer, self.views = buffer, {}
    self.uop = name_buffer(buffer, (buffer.size,), alias=False)

  def view(self, shape: tuple[int, ...]):
    if shape == self.uop.shape: return self.uop
    if (v := self.views.get(shape)) is None: v = self.views[shape] = self.uop.reshape(shape)
    return v

  def free(self) -> bool:
    # the uop is referred to by this entry and by each view's sources; a view by the views dict (and this loop)
    if sys.getrefcount(self.uop) > _UOP_REFS + len(self.views): return False
    for v in self.views.values():
      if sys.getrefcount(v) > _VIEW_REFS: return False
    return not named(self.buffer)


@dataclass
class _Plan:
  """One capture: its launches over numbered slots, and how each slot is bound and handed out at a replay."""
  arg_specs: list[tuple[tuple[int, ...], DType]]
  others: tuple
  objects: list                                  # the non-value arguments compared by identity, kept alive
  launches: list[tuple[Any, list[int]]]
  steps: list[tuple[LaunchGraph, tuple[int, Any] | None]]   # the launches between index checks, each followed by its check
  table: list                                    # the Buffer of every slot that has one whatever the call (None: bound per call)
  reads: list[tuple[int, int, list[tuple]]]      # (slot, size, the places its value was read from: the first is trusted)
  temps: dict[int, tuple[Any, int, DType]]       # slot -> (backend, size, dtype): written and read back within the call
  shown: dict[int, tuple[Any, int, DType]]       # the same for what a replay hands out (state, outputs, .grad)
  draws: list[tuple[int, Callable, DType]]
  checks: list[tuple[int, int, Any]]
  publish: list[tuple[tuple, int | None, tuple[int, ...]]]   # (place, slot or None for a .grad set to None, shape)
  grad_guards: list[tuple[tuple, bool]]          # (leaf place, whether its .grad was None when captured)
  out: Any                                       # the return value with an _Out for every tensor
  same_args: list[tuple[int, ...]] = field(default_factory=list)   # argument positions that held one tensor (see _bind)
  pools: dict[int, list[_Held]] = field(default_factory=dict)
  memo: list = field(default_factory=list)       # per read, per place: (weakref to the uop last bound, to its Buffer)
  refreshed: list = field(default_factory=list)  # per publish, the (read, place) memo entries its new value fills (_refreshed)
  varying: list[int] | None = None               # the slots whose Buffer a replay may change: reads and results
  temp_groups: dict[int, int] = field(default_factory=dict)   # temporary slot -> its Buffer among temp_specs (_shared_temporaries)
  temp_specs: list[tuple[Any, int, DType]] = field(default_factory=list)
  static: LaunchGraph | None = None              # the launches computed from state and constants alone (_static_launches)
  static_inputs: list[int] = field(default_factory=list)   # the read slots they depend on
  static_seen: list | None = None                # per static input, (weakref to its Buffer, its version) when they last ran


class JitFunction:
  """A function of Tensors that runs once, is captured on its second call and replayed on every later one."""

  def __init__(self, fn: Callable):
    if not callable(fn): raise JitError(f"jit takes a function, got {type(fn).__name__}")
    self.fn = fn
    self.calls = 0
    self._plans: list[_Plan] = []
    self._lock = threading.RLock()
    functools.update_wrapper(self, fn)

  def reset(self) -> None:
    """Forget the captures: the next call runs the function again, and the one after captures it anew."""
    with self._lock:
      self.calls = 0
      self._plans = []

  def __call__(self, *args, **kwargs):
    if capturing() is not None: return self.fn(*args, **kwargs)   # inside another jitted call: its launches join that one
    with self._lock:
      realize_lazy_state()
      tensors, others, objects = _flatten_args(args, kwargs)
      _realize_all(tensors)
      if self.calls == 0:
        self.calls = 1
        return self._run(args, kwargs, tensors, Capture(strict=False))
      if self._plans: self._check_arguments(self._plans[0], tensors, others)
      for plan in self._plans:
        if (table := self._bind(plan, tensors)) is not None: return self._replay(plan, tensors, table)
      if len(self._plans) >= MAX_CAPTURES:
        raise JitError(f"{self.fn.__name__}: captured {MAX_CAPTURES} times already, and this call differs from every capture "
                       "(which tensor arguments share a buffer, or which .grad are None): make the calls alike, or reset()")
      self.calls += 1
      return self._capture(args, kwargs, tensors, others, objects)

  def _run(self, args: tuple, kwargs: dict, tensors: list[Tensor], cap: Capture, before: list[Tensor] | None = None):
    """Run the function under `cap`, then realize what it returns, every tensor it assigned and every .grad it set, in one
    schedule: state left lazy would be computed inside the next call's kernels (and a capture would bake it in)."""
    grads = {id(t): t.grad for t in grad_leaves()}
    with cap:
      out = self.fn(*args, **kwargs)
      todo = _out_tensors(out) + [t for t, _ in cap.assigned]
      todo += [t.grad for t in grad_leaves() if t.grad is not None and t.grad is not grads.get(id(t))]
      if before is not None:   # a capture also realizes the tensors the call made and left somewhere visible
        gc.collect()
        seen = {id(t) for t in before}
        todo += [t for t in _live_tensors() if id(t) not in seen and not is_realized(t.uop)]
      _realize_all(todo)
    return out

  # ---- capture
  def _capture(self, args: tuple, kwargs: dict, tensors: list[Tensor], others: tuple, objects: list):
    before = _live_tensors()                   # held (strongly) until the capture is built: no id is reused meanwhile
    leaves = grad_leaves()
    grad_before = {id(t): t.grad for t in leaves}
    arg_index = {id(t): k for k, t in enumerate(tensors)}
    def place(t: Tensor, attr: str | None = None) -> tuple:
      return ("arg", arg_index[id(t)], attr) if id(t) in arg_index else ("obj", weakref.ref(t), attr)
    holders: dict[int, list[tuple]] = {}       # id(Buffer) -> the places that held it when the call began
    for k, t in enumerate(tensors):
      if (b := buffer_of(t.uop)) is not None: holders.setdefault(id(b), []).append(("arg", k, None))
    grad_objects = {id(t.grad) for t in leaves if t.grad is not None}
    for t in leaves:
      if t.grad is not None and (b := buffer_of(t.grad.uop)) is not None: holders.setdefault(id(b), []).append(place(t, "grad"))
    for t in before:
      if id(t) not in arg_index and id(t) not in grad_objects and (b := buffer_of(t.uop)) is not None:
        holders.setdefault(id(b), []).append(place(t))

    cap = Capture(strict=True)
    out = self._run(args, kwargs, tensors, cap, before)

    slots: dict[int, int] = {}
    buffers: list[Buffer] = []
    def slot(b: Buffer) -> int:
      if id(b) not in slots:
        slots[id(b)] = len(buffers)
        buffers.append(b)
      return slots[id(b)]
    launches, written = [], set()
    for prog, bufs in cap.launches:
      ss = [slot(b) for b in bufs]
      written.update(s for p, s in zip(prog.params, ss) if p.written)
      launches.append((prog, ss))
    draws = [(slot(b), draw, b.dtype) for b, draw in cap.draws]
    written.update(s for s, _, _ in draws)
    checks = [(at, slot(c.buffer), c) for at, c in cap.index_checks]

    # what the call makes visible: the tensors it assigned, the .grad it set, and any other tensor holding what it wrote
    publish, grad_guards, shown = [], [], {}   # shown: id(tensor) -> the place a replay hands its value to
    for t, _ in cap.assigned:
      if id(t) in shown or t.numel() == 0: continue
      shown[id(t)] = place(t)
      publish.append((shown[id(t)], slot(buffer_of(t.uop)), t.shape))
    for t in grad_leaves():
      if id(t) not in grad_before or t.grad is grad_before[id(t)]: continue
      grad_guards.append((place(t), grad_before[id(t)] is None))
      if t.grad is None: publish.append((place(t, "grad"), None, t.shape))
      elif t.grad.numel():
        shown[id(t.grad)] = place(t, "grad")
        publish.append((shown[id(t.grad)], slot(buffer_of(t.grad.uop)), t.shape))
    outs = _out_tensors(out)
    out_ids = {id(t) for t in outs}
    live = _live_tensors()
    containers = _containers(out) | {id(outs), id(live), id(before)}   # and this function's own lists
    for t in live:
      if id(t) in shown or (b := buffer_of(t.uop)) is None or slots.get(id(b)) not in written: continue
      if id(t) in out_ids and not _held_elsewhere(t, containers): continue   # returned only: a replay returns a new tensor
      shown[id(t)] = place(t)
      publish.append((shown[id(t)], slots[id(b)], t.shape))
    def out_spec(t: Tensor):
      if id(t) in arg_index: return _Out("arg", arg_index[id(t)])
      if id(t) in shown: return _Out("place", shown[id(t)])
      if t.numel() == 0: return _Out("empty", (t.shape, t.dtype, t.device))
      return _Out("slot", (slot(buffer_of(t.uop)), t.shape, t.device))
    template = _rebuild(out, out_spec)

    # how each slot is bound at a replay: read from where its value lives now, fixed, or a buffer of the plan's own
    handed = {s for _, s, _ in publish if s is not None} | {o.value[0] for o in _out_tensors(template, _Out) if o.kind == "slot"}
    table, reads, temps, shown = [None] * len(buffers), [], {}, {}
    for s, b in enumerate(buffers):
      if s in written: (shown if s in handed else temps)[s] = (b.backend, b.size, b.dtype)
      elif places := holders.get(id(b)): reads.append((s, b.size, _trusted(places, {_key(p) for p, _, _ in publish})))
      else: table[s] = b   # made from host data during the call (a causal mask): the same on every call
    # a check of indices the call made from host data (an ONNX Gather's constant index) passed when captured and reads
    # the same buffer every time: it is not run again (nor does it split the launches)
    checks = [(at, s, c) for at, s, c in checks if table[s] is None]
    state = {s for s, _, places in reads if all(p[0] != "arg" for p in places)}   # not the arguments: new at every call
    static, static_inputs = _static_launches(launches, checks, table, state, temps)
    temp_groups, temp_specs = _shared_temporaries(launches, static, checks, temps, draws)
    rest = [launch for i, launch in enumerate(launches) if i not in static]
    steps, done = [], 0
    for at, s, check in checks:   # each check where the capture made it, after the launches before it
      at -= sum(i < at for i in static)   # the static launches run first (none reads what a check guards)
      steps.append((LaunchGraph(rest[done:at]), (s, check)))
      done = at
    steps.append((LaunchGraph(rest[done:]), None))
    self._plans.append(_Plan([(t.shape, t.dtype) for t in tensors], others, objects, launches, steps, table, reads, temps, shown,
                             draws, checks, publish, grad_guards, template, temp_groups=temp_groups, temp_specs=temp_specs,
                             static=LaunchGraph([launches[i] for i in sorted(static)]) if static else None, static_inputs=static_inputs,
                             same_args=[ks for ks in _positions(tensors) if len(ks) > 1], refreshed=_refreshed(reads, publish, shown)))
    return out

  # ---- replay
  def _check_arguments(self, plan: _Plan, tensors: list[Tensor], others: tuple) -> None:
    name = self.fn.__name__
    if len(tensors) != len(plan.arg_specs):
      raise JitError(f"{name}: captured with {len(plan.arg_specs)} tensor arguments, called with {len(tensors)}")
    for k, (t, (shape, dtype)) in enumerate(zip(tensors, plan.arg_specs)):
      if t.shape != shape or t.dtype is not dtype:
        raise JitError(f"{name}: tensor argument {k} is {t.dtype.name}{t.shape}, but the function was captured with {dtype.name}{shape}")
    if others != plan.others:
      raise JitError(f"{name}: the other arguments differ from the captured ones (a replay can't see them): compare "
                     "values, lists and arrays (changed in place too) and objects (by identity) with the capturing call's")

  def _bind(self, plan: _Plan, tensors: list[Tensor]) -> list[Buffer] | None:
    """The Buffer of every slot the call reads, for a replay of `plan` with these arguments, or None when the plan's
    guards don't hold (then another capture is needed). State left lazy is realized here."""
    for leaf, was_none in plan.grad_guards:
      if (t := _resolve(leaf, tensors)) is not None and (t.grad is None) != was_none: return None
    # one tensor passed in several places when captured (f(x, x)) is one argument to the plan: its launches read one
    # buffer for them, and a returned x is the tensor at one of them. Distinct tensors there (f(x, y)) are another
    # capture; a plan that read nothing of them returned y for x
    for ks in plan.same_args:
      if any(tensors[k] is not tensors[ks[0]] for k in ks[1:]): return None
    table = plan.table[:]
    if not plan.memo: plan.memo = [[None] * len(places) for _, _, places in plan.reads]
    for (s, size, places), memo in zip(plan.reads, plan.memo):
      found = None
      for j, (kind, key, attr) in enumerate(places):
        t = tensors[key] if kind == "arg" else key()     # (_resolve, inline: a decode step binds 40 slots a token)
        if t is not None and attr == "grad": t = t.grad
        if t is None: continue
        # a live BUFFER uop names one Buffer for good: when the place still holds the uop it held last time (a weight
        # between optimizer steps, a model's input), that Buffer is it. Weak: the memo keeps no old value alive
        if (m := memo[j]) is None or m[0]() is not t.uop or (b := m[1]()) is None:
          if (b := buffer_of(t.uop)) is None or b.size != size: b = buffer_of(t.realize().uop)   # state nobody computed yet
          if b is not None: memo[j] = (weakref.ref(t.uop), weakref.ref(b))
        if found is None: found = b
        elif b is not found: return None      # places that shared one buffer when captured no longer do
      if found is None: return None           # every tensor that held the value is gone (or a .grad read is None now)
      table[s] = found
    return table

  def _replay(self, plan: _Plan, tensors: list[Tensor], table: list):
    if plan.temps and table[next(iter(plan.temps))] is None:   # the first replay makes the plan's own temporaries
      made = [Buffer(backend, size, dtype) for backend, size, dtype in plan.temp_specs]
      for s, g in plan.temp_groups.items(): plan.table[s] = table[s] = made[g]
      plan.static_seen = None
    held: dict[int, _Held] = {}
    for s, (backend, size, dtype) in plan.shown.items():       # a result goes where no live tensor or graph can see it
      pool = plan.pools.setdefault(s, [])
      for i, h in enumerate(pool):
        if h.free():
          pool.append(pool.pop(i))             # round robin: the one just handed out is tried last next time
          break
      else: pool.append(h := _Held(Buffer(backend, size, dtype)))
      held[s], table[s] = h, h.buffer
    for h in held.values(): h.buffer.version += 1    # written again: what was computed from it before is stale
    for s, draw, dtype in plan.draws: table[s].copyin(np.asarray(draw(generator())).astype(np_dtype(dtype)))
    if plan.varying is None: plan.varying = sorted({s for s, _, _ in plan.reads} | set(plan.shown))
    if plan.static is not None:
      # the launches computed from state alone run again only when that state is not the very buffers, unwritten, that
      # the last replay computed them from (their temporaries still hold the values)
      now = [(table[s], table[s].version) for s in plan.static_inputs]
      if plan.static_seen is None or any(r() is not b or v != version for (r, v), (b, version) in zip(plan.static_seen, now)):
        plan.static(table, plan.varying)
        plan.static_seen = [(weakref.ref(b), version) for b, version in now]
    for graph, check in plan.steps:
      graph(table, plan.varying)   # the rest of the table (temporaries, constants) is the same at every replay
      if check is not None: check[1]._replace(buffer=table[check[0]]).run()   # on the buffer its slot holds now
    def view(s: int, shape: tuple[int, ...]):
      if s in held: return held[s].view(shape)
      return name_buffer(table[s], shape)      # handing out a value the call read (w.assign(x)): a name of its own
    for (p, s, shape), refresh in zip(plan.publish, plan.refreshed, strict=True):
      if p[2] == "grad":
        if (leaf := _resolve((p[0], p[1], None), tensors)) is not None: leaf.grad = None if s is None else _tensor(view(s, shape), leaf.device)
      elif (t := _resolve(p, tensors)) is not None:
        t.uop = view(s, shape)
        if refresh:   # state the next call reads (a decode step's caches): its bind finds it in the memo
          known = (weakref.ref(t.uop), weakref.ref(table[s]))
          for i, j in refresh: plan.memo[i][j] = known
    def output(o: _Out) -> Any:
      if o.kind == "arg": return tensors[o.value]
      if o.kind == "place": return _resolve(o.value, tensors)
      if o.kind == "empty": return Tensor(np.zeros(o.value[0], np_dtype(o.value[1])), device=o.value[2])
      s, shape, device = o.value
      return _tensor(view(s, shape), device)
    return _rebuild(plan.out, output, _Out)


def _static_launches(launches: list, checks: list, table: list, reads: set[int], temps: dict) -> tuple[set[int], list[int]]:
  """The launches (by index) a replay may skip when its state is what the last replay read, and the slots of `reads`
  they depend on. Each reads only `reads` (state bound from where it lives, not from the arguments: weights), the
  capture's constants and other such launches' outputs, and writes only temporaries that no other launch writes and
  nothing hands out. Buffers are not written after they are filled (only their `version` says otherwise), so such a
  launch would compute the same values into the same temporaries: packing a GEMM operand's weight into panels at every
  token of sampling was a third of a decode step. None reads indices an index check guards, so running them first
  keeps every check before the launches it guards."""
  writers: dict[int, int] = {}
  for prog, ss in launches:
    for p, s in zip(prog.params, ss):
      if p.written: writers[s] = writers.get(s, 0) + 1
  static, made, used = set(), set(), set()
  checked = {s for _, s, _ in checks}
  for i, (prog, ss) in enumerate(launches):
    outs = [s for p, s in zip(prog.params, ss) if p.written]
    ins = [s for p, s in zip(prog.params, ss) if not p.written]
    if all(s in temps and writers[s] == 1 for s in outs) and \
       all((s in reads or table[s] is not None or s in made) and s not in checked for s in ins):
      static.add(i)
      made.update(outs)
      used.update(s for s in ins if s in reads)
  return static, sorted(used)


def _shared_temporaries(launches: list, static: set[int], checks: list, temps: dict, draws: list) -> tuple[dict[int, int], list[tuple]]:
  """The plan's temporaries in Buffers shared where their lifetimes don't overlap (uopc.memory): (slot -> index of its
  Buffer, each Buffer's (backend, size, dtype)). A temporary lives from the launch that first writes it to the last
  launch or index check that reads it, in the order a replay runs them: drawn numbers copied in first, then the
  launches but the static ones, each index check just before the launch it precedes. What the static launches touch
  keeps its own Buffer: their values outlive a replay that skips them."""
  static_slots = {s for i in static for s in launches[i][1]}
  checked: dict[int, list[int]] = {}
  for at, s, _ in checks: checked.setdefault(at, []).append(s)
  def uses():
    yield from ((-2, s, True) for s, _, _ in draws)
    t = 0                                        # time 2t: the t-th launch a replay runs; 2t - 1: the checks just before it
    for i in range(len(launches) + 1):
      yield from ((2 * t - 1, s, False) for s in checked.get(i, ()))
      if i == len(launches) or i in static: continue
      prog, ss = launches[i]
      yield from ((2 * t, s, p.written) for p, s in zip(prog.params, ss))
      t += 1
  return share_buffers(lifetimes(uses(), temps.keys() - static_slots), temps)


def _tensor(uop, device: str) -> Tensor:
  t = Tensor.__new__(Tensor)
  t.uop, t.grad, t.device, t.requires_grad = uop, None, device, False
  return t


class _Out(NamedTuple):
  """Where a replay finds a captured output: ("arg", k), ("place", place), ("slot", (slot, shape, device)), ("empty", ...)."""
  kind: str
  value: Any


def _positions(tensors: list[Tensor]) -> list[tuple[int, ...]]:
  """The argument positions of each distinct tensor among `tensors` (by identity), in order."""
  at: dict[int, list[int]] = {}
  for k, t in enumerate(tensors): at.setdefault(id(t), []).append(k)
  return [tuple(ks) for ks in at.values()]


def _key(place: tuple) -> tuple:
  return (place[0], place[1] if place[0] == "arg" else id(place[1]()), place[2])


def _refreshed(reads: list, publish: list, shown: dict) -> list[list[tuple[int, int]]]:
  """Per entry of `publish`, the (read, place) entries of the bind's memo that its new value fills: the reads of that
  place with the published slot's size (a .grad, or a value the call only read, is looked up as before)."""
  where: dict[tuple, list[tuple[int, int]]] = {}
  for i, (_, size, places) in enumerate(reads):
    for j, q in enumerate(places): where.setdefault((_key(q), size), []).append((i, j))   # (a weakref's == builds tensors)
  return [where.get((_key(p), shown[s][1]), []) if p[2] != "grad" and s in shown else [] for p, s, _ in publish]


def _trusted(places: list[tuple], published: set[tuple]) -> list[tuple]:
  """The places a read slot is bound from. Where the plan also writes one of them (state it updates), the value lives
  there next time: trust it and the arguments, not other tensors that happened to share the buffer (a copy made with
  Tensor(w) stays behind when w moves on). Otherwise every holder must still agree at a replay."""
  mine = [p for p in places if _key(p) in published]
  return mine + [p for p in places if p[0] == "arg" and p not in mine] if mine else places


def _containers(out: Any) -> set[int]:
  """The ids of the lists, tuples and dicts in a return value."""
  ids, stack = set(), [out]
  while stack:
    x = stack.pop()
    if isinstance(x, (list, tuple, dict)):
      ids.add(id(x))
      stack.extend(x.values() if isinstance(x, dict) else x)
  return ids


def _held_elsewhere(t: Tensor, containers: set[int]) -> bool:
  """Whether something besides the return value (and running frames) holds t: the function stored it (an attribute, a
  list of its own), so a replay must update that object rather than return a new one."""
  return any(id(r) not in containers and not isinstance(r, types.FrameType) for r in gc.get_referrers(t))


def _rebuild(out: Any, leaf: Callable, kind: type = Tensor) -> Any:
  """out with every `kind` in it replaced by leaf(x), lists, tuples (named ones too) and dicts rebuilt around them."""
  if isinstance(out, kind): return leaf(out)
  if isinstance(out, list): return [_rebuild(x, leaf, kind) for x in out]
  if isinstance(out, tuple):
    items = [_rebuild(x, leaf, kind) for x in out]
    return type(out)(*items) if hasattr(out, "_fields") else tuple(items)
  if isinstance(out, dict): return {k: _rebuild(v, leaf, kind) for k, v in out.items()}
  return out


def jit(fn: Callable) -> JitFunction:
  """Capture fn's kernel launches on its second call and replay them on every later one (see the module docstring)."""
  return JitFunction(fn)


__all__ = ["jit", "JitFunction", "JitError", "MAX_CAPTURES"]


def _calibrate() -> tuple[int, int]:
  """The reference counts of a free _Held's uop and views, measured on one (they differ between Python versions)."""
  class Dummy:   # a stand-in Buffer: _Held needs its size and dtype only
    size, dtype = 4, dtypes.f32
  h = _Held(Dummy())
  h.view((2, 2))
  del h.views[(2, 2)]
  uop_refs = sys.getrefcount(h.uop)
  h.view((2, 2))
  for v in h.views.values(): view_refs = sys.getrefcount(v)
  return uop_refs, view_refs


_UOP_REFS, _VIEW_REFS = _calibrate()
