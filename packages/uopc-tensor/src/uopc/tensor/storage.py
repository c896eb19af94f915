"""uopc.tensor.storage: the data behind realized tensors, and the few registries the frontend keeps beside its graphs.

A realized tensor's uop is a BUFFER (or a RESHAPE view of one); `buffers` maps each such BUFFER uop to its memory (a
uopc.runtime.Buffer on the tensor's backend), weakly, so the memory dies with the last graph that mentions the BUFFER.
Data stays on the backend between kernels and crosses to NumPy only in numpy(). A Buffer is never written after the
kernel (or copy) that fills it: assign and load_state_dict give a tensor a new buffer, so a value read once stays that
value wherever it is shared. The one exception is uopc.jit, which writes its replays' results into buffers of its own,
and only into one no live BUFFER uop names (see `named`).

Beside the data: the graph a realized value came from when it depends on gradient leaves (`history`, so backward()
sees through a value realized on the way), the tensors assign() left lazy, the tensors marked requires_grad, and the
random generator. Everything is held weakly or keyed by UOps: nothing here keeps a tensor alive.
"""
from __future__ import annotations
import gc, itertools, os, weakref
import numpy as np
from uopc.dtype import DType
from uopc.uop import UOp, Ops, ParamArg, prod
from uopc.runtime import Buffer

buffers: weakref.WeakKeyDictionary[UOp, Buffer] = weakref.WeakKeyDictionary()   # BUFFER uop -> its memory
# a realized tensor that depends on gradient leaves keeps the graph it came from, so backward() can still see through it
history: weakref.WeakKeyDictionary[UOp, UOp] = weakref.WeakKeyDictionary()
# the aliases name_buffer made of a Buffer (detach() of a value keeps its memory under a new name): uopc.jit reuses a
# buffer of its own only once none of them is alive
_names: weakref.WeakKeyDictionary[Buffer, weakref.WeakSet] = weakref.WeakKeyDictionary()
# tensors assign() left holding an unrealized value, by id: uopc.jit realizes them before a call reads them as state
_lazy_state: dict[int, weakref.ref] = {}
# tensors marked requires_grad, by id (a WeakSet would compare them with __eq__, which builds a Tensor)
_grad_leaves: dict[int, weakref.ref] = {}
_buffer_ids = itertools.count(1 << 20)   # BUFFER slots of tensors; kernels renumber their own buffers from 0
_generator = np.random.default_rng(0)   # the one generator every random tensor is drawn from (manual_seed replaces it)


def new_buffer(n: int, dtype: DType) -> UOp:
  """A BUFFER uop for n elements of dtype, with no data yet (realize's outputs; a BUFFER holds at least one element)."""
  return UOp(Ops.BUFFER, (), ParamArg(next(_buffer_ids), dtype, (max(1, n),)))


def name_buffer(buffer: Buffer, shape: tuple[int, ...], alias: bool = True) -> UOp:
  """A new BUFFER uop for an existing Buffer, viewed in `shape`: how detach() names a value without the graph behind
  it, and how uopc.jit hands out a replay's results. An alias (the default) keeps the Buffer in use while it lives (see
  `named`); uopc.jit's own names (alias=False) it tracks itself."""
  b = UOp(Ops.BUFFER, (), ParamArg(next(_buffer_ids), buffer.dtype, (buffer.size,)))
  buffers[b] = buffer
  if alias: _names.setdefault(buffer, weakref.WeakSet()).add(b)
  return b.reshape(shape) if shape != b.shape else b


def named(buffer: Buffer) -> bool:
  """Whether a live BUFFER uop made by name_buffer still names `buffer` (someone may read it)."""
  return bool(_names.get(buffer))


def buffer_uop(u: UOp) -> UOp | None:
  """The BUFFER behind a realized value: u itself or the BUFFER under its RESHAPE view; None for anything else. The one
  place that knows what a realized value looks like."""
  b = u.src[0] if u.op is Ops.RESHAPE else u
  return b if b.op is Ops.BUFFER and b in buffers else None


def buffer_of(u: UOp) -> Buffer | None:
  """The Buffer holding the value of `u` (a tensor's uop) when it is realized; None when it isn't, or is empty."""
  b = buffer_uop(u) if prod(u.shape) else None
  return buffers[b] if b is not None else None


def is_realized(u: UOp) -> bool:
  """Whether `u` (a tensor's uop) is a value with nothing left to compute: a view of a BUFFER that holds all of it."""
  if prod(u.shape) == 0: return True   # an empty tensor has no data to compute (numpy() makes it from the shape)
  b = buffer_uop(u)
  return b is not None and prod(u.shape) == b.shape[0]


def mark_lazy(t) -> None:
  """Remember a tensor assign() left holding an unrealized value (until realize_lazy_state, or until it dies)."""
  _lazy_state[id(t)] = weakref.ref(t, lambda _, k=id(t): _lazy_state.pop(k, None))


def realize_lazy_state() -> None:
  """Realize every tensor that assign() left holding an unrealized value (a state update made outside a jitted function,
  never read since): uopc.jit calls this first, so that a call reads state as values, never as graphs to recompute."""
  todo: dict[str, list] = {}
  for r in list(_lazy_state.values()):
    if (t := r()) is not None and not is_realized(t.uop): todo.setdefault(t.device, []).append(t)
  _lazy_state.clear()
  for ts in todo.values(): ts[0].realize(*ts[1:])


# the graph realize() computed last, held (see hold_graph) while it is HELD_MAX_KERNELS kernels at most and its
# inputs hold HELD_MAX_BYTES
HELD_MAX_KERNELS, HELD_MAX_BYTES = 64, 8 << 20
_held: list[tuple[UOp, ...] | None] = [None]   # (one slot, read and written whole: realize() may run in threads)


def hold_graph(roots: tuple[UOp, ...], kernels: int, used, outputs) -> None:
  """Hold the graph of `roots`, just realized in `kernels` kernels over the BUFFERs `used` (kernelize_cached's table:
  the graph's inputs, `outputs`, and None or a BUFFER for each temporary), until the next realize() of another graph.
  Code called plainly in a loop over the same tensors builds the same graph each time; while the last one lives, its
  nodes are found in UOp's cache instead of built, freed and built again, and kernelize_cached keys it once (on its
  root): attention's forward called plainly 459 -> 391 us, a GEMM of 512 919 -> 896 us. A loop over new inputs gains
  little (attention with a new q each call: 485 -> 477 us): what differs from the last graph is built anyway.

  What holding costs is bounded. One graph, dropped as the next realize() starts (release_graph), before that one
  allocates (holding the last four, a plain GPT step was 7% slower). A graph of HELD_MAX_KERNELS kernels at most: a
  whole program (a plain GPT step: 233 kernels over new weights each step) is seldom built again over the same tensors,
  and its thousands of nodes held past the step cost the cyclic collector's young collections (the step 2-4% slower,
  as fast with the collector off). Inputs of HELD_MAX_BYTES at most, none a value with a history (which would hold its
  own graph and inputs in turn): what the graph keeps alive past its tensors stays small."""
  _held[0] = None
  if kernels > HELD_MAX_KERNELS: return
  total = 0
  for b in used:
    if b is None or b in outputs: continue
    if b in history: return
    if (total := total + b.shape[0] * b.dtype.itemsize) > HELD_MAX_BYTES: return
  _held[0] = roots


def release_graph(roots: tuple[UOp, ...]) -> None:
  """Drop the held graph (see hold_graph) unless it is the graph of `roots`, about to be realized again."""
  if (held := _held[0]) is not None and held != roots: _held[0] = None


def mark_grad_leaf(t) -> None:
  """Remember a tensor marked requires_grad: backward() differentiates by every one of these its graph reaches."""
  _grad_leaves[id(t)] = weakref.ref(t, lambda _, k=id(t): _grad_leaves.pop(k, None))


def is_grad_leaf(t) -> bool: return id(t) in _grad_leaves


def grad_leaves() -> list:
  """Every live tensor ever marked requires_grad (whether it still requires it is its own requires_grad)."""
  return [t for r in list(_grad_leaves.values()) if (t := r()) is not None]


def generator() -> np.random.Generator:
  """The generator random tensors are drawn from now (Tensor.rand, randn, uniform, dropout's masks; a jit replay's)."""
  return _generator


def seed_generator(seed: int) -> None:
  global _generator
  _generator = np.random.default_rng(seed)


# Python's cyclic collector walks its youngest generation every 700 net allocations of container objects (CPython's
# default threshold), and every 10 of those walks the next. A plain training step builds thousands of short-lived graph
# nodes (the default GPT's: about 2,000 UOps, 10,000 objects with their keys, sources and Tensors), none of them in a
# reference cycle (they die by reference counting when the step's tensors do), so the collector walked them 14 times a
# step and the whole heap every few steps, finding nothing: 2.2 ms of a 25 ms step. Importing uopc.tensor raises the
# first threshold to GC_THRESHOLD while it is CPython's default (a program that set its own keeps it, and UOPC_GC=0
# leaves the collector alone). Cyclic garbage elsewhere is still found, after 10,000 allocations instead of 700.
GC_THRESHOLD = 10_000
_CPYTHON_DEFAULTS = {(700, 10, 10), (2000, 10, 10), (2000, 10, 0)}


def tune_collector() -> None:
  """Raise the cyclic collector's first threshold to GC_THRESHOLD (see above); nothing when the program set its own
  thresholds or UOPC_GC=0."""
  if os.environ.get("UOPC_GC", "").strip() == "0": return
  if (now := gc.get_threshold()) in _CPYTHON_DEFAULTS and now[0] < GC_THRESHOLD: gc.set_threshold(GC_THRESHOLD, *now[1:])
