"""Tensor: the frontend. A thin, lazy layer that builds shaped UOp graphs as you call methods.

A Tensor holds one shaped UOp. Nothing runs until a value is asked for: `realize()` (or numpy/item/tolist)
kernelizes the graph, lowers and compiles each kernel (cached by its structure, so a training loop compiles once),
runs the kernels on the backend, and replaces the tensor's graph by the BUFFER that holds its value.
`schedule()` returns the kernels realize() would run, without running them.

Everything is the IR's primitives: broadcasting is RESHAPE + EXPAND, a reduction over any axes is a PERMUTE
that moves them last and a REDUCE, `x - y` is `x + y*-1`, exp is exp2, a gather with an integer Tensor is a
one-hot mask and a sum, a convolution is a window view (movement ops only) times the weights, summed. The
gradients come from uopc.grad on the same graph, so backward passes fuse and compile like forward ones.
What the IR has no primitive for is a composite in fixed shapes: & | ^ on i32 take the 32 bits apart, a product
halves its axis pairwise, a cumulative op reduces triangular blocks, sort counts each element's rank, min is max
under -1 - x (no overflow at INT_MIN). Where PyTorch's gradient is a formula of its own at the edges (pow at 0 and
infinity, erf, binary_cross_entropy), value and slope are computed apart and joined by `_with_gradient`.

Conventions follow PyTorch where DESIGN.md is silent, and tinygrad's where they differ and the IR's sugar
agrees: `cond.where(a, b)`, `max(axis)` returns values only, `pad(((before, after), ...))` takes numpy.pad's
pairs (and F.pad's flat tuple), `Tensor.cat(*ts, dim=)`, `layernorm` has no affine parameters, `gelu` is the tanh
approximation, `//` on integers floors. Dtypes promote bool < i32 < f16 < f32; a python scalar adopts the tensor's
dtype (a float scalar with an integer tensor gives f32). f16 tensors are stored in f16 but summed, multiplied and put
through the math functions in f32, rounded to f16 once (`_f16_in_f32`), as torch and NumPy compute them. Errors name
the shapes and are of the kinds torch raises: TensorError is a ValueError and a RuntimeError, TensorIndexError an
IndexError, TensorTypeError a TypeError.
"""
from __future__ import annotations
import functools, itertools, math, operator, os, reprlib, threading, weakref
from typing import Any, Callable, NamedTuple
import numpy as np
from uopc.dtype import DType, dtypes, I32_MIN, I32_MAX
from uopc.uop import UOp, Ops, ParamArg, prod
from uopc.composite import pad as _pad_uop, flip_axis
from uopc.kernelize import kernelize, kernelize_cached, Kernel
from uopc.backends import BackendError, get_backend
from uopc.runtime import Buffer, run_schedule, np_dtype
from uopc.grad import gradient as grad_of

_PROMOTION = (dtypes.bool, dtypes.i32, dtypes.f16, dtypes.f32)
_NP_TO_DTYPE = {np.dtype(np.float32): dtypes.f32, np.dtype(np.float64): dtypes.f32, np.dtype(np.float16): dtypes.f16,
                np.dtype(np.int32): dtypes.i32, np.dtype(np.int64): dtypes.i32, np.dtype(np.int16): dtypes.i32,
                np.dtype(np.int8): dtypes.i32, np.dtype(np.uint8): dtypes.i32, np.dtype(np.uint16): dtypes.i32,
                np.dtype(np.bool_): dtypes.bool}


class TensorError(ValueError, RuntimeError):
  """A Tensor operation called with shapes, dtypes or arguments it can't take. It is a ValueError (what NumPy users
  catch) and a RuntimeError (what PyTorch raises for the same mistakes, so code written against torch catches it)."""


class TensorIndexError(TensorError, IndexError):
  """An index or a dimension out of range, or an index of a kind that can't index (a float, a bool mask)."""


class TensorTypeError(TensorError, TypeError, NotImplementedError):
  """An argument of a type or a value an op doesn't take: an unknown mode or reduction name, a float where bits are
  needed. (torch raises TypeError or NotImplementedError for these; this is both.)"""


class JitError(TensorError):
  """A function uopc.jit can't capture or replay faithfully (see uopc.jit)."""


class Capture:
  """What uopc.jit records while a call of a jitted function runs in this thread: every launch the call makes (Program and
  Buffers), every tensor whose value it replaced (assign, with the value the tensor held before), every batch of random
  numbers it drew (the Buffer they went into and how to draw them again) and every index check. `strict` while it
  captures (the call a replay will repeat): reading a value there is refused. The capture hook is this class alone:
  `with Capture(strict) as cap:` makes it the current one in this thread; `capturing()` returns it."""
  def __init__(self, strict: bool):
    self.strict = strict
    self.launches: list[tuple[Any, list[Buffer]]] = []
    self.assigned: list[tuple[Tensor, UOp]] = []
    self.index_checks: list[tuple[int, IndexCheck]] = []   # (launches made before it, the check): a replay repeats it there
    self.draws: list[tuple[Buffer, Callable[[np.random.Generator], np.ndarray]]] = []
    self._outer: Capture | None = None

  def __enter__(self) -> Capture:
    self._outer, _local.capture = _local.capture, self
    return self

  def __exit__(self, *exc) -> None: _local.capture = self._outer


class _Local(threading.local):
  capture: Capture | None = None   # a capture belongs to its thread: another thread's launches and assigns are its own


_local = _Local()


def capturing() -> Capture | None:
  """The uopc.jit capture running in this thread, or None (almost always)."""
  return _local.capture


def _not_while_capturing(what: str) -> None:
  if (cap := _local.capture) is not None and cap.strict:
    raise JitError(f"{what} inside a function uopc.jit is capturing: a replay runs only the captured kernels, so the value "
                   "read here would be the capture's on every call. Return the tensor and read it after the call instead")


class IndexCheck(NamedTuple):
  """Integer indices that must lie in [low, high) (`ignore` excepted): the first `n` values of `buffer`. A gather here
  is a one-hot mask and a sum, which silently gives 0 for an index that hits nothing, so the values are checked as
  PyTorch checks them, on the realized data; `message` says what was indexed, with {} for the bad value."""
  buffer: Buffer
  n: int
  low: int
  high: int
  message: str
  ignore: int | None = None

  def run(self) -> None:
    v = self.buffer.numpy()[:self.n]
    bad = (v < self.low) | (v >= self.high)
    if self.ignore is not None: bad &= v != self.ignore
    if bad.any(): raise TensorError(self.message.format(int(v[int(np.argmax(bad))])))


def _check_indices(index: Tensor, low: int, high: int, message: str, ignore: int | None = None) -> None:
  """Refuse index values outside [low, high) (see IndexCheck). The index tensor is realized for it; a uopc.jit capture
  records the check after the launches made so far, and every replay repeats it at that point."""
  if index.numel() == 0: return
  index.realize()
  u = index.uop
  check = IndexCheck(_storage[u.src[0] if u.op is Ops.RESHAPE else u], index.numel(), low, high, message, ignore)
  if (cap := _local.capture) is not None: cap.index_checks.append((len(cap.launches), check))
  check.run()


# ---- storage: the data behind realized BUFFERs -------------------------------------------------------------------
# the only state here is keyed by UOps: a BUFFER's memory (a uopc.runtime.Buffer on the tensor's backend) dies with the
# last graph that mentions the BUFFER. Data stays on the backend between kernels and crosses to NumPy only in numpy().
# A Buffer is never written after the kernel (or copy) that fills it: assign and load_state_dict give a tensor a new
# buffer, so a value read once stays that value wherever it is shared. The one exception is uopc.jit, which writes its
# replays' results into buffers of its own, and only into one no live BUFFER uop names (see `_names`).

_storage: weakref.WeakKeyDictionary[UOp, Buffer] = weakref.WeakKeyDictionary()
# the aliases name_buffer made of a Buffer (detach() of a value keeps its memory under a new name): uopc.jit reuses a
# buffer of its own only once none of them is alive
_names: weakref.WeakKeyDictionary[Buffer, weakref.WeakSet] = weakref.WeakKeyDictionary()
# a realized tensor that depends on gradient leaves keeps the graph it came from, so backward() can still see through it
_history: weakref.WeakKeyDictionary[UOp, UOp] = weakref.WeakKeyDictionary()
# tensors assign() left holding an unrealized value, by id: uopc.jit realizes them before a call reads them as state
_lazy_state: dict[int, weakref.ref] = {}
_buffer_ids = itertools.count(1 << 20)   # BUFFER slots of tensors; kernels renumber their own buffers from 0


def _new_buffer(n: int, dtype: DType) -> UOp:
  return UOp(Ops.BUFFER, (), ParamArg(next(_buffer_ids), dtype, (max(1, n),)))


def name_buffer(buffer: Buffer, shape: tuple[int, ...], alias: bool = True) -> UOp:
  """A new BUFFER uop for an existing Buffer, viewed in `shape`: how detach() names a value without the graph behind
  it, and how uopc.jit hands out a replay's results. An alias (the default) keeps the Buffer in use while it lives (see
  `named`); uopc.jit's own names (alias=False) it tracks itself."""
  b = UOp(Ops.BUFFER, (), ParamArg(next(_buffer_ids), buffer.dtype, (buffer.size,)))
  _storage[b] = buffer
  if alias: _names.setdefault(buffer, weakref.WeakSet()).add(b)
  return b.reshape(shape) if shape != b.shape else b


def named(buffer: Buffer) -> bool:
  """Whether a live BUFFER uop made by name_buffer still names `buffer` (someone may read it)."""
  return bool(_names.get(buffer))


def _default_device() -> str: return os.environ.get("UOPC_DEVICE", "").strip().upper() or "C"


def _buffer_uop(u: UOp) -> UOp | None:
  """The BUFFER behind a realized value: u itself or the BUFFER under its RESHAPE view; None for anything else."""
  b = u.src[0] if u.op is Ops.RESHAPE else u
  return b if b.op is Ops.BUFFER and b in _storage else None


def _realized(u: UOp) -> bool:
  if prod(u.shape) == 0: return True   # an empty tensor has no data to compute (numpy() makes it from the shape)
  b = _buffer_uop(u)
  return b is not None and prod(u.shape) == b.shape[0]


def realize_lazy_state() -> None:
  """Realize every tensor that assign() left holding an unrealized value (a state update made outside a jitted function,
  never read since): uopc.jit calls this first, so that a call reads state as values, never as graphs to recompute."""
  todo: dict[str, list[Tensor]] = {}
  for r in list(_lazy_state.values()):
    if (t := r()) is not None and not _realized(t.uop): todo.setdefault(t.device, []).append(t)
  _lazy_state.clear()
  for ts in todo.values(): ts[0].realize(*ts[1:])


# ---- helpers --------------------------------------------------------------------------------------------------------

def _to_dtype(d) -> DType:
  if d is None or isinstance(d, DType): return d
  if isinstance(d, str):
    try: return dtypes.from_name({"float32": "f32", "float": "f32", "int32": "i32", "int": "i32", "float16": "f16", "half": "f16"}.get(d, d))
    except ValueError as e: raise TensorError(str(e)) from None
  if d is float: return dtypes.f32
  if d is int: return dtypes.i32
  if d is bool: return dtypes.bool
  try: return _NP_TO_DTYPE[np.dtype(d)]
  except (TypeError, KeyError, ValueError): raise TensorError(f"unknown dtype {d!r}") from None


def _dtype_name(name: str) -> DType | None:
  """The dtype a string names ("f16", "float32", "half"), or None when it names none (a device, then)."""
  try: return _to_dtype(name)
  except TensorError: return None


def _int_arg(v, what: str) -> int:
  """An argument that must be an integer (a dimension, a count): a float, a string or an array is a TensorError."""
  if isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, np.integer)): raise TensorError(f"{what} must be an int, got {v!r}")
  return int(v)


def _number_arg(v, what: str) -> float:
  """An argument that must be a real number (a probability, an exponent, a bound)."""
  if isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, float, np.integer, np.floating)):
    raise TensorError(f"{what} must be a number, got {v!r}")
  return v


def _tensor_arg(x, what: str) -> Tensor:
  """An argument that must be a Tensor (a weight, an index); arrays and lists are taken as one."""
  if isinstance(x, Tensor): return x
  if isinstance(x, (np.ndarray, list, tuple)): return Tensor(x)
  raise TensorError(f"{what} must be a Tensor, got {type(x).__name__}")


def _shape_arg(shape) -> tuple[int, ...]:
  if len(shape) == 1 and isinstance(shape[0], (tuple, list)): shape = shape[0]
  try: return tuple(operator.index(s) for s in shape)   # int(2.7) would make Tensor.zeros(2.7) silently (2,)
  except TypeError: raise TensorError(f"sizes and dimensions are integers, got {tuple(shape)!r}") from None


def _check_size(shape: tuple[int, ...], what: str) -> tuple[int, ...]:
  """Every element of a tensor is addressed by an i32 index: refuse a shape past that when the tensor is made, naming it
  (rather than with an i32 CONST error at realize, or after minutes of looping over 2**40 elements)."""
  if (n := prod(shape)) > I32_MAX:
    raise TensorError(f"{what}: a tensor of shape {shape} has {n} elements, more than the {I32_MAX} an i32 index can reach")
  return shape


def _new_shape(shape, what: str) -> tuple[int, ...]:
  """The shape of a tensor being created: integers, none negative, within the index limit."""
  shape = _shape_arg(tuple(shape) if isinstance(shape, (tuple, list)) else (shape,))
  if any(s < 0 for s in shape): raise TensorError(f"{what}: sizes can't be negative, got {shape}")
  return _check_size(shape, what)


def broadcast_shape(*shapes: tuple[int, ...]) -> tuple[int, ...]:
  """NumPy's broadcast of the shapes (aligned on the right, size 1 stretches), or a TensorError naming them."""
  n = max(len(s) for s in shapes)
  padded = [(1,) * (n - len(s)) + tuple(s) for s in shapes]
  out = []
  for dims in zip(*padded):
    big = {d for d in dims if d != 1}
    if len(big) > 1: raise TensorError(f"can't broadcast shapes {' and '.join(str(tuple(s)) for s in shapes)}")
    out.append(big.pop() if big else 1)
  # a broadcast that makes something bigger than every operand is a new tensor (matmul's product of two equal shapes isn't)
  if prod(out) > max(prod(s) for s in shapes): _check_size(tuple(out), f"broadcasting {' and '.join(str(tuple(s)) for s in shapes)}")
  return tuple(out)


def _pairs_arg(arg, ndim: int, what: str) -> tuple[tuple[int, int] | None, ...]:
  """One (a, b) pair of ints or None per axis (pad's widths, shrink's ranges)."""
  if not isinstance(arg, (tuple, list)) or len(arg) != ndim:
    raise TensorError(f"{what}: expected {ndim} pairs (or None), one per axis, got {arg!r}")
  out = []
  for a in arg:
    if a is not None and (not isinstance(a, (tuple, list)) or len(a) != 2): raise TensorError(f"{what}: {a!r} is not a pair of ints or None")
    out.append(None if a is None else (_int_arg(a[0], what), _int_arg(a[1], what)))
  return tuple(out)


def _spatial(v, nd: int, what: str) -> tuple[int, ...]:
  """An argument per spatial axis (stride, dilation, ...) given as one int or nd of them."""
  if isinstance(v, (int, np.integer)): return (int(v),) * nd
  v = tuple(v)
  if len(v) != nd: raise TensorError(f"{what}: expected an int or {nd} ints, got {v}")
  return v


def _padding_pairs(padding, nd: int, kernel, dilation, what: str) -> tuple[tuple[int, int], ...]:
  """(before, after) per spatial axis from an int, one int per axis, F.pad's flat tuple (last axis first), or 'valid' /
  'same' (torch's: the odd one out of an even window goes after)."""
  if isinstance(padding, str):
    if padding == "valid": return ((0, 0),) * nd
    if padding == "same": return tuple((d * (k - 1) // 2, d * (k - 1) - d * (k - 1) // 2) for k, d in zip(kernel, dilation))
    raise TensorTypeError(f"{what}: padding must be a number, numbers, 'same' or 'valid', got {padding!r}")
  ints = (padding,) if not isinstance(padding, (tuple, list)) else tuple(padding)
  if not all(isinstance(p, (int, np.integer)) and not isinstance(p, bool) for p in ints):
    raise TensorError(f"{what}: padding must be an int, a tuple of ints, 'same' or 'valid', got {padding!r}")
  if isinstance(padding, (int, np.integer)): return ((int(padding), int(padding)),) * nd
  padding = tuple(int(p) for p in padding)
  if len(padding) == nd: return tuple((p, p) for p in padding)
  if len(padding) == 2 * nd: return tuple((padding[2 * k], padding[2 * k + 1]) for k in reversed(range(nd)))
  raise TensorError(f"{what}: padding {padding} for {nd} spatial axes: expected an int, {nd} ints or {2 * nd} (before, after, last axis first)")


def _check_window_args(what: str, **args) -> None:
  """kernel_size, stride, dilation and groups are at least 1 and (output_)padding at least 0, each an int or (groups excepted) a
  tuple of ints (one per spatial axis; padding may also be F.pad's flat tuple or a string, which _padding_pairs reads): a 0
  was a ZeroDivisionError, a float a silently truncated size."""
  for name, v in args.items():
    if name == "padding" and isinstance(v, str): continue
    least = 0 if name in ("padding", "output_padding") else 1
    vals = (v,) if not isinstance(v, (tuple, list)) or name == "groups" else tuple(v)
    if not vals or not all(isinstance(x, (int, np.integer)) and not isinstance(x, bool) and x >= least for x in vals):
      raise TensorError(f"{what}: {name} must be {'an int' if name == 'groups' else 'an int or a tuple of ints'} of at least {least}, got {v!r}")


def _promote(*ds: DType) -> DType: return max(ds, key=_PROMOTION.index)


def _f16_in_f32(fn):
  """A float function of an f16 tensor computed in f32 and rounded to f16 once, as torch and NumPy compute f16 math.
  f16 holds 11 significant bits: a sum of 3000 f16 ones stopped at 2048 (2049 rounds back to 2048), a softmax over
  3000 logits gave 1/2048 each, and a composite such as exp (a product, then exp2) or tanh rounded at every step.
  The result is f16 unless a float Tensor argument promotes it to f32 (f16 logits with f32 targets give f32)."""
  @functools.wraps(fn)
  def wrapper(self, *args, **kwargs):
    if self.dtype is not dtypes.f16: return fn(self, *args, **kwargs)
    others = [a.dtype for a in (*args, *kwargs.values()) if isinstance(a, Tensor) and a.dtype.is_float]
    out = fn(self.float(), *args, **kwargs)
    return out.cast(dtypes.f16) if _promote(dtypes.f16, *others) is dtypes.f16 and out.dtype is dtypes.f32 else out
  return wrapper


_POW2_I32 = np.array([1 << k for k in range(31)] + [I32_MIN], np.int32)   # bit k's weight in an i32 (bit 31: -2**31)
SORT_BY_COUNTING_MAX = 1024   # longer sorts go through a bitonic network (Tensor._sort_network)
PROD_FUSED = 16    # prod's pairwise halvings fuse this many inputs per kernel before storing the partial products
SCAN_BLOCK = 32   # cumulative ops scan blocks of this many elements as (b, b) squares, then the blocks' totals (Tensor._scan)
# pi/2 as C1 + C2 + C3 (to 2e-21): C1 to 12 bits, so q * C1 is exact for the quarter-turn counts q < 2^12 that cos and tan
# reduce by (Tensor._quarter_turns), C2 and C3 f32 roundings of what is left
PIO2_PARTS = (1.57080078125, -4.454454938240815e-06, -1.6513995574653217e-13)
TRIG_REDUCE_MAX = 4096.0


class ValuesIndices(NamedTuple):
  """What sort, topk, cummax and cummin return: t.sort(0).values and t.sort(0)[0] both work, as with torch's return types."""
  values: Tensor
  indices: Tensor


def _index_array(i) -> np.ndarray:
  """A list, tuple or array used as an index, as an array of i32 indices (a bool or float one is refused)."""
  try: arr = np.asarray(i)
  except ValueError: raise TensorIndexError(f"can't index with the ragged sequence {i!r}") from None
  if arr.size == 0: return arr.astype(np.int32)   # [] is a float array to numpy, an empty index to everyone
  if arr.dtype == bool: raise TensorIndexError("boolean mask indexing isn't supported (its result shape depends on the data; see masked_select)")
  if arr.dtype.kind not in "iu": raise TensorIndexError(f"indices must be integers, got {arr.dtype} {str(i)[:60]}")
  return arr.astype(np.int32)


class Tensor:
  """A lazy n-dimensional array: a shaped UOp graph, computed on `realize()`."""
  __slots__ = ("uop", "requires_grad", "grad", "device", "__weakref__")
  __array_ufunc__ = None   # `np.float32(2) * t` defers to Tensor.__rmul__ instead of NumPy iterating over t
  _rng = np.random.default_rng(0)
  # tensors marked requires_grad, by id (a WeakSet would compare them with __eq__, which builds a Tensor)
  _grad_leaves: dict[int, weakref.ref] = {}

  def __init__(self, data: Any, dtype=None, requires_grad: bool = False, device: str | None = None):
    if device is not None and not isinstance(device, str): raise TensorError(f"device must be a backend's name (a str), got {device!r}")
    self.device = (device or _default_device()).upper()
    get_backend(self.device)   # fail early on an unknown device
    dtype = _to_dtype(dtype)
    self.grad: Tensor | None = None
    if isinstance(data, UOp): self.uop = data if dtype is None or data.dtype is dtype else data.cast(dtype)
    elif isinstance(data, Tensor): self.uop = data.uop if dtype is None else data.uop.cast(dtype)
    else:
      try: arr = data if isinstance(data, np.ndarray) else np.asarray(data)
      except (ValueError, TypeError, RecursionError):   # NumPy 2 refuses ragged lists itself; a list nested 10^5 deep recurses
        raise TensorError(f"can't make a Tensor from {type(data).__name__} {reprlib.repr(data)}: ragged or not numbers") from None
      _check_size(arr.shape, "Tensor")
      if arr.dtype.kind in "USV": raise TensorError(f"can't make a Tensor of {arr.dtype} data {reprlib.repr(data)}: not numbers")
      if arr.dtype == object: raise TensorError(f"can't make a Tensor from {type(data).__name__} {reprlib.repr(data)}: ragged or not numbers")
      if dtype is None:
        if arr.dtype not in _NP_TO_DTYPE: raise TensorError(f"NumPy dtype {arr.dtype} has no uopc dtype (bool, int32, float16, float32)")
        dtype = _NP_TO_DTYPE[arr.dtype]
      if arr.dtype.kind in "iu" and arr.size and (arr.max() > I32_MAX or arr.min() < I32_MIN) and dtype is dtypes.i32:
        raise TensorError("integer data doesn't fit in i32")
      # not np.ascontiguousarray, which makes a 0-d array 1-d
      self.uop = Tensor._from_numpy(np.asarray(arr, dtype=np_dtype(dtype), order="C"), dtype, self.device)
    self.requires_grad = False
    if requires_grad: self.requires_grad_(True)

  @staticmethod
  def _from_numpy(arr: np.ndarray, dtype: DType, device: str) -> UOp:
    b = _new_buffer(arr.size, dtype)
    _storage[b] = Buffer.from_numpy(arr.reshape(-1) if arr.size else np.zeros(1, arr.dtype), get_backend(device), dtype)
    if not arr.size: return b.shrink(((0, 0),)).reshape(arr.shape)   # a BUFFER holds at least one element: view none of it
    return b.reshape(arr.shape) if arr.shape != b.shape else b

  def requires_grad_(self, flag: bool = True) -> Tensor:
    if flag:
      if not self.dtype.is_float: raise TensorError(f"only float tensors can require gradients, this one is {self.dtype.name}")
      if not _realized(self.uop): self.realize()   # a leaf must be its own BUFFER: two zero tensors are one hash-consed graph
      Tensor._grad_leaves[id(self)] = weakref.ref(self, lambda _, k=id(self): Tensor._grad_leaves.pop(k, None))
    self.requires_grad = flag
    return self

  # ---- properties
  @property
  def shape(self) -> tuple[int, ...]: return self.uop.shape
  @property
  def dtype(self) -> DType: return self.uop.dtype
  @property
  def ndim(self) -> int: return len(self.shape)
  def numel(self) -> int: return prod(self.shape)
  def size(self, dim: int | None = None): return self.shape if dim is None else self.shape[self._dim(dim)]
  def __len__(self) -> int:
    if not self.shape: raise TensorError("len() of a 0-d tensor")
    return self.shape[0]
  def __iter__(self): return (self[i] for i in range(len(self)))   # __getitem__'s TensorError would not end the iteration
  def __repr__(self) -> str:
    return f"<Tensor shape={self.shape} dtype={self.dtype.name} device={self.device}{' requires_grad' if self.requires_grad else ''}>"
  __hash__ = object.__hash__

  # ---- running
  def schedule(self, *others: Tensor) -> list[Kernel]:
    """The kernels realize() would run for this tensor (and `others`), without running them."""
    ts = [t for t in (self, *others) if not _realized(t.uop)]
    return kernelize([(t.uop, _new_buffer(t.numel(), t.dtype)) for t in ts], _new_buffer) if ts else []

  def realize(self, *others: Tensor) -> Tensor:
    """Compute this tensor (and `others`, in the same schedule so they share work); returns self. Each tensor gets a
    buffer of its own, even where two hold one graph (Tensor.zeros(3) twice): two tensors are one buffer only when they
    are one tensor, so writing one (load_state_dict) or differentiating by one never reaches the other."""
    todo = list({id(t): t for t in (self, *others) if not _realized(t.uop)}.values())
    if not todo: return self
    outs = [(t.uop, _new_buffer(t.numel(), t.dtype)) for t in todo]
    launches = run_schedule(kernelize_cached(outs, _new_buffer), get_backend(self.device), _storage)
    if (cap := _local.capture) is not None: cap.launches += launches
    for t, (u, b) in zip(todo, outs):
      # a value computed from gradient leaves (not a leaf itself: an optimizer's update is a fresh start) keeps its graph
      if t.requires_grad and id(t) not in Tensor._grad_leaves: _history[b] = u.reshape(b.shape) if u.shape != b.shape else u
      t.uop = b.reshape(u.shape) if u.shape != b.shape else b
    return self

  def numpy(self) -> np.ndarray:
    _not_while_capturing(".numpy() / .item() / .tolist()")
    if self.numel() == 0: return np.zeros(self.shape, np_dtype(self.dtype))
    return self.realize()._buffer().numpy()[:self.numel()].reshape(self.shape)

  def _buffer(self) -> Buffer | None:
    """The Buffer behind this tensor's value when it is realized (None when it isn't, or is empty)."""
    b = _buffer_uop(self.uop) if self.numel() else None
    return _storage[b] if b is not None else None

  def item(self):
    if self.numel() != 1: raise TensorError(f"item() needs a tensor with one element, this one has shape {self.shape}")
    return self.numpy().reshape(()).item()

  def tolist(self): return self.numpy().tolist()
  def __bool__(self):
    if self.numel() != 1: raise TensorError(f"the truth value of a tensor of shape {self.shape} is ambiguous")
    return bool(self.item())
  def __float__(self): return float(self.item())
  def __int__(self): return int(self.item())

  def _new(self, uop: UOp, *parents: Tensor) -> Tensor:
    t = Tensor.__new__(Tensor)
    t.uop, t.grad, t.device = uop, None, self.device
    t.requires_grad = self.requires_grad or any(p.requires_grad for p in parents if isinstance(p, Tensor))
    return t

  def detach(self) -> Tensor:
    """The same value, cut from the graph: it requires no gradient and backward() never reaches through it. As torch's,
    it is the value now: a tensor not computed yet is realized first, and the result names the same memory without the
    graph realize() keeps for backward (a list of detached losses holds numbers, not every step's model)."""
    if self.numel() == 0: return Tensor(np.zeros(self.shape, np_dtype(self.dtype)), device=self.device)
    t = Tensor.__new__(Tensor)
    t.uop, t.grad, t.device, t.requires_grad = name_buffer(self.realize()._buffer(), self.shape), None, self.device, False
    return t

  def _stop_gradient(self) -> Tensor:
    """The same value, lazily, with no gradient flowing back through it (a same-dtype CAST is the marker): what the
    composites here use inside a graph, where detach() would compute the value on its own."""
    return self._new(UOp(Ops.CAST, (self.uop,), self.dtype)) if self.dtype.is_float else self._new(self.uop)

  def _write(self, value) -> Tensor:
    """Give this tensor the value `value` (array-like of its shape), as torch's copy_ does, in a buffer of its own: the old
    one may be shared (realize's siblings, a detached view), and a uopc.jit replay reads the tensor's current buffer."""
    arr = np.asarray(value)
    if arr.shape != self.shape: raise TensorError(f"write: a value of shape {arr.shape} into a tensor of shape {self.shape}")
    return self.assign(Tensor(arr, dtype=self.dtype, device=self.device))

  def assign(self, other: Tensor | Any) -> Tensor:
    """Make this tensor hold `other`'s value (same shape, dtype and device), lazily: the tensor object stays the one
    everyone holds (an optimizer's parameter), its value is replaced."""
    other = other if isinstance(other, Tensor) else Tensor(other, dtype=self.dtype, device=self.device)
    if other.shape != self.shape or other.dtype is not self.dtype:
      raise TensorError(f"assign: {other.dtype.name}{other.shape} into {self.dtype.name}{self.shape}")
    if other.device != self.device:
      raise TensorError(f"assign: a tensor on {other.device} into one on {self.device}: move it first (Tensor(x, device=...))")
    if (cap := _local.capture) is not None: cap.assigned.append((self, self.uop))
    self.uop = other.uop
    if not _realized(self.uop): _lazy_state[id(self)] = weakref.ref(self, lambda _, k=id(self): _lazy_state.pop(k, None))
    return self

  # ---- creation
  @staticmethod
  def full(shape, value, dtype=None, requires_grad: bool = False, device: str | None = None) -> Tensor:
    shape = _new_shape(shape, "full")
    if isinstance(value, np.generic): value = value.item()
    if not isinstance(value, (int, float, bool)): raise TensorError(f"full: the value must be a number, got {value!r:.60}")
    dtype = _to_dtype(dtype) or dtypes.from_py(value)
    if dtype is dtypes.i32 and not (isinstance(value, float) and math.isfinite(value) or isinstance(value, int)):
      raise TensorError(f"full: {value} has no i32 value")
    if dtype is dtypes.i32 and not I32_MIN <= int(value) <= I32_MAX: raise TensorError(f"full: {value} doesn't fit in i32")
    c = UOp.const(value, dtype)
    t = Tensor(c.reshape((1,) * len(shape)).expand(shape) if shape else c, device=device)
    return t.requires_grad_() if requires_grad else t
  @staticmethod
  def zeros(*shape, dtype=None, **kw) -> Tensor: return Tensor.full(_shape_arg(shape), 0.0, dtype or dtypes.f32, **kw)
  @staticmethod
  def ones(*shape, dtype=None, **kw) -> Tensor: return Tensor.full(_shape_arg(shape), 1.0, dtype or dtypes.f32, **kw)
  @staticmethod
  def arange(start, stop=None, step=1, dtype=None, device: str | None = None) -> Tensor:
    if stop is None: start, stop = 0, start
    for v in (start, stop, step): _number_arg(v, "arange: start, stop and step")
    if step == 0: raise TensorError("arange: step must not be 0")
    if not all(math.isfinite(v) for v in (start, stop, step)): raise TensorError(f"arange: ({start}, {stop}, {step}) must be finite")
    _check_size((max(0, math.ceil((stop - start) / step)),), "arange")
    dtype = _to_dtype(dtype) or (dtypes.f32 if any(isinstance(v, float) for v in (start, stop, step)) else dtypes.i32)
    n = max(0, math.ceil((stop - start) / step))
    if dtype is dtypes.i32 and n and not (I32_MIN <= start <= I32_MAX and I32_MIN <= start + (n - 1) * step <= I32_MAX):
      raise TensorError(f"arange({start}, {stop}, {step}): values from {start} to {start + (n - 1) * step} don't fit in i32 (they would wrap)")
    return Tensor(np.arange(start, stop, step).astype(np_dtype(dtype)), dtype=dtype, device=device)
  @staticmethod
  def linspace(start, stop, steps: int, dtype=None, device: str | None = None) -> Tensor:
    """steps values from start to stop, evenly spaced (torch's: the first half counted from start, the rest back from
    stop, so both ends are exact)."""
    if not isinstance(steps, (int, np.integer)) or steps < 0: raise TensorError(f"linspace: steps must be an int >= 0, got {steps!r}")
    dtype = _to_dtype(dtype) or dtypes.f32
    if dtype is dtypes.bool: raise TensorError("linspace: a bool range isn't supported")
    f = np.float32
    step = f((stop - start) / (steps - 1)) if steps > 1 else f(0)
    i = np.arange(steps, dtype=np.float32)
    vals = np.where(i < steps // 2, f(start) + step * i, f(stop) - step * (f(steps - 1) - i)) if steps > 1 else np.full(steps, start, f)
    return Tensor(vals.astype(np_dtype(dtype)), dtype=dtype, device=device)
  @staticmethod
  def empty(*shape, dtype=None, **kw) -> Tensor:
    """A tensor whose values don't matter (zeros here: uopc has no uninitialized memory to hand out)."""
    return Tensor.zeros(*shape, dtype=dtype, **kw)
  @staticmethod
  def eye(n: int, m: int | None = None, dtype=None, device: str | None = None) -> Tensor:
    shape = _new_shape((n, n if m is None else m), "eye")
    return Tensor(np.eye(*shape, dtype=np_dtype(_to_dtype(dtype) or dtypes.f32)), device=device)
  @staticmethod
  def manual_seed(seed: int = 0) -> None:
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
      raise TensorError(f"manual_seed: a seed is an int >= 0, got {seed!r}")
    Tensor._rng = np.random.default_rng(seed)
  @staticmethod
  def _drawn(draw: Callable[[np.random.Generator], np.ndarray], dtype: DType, device: str | None, requires_grad: bool = False) -> Tensor:
    """A tensor of random numbers that `draw` makes on the host from Tensor._rng (the generator manual_seed resets). Under
    a uopc.jit capture the draw is recorded, and every replay draws again with it from the same generator: a replayed call
    gets the numbers a plain call would have drawn at that point, bit for bit."""
    t = Tensor(np.asarray(draw(Tensor._rng)).astype(np_dtype(dtype)), dtype=dtype, device=device)
    if (cap := _local.capture) is not None and t.numel(): cap.draws.append((t._buffer(), draw))
    return t.requires_grad_() if requires_grad else t
  @staticmethod
  def rand(*shape, dtype=None, requires_grad: bool = False, device: str | None = None) -> Tensor:
    shape = _new_shape(shape, "rand")
    return Tensor._drawn(lambda g: g.random(shape, dtype=np.float32), _to_dtype(dtype) or dtypes.f32, device, requires_grad)
  @staticmethod
  def randn(*shape, dtype=None, requires_grad: bool = False, device: str | None = None) -> Tensor:
    shape = _new_shape(shape, "randn")
    return Tensor._drawn(lambda g: g.standard_normal(shape, dtype=np.float32), _to_dtype(dtype) or dtypes.f32, device, requires_grad)
  @staticmethod
  def uniform(*shape, low: float = 0.0, high: float = 1.0, dtype=None, requires_grad: bool = False, device: str | None = None) -> Tensor:
    shape, low, high = _new_shape(shape, "uniform"), _number_arg(low, "uniform: low"), _number_arg(high, "uniform: high")
    return Tensor._drawn(lambda g: (g.random(shape) * (high - low) + low).astype(np.float32), _to_dtype(dtype) or dtypes.f32, device, requires_grad)
  def zeros_like(self, **kw) -> Tensor: return Tensor.zeros(*self.shape, dtype=kw.pop("dtype", self.dtype), device=self.device, **kw)
  def ones_like(self, **kw) -> Tensor: return Tensor.ones(*self.shape, dtype=kw.pop("dtype", self.dtype), device=self.device, **kw)
  def full_like(self, value, **kw) -> Tensor: return Tensor.full(self.shape, value, dtype=kw.pop("dtype", self.dtype), device=self.device, **kw)
  def rand_like(self, **kw) -> Tensor: return Tensor.rand(*self.shape, dtype=kw.pop("dtype", self.dtype), device=self.device, **kw)
  def randn_like(self, **kw) -> Tensor: return Tensor.randn(*self.shape, dtype=kw.pop("dtype", self.dtype), device=self.device, **kw)

  # ---- broadcasting and promotion
  def _scalar_dtype(self, v) -> DType:
    if isinstance(v, bool): return self.dtype
    if isinstance(v, float) and not self.dtype.is_float: return dtypes.f32
    if isinstance(v, int) and self.dtype is dtypes.bool: return dtypes.i32
    return self.dtype

  def _operands(self, other, reverse: bool = False) -> tuple[UOp, UOp, list[Tensor]]:
    """Both operands as UOps of one shape and dtype: python scalars adopt this tensor's dtype, tensors promote."""
    if isinstance(other, Tensor):
      d = _promote(self.dtype, other.dtype)
      shape = broadcast_shape(self.shape, other.shape)
      a, b = self.cast(d)._broadcast_to(shape).uop, other.cast(d)._broadcast_to(shape).uop
      parents = [self, other]
    else:
      if isinstance(other, np.ndarray) or isinstance(other, (list, tuple)): return self._operands(Tensor(other, device=self.device), reverse)
      if not isinstance(other, (int, float, bool, np.number, np.bool_)): raise TensorError(f"can't combine a Tensor with {type(other).__name__}")
      other = other.item() if isinstance(other, (np.number, np.bool_)) else other
      d = self._scalar_dtype(other)
      if d is dtypes.i32 and isinstance(other, int) and not I32_MIN <= other <= I32_MAX:
        raise TensorError(f"the python int {other} doesn't fit the tensor's i32 (it would wrap); use a float or a smaller value")
      a = self.cast(d).uop
      b = a.const_like(other)
      parents = [self]
    return (b, a, parents) if reverse else (a, b, parents)

  def _broadcast_to(self, shape: tuple[int, ...]) -> Tensor:
    if self.shape == shape: return self
    if len(shape) < self.ndim: raise TensorError(f"can't broadcast {self.shape} to {shape}")
    t = self.reshape((1,) * (len(shape) - self.ndim) + self.shape) if self.ndim < len(shape) else self
    for a, b in zip(t.shape, shape):
      if a != b and a != 1: raise TensorError(f"can't broadcast {self.shape} to {shape}")
    return t if t.shape == shape else t._new(t.uop.expand(shape))

  def _binop(self, op: Ops, other, reverse: bool = False) -> Tensor:
    a, b, parents = self._operands(other, reverse)
    return self._new(UOp(op, (a, b)), *parents)

  # ---- elementwise
  def __add__(self, x): return self._binop(Ops.ADD, x)
  def __radd__(self, x): return self._binop(Ops.ADD, x, True)
  def __mul__(self, x): return self._binop(Ops.MUL, x)
  def __rmul__(self, x): return self._binop(Ops.MUL, x, True)
  def __sub__(self, x):
    a, b, parents = self._operands(x)
    return self._new(a - b, *parents)
  def __rsub__(self, x):
    a, b, parents = self._operands(x, True)
    return self._new(a - b, *parents)
  def __neg__(self): return self._new(-self.uop) if self.dtype is not dtypes.bool else self.logical_not()
  def __truediv__(self, x):
    a, b, parents = (self.float() if not self.dtype.is_float else self)._operands(x if not isinstance(x, Tensor) or x.dtype.is_float else x.float())
    return self._new(a * b.recip(), *parents)
  def __rtruediv__(self, x):
    t = self.float() if not self.dtype.is_float else self
    a, b, parents = t._operands(x, True)
    return self._new(a * b.recip(), *parents)
  def __floordiv__(self, x):
    a, b, parents = self._operands(x)
    if a.dtype is dtypes.i32: return self._new(a // b, *parents)
    return self._new(a, *parents)._float_floordiv(self._new(b, *parents))
  def __rfloordiv__(self, x):
    a, b, parents = self._operands(x, True)
    return self._new(a, *parents).__floordiv__(self._new(b, *parents))
  def __mod__(self, x):
    a, b, parents = self._operands(x)
    if a.dtype is dtypes.i32: return self._new(a % b, *parents)
    ta, tb = self._new(a, *parents), self._new(b, *parents)
    # a - q*b as one fused multiply-add: rounded once, it is NumPy's fmod-based remainder (rounded twice, 6 in 10 random
    # cases were off by an ulp or more); x % inf is x when the signs agree (0 * inf would be nan). Gradients: 1 and -q
    a32, b32 = (ta, tb) if ta.dtype is dtypes.f32 else (ta.float(), tb.float())
    r = ta._new(UOp(Ops.MULACC, ((-ta._float_floordiv(tb).float()).uop, b32.uop, a32.uop)), ta, tb).cast(ta.dtype)
    return ta._finite_by_infinite(tb, same_sign=True).where(ta, r)
  def _finite_by_infinite(self, b: Tensor, same_sign: bool) -> Tensor:
    """Where self is finite and b infinite, and their signs agree (or self is 0) or differ, as asked."""
    mixed = (self * b) < 0                                   # 0 * inf is nan: a zero counts as agreeing
    return ((self - self).eq(0) & b.abs().eq(math.inf)) & (mixed.logical_not() if same_sign else mixed)
  def __rmod__(self, x):
    a, b, parents = self._operands(x, True)
    return self._new(a, *parents).__mod__(self._new(b, *parents))
  def _float_floordiv(self, other: Tensor) -> Tensor:
    """floor(self / other) on floats. self * (1/other) can land an ulp below an exact integer quotient (49 * (1/49) < 1),
    so the floor moves by one where the remainder falls outside [0, other) ((other, 0] for a negative divisor). The
    remainder is a fused multiply-add, rounded once: a - q*b rounded twice hid it (1 // 0.1 was 10; NumPy says 9)."""
    a, b = (self, other) if self.dtype is dtypes.f32 else (self.float(), other.float())
    q = (a / b).floor()
    r = a._new(UOp(Ops.MULACC, ((-q).uop, b.uop, a.uop)))
    pos = b > 0
    q = pos.where(r >= b, r <= b).where(q + 1, pos.where(r < 0, r > 0).where(q - 1, q))
    # NumPy's floor division goes through fmod, so inf // b is nan (b != 0) and x // inf is -1 when the signs differ (the
    # floor of -0.0...); found by the fuzzer
    q = (a.abs().eq(math.inf) & b.ne(0)).where(float("nan"), a._finite_by_infinite(b, same_sign=False).where(-1.0, q))
    # piecewise constant: no gradient (so a % b has torch's gradients 1 and -(a // b))
    return q.cast(self.dtype if self.dtype.is_float else dtypes.f32)._stop_gradient()
  def __pow__(self, x): return self.pow(x)
  def __rpow__(self, x): return self.pow(x, reverse=True)
  def __matmul__(self, x): return self.matmul(x)
  def __rmatmul__(self, x): return Tensor(x, device=self.device).matmul(self)
  def __lt__(self, x): return self._binop(Ops.CMPLT, x)
  def __gt__(self, x): return self._binop(Ops.CMPLT, x, True)
  # not(x > y) is wrong for NaN (nan <= 1 is false), so floats compare as (x < y) | (x == y)
  def __le__(self, x): return (self < x) | self.eq(x) if self._float_compare(x) else (self > x).logical_not()
  def __ge__(self, x): return (self > x) | self.eq(x) if self._float_compare(x) else (self < x).logical_not()
  def _float_compare(self, x) -> bool: return self.dtype.is_float or isinstance(x, float) or (isinstance(x, Tensor) and x.dtype.is_float)
  def __eq__(self, x): return self.ne(x).logical_not()   # type: ignore[override]
  def __ne__(self, x): return self.ne(x)                 # type: ignore[override]
  def ne(self, x) -> Tensor: return self._binop(Ops.CMPNE, x)
  def eq(self, x) -> Tensor: return self.ne(x).logical_not()
  def logical_not(self) -> Tensor: return self._new(self.cast(dtypes.bool).uop.ne(True))
  def logical_and(self, x) -> Tensor: return self.bool() & (x.bool() if isinstance(x, Tensor) else bool(x))
  def logical_or(self, x) -> Tensor: return self.bool() | (x.bool() if isinstance(x, Tensor) else bool(x))
  def logical_xor(self, x) -> Tensor: return self.bool() ^ (x.bool() if isinstance(x, Tensor) else bool(x))

  # ---- bits: & | ^ ~ << >> are logical on bool and bitwise on i32, as in PyTorch
  def _bitwise(self, x, op: str, reverse: bool = False) -> Tensor:
    """a & b, a | b, a ^ b. The IR has no bit operations, so an i32 is taken apart into its 32 bits (bit k is
    floor(v / 2**k) mod 2, which is two's complement's bit k for negative v too; bit 31 is v < 0), the bits are combined,
    and the word is summed back with weights 2**k and -2**31 for bit 31 (no partial sum of those can overflow)."""
    a, b, parents = self._operands(x, reverse)
    if a.dtype.is_float: raise TensorTypeError(f"{op} needs bool or integer tensors, got {a.dtype.name}")
    if a.dtype is dtypes.bool:
      return self._new({"&": a * b, "|": UOp(Ops.ADD, (a, b)), "^": a.ne(b)}[op], *parents)
    ta, tb = self._new(a), self._new(b)
    weights = Tensor(_POW2_I32, device=self.device)
    ba, bb = ta._bits(), tb._bits()
    bits = {"&": ba * bb, "|": ba.maximum(bb), "^": ba.ne(bb).int()}[op]
    return self._new((bits * weights).sum(-1).uop, *parents)
  def _bits(self) -> Tensor:
    """The 32 bits of an i32 tensor as a new last axis of 0/1 i32s, bit 0 first."""
    low = Tensor(_POW2_I32[:31], device=self.device)
    return ((self.unsqueeze(-1) // low) % 2).cat((self < 0).int().unsqueeze(-1), dim=-1)
  def __and__(self, x): return self._bitwise(x, "&")
  def __or__(self, x): return self._bitwise(x, "|")
  def __xor__(self, x): return self._bitwise(x, "^")
  def __rand__(self, x): return self._bitwise(x, "&", True)
  def __ror__(self, x): return self._bitwise(x, "|", True)
  def __rxor__(self, x): return self._bitwise(x, "^", True)
  bitwise_and, bitwise_or, bitwise_xor = __and__, __or__, __xor__
  def __invert__(self) -> Tensor:
    if self.dtype.is_float: raise TensorTypeError(f"~ needs a bool or integer tensor, got {self.dtype.name}")
    return self.logical_not() if self.dtype is dtypes.bool else -1 - self   # ~v is -1 - v in two's complement, and never overflows
  bitwise_not = __invert__
  def _shift_operands(self, x, op: str) -> tuple[Tensor, Tensor | int]:
    if self.dtype is not dtypes.i32 or (isinstance(x, Tensor) and x.dtype is not dtypes.i32) or isinstance(x, (float, bool)):
      raise TensorTypeError(f"{op} shifts i32 tensors by integers, got {self.dtype.name} {op} {x.dtype.name if isinstance(x, Tensor) else repr(x)}")
    if not isinstance(x, Tensor) and not 0 <= x < 32: raise TensorError(f"{op}: shift by {x}, expected 0 to 31")
    return self, x
  def _pow2(self) -> Tensor:
    """2**self for an i32 tensor of shift amounts in 0..31 (2**31 wraps to -2**31): a table lookup."""
    table = Tensor(_POW2_I32, device=self.device)
    return (self.unsqueeze(-1).eq(Tensor.arange(32, device=self.device))).where(table, 0).sum(-1)
  def __lshift__(self, x) -> Tensor:
    """self * 2**x, wrapping like the i32 it is."""
    t, x = self._shift_operands(x, "<<")
    return t * (x._pow2() if isinstance(x, Tensor) else (1 << x if x < 31 else I32_MIN))
  def __rshift__(self, x) -> Tensor:
    """The arithmetic shift: floor(self / 2**x) (by 31: -1 for negative values, 0 for the rest)."""
    t, x = self._shift_operands(x, ">>")
    if not isinstance(x, Tensor): return t // (1 << x) if x < 31 else -(t < 0).int()
    return x.eq(31).where(-(t < 0).int(), t // x.minimum(30)._pow2())
  lshift, rshift, bitwise_left_shift, bitwise_right_shift = __lshift__, __rshift__, __lshift__, __rshift__

  def cast(self, dtype) -> Tensor:
    if dtype is None: raise TensorError("cast needs a dtype, got None")
    d = _to_dtype(dtype)
    return self if d is self.dtype else self._new(self.uop.cast(d))
  def float(self) -> Tensor: return self.cast(dtypes.f32)
  def half(self) -> Tensor: return self.cast(dtypes.f16)
  def int(self) -> Tensor: return self.cast(dtypes.i32)
  def bool(self) -> Tensor: return self.cast(dtypes.bool)
  def to(self, *args, device: str | None = None, dtype=None) -> Tensor:
    """torch's Tensor.to: a backend's name moves the tensor there (`.to("PYTHON")`), a dtype casts (`.to(dtypes.f16)`,
    `.to("f16")`), a Tensor gives its device and dtype, and to(device, dtype) does both. A str names a dtype when it is
    one, else a backend ("unknown dtype 'PYTHON'" was the error: `to` was cast alone)."""
    if len(args) > 2: raise TensorError(f"to: takes a device, a dtype or a tensor (and dtype=, device=), got {len(args)} arguments")
    for a in args:
      if isinstance(a, Tensor): device, dtype = device or a.device, dtype or a.dtype
      elif isinstance(a, str) and dtype is None and _dtype_name(a) is not None: dtype = _dtype_name(a)
      elif isinstance(a, str) and device is None: device = a
      elif a is None: raise TensorError("to: None is neither a device nor a dtype")
      elif dtype is None and not isinstance(a, str): dtype = a
      else: raise TensorError(f"to: {a!r} given with device={device!r} and dtype={dtype!r}: one device and one dtype at most")
    t = self.cast(dtype) if dtype is not None else self
    return t._moved(device) if device is not None else t
  def _moved(self, device: str) -> Tensor:
    """The same value on the backend `device`: realized here, read back, and copied in there (no kernel runs across two
    backends). A tensor that requires a gradient isn't moved: its gradient can't flow back across backends."""
    if not isinstance(device, str): raise TensorError(f"to: a device is a backend's name (a str), got {device!r}")
    try: get_backend(device)
    except BackendError as e: raise TensorError(f"to: {device!r} is neither a dtype nor a backend ({e})") from None
    if device.strip().upper() == self.device: return self
    if self.requires_grad:
      raise TensorError(f"to({device!r}): this tensor requires a gradient, which can't flow back from another backend; copy "
                        f"the values alone with Tensor(t.numpy(), device={device!r}) (and requires_grad_() the copy there)")
    return Tensor(self.numpy(), dtype=self.dtype, device=device)

  def _float_unary(self, op: Ops) -> Tensor:
    x = self if self.dtype.is_float else self.float()
    return self._new(UOp(op, (x.uop,)))
  def recip(self) -> Tensor: return self._float_unary(Ops.RECIP)
  def exp2(self) -> Tensor: return self._float_unary(Ops.EXP2)
  def log2(self) -> Tensor: return self._float_unary(Ops.LOG2)
  def sqrt(self) -> Tensor: return self._float_unary(Ops.SQRT)
  def sin(self) -> Tensor: return self._float_unary(Ops.SIN)
  @_f16_in_f32
  def exp(self) -> Tensor: return (self * (1 / math.log(2))).exp2()
  @_f16_in_f32
  def log(self) -> Tensor: return self.log2() * math.log(2)
  @_f16_in_f32
  def rsqrt(self) -> Tensor: return self.sqrt().recip()
  def _quarter_turns(self) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """(in_range, q mod 4, sin r, cos r) for x = q pi/2 + r, |r| <= pi/4, where |x| <= TRIG_REDUCE_MAX (elsewhere x reads 0).
    r comes from Cody and Waite's reduction by pi/2 split into three f32s (PIO2_PARTS), each step one fused multiply-add:
    q * C1 is exact (C1 has 12 bits, q < 2^12), x - q * C1 then too (the two are within a factor 2), and the later parts
    add the bits an f32 pi/2 lacks, so r is right to its last bits even beside a zero of cos (the f32 nearest pi/2 is
    4.4e-8 past it, where cos is -4.4e-8: subtracting an f32 pi/2 alone gives 0). |r| <= pi/4 keeps cos r >= 0.7, so
    1 - 2 sin(r/2)^2 can't cancel."""
    x = self.float()
    near = x.abs() <= TRIG_REDUCE_MAX
    xs = near.where(x, 0.0)   # a safe input where the reduction isn't used: no NaN from inf in its backward pass
    q = (xs * (2 / math.pi)).round()   # piecewise constant: no gradient
    r = xs
    for part in PIO2_PARTS: r = r._new(UOp(Ops.MULACC, ((-q).uop, r.uop.const_like(part), r.uop)), r)
    r = q.eq(0).where(xs, r)   # x itself within pi/4 of 0 (0 * C + -0.0 is +0.0: tan(-0.0) is -0.0)
    half = (r * 0.5).sin()
    return near, q - 4 * (q * 0.25).floor(), r.sin(), 1 - 2 * half * half
  @_f16_in_f32
  def cos(self) -> Tensor:
    """cos of the reduced argument (see _quarter_turns) up to TRIG_REDUCE_MAX; past it 1 - 2 sin(x/2)^2 (halving is exact and
    sinf reduces a large argument exactly; sin(x + pi/2) rounded x + pi/2 first, which at |x| = 1e6 was 5% off)."""
    near, quarter, s, c = self._quarter_turns()
    h = (self * 0.5).sin()
    far = 1 - 2 * h * h
    return near.where(quarter.eq(0).where(c, quarter.eq(1).where(-s, quarter.eq(2).where(-c, s))), far)
  @_f16_in_f32
  def tan(self) -> Tensor:
    """sin r / cos r, or -cos r / sin r an odd number of quarter turns away (see _quarter_turns): accurate beside the poles
    too, where sin(x) / cos(x) divided by a cos that 1 - 2 sin(x/2)^2 had cancelled to its last bits (27% off at 1e-7 from
    pi/2). Past TRIG_REDUCE_MAX, sin(x) / cos(x)."""
    near, quarter, s, c = self._quarter_turns()
    odd = (quarter.eq(1) | quarter.eq(3))
    far = self.sin() / self.cos()
    return near.where(odd.where(-c / odd.where(s, 1.0), s / c), far)
  @_f16_in_f32
  def sigmoid(self) -> Tensor:
    # 1/(1+e^-x) for x >= 0 and e^x/(1+e^x) below, both through e = e^-|x| <= 1: no exp overflows, so neither the value
    # nor the gradient (which would meet 0 * inf in the plain form for x below about -88) is ever NaN
    x = self.float()
    pos = x >= 0
    e = pos.where(-x, x).exp()
    r = (1.0 + e).recip()
    return pos.where(r, e * r)
  @_f16_in_f32
  def tanh(self) -> Tensor:
    """-expm1(-2|x|) / (2 + expm1(-2|x|)) with x's sign: nothing overflows, and near 0 no cancellation (2 sigmoid(2x) - 1
    was 7% off at x = 1e-6 and 150% at 5e-8, where sigmoid is 1/2 plus a few of its last bits)."""
    x = self.float()
    neg = x < 0
    t = (-2 * neg.where(-x, x)).expm1()   # |x| with slope 1 at 0 (abs would split it)
    r = -t / (t + 2)
    return neg.where(-r, r)
  def relu(self) -> Tensor: return ((self > 0) | self.ne(self)).where(self, 0) if self.dtype.is_float else (self > 0).where(self, 0)   # NaN stays
  def leaky_relu(self, neg_slope: float = 0.01) -> Tensor: return (self > 0).where(self, self * neg_slope)
  @_f16_in_f32
  def gelu(self, approximate: str = "tanh") -> Tensor:
    """GELU: the tanh approximation by default (DESIGN 6.2), x * Phi(x) through erf with approximate="none"."""
    if approximate == "none": return 0.5 * self * (1 + (self * (1 / math.sqrt(2))).erf())
    if approximate != "tanh": raise TensorTypeError(f"gelu: approximate must be 'tanh' or 'none', got {approximate!r}")
    # 0.5 x (1 + tanh(u)) as x sigmoid(2u), the same function: 1 + tanh(u) cancelled for negative x (gelu(-5.5) was 0)
    return self * (2 * math.sqrt(2 / math.pi) * (self + 0.044715 * self * self * self)).sigmoid()
  @_f16_in_f32
  def silu(self) -> Tensor: return self * self.sigmoid()
  def abs(self) -> Tensor:
    # MAX splits ties, so the gradient at 0 is 0, as in torch; max(0.0, -0.0) is -0.0, and + 0.0 makes it +0.0, so that
    # 1 / abs(0.0) is inf as in NumPy (the fuzzer found -inf)
    return self.maximum(-self) + 0.0 if self.dtype.is_float else self.maximum(-self)
  def sign(self) -> Tensor:
    s = (self > 0).where(1, (self < 0).where(-1, 0)).cast(self.dtype)
    return self.ne(self).where(self, s) if self.dtype.is_float else s   # sign(nan) is nan (the fuzzer found 0)
  def square(self) -> Tensor: return self * self
  def maximum(self, x) -> Tensor: return self._binop(Ops.MAX, x)
  def minimum(self, x) -> Tensor:
    a, b, parents = self._operands(x)   # promote first: minimum(bool tensor, 3) compares integers, as torch does
    return self._new(a, *parents)._inverse().maximum(self._new(b, *parents)._inverse())._inverse()
  def _inverse(self) -> Tensor:
    """An order-reversing bijection, its own inverse: -x on floats, ~x = -1 - x on integers (-x overflows at INT_MIN), not
    on bools. min is max under it, argmin is argmax."""
    if self.dtype.is_float: return -self
    return self.logical_not() if self.dtype is dtypes.bool else -1 - self
  def clip(self, min_=None, max_=None) -> Tensor:
    # WHERE, not maximum/minimum: torch.clamp gives self the whole gradient on a bound too (MAX would split the tie),
    # and a NaN stays NaN. A NaN bound gives NaN as in torch.clamp (t < nan is false, so it was ignored)
    if min_ is None and max_ is None: raise TensorError("clip: give min_, max_ or both (torch.clamp refuses neither too)")
    t = self
    for bound, beyond in ((min_, Tensor.__lt__), (max_, Tensor.__gt__)):
      if bound is None: continue
      if isinstance(bound, (np.ndarray, list, tuple)): bound = Tensor(bound, device=self.device)
      if isinstance(bound, Tensor): t = (beyond(t, bound) | bound.isnan()).where(bound, t)
      elif isinstance(bound, (float, np.floating)) and math.isnan(bound): t = t.ne(t).where(t, math.nan)   # NaN everywhere, t kept for its 0 gradient
      else: t = beyond(t, bound).where(bound, t)
    return t
  clamp = clip
  def trunc(self) -> Tensor:
    if not self.dtype.is_float: return self
    # floats of magnitude 2**23 and more (and inf, nan) are integers already, and don't survive the round trip through i32
    # (piecewise constant: no gradient, as in torch)
    return (self.abs() < 2**23).where(self.cast(dtypes.i32).cast(self.dtype), self)._stop_gradient()
  def floor(self) -> Tensor:
    if not self.dtype.is_float: return self
    t = self.trunc()
    return (self < t).where(t - 1, t)
  def ceil(self) -> Tensor:
    if not self.dtype.is_float: return self
    t = self.trunc()
    return (self > t).where(t + 1, t)
  def round(self) -> Tensor:
    """Half to even, like torch.round and numpy.round (floor(x + 0.5) would also be off where x + 0.5 rounds up to an integer)."""
    if not self.dtype.is_float: return self
    f = self.floor()
    d = self - f   # exact
    odd = ((f * 0.5).floor() * 2).ne(f)
    return ((d > 0.5) | (d.eq(0.5) & odd)).where(f + 1, f)

  # ---- torch's names for the arithmetic above
  def add(self, x, alpha=1) -> Tensor: return self + (x * alpha if alpha != 1 else x)
  def sub(self, x, alpha=1) -> Tensor: return self - (x * alpha if alpha != 1 else x)
  def mul(self, x) -> Tensor: return self * x
  def neg(self) -> Tensor: return -self
  def reciprocal(self) -> Tensor: return self.recip()
  def clone(self) -> Tensor: return self.contiguous()   # a copy of its own: writing into one doesn't show in the other
  def mod(self, x) -> Tensor: return self % x
  remainder = mod
  def div(self, x, rounding_mode: str | None = None) -> Tensor:
    """self / x: true division (rounding_mode None), rounded toward zero ("trunc") or down ("floor"). Integers stay
    integers under trunc and floor, as in torch."""
    if rounding_mode is None: return self / x
    if rounding_mode not in ("trunc", "floor"):
      raise TensorTypeError(f"div: rounding_mode must be None, 'trunc' or 'floor', got {rounding_mode!r}")
    a, b, parents = self._operands(x)
    ta, tb = self._new(a, *parents), self._new(b, *parents)
    if rounding_mode == "floor": return ta // tb
    if a.dtype.is_float: return (ta / tb).trunc()
    q = ta // tb   # floor; trunc is one more where the exact quotient is negative and not whole
    return ((ta % tb).ne(0) & ((ta < 0).ne(tb < 0))).where(q + 1, q)
  divide = div
  def fmod(self, x) -> Tensor:
    """C's fmod: the remainder of the division rounded toward zero, with self's sign (% takes the divisor's)."""
    a, b, parents = self._operands(x)
    ta, tb = self._new(a, *parents), self._new(b, *parents)
    r = ta % tb
    r = (r.ne(0) & ((r < 0).ne(ta < 0))).where(r - tb, r)
    # by an infinity the remainder is self itself (% gives the infinity where the signs differ, and r - tb was inf - inf)
    return ta._finite_by_infinite(tb, same_sign=False).where(ta, r) if r.dtype.is_float else r
  @_f16_in_f32
  def lerp(self, end, weight) -> Tensor:
    """self + weight * (end - self); from the end for weights of 1/2 and more, as torch does (exact at weight 1)."""
    w = weight if isinstance(weight, Tensor) else Tensor.full((), float(weight), device=self.device)
    return (w < 0.5).where(self + w * (end - self), end - (end - self) * (1 - w))

  # ---- floating point classes and comparisons
  def isnan(self) -> Tensor: return self.ne(self)
  def isinf(self, detect_positive: bool = True, detect_negative: bool = True) -> Tensor:
    t = self.float() if not self.dtype.is_float else self
    if detect_positive and detect_negative: return t.eq(float("inf")) | t.eq(float("-inf"))
    if detect_positive or detect_negative: return t.eq(float("inf") if detect_positive else float("-inf"))
    return Tensor.zeros(*self.shape, dtype=dtypes.bool, device=self.device)
  def isfinite(self) -> Tensor:
    if not self.dtype.is_float: return self.ne(self).logical_not()
    return (self - self).eq(0)   # inf - inf and nan - nan are nan
  def isclose(self, other, rtol: float = 1e-05, atol: float = 1e-08, equal_nan: bool = False) -> Tensor:
    """|self - other| <= atol + rtol * |other|, elementwise, as torch.isclose (equal infinities are close, NaN is not unless
    equal_nan)."""
    other = other if isinstance(other, Tensor) else Tensor.full((), other, device=self.device)
    close = self.eq(other)
    if equal_nan: close = close | (self.isnan() & other.isnan())
    err = (self - other).abs()
    return close | (err.isfinite() & (err <= atol + (rtol * other).abs()))
  def allclose(self, other, rtol: float = 1e-05, atol: float = 1e-08, equal_nan: bool = False) -> bool:
    return bool(self.isclose(other, rtol, atol, equal_nan).all().item())
  @_f16_in_f32
  def copysign(self, other) -> Tensor:
    """|self| with other's sign, -0.0 included (1 / -0.0 is -inf). torch's gradient: sign(self) * sign(result), 0 at 0."""
    other = other if isinstance(other, Tensor) else Tensor.full((), float(other), device=self.device)
    x = self if self.dtype.is_float else self.float()
    neg = (other < 0) | (other.float().recip() < 0)
    x_neg = (x < 0) | (x.recip() < 0)
    mag = x_neg.where(-x, x)
    return x.eq(0).where(neg.where(-0.0, 0.0), neg.where(-mag, mag))

  # ---- more exponentials and logarithms
  @_f16_in_f32
  def log10(self) -> Tensor: return self.log2() * (math.log(2) / math.log(10))
  @_f16_in_f32
  def log1p(self) -> Tensor:
    """log(1 + x), accurate near 0: there log(1 + x) loses the low bits of x, so a series takes over."""
    x = self if self.dtype.is_float else self.float()
    small = x.abs() < 0.1
    xs = small.where(x, 0.0)
    series = xs * (1 - xs * (1 / 2 - xs * (1 / 3 - xs * (1 / 4 - xs * (1 / 5 - xs * (1 / 6 - xs * (1 / 7 - xs * (1 / 8 - xs / 9))))))))
    return small.where(series, (1 + small.where(0.0, x)).log())
  @_f16_in_f32
  def expm1(self) -> Tensor:
    """e^x - 1, accurate near 0: a series up to |x| = 1/2 (its first term left out, x^9/9!, is 1e-8 of the value there;
    e^x - 1 cancels, 6e-7 off at 0.1)."""
    x = self if self.dtype.is_float else self.float()
    small = x.abs() < 0.5
    xs = small.where(x, 0.0)
    series = xs * (1 + xs * (1 / 2 + xs * (1 / 6 + xs * (1 / 24 + xs * (1 / 120 + xs * (1 / 720 + xs * (1 / 5040 + xs / 40320)))))))
    return small.where(series, small.where(0.0, x).exp() - 1)
  @_f16_in_f32
  def logaddexp(self, other) -> Tensor:
    """log(e^self + e^other), shifted by the larger so nothing overflows."""
    other = other if isinstance(other, Tensor) else Tensor.full((), float(other), device=self.device)
    m = self.maximum(other)._stop_gradient()
    m = m.isinf().where(0.0, m)   # both -inf (or an inf): no shift, the log of the sum is the answer
    return ((self - m).exp() + (other - m).exp()).log() + m
  @_f16_in_f32
  def logsumexp(self, axis=None, keepdim: bool = False) -> Tensor:
    """log(sum(exp(self))) over axis, shifted by the (detached) max so nothing overflows; over nothing it is log 0 = -inf."""
    if prod(self.shape[a] for a in self._axes(axis)) == 0: m = self.sum(axis, keepdim=True)._stop_gradient()   # no max to take: no shift
    else: m = self.max(axis, keepdim=True)._stop_gradient()
    m = m.isinf().where(0.0, m)
    out = (self - m).exp().sum(axis, keepdim=True).log() + m
    return out if keepdim else out.reshape(tuple(n for k, n in enumerate(self.shape) if k not in self._axes(axis)))

  # ---- hyperbolic and inverse trigonometric functions
  def _half_exp(self) -> Tensor:
    """e^x / 2 for x >= 0 as (e^(x/2))^2 / 2, finite wherever the result is: e^x itself overflows past 88.7, where sinh
    and cosh (to 89.4) don't yet."""
    h = (self * 0.5).exp()
    return h * (h * 0.5)
  @_f16_in_f32
  def sinh(self) -> Tensor:
    """(expm1(x) - expm1(-x)) / 2, and sign(x) e^|x| / 2 past |x| = 20 (where e^-|x| is below the last bit)."""
    x = self if self.dtype.is_float else self.float()
    big = x.abs() > 20
    xs = big.where(0.0, x)   # each branch reads a safe value where the other is taken: no inf * 0 in the backward pass
    xb = big.where(x, 20.0)
    far = (xb < 0).where(-(-xb)._half_exp(), xb._half_exp())
    return big.where(far, (xs.expm1() - (-xs).expm1()) * 0.5)
  @_f16_in_f32
  def cosh(self) -> Tensor:
    """(e^x + e^-x) / 2, and e^|x| / 2 past |x| = 20."""
    x = self if self.dtype.is_float else self.float()
    big = x.abs() > 20
    xs = big.where(0.0, x)
    e = xs.exp()
    return big.where(big.where(x.abs(), 20.0)._half_exp(), (e + e.recip()) * 0.5)
  @_f16_in_f32
  def atan(self) -> Tensor:
    """Cephes' atanf: |x| is reduced into [0, tan(pi/8)] (through 1/|x| above 1 and (t-1)/(t+1) above tan(pi/8)) and a
    polynomial finishes (error ~1e-7). Every reduction reads a safe input where it isn't taken, so no unused branch is NaN
    in the backward pass."""
    x = self if self.dtype.is_float else self.float()
    neg = x < 0
    a = neg.where(-x, x)   # |x| with slope 1 at 0 (abs would split it)
    big = a > 1
    t = big.where(big.where(a, 1.0).recip(), a)                       # in [0, 1]
    mid = t > 0.4142135623730950
    u = mid.where((t - 1) / (t + 1), t)                               # in [-tan(pi/8), tan(pi/8)]
    z = u * u
    r = (((8.05374449538e-2 * z - 1.38776856032e-1) * z + 1.99777106478e-1) * z - 3.33329491539e-1) * z * u + u
    r = mid.where(r + math.pi / 4, r)
    r = big.where(math.pi / 2 - r, r)
    return neg.where(-r, r)
  @_f16_in_f32
  def asin(self) -> Tensor:
    """atan(x / sqrt(1 - x^2)), with torch's slope 1 / sqrt(1 - x^2) attached (through atan it was inf * 0 = NaN at +-1)."""
    x = self if self.dtype.is_float else self.float()
    xd = x._stop_gradient()
    return (xd / ((1 - xd) * (1 + xd)).sqrt()).atan()._with_gradient((x, ((1 - xd) * (1 + xd)).sqrt().recip()))
  @_f16_in_f32
  def acos(self) -> Tensor:
    """2 atan(sqrt((1 - x) / (1 + x))), with asin's slope negated: pi/2 - asin(x) cancelled near x = 1 (1e-4 off at
    0.99999994, where acos is 3.5e-4)."""
    x = self if self.dtype.is_float else self.float()
    xd = x._stop_gradient()
    return (2 * ((1 - xd) / (1 + xd)).sqrt().atan())._with_gradient((x, -((1 - xd) * (1 + xd)).sqrt().recip()))
  @_f16_in_f32
  def asinh(self) -> Tensor:
    """A series near 0, log(a + sqrt(a^2 + 1)) in the middle and log(a) + log(2) past 2^12, where a^2 + 1 is a^2 in f32
    (a^2 overflowed past 1.8e19, so asinh(1e30) was inf, not 69.77)."""
    x = self if self.dtype.is_float else self.float()
    neg = x < 0
    a = neg.where(-x, x)
    small, big = a < 0.1, a > 2.0**12   # log(a + sqrt(a^2 + 1)) loses a's low bits near 0, where the series is exact
    s = small.where(a, 0.0)             # each branch reads a safe value where another is taken (no inf * 0 backward)
    m = (small | big).where(1.0, a)
    z = s * s
    far = big.where(a, 1.0).log() + math.log(2)
    r = small.where(s * (1 - z * (1 / 6 - z * (3 / 40 - z * 15 / 336))), big.where(far, (m + (m * m + 1).sqrt()).log()))
    return neg.where(-r, r)
  @_f16_in_f32
  def acosh(self) -> Tensor:
    """log1p(d + sqrt(d (x + 1))) with d = x - 1 (exact near 1, where x^2 - 1 lost the low bits), and log(x) + log(2) past
    2^12 (x^2 overflowed past 1.8e19)."""
    x = self if self.dtype.is_float else self.float()
    big = x > 2.0**12
    m = big.where(2.0, x)
    d = m - 1
    return big.where(big.where(x, 2.0).log() + math.log(2), (d + (d * (m + 1)).sqrt()).log1p())
  @_f16_in_f32
  def atanh(self) -> Tensor: return (self.log1p() - (-self).log1p()) * 0.5
  @_f16_in_f32
  def erf(self) -> Tensor:
    """A series below 0.5 and Abramowitz & Stegun 7.1.26 above (error < 1.5e-7), with the exact gradient
    2/sqrt(pi) e^(-x^2) attached (the approximation's own derivative is less accurate than its value)."""
    x = self if self.dtype.is_float else self.float()
    xd = x._stop_gradient()
    a = (xd < 0).where(-xd, xd)
    small = a < 0.5
    s = small.where(a, 0.0)
    z = s * s
    series = s * (2 / math.sqrt(math.pi)) * (1 - z * (1 / 3 - z * (1 / 10 - z * (1 / 42 - z * (1 / 216 - z / 1320)))))
    t = (1 + 0.3275911 * a).recip()
    poly = ((((1.061405429 * t - 1.453152027) * t + 1.421413741) * t - 0.284496736) * t + 0.254829592) * t
    y = small.where(series, 1 - poly * (-a * a).exp())
    return (xd < 0).where(-y, y)._with_gradient((x, (-xd * xd).exp() * (2 / math.sqrt(math.pi))))

  # ---- activations (torch.nn.functional's), each with torch's gradient at its kinks
  def relu6(self) -> Tensor: return self.hardtanh(0.0, 6.0)
  def hardtanh(self, min_val: float = -1.0, max_val: float = 1.0) -> Tensor:
    # the bounds themselves get no gradient (torch's hardtanh_backward), unlike clip's
    return (self <= min_val).where(min_val, (self >= max_val).where(max_val, self))
  @_f16_in_f32
  def hardsigmoid(self) -> Tensor: return ((self + 3) / 6).hardtanh(0.0, 1.0)
  @_f16_in_f32
  def hardswish(self) -> Tensor:
    # torch's gradient: 0 below -3, x/3 + 1/2 in [-3, 3], 1 above
    lo, hi = self <= -3, self >= 3   # torch's slope is 0 at -3 and 1 at 3
    mid = (lo | hi).where(0.0, self)   # the middle piece reads 0 where unused: no inf * 0 in its backward at the infinities
    return lo.where(self * 0, hi.where(self, mid * (mid + 3) / 6))   # -inf * 0: NaN, as torch's x * relu6(x + 3) / 6
  @_f16_in_f32
  def elu(self, alpha: float = 1.0) -> Tensor:
    pos = self > 0
    return pos.where(self, alpha * pos.where(0.0, self).expm1())   # expm1 reads 0 where unused: no inf in its backward
  @_f16_in_f32
  def celu(self, alpha: float = 1.0) -> Tensor:
    pos = self > 0
    return pos.where(self, alpha * (pos.where(0.0, self) / alpha).expm1())
  @_f16_in_f32
  def selu(self) -> Tensor: return 1.0507009873554804934193349852946 * self.elu(1.6732632423543772848170429916717)
  @_f16_in_f32
  def softplus(self, beta: float = 1.0, threshold: float = 20.0) -> Tensor:
    """log(1 + e^(beta x)) / beta, and x itself where beta x > threshold (torch's rule)."""
    bx = self * beta
    lin = bx > threshold
    return lin.where(self, lin.where(0.0, bx).exp().log1p() / beta)
  @_f16_in_f32
  def softsign(self) -> Tensor: return self / (1 + self.abs())
  @_f16_in_f32
  def mish(self) -> Tensor: return self * self.softplus().tanh()
  @_f16_in_f32
  def logsigmoid(self) -> Tensor: return -(-self).softplus()
  @_f16_in_f32
  def quick_gelu(self) -> Tensor: return self * (self * 1.702).sigmoid()
  def swish(self) -> Tensor: return self.silu()

  # ---- pow: PyTorch's values and gradients also at 0, at the infinities and for negative bases
  @_f16_in_f32
  def pow(self, x, reverse: bool = False) -> Tensor:
    """self ** x (x ** self when reverse). An integer exponent is exact repeated squaring (right for negative bases and for
    integer tensors); otherwise the value follows C's pow and the gradients are PyTorch's formulas, attached with
    _with_gradient because differentiating exp2(x * log2 b) gives NaN where torch has 0 or inf (b = 0, b = inf)."""
    if isinstance(x, np.generic): x = x.item()
    if not isinstance(x, (Tensor, int, float)): raise TensorTypeError(f"pow: can't raise to a {type(x).__name__}")
    if not reverse and not isinstance(x, Tensor):
      c = int(x) if isinstance(x, bool) else x
      t = self.int() if self.dtype is dtypes.bool else self
      if not t.dtype.is_float and isinstance(c, int):
        if c < 0: raise TensorError(f"pow: integers to negative integer powers are not allowed ({t.dtype.name} tensor ** {c}), as in PyTorch")
        return t._power_of(c)
      t = t if t.dtype.is_float else t.float()
      if float(c).is_integer() and abs(c) <= 64:
        if c >= -1: return t._power_of(int(c)) if c >= 0 else t.recip()
        # 1 / x**n: its derivative through the products is 0 * inf = NaN at x = 0, where torch has c * 0**(c-1) = inf
        return t._power_of(-int(c)).recip()._with_gradient((t, c * Tensor._pow_value(t, c - 1)))
      if c == 0.5: return t.sqrt()   # as torch computes it (so (-inf) ** 0.5 is NaN); sqrt's gradient is torch's at 0 too
      return Tensor._pow_value(t, c)._with_gradient((t, c * Tensor._pow_value(t, c - 1)))
    base, exp = (self, x) if not reverse else (x, self)
    if isinstance(base, Tensor) and isinstance(exp, Tensor) and not base.dtype.is_float and not exp.dtype.is_float:
      b, e, _ = base._operands(exp)
      return base._new(b, base, exp)._int_pow(base._new(e, base, exp))
    ref = base if isinstance(base, Tensor) else exp
    b, e, _ = (ref.float() if not ref.dtype.is_float else ref)._operands(exp if ref is base else base, reverse=ref is not base)
    b, e = ref._new(b, ref), ref._new(e, ref)
    value = Tensor._pow_value(b, e)
    pairs = []
    # torch: d/db = e * b**(e-1), 0 where e == 0; d/de = b**e * log(b), 0 where b == 0 and e >= 0
    if isinstance(base, Tensor): pairs.append((base, e.eq(0).where(0.0, e * Tensor._pow_value(b, e - 1))))
    if isinstance(exp, Tensor): pairs.append((exp, (b.eq(0) & (e >= 0)).where(0.0, value * b.log())))
    return value._with_gradient(*pairs)

  def _power_of(self, n: int) -> Tensor:
    """self ** n for a python int n >= 0 by repeated squaring: exact on integers, right for negative bases. x ** 0 is 1 but
    keeps x in the graph, so x gets a zero gradient as in torch."""
    if n == 0: return self.ne(self).where(1, 1).cast(self.dtype)
    out, sq = None, self
    while True:
      if n & 1: out = sq if out is None else out * sq
      n >>= 1
      if not n: return out
      sq = sq * sq

  def _int_pow(self, e: Tensor) -> Tensor:
    """self ** e elementwise on i32 tensors: square and multiply over the 31 bits of e (wrapping like i32 products). A
    negative e gives 1 / self**|e| truncated toward zero (torch refuses it): 0 unless self is 1 or -1."""
    out, sq, rest = self.ones_like(), self, e.maximum(0)
    for _ in range(31):
      out = (rest % 2).eq(1).where(out * sq, out)
      sq, rest = sq * sq, rest // 2
    unit = self.eq(1) | self.eq(-1)
    return (e < 0).where(unit.where(self.eq(1).where(1, 1 - 2 * (e % 2)), 0), out)

  @staticmethod
  def _pow_value(b: Tensor, e) -> Tensor:
    """b ** e by C's pow rules (a negative base needs an integral exponent, except -inf; anything ** 0 and 1 ** anything are
    1), as exp2(e * log2|b|), with no gradient of its own: pow attaches PyTorch's. e is a float tensor or a python number."""
    b = b._stop_gradient()
    neg = (b < 0) | (b.recip() < 0)   # -0.0 too, as C's pow: (-0.0) ** -3 is -inf
    mag = (neg.where(-b, b).log2() * (e._stop_gradient() if isinstance(e, Tensor) else e)).exp2()
    if isinstance(e, Tensor):
      e = e._stop_gradient()
      integral, odd = e.eq(e.floor()), ((e * 0.5).floor() * 2).ne(e)
      negative = integral.where(odd.where(-mag, mag), (b.eq(float("-inf")) | b.eq(0)).where(mag, float("nan")))
      return (e.eq(0) | b.eq(1)).where(1.0, neg.where(negative, mag))
    if e == 0: return b.ne(b).where(1.0, 1.0)
    if float(e).is_integer(): negative = -mag if int(e) % 2 else mag
    else: negative = (b.eq(float("-inf")) | b.eq(0)).where(mag, float("nan"))
    return b.eq(1).where(1.0, neg.where(negative, mag))

  def _with_gradient(self, *pairs: tuple[Tensor, Tensor]) -> Tensor:
    """self's value, whose gradient with respect to each x of `pairs` is the paired slope (d self / d x, of self's shape)
    instead of what differentiating self's graph would give. For ops whose PyTorch gradient is a formula of its own at the
    edges (pow at 0 and at infinity, erf): value and slope are computed robustly apart and joined as v + (x - x') * slope,
    x' being x detached: exactly v forward, the slope backward. 0 * slope would be NaN forward for an infinite slope, so
    that goes in as (x - x') * big * big (forward 0, gradient g * big * big = inf for any g above 2^-126), and a NaN slope
    as the difference of two such products (gradient inf - inf). At an infinite x, x - x' is NaN, so there the gradient
    is 0 (where torch's formula may give inf: b ** 3.3 at b = inf): no graph of x has a finite forward value and an
    infinite slope there. Where x is NaN and so is the value, the gradient is NaN, as torch's (a NaN must not vanish in
    the backward pass): a term NaN there and +0.0 elsewhere, subtracted so a -0.0 value keeps its sign."""
    out = self._stop_gradient()
    big = 2.0 ** (127 if out.dtype is dtypes.f32 else 15)
    value_nan = out.isnan()
    for x, slope in pairs:
      xn = x._stop_gradient().isnan() & value_nan
      out = out - (xn.where(x, 0.0) - xn.where(x._stop_gradient(), 0.0)) * xn.where(math.nan, 0.0)
      xd, slope = x._stop_gradient(), slope._stop_gradient()
      finite = xd.isfinite()
      z = (finite.where(x, 0.0) - finite.where(xd, 0.0))._broadcast_to(out.shape)   # 0, with slope 1 in x where x is finite
      inf, nan = slope.isinf(), slope.isnan()
      out = out + z * (inf | nan).where(0.0, slope)
      out = out + (inf.where(z * slope.sign(), 0.0) * big) * big
      zn = nan.where(z, 0.0)
      out = out + ((zn * big) * big - ((zn * 2.0) * big) * (big / 2))
    return out

  def where(self, a, b) -> Tensor:
    """cond.where(a, b): a where self is true, b elsewhere, broadcast together."""
    cond = self.cast(dtypes.bool)
    a, b = (Tensor(x, device=self.device) if isinstance(x, (np.ndarray, list, tuple)) else x for x in (a, b))
    for x in (a, b):
      if not isinstance(x, (Tensor, bool, np.bool_)): _number_arg(x, "where: a branch")   # a bool is a value too (tril of a mask)
    ta = a if isinstance(a, Tensor) else None
    tb = b if isinstance(b, Tensor) else None
    if ta is None and tb is None:
      d = dtypes.from_py(a) if type(a) is type(b) else _promote(dtypes.from_py(a), dtypes.from_py(b))
      ta, tb = Tensor.full((), a, d, device=self.device), Tensor.full((), b, d, device=self.device)
    elif ta is None: ta = Tensor.full((), a, tb._scalar_dtype(a), device=self.device)
    elif tb is None: tb = Tensor.full((), b, ta._scalar_dtype(b), device=self.device)
    d = _promote(ta.dtype, tb.dtype)
    shape = broadcast_shape(cond.shape, ta.shape, tb.shape)
    c, x, y = cond._broadcast_to(shape), ta.cast(d)._broadcast_to(shape), tb.cast(d)._broadcast_to(shape)
    return self._new(UOp(Ops.WHERE, (c.uop, x.uop, y.uop)), ta, tb)

  # ---- reductions
  def _axes(self, axis) -> list[int]:
    """The axes `axis` names (None: all), sorted. A 0-d tensor takes axis 0 and -1 as PyTorch does, and has none to reduce."""
    if axis is None: return list(range(self.ndim))
    axes = sorted({self._dim(a) for a in (axis if isinstance(axis, (tuple, list)) else [axis])})
    return axes if self.ndim else []

  def _dim(self, d: int, extra: int = 0) -> int:
    """Dimension d (negative counts from the end) of a tensor with `extra` more axes; a 0-d tensor has dims 0 and -1."""
    if isinstance(d, bool) or not isinstance(d, (int, np.integer)): raise TensorTypeError(f"a dimension must be an int, got {d!r}")
    n = max(self.ndim + extra, 1)
    if not -n <= d < n: raise TensorIndexError(f"dimension {d} out of range for a tensor of shape {self.shape} (expected {-n} to {n - 1})")
    return int(d) % n

  def _reduce(self, op: Ops, axis=None, keepdim: bool = False) -> Tensor:
    """REDUCE pops the last axes, so the reduced axes are PERMUTEd to the end first (a free index map)."""
    axes = self._axes(axis)
    if not axes: return self   # nothing to reduce (a 0-d tensor, or axis=())
    order = [a for a in range(self.ndim) if a not in axes] + axes
    t = self.permute(order) if order != list(range(self.ndim)) else self
    out = self._new(t.uop.reduce(op, len(axes)))
    if not keepdim: return out
    return out.reshape(tuple(1 if a in axes else n for a, n in enumerate(self.shape)))

  def sum(self, axis=None, keepdim: bool = False, dtype=None) -> Tensor:
    t = self.cast(dtype) if dtype is not None else (self.cast(dtypes.i32) if self.dtype is dtypes.bool else self)
    if t.dtype is dtypes.f16: return t.float()._reduce(Ops.ADD, axis, keepdim).half()   # summed in f32, rounded once (_f16_in_f32)
    return t._reduce(Ops.ADD, axis, keepdim)
  # over an empty axis max and min give their identities (-inf and inf, INT_MIN and INT_MAX), as every reduction does
  # here and in tinygrad (NumPy and PyTorch raise instead)
  def max(self, axis=None, keepdim: bool = False) -> Tensor: return self._reduce(Ops.MAX, axis, keepdim)
  def min(self, axis=None, keepdim: bool = False) -> Tensor: return self._inverse()._reduce(Ops.MAX, axis, keepdim)._inverse()
  def _valued(self, what: str, axis) -> Tensor:
    """An argmax or argmin over nothing has no value (the index INT_MIN would be made up): refused as NumPy and PyTorch
    refuse it."""
    if self.numel() == 0 and prod(self.shape[a] for a in self._axes(axis)) == 0:
      raise TensorError(f"{what} over an axis of size 0 (shape {self.shape}) has no value")
    return self
  @_f16_in_f32
  def mean(self, axis=None, keepdim: bool = False) -> Tensor:
    n = prod(self.shape[a] for a in self._axes(axis))
    return self.float().sum(axis, keepdim) * (1.0 / n if n else float("nan"))
  @_f16_in_f32
  def var(self, axis=None, keepdim: bool = False, correction: int = 1) -> Tensor:
    """The sum of squared deviations over n - correction; with no degrees of freedom left that is a division by 0 (inf,
    or NaN for a zero sum), as in torch."""
    correction = _number_arg(correction, "var: correction")
    n = prod(self.shape[a] for a in self._axes(axis))
    d = self.float() - self.float().mean(axis, keepdim=True)
    return (d * d).sum(axis, keepdim) * (1.0 / (n - correction) if n - correction > 0 else float("inf"))
  @_f16_in_f32
  def std(self, axis=None, keepdim: bool = False, correction: int = 1) -> Tensor: return self.var(axis, keepdim, correction).sqrt()
  def var_mean(self, axis=None, keepdim: bool = False, correction: int = 1) -> tuple[Tensor, Tensor]:
    return self.var(axis, keepdim, correction), self.mean(axis, keepdim)
  def std_mean(self, axis=None, keepdim: bool = False, correction: int = 1) -> tuple[Tensor, Tensor]:
    return self.std(axis, keepdim, correction), self.mean(axis, keepdim)
  def prod(self, axis=None, keepdim: bool = False, dtype=None) -> Tensor:
    """The product over axis. The IR reduces only by ADD and MAX, so the reduced axes become one axis, padded with ones to
    a power of two and halved pairwise log2(n) times: exact on integers, and its gradient is the product of the others
    (right at zeros too)."""
    t = self.cast(dtype) if dtype is not None else (self.int() if self.dtype is dtypes.bool else self)
    if t.dtype is dtypes.f16: return t.float().prod(axis, keepdim).half()   # multiplied in f32, rounded once (_f16_in_f32)
    axes = t._axes(axis)
    if not axes: return t
    rest = [a for a in range(t.ndim) if a not in axes]
    n = prod(t.shape[a] for a in axes)
    x = t.permute(rest + axes).reshape(tuple(t.shape[a] for a in rest) + (n,))
    if n == 0: return t.sum(axes, keepdim) + 1   # the empty product, with t still in the graph
    m = 1 << max(0, n - 1).bit_length()
    if m != n: x = x.pad(tuple(None for _ in rest) + ((0, m - n),), value=1)
    fan_in = 1        # the inputs of one fused product tree: stored every 16, or 3000 products became one C expression (10 s of gcc)
    while x.shape[-1] > 1:
      if fan_in == PROD_FUSED: x, fan_in = x.contiguous(), 1
      x = x.reshape(x.shape[:-1] + (x.shape[-1] // 2, 2))
      x = x.shrink(tuple(None for _ in x.shape[:-1]) + ((0, 1),)) * x.shrink(tuple(None for _ in x.shape[:-1]) + ((1, 2),))
      x = x.reshape(x.shape[:-1])
      fan_in *= 2
    out = x.reshape(x.shape[:-1])
    return out.reshape(tuple(1 if a in axes else d for a, d in enumerate(t.shape))) if keepdim else out
  @_f16_in_f32
  def norm(self, p: float = 2.0, dim=None, keepdim: bool = False) -> Tensor:
    """The vector p-norm over dim (all axes by default), as torch.linalg.vector_norm: p = inf is the largest |x|, p = 0
    counts the nonzero elements."""
    a = self.float().abs()
    if p == float("inf"): return a.max(dim, keepdim)
    if p == float("-inf"): return a.min(dim, keepdim)
    if p == 0: return a.ne(0).float().sum(dim, keepdim)
    if p == 1: return a.sum(dim, keepdim)
    s = (a * a if p == 2 else a ** p).sum(dim, keepdim)
    # the root of a zero sum reads a safe 1: its slope there is inf, and inf * 0 was a NaN gradient (torch's is 0)
    zero = s.eq(0)
    root = zero.where(1.0, s)
    return zero.where(0.0, root.sqrt() if p == 2 else root ** (1 / p))
  @_f16_in_f32
  def normalize(self, p: float = 2.0, dim: int = 1, eps: float = 1e-12) -> Tensor:
    """self / max(||self||_p over dim, eps), as torch.nn.functional.normalize."""
    return self / self.norm(p, dim, keepdim=True).clip(min_=eps)
  def argmax(self, axis=None, keepdim: bool = False) -> Tensor:
    """The index of the (first) maximum, as i32; over the flattened tensor when axis is None."""
    if axis is None: return self.reshape(-1).argmax(0)
    ax = self._valued("argmax", axis)._dim(axis)
    if self.ndim == 0: return Tensor.zeros(dtype=dtypes.i32, device=self.device)
    n = self.shape[ax]
    hit = self.eq(self.max(ax, keepdim=True))
    if self.dtype.is_float: hit = hit | self.ne(self)   # a NaN is the maximum, as in NumPy and torch: the first NaN wins
    rev = Tensor(np.arange(n, 0, -1, dtype=np.int32), device=self.device).reshape(tuple(n if i == ax else 1 for i in range(self.ndim)))
    return (n - hit.where(rev, 0).max(ax, keepdim)).cast(dtypes.i32)
  def argmin(self, axis=None, keepdim: bool = False) -> Tensor: return self._valued("argmin", axis)._inverse().argmax(axis, keepdim)
  # a bool MAX starts from False: through i32 an empty any() started from INT_MIN, which is True
  def any(self, axis=None, keepdim: bool = False) -> Tensor: return self.bool()._reduce(Ops.MAX, axis, keepdim)
  def all(self, axis=None, keepdim: bool = False) -> Tensor: return self.bool().logical_not().any(axis, keepdim).logical_not()

  # ---- movement
  def reshape(self, *shape) -> Tensor:
    """The same elements in a new shape; one -1 takes what is left, and None keeps that axis's size (tinygrad's)."""
    if len(shape) == 1 and isinstance(shape[0], (tuple, list)): shape = tuple(shape[0])
    shape = _shape_arg(tuple(self.shape[k] if s is None and k < self.ndim else s for k, s in enumerate(shape)))
    if shape.count(-1) > 1: raise TensorError(f"reshape: only one -1, got {shape}")
    if -1 in shape:
      rest = prod(s for s in shape if s != -1)
      if rest == 0 or self.numel() % rest: raise TensorError(f"reshape: can't reshape {self.shape} into {shape}")
      shape = tuple(self.numel() // rest if s == -1 else s for s in shape)
    if prod(shape) != self.numel() or any(s < 0 for s in shape): raise TensorError(f"reshape: can't reshape {self.shape} into {shape}")
    return self if shape == self.shape else self._new(self.uop.reshape(shape))
  view = reshape
  def permute(self, *dims) -> Tensor:
    dims = tuple(self._dim(d) for d in _shape_arg(dims))
    if sorted(dims) != list(range(self.ndim)): raise TensorError(f"permute: {dims} is not a permutation of the axes of {self.shape}")
    return self if dims == tuple(range(self.ndim)) else self._new(self.uop.permute(dims))
  def transpose(self, dim0: int = -2, dim1: int = -1) -> Tensor:
    order = list(range(self.ndim))
    a, b = self._dim(dim0), self._dim(dim1)
    order[a], order[b] = order[b], order[a]
    return self.permute(order)
  @property
  def T(self) -> Tensor: return self.permute(tuple(reversed(range(self.ndim))))
  def expand(self, *shape) -> Tensor:
    shape = _shape_arg(shape)
    if len(shape) < self.ndim: raise TensorError(f"expand: {shape} has fewer dimensions than {self.shape}")
    src = (1,) * (len(shape) - self.ndim) + self.shape
    return self._broadcast_to(_new_shape(tuple(s if n == -1 else n for s, n in zip(src, shape)), f"expand of {self.shape}"))
  def broadcast_to(self, *shape) -> Tensor: return self._broadcast_to(_new_shape(_shape_arg(shape), f"expand of {self.shape}"))
  def squeeze(self, dim: int | tuple[int, ...] | None = None) -> Tensor:
    """Drop axes of size 1: all of them, or those of dim (an int or a tuple) that have size 1."""
    if dim is None: return self.reshape(tuple(s for s in self.shape if s != 1))
    dims = {self._dim(d) for d in (dim if isinstance(dim, (tuple, list)) else (dim,))}
    if self.ndim == 0: return self
    return self.reshape(tuple(s for k, s in enumerate(self.shape) if not (k in dims and s == 1)))
  def unsqueeze(self, dim: int) -> Tensor:
    d = self._dim(dim, extra=1)
    return self.reshape(self.shape[:d] + (1,) + self.shape[d:])
  def flatten(self, start_dim: int = 0, end_dim: int = -1) -> Tensor:
    if self.ndim == 0: return self.reshape(1)
    s, e = self._dim(start_dim), self._dim(end_dim)
    return self.reshape(self.shape[:s] + (prod(self.shape[s:e + 1]),) + self.shape[e + 1:])
  def shrink(self, arg) -> Tensor:
    """Keep [begin, end) on each axis; None keeps the whole axis."""
    arg = _pairs_arg(arg, self.ndim, f"shrink of {self.shape}")
    arg = tuple((0, s) if a is None else a for a, s in zip(arg, self.shape))
    for (b, e), s in zip(arg, self.shape):
      if not 0 <= b <= e <= s: raise TensorError(f"shrink: range ({b}, {e}) doesn't fit an axis of {s} in shape {self.shape}")
    return self if all(a == (0, s) for a, s in zip(arg, self.shape)) else self._new(self.uop.shrink(arg))
  def _pad_pairs(self, padding) -> tuple[tuple[int, int], ...]:
    """One (before, after) pair per axis from numpy.pad's pairs (None for none, one per axis) or PyTorch's flat tuple
    (before, after for the last axis, then the one before it, ...; ints, an even number, up to two per axis)."""
    if not isinstance(padding, (tuple, list)):
      raise TensorError(f"pad: padding must be a tuple of (before, after) pairs or F.pad's flat tuple, got {padding!r}")
    padding = tuple(padding)
    if all(isinstance(p, (int, np.integer)) and not isinstance(p, bool) for p in padding) and padding:
      if len(padding) % 2 or len(padding) > 2 * self.ndim:
        raise TensorError(f"pad: a flat padding needs an even number of ints, at most 2 per axis (shape {self.shape}), got {padding}")
      flat = [(int(padding[k]), int(padding[k + 1])) for k in range(0, len(padding), 2)]
      return tuple([(0, 0)] * (self.ndim - len(flat)) + flat[::-1])
    if len(padding) != self.ndim:
      raise TensorError(f"pad: {len(padding)} (before, after) pairs for shape {self.shape}, expected {self.ndim}")
    try: return tuple((0, 0) if p is None else (int(p[0]), int(p[1])) for p in padding)
    except (TypeError, IndexError): raise TensorError(f"pad: expected (before, after) pairs or None per axis, got {padding}") from None

  def pad(self, padding, mode: str = "constant", value: float = 0.0) -> Tensor:
    """Pad each axis: `padding` is numpy.pad's (before, after) per axis or F.pad's flat tuple from the last axis; negative
    amounts crop. mode: "constant" (with value), "reflect" (mirror without repeating the edge), "replicate" (repeat the
    edge), "circular" (wrap around). Negative amounts crop after reflect and replicate pad but before circular wraps, as
    in torch."""
    pairs = self._pad_pairs(padding)
    if isinstance(value, np.generic): value = value.item()
    if not isinstance(value, (int, float, bool)): raise TensorError(f"pad: the value must be a number, got {value!r:.60}")
    if mode not in ("constant", "reflect", "replicate", "circular"):
      raise TensorTypeError(f"pad: mode must be 'constant', 'reflect', 'replicate' or 'circular', got {mode!r}")
    if mode != "constant":
      if value != 0: raise TensorError(f"pad: value is for mode 'constant', not {mode!r}")
      crops = tuple((min(b, 0), min(a, 0)) for b, a in pairs)
      t = self.pad(crops) if mode == "circular" else self
      for ax, (b, a) in enumerate(pairs):
        if b > 0 or a > 0: t = t._pad_axis(ax, max(b, 0), max(a, 0), mode)
      return t if mode == "circular" else t.pad(crops)
    t = self.shrink(tuple((max(0, -b), s - max(0, -a)) for (b, a), s in zip(pairs, self.shape)))
    widths = tuple((max(0, b), max(0, a)) for b, a in pairs)
    if all(w == (0, 0) for w in widths): return t
    _check_size(tuple(s + b + a for s, (b, a) in zip(t.shape, widths)), f"pad of {self.shape}")
    if t.numel() == 0 and any(w != (0, 0) for w in widths):
      # the PAD composite can't grow an empty axis: the fill is built from t's sum over its empty axes (zeros, with the
      # empty axes kept as 1s), padded on the other axes and expanded, so t stays in the graph for its (empty) gradient
      empty = [a for a, n in enumerate(t.shape) if n == 0]
      base = t.sum(empty, keepdim=True).cast(t.dtype).pad(tuple((0, 0) if a in empty else w for a, w in enumerate(widths)))
      base = base.expand(tuple(b + a if k in empty else n for k, (n, (b, a)) in enumerate(zip(base.shape, widths))))
      return base.ne(base).where(base, Tensor.full((), value, t.dtype, device=self.device))
    out = t._new(_pad_uop(t.uop, widths))
    if value != 0:
      inside = t._new(_pad_uop(t.ones_like(dtype=dtypes.bool).uop, widths))
      out = inside.where(out, Tensor.full((), value, t.dtype, device=self.device))   # the tensor's dtype, as torch's (2.5 pads an i32 with 2)
    return out

  def _pad_axis(self, ax: int, before: int, after: int, mode: str) -> Tensor:
    """One axis padded by reflect, replicate or circular: pieces of the axis itself, concatenated."""
    n = self.shape[ax]
    piece = lambda b, e: self.shrink(tuple((b, e) if k == ax else None for k in range(self.ndim)))
    if mode == "reflect" and (before >= n or after >= n):
      raise TensorError(f"pad: reflect padding ({before}, {after}) must be smaller than the axis it mirrors ({n}, shape {self.shape})")
    if mode == "circular" and (before > n or after > n):
      raise TensorError(f"pad: circular padding ({before}, {after}) can wrap around axis {ax} of {n} at most once (shape {self.shape})")
    if mode == "replicate" and n == 0: raise TensorError(f"pad: can't replicate the edge of an empty axis (shape {self.shape})")
    if mode == "reflect": left, right = piece(1, before + 1).flip(ax), piece(n - 1 - after, n - 1).flip(ax)
    elif mode == "circular": left, right = piece(n - before, n), piece(0, after)
    else:
      grow = lambda t, k: t.expand(tuple(k if i == ax else s for i, s in enumerate(t.shape)))
      left, right = grow(piece(0, 1), before), grow(piece(n - 1, n), after)
    return Tensor.cat(*(p for p in (left, self, right) if p.shape[ax]), dim=ax)

  def flip(self, axis) -> Tensor:
    axes = [self._dim(a) for a in (axis if isinstance(axis, (tuple, list)) else [axis])]
    if len(set(axes)) != len(axes): raise TensorError(f"flip: dims {tuple(axis)} name an axis twice (shape {self.shape})")
    t = self
    for a in (sorted(axes) if self.ndim else []): t = t._new(flip_axis(t.uop, a))
    return t
  def cat(*tensors: Tensor, dim: int = 0) -> Tensor:
    """Concatenate along dim (all other axes equal). Tensor.cat(a, b, dim=1) and a.cat(b, dim=1) are the same."""
    if len(tensors) == 1 and isinstance(tensors[0], (list, tuple)): tensors = tuple(tensors[0])   # torch.cat([a, b])
    ts = [t for t in tensors if isinstance(t, Tensor)]
    if len(ts) != len(tensors) or not ts: raise TensorError("cat takes one or more Tensors")
    first = ts[0]
    if any(t.ndim == 0 for t in ts): raise TensorIndexError("cat: zero-dimensional tensors can't be concatenated (stack them)")
    d = first._dim(dim)
    for t in ts[1:]:
      if t.ndim != first.ndim or any(a != b for i, (a, b) in enumerate(zip(t.shape, first.shape)) if i != d):
        raise TensorError(f"cat: shapes {' and '.join(str(x.shape) for x in ts)} differ outside dim {d}")
    dt = _promote(*(t.dtype for t in ts))
    ts = [t.cast(dt) for t in ts]
    if len(ts) == 1: return ts[0]
    if all(t.shape == first.shape for t in ts):   # equal pieces: STACK them and merge the new axis into dim
      st = Tensor.stack(*ts, dim=d)   # the piece index goes before dim (at dim + 1 the pieces would interleave)
      return st.reshape(first.shape[:d] + (len(ts) * first.shape[d],) + first.shape[d + 1:])
    total, off, out = sum(t.shape[d] for t in ts), 0, None
    for t in ts:
      p = t.pad(tuple((off, total - off - t.shape[d]) if i == d else (0, 0) for i in range(t.ndim)))
      out = p if out is None else out + p
      off += t.shape[d]
    return out
  def stack(*tensors: Tensor, dim: int = 0) -> Tensor:
    """Join same-shaped tensors along a new axis `dim`. Tensor.stack(a, b) and a.stack(b) are the same."""
    ts = list(tensors[0]) if len(tensors) == 1 and isinstance(tensors[0], (list, tuple)) else list(tensors)   # torch.stack([a, b])
    if not ts or not all(isinstance(t, Tensor) for t in ts):
      raise TensorError("stack takes Tensors, or one list or tuple of them (the dimension goes in dim=)")
    if any(t.shape != ts[0].shape for t in ts): raise TensorError(f"stack: shapes {' and '.join(str(t.shape) for t in ts)} differ")
    dt = _promote(*(t.dtype for t in ts))
    ts = [t.cast(dt) for t in ts]
    d = ts[0]._dim(dim, extra=1)
    _check_size((len(ts),) + ts[0].shape, "stack")
    s = ts[0]._new(UOp(Ops.STACK, tuple(t.uop for t in ts)), *ts)
    return s.permute(list(range(1, d + 1)) + [0] + list(range(d + 1, s.ndim))) if d else s
  def split(self, sizes, dim: int = 0) -> list[Tensor]:
    d = self._dim(dim)
    n = self.shape[d]
    sizes = _int_arg(sizes, "split: sizes") if not isinstance(sizes, (list, tuple)) else [_int_arg(x, "split: a size") for x in sizes]
    if isinstance(sizes, int): sizes = [min(sizes, n - i) for i in range(0, n, sizes)] if sizes > 0 else None
    if sizes is not None and any(x < 0 for x in sizes): raise TensorError(f"split: sizes can't be negative, got {sizes}")
    if sizes is None or sum(sizes) != n: raise TensorError(f"split: sizes {sizes} don't add up to {n} (dim {d} of {self.shape})")
    out, off = [], 0
    for s in sizes:
      out.append(self.shrink(tuple((off, off + s) if i == d else None for i in range(self.ndim))))
      off += s
    return out
  def chunk(self, chunks: int, dim: int = 0) -> list[Tensor]:
    if _int_arg(chunks, "chunk: chunks") < 1: raise TensorError(f"chunk: chunks must be at least 1, got {chunks}")
    n = self.shape[self._dim(dim)]
    return self.split(max(1, math.ceil(n / chunks)), dim)
  def repeat(self, *repeats) -> Tensor:
    reps = _shape_arg(repeats)
    if len(reps) < self.ndim: raise TensorError(f"repeat: {len(reps)} repeats for a tensor of shape {self.shape} (one per axis at least)")
    base = (1,) * (len(reps) - self.ndim) + self.shape
    t = self.reshape(base)
    inter = tuple(x for s in base for x in (1, s))
    t = t.reshape(inter).expand(tuple(x for r, s in zip(reps, base) for x in (r, s)))
    return t.reshape(tuple(r * s for r, s in zip(reps, base)))

  def repeat_interleave(self, repeats: int, dim: int | None = None) -> Tensor:
    """Each element `repeats` times in a row along dim (of the flattened tensor when dim is None)."""
    if isinstance(repeats, bool) or not isinstance(repeats, (int, np.integer)) or repeats < 0:
      raise TensorTypeError(f"repeat_interleave: repeats must be an int >= 0, got {repeats!r}")
    t = self.flatten() if dim is None else self
    d = t._dim(dim) if dim is not None else 0
    if t.ndim == 0: t = t.reshape(1)
    x = t.unsqueeze(d + 1)
    x = x.expand(x.shape[:d + 1] + (int(repeats),) + x.shape[d + 2:])
    return x.reshape(t.shape[:d] + (t.shape[d] * int(repeats),) + t.shape[d + 1:])
  def unflatten(self, dim: int, sizes) -> Tensor:
    d = self._dim(dim)
    return self.reshape(self.shape[:d] + tuple(sizes) + self.shape[d + 1:])
  def roll(self, shifts, dims=None) -> Tensor:
    """Shift elements along dims, wrapping around (over the flattened tensor when dims is None)."""
    shifts_t = tuple(shifts) if isinstance(shifts, (tuple, list)) else (shifts,)
    if dims is None:
      if len(shifts_t) != 1: raise TensorError(f"roll: {len(shifts_t)} shifts need as many dims")
      return self.flatten().roll(shifts_t[0], 0).reshape(self.shape)
    dims_t = tuple(dims) if isinstance(dims, (tuple, list)) else (dims,)
    if len(shifts_t) != len(dims_t): raise TensorError(f"roll: {len(shifts_t)} shifts for {len(dims_t)} dims")
    t = self
    for sh, dim in zip(shifts_t, dims_t):
      d = t._dim(dim)
      n = t.shape[d] if t.ndim else 1
      if not t.ndim or n == 0 or sh % n == 0: continue
      k = sh % n
      cut = lambda b, e: t.shrink(tuple((b, e) if i == d else None for i in range(t.ndim)))
      t = Tensor.cat(cut(n - k, n), cut(0, n - k), dim=d)
    return t
  def _tri(self, diagonal: int, upper: bool) -> Tensor:
    if self.ndim < 2: raise TensorError(f"{'triu' if upper else 'tril'} needs at least 2 dimensions, got shape {self.shape}")
    r, c = self.shape[-2:]
    keep = (np.triu if upper else np.tril)(np.ones((r, c), dtype=bool), diagonal)
    return Tensor(keep, device=self.device).where(self, False if self.dtype is dtypes.bool else 0)
  def triu(self, diagonal: int = 0) -> Tensor: return self._tri(diagonal, True)
  def tril(self, diagonal: int = 0) -> Tensor: return self._tri(diagonal, False)
  def diagonal(self, offset: int = 0, dim1: int = 0, dim2: int = 1) -> Tensor:
    """The diagonal of the (dim1, dim2) planes (offset above or below it) as a new last axis: the plane flattened and read
    with a stride of n + 1, movement ops only."""
    a, b = self._dim(dim1), self._dim(dim2)
    if a == b: raise TensorError(f"diagonal: dim1 and dim2 are both {a}")
    rest = [k for k in range(self.ndim) if k not in (a, b)]
    x = self.permute(rest + [a, b])
    lead = x.shape[:-2]
    r, c = x.shape[-2:]
    x = x.shrink(tuple(None for _ in lead) + (((0, r), (min(offset, c), c)) if offset >= 0 else ((min(-offset, r), r), (0, c))))
    n = min(x.shape[-2:])
    x = x.shrink(tuple(None for _ in lead) + ((0, n), (0, n))).reshape(lead + (n * n,))
    return x._strided(len(lead), 0, n * n, n + 1) if n else x
  def diag(self, diagonal: int = 0) -> Tensor:
    """A 1-D tensor as the given diagonal of a square matrix; the diagonal of a 2-D one."""
    if self.ndim == 2: return self.diagonal(diagonal)
    if self.ndim != 1: raise TensorError(f"diag takes a 1-D or 2-D tensor, got shape {self.shape}")
    n, k = self.shape[0], abs(diagonal)
    square = Tensor(np.eye(n, dtype=bool), device=self.device).where(self.reshape(1, n).expand(n, n), 0)
    return square.pad(((0, k), (k, 0)) if diagonal >= 0 else ((k, 0), (0, k)))
  def unfold(self, dim: int, size: int, step: int) -> Tensor:
    """torch's Tensor.unfold: the windows of `size` along dim, `step` apart, as a new last axis."""
    d = self._dim(dim)
    n = self.shape[d] if self.ndim else 1
    if size < 0 or size > n: raise TensorError(f"unfold: size {size} doesn't fit dim {d} of {n} (shape {self.shape})")
    if step <= 0: raise TensorError(f"unfold: step must be positive, got {step}")
    if self.ndim == 0: return self.reshape(size)
    o = (n - size) // step + 1
    if size == 0:   # empty windows, still from self (its gradient is then zeros, not missing)
      return self.shrink(tuple((0, 0) if k == d else None for k in range(self.ndim))).reshape(self.shape[:d] + (o,) + self.shape[d + 1:] + (0,))
    others = [k for k in range(self.ndim) if k != d]
    win = self.permute(others + [d])._windows((size,), (step,), (1,))   # (*others, o, size)
    return win.permute(list(range(d)) + [self.ndim - 1] + list(range(d, self.ndim - 1)) + [self.ndim])
  def meshgrid(self, *others: Tensor, indexing: str = "ij") -> tuple[Tensor, ...]:
    """Coordinate grids of 1-D tensors (torch.meshgrid): "ij" indexes by the order given, "xy" swaps the first two."""
    if indexing not in ("ij", "xy"): raise TensorError(f"meshgrid: indexing must be 'ij' or 'xy', got {indexing!r}")
    ts = [t.reshape(-1) for t in (self, *others)]
    shape = tuple(t.shape[0] for t in ts)
    if indexing == "xy" and len(ts) > 1: shape = (shape[1], shape[0]) + shape[2:]
    outs = []
    for k, t in enumerate(ts):
      axis = {0: 1, 1: 0}.get(k, k) if indexing == "xy" and len(ts) > 1 else k
      outs.append(t.reshape(tuple(-1 if i == axis else 1 for i in range(len(ts)))).expand(shape))
    return tuple(outs)

  def _strided(self, axis: int, start: int, stop: int, step: int) -> Tensor:
    """x[start:stop:step] on one axis (step > 0): shrink, pad to a multiple of step, split off the step, keep the first."""
    t = self.shrink(tuple((start, stop) if i == axis else None for i in range(self.ndim)))
    if step == 1: return t
    n = t.shape[axis]
    m = math.ceil(n / step)
    t = t.pad(tuple((0, m * step - n) if i == axis else None for i in range(t.ndim)))
    t = t.reshape(t.shape[:axis] + (m, step) + t.shape[axis + 1:])
    t = t.shrink(tuple((0, 1) if i == axis + 1 else None for i in range(t.ndim)))
    return t.reshape(t.shape[:axis + 1] + t.shape[axis + 2:])

  def __getitem__(self, idx) -> Tensor:
    """Python indexing: ints, slices (with steps, negative too), None, Ellipsis, and integer Tensors (or lists) to gather."""
    if not isinstance(idx, tuple): idx = (idx,)
    # a list or tuple inside the index is a list of indices, as in numpy and torch (x[(0, 1), :] gathers rows 0 and 1)
    idx = tuple(Tensor(_index_array(i), device=self.device) if isinstance(i, (list, tuple, np.ndarray)) else i for i in idx)
    if sum(1 for i in idx if i is Ellipsis) > 1: raise TensorIndexError("an index can only have a single ellipsis ('...')")
    n_real = sum(1 for i in idx if i is not None and i is not Ellipsis)
    if n_real > self.ndim: raise TensorIndexError(f"too many indices ({n_real}) for a tensor of shape {self.shape}")
    if any(i is Ellipsis for i in idx):   # `in` would compare Tensors with ==
      k = next(j for j, i in enumerate(idx) if i is Ellipsis)
      idx = idx[:k] + (slice(None),) * (self.ndim - n_real) + idx[k + 1:]
    else: idx = idx + (slice(None),) * (self.ndim - n_real)
    t, axis, tensor_axes = self, 0, []
    for i in idx:
      if i is None: t = t.unsqueeze(axis); axis += 1; continue
      if isinstance(i, Tensor):
        if i.dtype is dtypes.bool:
          raise TensorIndexError("boolean mask indexing isn't supported (its result shape depends on the data; see masked_select)")
        if i.dtype is not dtypes.i32: raise TensorIndexError(f"index tensors must be integers, got {i.dtype.name}")
        tensor_axes.append((axis, i)); axis += 1; continue
      if isinstance(i, (bool, np.bool_)): raise TensorIndexError("a bool index isn't supported")
      if isinstance(i, (int, np.integer)):
        n = t.shape[axis]
        j = int(i) + n if i < 0 else int(i)
        if not 0 <= j < n: raise TensorIndexError(f"index {i} is out of bounds for axis {axis} of size {n} (shape {self.shape})")
        t = t.shrink(tuple((j, j + 1) if a == axis else None for a in range(t.ndim)))
        t = t.reshape(t.shape[:axis] + t.shape[axis + 1:])
        continue
      if isinstance(i, slice):
        n = t.shape[axis]
        if i.step == 0: raise TensorError("a slice step can't be zero")
        try: start, stop, step = i.indices(n)
        except TypeError: raise TensorError(f"slice indices must be integers or None, got {i!r}") from None
        if step > 0: t = t._strided(axis, start, max(start, stop), step)
        else:   # a negative step: the mirrored positive slice of the flipped axis (or nothing)
          count, first = len(range(start, stop, step)), n - 1 - start
          t = t.flip(axis)._strided(axis, first, first + (count - 1) * -step + 1, -step) if count else t._strided(axis, 0, 0, 1)
        axis += 1
        continue
      raise TensorIndexError(f"can't index a Tensor with {type(i).__name__} {i!r}")
    return t._gather(tensor_axes) if tensor_axes else t

  def _gather(self, tensor_axes: list[tuple[int, Tensor]]) -> Tensor:
    """Advanced indexing (NumPy's rule): the index tensors broadcast together and select along their axes; the result's
    index dimensions go where the indexed axes were when those are adjacent, else first. A one-hot mask and a sum."""
    axes = [a for a, _ in tensor_axes]
    ishape = broadcast_shape(*(i.shape for _, i in tensor_axes))
    flat = None
    for a, i in tensor_axes:   # one flat index over the indexed axes (negative indices count from the end)
      n = self.shape[a]
      _check_indices(i, -n, n, f"index {{}} is out of range for axis {a} of size {n} (shape {self.shape})")
      i = (i < 0).where(i + n, i)._broadcast_to(ishape)
      flat = i if flat is None else flat * n + i
    rest = [k for k in range(self.ndim) if k not in axes]
    x = self.permute(rest + axes)
    m = prod(self.shape[a] for a in axes)
    x = x.reshape(tuple(self.shape[k] for k in rest) + (m,))                # (*rest, m)
    pre = tuple(self.shape[k] for k in rest)
    onehot = flat.unsqueeze(-1).eq(Tensor.arange(m, device=self.device))   # (*ishape, m)
    xe = x.reshape(pre[:0] + pre + (1,) * len(ishape) + (m,))._broadcast_to(pre + ishape + (m,))
    oh = onehot.reshape((1,) * len(pre) + ishape + (m,))._broadcast_to(pre + ishape + (m,))
    out = oh.where(xe, 0).sum(-1) if self.dtype is not dtypes.bool else oh.where(xe.int(), 0).sum(-1).bool()   # (*rest, *ishape)
    adjacent = axes == list(range(axes[0], axes[0] + len(axes)))
    if adjacent and axes[0] > 0:   # move the index dimensions back to where the indexed axes were
      k = len(ishape)
      lead = axes[0]
      order = list(range(lead)) + [len(pre) + j for j in range(k)] + list(range(lead, len(pre)))
      out = out.permute(order)
    elif not adjacent or axes[0] == 0:
      out = out.permute([len(pre) + j for j in range(len(ishape))] + list(range(len(pre))))
    return out

  def gather(self, dim: int, index: Tensor) -> Tensor:
    """torch.gather: out[i][j] = self[index[i][j]][j] for dim 0, and so on; index has self's rank."""
    d, index = self._dim(dim), _tensor_arg(index, "gather: index")
    if index.ndim != self.ndim: raise TensorError(f"gather: index of shape {index.shape} for a tensor of shape {self.shape}")
    if self.ndim == 0: return self.reshape(1).gather(0, index.reshape(1)).reshape(())   # torch takes a 0-d tensor as one element
    n = self.shape[d]
    if index.dtype is not dtypes.i32: raise TensorError(f"gather: index must be i32, got {index.dtype.name}")
    if any(a > b for i, (a, b) in enumerate(zip(index.shape, self.shape)) if i != d):
      raise TensorError(f"gather: index of shape {index.shape} is larger than the tensor {self.shape} outside dim {d}")
    _check_indices(index, 0, n, f"gather: index {{}} is out of range for dim {d} of size {n} (shape {self.shape})")
    x = self.shrink(tuple(None if i == d else (0, s) for i, s in enumerate(index.shape)))
    oh = index.unsqueeze(-1).eq(Tensor.arange(n, device=self.device))
    xe = x.unsqueeze(-1).transpose(d, -1)
    return oh.where(xe._broadcast_to(oh.shape), 0).sum(-1)

  # ---- scans: cumulative sums, products, maxima along one axis
  def _scan(self, axis: int, reduce: str) -> Tensor:
    """out[..., i] = reduce(self[..., :i + 1]) along axis ("sum", "prod" or "max"). A running loop would carry a value from
    one iteration to the next, which the IR has no way to say; instead a block of b elements is spread into a (b, b)
    square whose entries above the diagonal are the reduction's identity, and the square is reduced along its rows. A
    longer axis is cut into blocks of 32: each block is scanned so, the blocks' totals are scanned the same way, and each
    block is combined with the total of the blocks before it. O(32 n) work in a few kernels."""
    t = self.int() if self.dtype is dtypes.bool else self
    d = t._dim(axis)
    if t.ndim == 0 or t.shape[d] == 0: return t
    return t.transpose(d, -1)._scan_last(reduce).transpose(d, -1)
  def _scan_last(self, reduce: str) -> Tensor:
    n, B = self.shape[-1], SCAN_BLOCK
    identity = {"sum": 0, "prod": 1, "max": dtypes.min(self.dtype), "logaddexp": float("-inf")}[reduce]
    if n <= B:
      keep = Tensor(np.tril(np.ones((n, n), dtype=bool)), device=self.device)   # keep[i, j] = j <= i
      square = keep.where(self.unsqueeze(-2), identity)
      return {"sum": square.sum, "prod": square.prod, "max": square.max, "logaddexp": square.logsumexp}[reduce](-1)
    m = -(-n // B)
    lead = self.shape[:-1]
    blocks = self.pad(tuple(None for _ in lead) + ((0, m * B - n),), value=identity).reshape(lead + (m, B))._scan_last(reduce)
    before = blocks[..., -1]._scan_last(reduce).pad(tuple(None for _ in lead) + ((1, -1),), value=identity)   # the blocks before
    combine = {"sum": lambda a, b: a + b, "prod": lambda a, b: a * b, "max": lambda a, b: a.maximum(b), "logaddexp": Tensor.logaddexp}[reduce]
    return combine(blocks, before.unsqueeze(-1)).reshape(lead + (m * B,)).shrink(tuple(None for _ in lead) + ((0, n),))
  @_f16_in_f32
  def cumsum(self, axis: int = 0, *, dim: int | None = None) -> Tensor: return self._scan(axis if dim is None else dim, "sum")
  @_f16_in_f32
  def cumprod(self, axis: int = 0, *, dim: int | None = None) -> Tensor: return self._scan(axis if dim is None else dim, "prod")
  def cummax(self, axis: int = 0, *, dim: int | None = None) -> ValuesIndices:
    """The running maximum and, as torch gives it, the index of its last occurrence so far: the last position j <= i that
    holds its own running maximum (a record or a tie with it), itself a running max of those positions."""
    d = self._dim(axis if dim is None else dim)
    values = self._scan(d, "max")
    if self.ndim == 0: return ValuesIndices(values, Tensor.zeros(dtype=dtypes.i32, device=self.device))
    pos = Tensor.arange(self.shape[d], device=self.device).reshape(tuple(-1 if k == d else 1 for k in range(self.ndim)))
    holds = self.eq(values) | self.isnan() if self.dtype.is_float else self.eq(values)   # a NaN is its own running max
    return ValuesIndices(values, holds.where(pos, -1)._scan(d, "max"))
  def cummin(self, axis: int = 0, *, dim: int | None = None) -> ValuesIndices:
    values, indices = self._inverse().cummax(axis, dim=dim)
    return ValuesIndices(values._inverse(), indices)
  @_f16_in_f32
  def logcumsumexp(self, axis: int = 0, *, dim: int | None = None) -> Tensor:
    """log(cumsum(exp(self))): the blocked scan with logaddexp as its combine (associative, identity -inf), each step
    shifted by its larger operand so nothing overflows; O(32 n) like the other scans (an (n, n) square was quadratic)."""
    return self.float()._scan(axis if dim is None else dim, "logaddexp")

  # ---- sorting: by counting, in a fixed shape
  def sort(self, dim: int = -1, descending: bool = False, stable: bool = True) -> ValuesIndices:
    """Sorted values and their original indices along dim (stable; NaN sorts as the largest, as in torch). Each element's
    rank is the number of elements that go before it (smaller ones, and equal ones earlier in the row), and the output
    position r takes the element of rank r: n^2 comparisons, no data-dependent shapes or loops."""
    return self._sorted(dim, descending, None)
  def argsort(self, dim: int = -1, descending: bool = False, stable: bool = True) -> Tensor: return self.sort(dim, descending).indices
  def topk(self, k: int, dim: int = -1, largest: bool = True, sorted: bool = True) -> ValuesIndices:
    """The k largest (smallest with largest=False) values along dim, in order, and their indices (ties: the earlier first)."""
    d = self._dim(dim)
    n = self.shape[d] if self.ndim else 1
    if not 0 <= k <= n: raise TensorError(f"topk: k={k} is out of range for dim {d} of size {n} (shape {self.shape})")
    return self._sorted(d, largest, k)
  def _sorted(self, dim: int, descending: bool, k: int | None) -> ValuesIndices:
    d = self._dim(dim)
    if self.ndim == 0: return ValuesIndices(self, Tensor.zeros(dtype=dtypes.i32, device=self.device))
    n = self.shape[d]
    k = n if k is None else k
    x = self.transpose(d, -1)
    key = x.int() if x.dtype is dtypes.bool else x
    if n > SORT_BY_COUNTING_MAX:
      values, indices = Tensor._sort_network(key, descending)
      values, indices = values.cast(x.dtype), indices
    else:
      first, same = Tensor._order(key.unsqueeze(-2), key.unsqueeze(-1), descending)   # [i, j]: element j before / tied with i
      earlier = Tensor(np.tril(np.ones((n, n), dtype=bool), -1), device=self.device)   # [i, j]: j < i
      rank = (first | (same & earlier)).sum(-1)                     # (..., n): where element i lands
      at = rank.unsqueeze(-2).eq(Tensor.arange(n, device=self.device).unsqueeze(-1))   # [r, i]: element i lands at r
      values = at.where(x.unsqueeze(-2), False if x.dtype is dtypes.bool else 0).sum(-1).cast(x.dtype)
      indices = at.where(Tensor.arange(n, device=self.device), 0).sum(-1)
    if k != n: values, indices = values[..., :k], indices[..., :k]
    return ValuesIndices(values.transpose(d, -1), indices.transpose(d, -1))

  @staticmethod
  def _order(a: Tensor, b: Tensor, descending: bool) -> tuple[Tensor, Tensor]:
    """(a sorts strictly before b, a ties b): NaN is the largest float and ties NaN, as in torch's sort."""
    first, same = (a > b) if descending else (a < b), a.eq(b)
    if a.dtype.is_float:
      na, nb = a.isnan(), b.isnan()
      first = first | ((na & nb.logical_not()) if descending else (nb & na.logical_not()))
      same = same | (na & nb)
    return first, same

  @staticmethod
  def _sort_network(key: Tensor, descending: bool, payload: Tensor | None = None) -> tuple[Tensor, ...]:
    """key sorted along its last axis by a bitonic network, with the original indices carried along: O(n log^2 n) work
    in log2(n) (log2(n) + 1) / 2 stages (counting ranks is O(n^2), an hour at a million elements). Each stage compares
    the elements j apart within blocks of `size` and swaps the pairs that are out of order, blocks alternately up and
    down; an order of (key, index) pairs makes it stable. Padding to a power of two sorts last (NaN, or the lowest
    value descending, after every real one of its key by its larger index). Each stage is stored, or every element of
    the last one would recompute the whole network. A payload of key's shape rides along too (returned third)."""
    n, lead = key.shape[-1], key.shape[:-1]
    N = 1 << (n - 1).bit_length()
    fill = (float("-inf") if descending else float("nan")) if key.dtype.is_float else (I32_MIN if descending else I32_MAX)
    k = key.pad(tuple(None for _ in lead) + ((0, N - n),), value=fill)
    idx = Tensor.arange(N, device=key.device).reshape((1,) * len(lead) + (N,))._broadcast_to(lead + (N,))
    if payload is not None: payload = payload.pad(tuple(None for _ in lead) + ((0, N - n),))
    half = lambda t, h: t[..., h, :]
    size = 2
    while size <= N:
      j = size // 2
      while j:
        shape = lead + (N // (2 * j), 2, j)
        kk, ii = k.reshape(shape), idx.reshape(shape)
        k0, k1, i0, i1 = half(kk, 0), half(kk, 1), half(ii, 0), half(ii, 1)
        up = Tensor((np.arange(N // (2 * j)) * 2 * j // size) % 2 == 0, device=key.device).reshape(-1, 1)
        f10, s10 = Tensor._order(k1, k0, descending)
        f01, s01 = Tensor._order(k0, k1, descending)
        swap = up.where(f10 | (s10 & (i1 < i0)), f01 | (s01 & (i0 < i1)))
        k = Tensor.stack(swap.where(k1, k0), swap.where(k0, k1), dim=-2).reshape(lead + (N,)).contiguous()
        idx = Tensor.stack(swap.where(i1, i0), swap.where(i0, i1), dim=-2).reshape(lead + (N,)).contiguous()
        if payload is not None:
          p0, p1 = half(payload.reshape(shape), 0), half(payload.reshape(shape), 1)
          payload = Tensor.stack(swap.where(p1, p0), swap.where(p0, p1), dim=-2).reshape(lead + (N,)).contiguous()
        j //= 2
      size *= 2
    return (k[..., :n], idx[..., :n]) + ((payload[..., :n],) if payload is not None else ())

  # ---- scatter and masks
  def _scatter_parts(self, dim: int, index: Tensor, src) -> tuple[int, Tensor, Tensor]:
    """For scatter and scatter_reduce: dim, and the one-hot `hit[..., t, i]` (index[..., i] == t, dim moved last, t over
    self's dim) with src's matching values broadcast to it, both over the region of self that index covers."""
    d = self._dim(dim)
    if not isinstance(index, Tensor) or index.dtype is not dtypes.i32: raise TensorIndexError("scatter: index must be an i32 Tensor")
    if index.ndim != self.ndim: raise TensorError(f"scatter: index of shape {index.shape} for a tensor of shape {self.shape}")
    _check_indices(index, 0, self.shape[d], f"scatter: index {{}} is out of range for dim {d} of size {self.shape[d]} (shape {self.shape})")
    if isinstance(src, Tensor):
      if src.dtype is not self.dtype: raise TensorError(f"scatter: src is {src.dtype.name}, the tensor {self.dtype.name}")
      if src.ndim != self.ndim or any(i > s for i, s in zip(index.shape, src.shape)):
        raise TensorError(f"scatter: index of shape {index.shape} is larger than src {src.shape}")
      src = src.shrink(tuple((0, i) for i in index.shape))
    else: src = Tensor.full(index.shape, src, self.dtype, device=self.device)
    if any(i > s for k, (i, s) in enumerate(zip(index.shape, self.shape)) if k != d):
      raise TensorError(f"scatter: index of shape {index.shape} is larger than the tensor {self.shape} outside dim {d}")
    n = self.shape[d]
    idx, vals = index.transpose(d, -1), src.transpose(d, -1)                       # (..., I)
    hit = idx.unsqueeze(-2).eq(Tensor.arange(n, device=self.device).unsqueeze(-1))  # (..., n, I)
    return d, hit, vals.unsqueeze(-2)._broadcast_to(hit.shape)
  def _as_1d(self, fn, dim, index, src) -> Tensor:
    """A scatter into a 0-d tensor (torch takes it as one element): fn on (1,)-shaped self, index and src, back to 0-d."""
    self._dim(dim)
    index = _tensor_arg(index, "scatter: index")
    if index.ndim != 0: raise TensorError(f"scatter: index of shape {index.shape} for a tensor of shape ()")
    return fn(self.reshape(1), index.reshape(1), src.reshape(1) if isinstance(src, Tensor) and src.ndim == 0 else src).reshape(())
  def _scatter_back(self, d: int, region: Tensor, touched: Tensor) -> Tensor:
    """The updated region (dim last, other axes as index's) placed back into self where touched."""
    pads = tuple((0, s - r) for s, r in zip(self.transpose(d, -1).shape, region.shape))
    full, mask = region.pad(pads).transpose(d, -1), touched.pad(pads).transpose(d, -1)
    return mask.where(full, self)
  def scatter(self, dim: int, index: Tensor, src, reduce: str | None = None) -> Tensor:
    """torch.scatter: a copy of self with self[index[i][j]][j] = src[i][j] (dim 0, and so on). src is a tensor or a number;
    where index repeats a position the last write wins, as on torch's CPU. reduce "add" or "multiply" combine instead."""
    if reduce not in (None, "add", "multiply"):
      raise TensorTypeError(f"scatter: reduce must be None, 'add' or 'multiply', got {reduce!r}")
    if reduce is not None: return self.scatter_reduce(dim, index, src, {"add": "sum", "multiply": "prod"}[reduce])
    if self.ndim == 0: return self._as_1d(lambda t, i, v: t.scatter(0, i, v), dim, index, src)
    d, hit, vals = self._scatter_parts(dim, index, src)
    I = hit.shape[-1]
    last = hit.where(Tensor.arange(1, I + 1, device=self.device), 0).max(-1, keepdim=True)   # 1 + the last i that writes t
    pick = hit & last.eq(Tensor.arange(1, I + 1, device=self.device))
    region = pick.where(vals, False if self.dtype is dtypes.bool else 0).sum(-1).cast(self.dtype)
    return self._scatter_back(d, region, hit.any(-1))
  def scatter_reduce(self, dim: int, index: Tensor, src: Tensor, reduce: str, include_self: bool = True) -> Tensor:
    """torch.scatter_reduce: every src element folded into self at its index by sum, prod, mean, amax or amin (with self's
    own value unless include_self is False); positions nothing is scattered to keep self's value."""
    if reduce not in ("sum", "prod", "mean", "amax", "amin"):
      raise TensorTypeError(f"scatter_reduce: reduce must be 'sum', 'prod', 'mean', 'amax' or 'amin', got {reduce!r}")
    if self.ndim == 0: return self._as_1d(lambda t, i, v: t.scatter_reduce(0, i, v, reduce, include_self), dim, index, src)
    d, hit, vals = self._scatter_parts(dim, index, src)
    base = self.transpose(d, -1).shrink(tuple((0, s) for s in hit.shape[:-1]))   # self over the region
    touched = hit.any(-1)
    if reduce in ("amax", "amin"):
      v = vals if reduce == "amax" else vals._inverse()
      b = base if reduce == "amax" else base._inverse()
      r = hit.where(v, dtypes.min(v.dtype)).max(-1)
      r = r.maximum(b) if include_self else r
      if r.requires_grad and r.dtype.is_float:
        # torch shares the gradient evenly among the tied maxima (MAX splits pairwise: 1/2, 1/4, 1/4): the value is r
        # exactly, plus terms that are 0 forward and carry 1/count of the gradient to each tie
        rd = r._stop_gradient()
        tie = hit & v._stop_gradient().eq(rd.unsqueeze(-1))
        share = tie.where(v - v._stop_gradient(), 0.0).sum(-1)
        # torch counts self among the ties where it equals the result even when it isn't included (it then gets no share)
        self_tie = b._stop_gradient().eq(rd)
        count = tie.int().sum(-1) + self_tie.int()
        if include_self: share = share + self_tie.where(b - b._stop_gradient(), 0.0)
        r = rd + share / count.maximum(1)
      region = r if reduce == "amax" else r._inverse()
    elif reduce == "prod":
      r = hit.where(vals, 1).prod(-1)
      region = r * base if include_self else r
    else:
      r = hit.where(vals, 0).sum(-1)
      region = r + base if include_self else r
      if reduce == "mean":
        count = hit.sum(-1) + (1 if include_self else 0)
        region = region / count.maximum(1) if self.dtype.is_float else region // count.maximum(1)
    return self._scatter_back(d, region.cast(self.dtype), touched)
  def masked_fill(self, mask: Tensor, value) -> Tensor:
    """value where mask is true, self elsewhere (self's dtype)."""
    v = value.cast(self.dtype) if isinstance(value, Tensor) else Tensor.full((), value, self.dtype, device=self.device)
    return mask.where(v, self)
  def masked_select(self, mask: Tensor, size: int | None = None, fill_value=0) -> Tensor:
    """The elements where mask (broadcast with self) is true, flattened. The result's length depends on the data: pass
    `size` to keep it static (shorter: cut; longer: filled with fill_value); without it the count is read back (a sync).
    Each output position sums its one selected element out of all of them (O(n * size)), or for long inputs a stable
    sort network puts the selected elements first (O(n log^2 n))."""
    shape = broadcast_shape(self.shape, mask.shape)
    x, m = self._broadcast_to(shape).reshape(-1), mask.bool()._broadcast_to(shape).reshape(-1)
    if size is None: size = int(m.sum().item())
    n = x.shape[0]
    if n == 0: return Tensor.full((size,), fill_value, self.dtype, device=self.device)
    fill = Tensor.full((), fill_value, self.dtype, device=self.device)
    if n * size > SORT_BY_COUNTING_MAX ** 2:   # long: a stable sort by "not selected" brings the selected ones first, in order
      _, _, picked = Tensor._sort_network(m.logical_not().int(), False, x)
      picked = picked.pad(((0, max(0, size - n)),))[:size]
      return (Tensor.arange(size, device=self.device) < m.int().sum()).where(picked, fill)
    pos = m.int().cumsum(0) - 1                                   # where each selected element goes
    at = m & pos.eq(Tensor.arange(size, device=self.device).unsqueeze(-1))   # (size, n)
    out = at.where(x, False if self.dtype is dtypes.bool else 0).sum(-1).cast(self.dtype)
    return at.any(-1).where(out, fill)
  def nonzero(self, size: int | None = None, fill_value=0) -> Tensor:
    """The indices of the nonzero elements, one row each (n, ndim), in row-major order; `size` as in masked_select."""
    m = self.ne(0) if self.dtype is not dtypes.bool else self
    if size is None: size = int(m.sum().item())
    coords = [Tensor.arange(s, device=self.device).reshape(tuple(s if k == a else 1 for k in range(self.ndim)))._broadcast_to(self.shape)
              for a, s in enumerate(self.shape)]
    if not coords: return Tensor.zeros(size, 0, dtype=dtypes.i32, device=self.device)
    return Tensor.stack(*(c.masked_select(m, size, fill_value) for c in coords), dim=1)
  def one_hot(self, num_classes: int = -1) -> Tensor:
    """i32 one-hot vectors along a new last axis; num_classes -1 takes the largest index + 1 (a read back, as in torch)."""
    if self.dtype is not dtypes.i32: raise TensorError(f"one_hot: indices must be i32, got {self.dtype.name}")
    if num_classes == -1: num_classes = int(self.max().item()) + 1 if self.numel() else 0
    if num_classes < 0: raise TensorError(f"one_hot: num_classes must be -1 or >= 0, got {num_classes}")
    _check_indices(self, 0, num_classes, f"one_hot: class {{}} is out of range for {num_classes} classes")
    return self.unsqueeze(-1).eq(Tensor.arange(num_classes, device=self.device)).int()

  # ---- linear algebra and nn
  def dot(self, w: Tensor) -> Tensor: return self.matmul(w)

  def matmul(self, w: Tensor) -> Tensor:
    """self @ w with NumPy's rules: batched over leading axes (broadcast), a 1-D operand a vector."""
    w = w if isinstance(w, Tensor) else Tensor(w, device=self.device)
    if self.ndim == 0 or w.ndim == 0: raise TensorError(f"matmul: {self.shape} @ {w.shape}: both operands need at least one dimension")
    x, y = (self.unsqueeze(0) if self.ndim == 1 else self), (w.unsqueeze(-1) if w.ndim == 1 else w)
    if x.shape[-1] != y.shape[-2]:
      raise TensorError(f"matmul: {self.shape} @ {w.shape}: inner dimensions {x.shape[-1]} and {y.shape[-2]} differ")
    try: batch = broadcast_shape(x.shape[:-2], y.shape[:-2])
    except TensorError:
      raise TensorError(f"matmul: {self.shape} @ {w.shape}: batch dimensions {x.shape[:-2]} and {y.shape[:-2]} don't broadcast") from None
    d = _promote(x.dtype, y.dtype)
    acc = dtypes.f32 if d is dtypes.f16 else d   # f16 products are summed in f32, as every BLAS does (f16 sums drift)
    n, k, m = x.shape[-2], x.shape[-1], y.shape[-1]
    a = x.cast(d).cast(acc).reshape(x.shape[:-2] + (n, 1, k))._broadcast_to(batch + (n, m, k))
    b = y.cast(d).cast(acc).transpose(-1, -2).reshape(y.shape[:-2] + (1, m, k))._broadcast_to(batch + (n, m, k))
    out = (a * b).sum(-1).cast(d)
    if self.ndim == 1: out = out.squeeze(-2)
    if w.ndim == 1: out = out.squeeze(-1)
    return out

  def linear(self, weight: Tensor, bias: Tensor | None = None) -> Tensor:
    """self @ weight.T + bias, with weight (out_features, in_features) as in torch."""
    weight = _tensor_arg(weight, "linear: weight")
    out = self.matmul(weight.T)
    return out + bias if bias is not None else out

  def _windows(self, kernel: tuple[int, ...], stride: tuple[int, ...], dilation: tuple[int, ...], value: float = 0.0) -> Tensor:
    """Sliding windows over the last len(kernel) axes: (..., *in) -> (..., *out, K), K = prod(kernel) window positions,
    as a STACK of shifted views. The view of window position p on an axis (length i, kernel k, dilation d, stride s,
    o outputs) starts at p*d, takes o*s elements, views them as (o, s) and keeps column 0: movement ops alone, so a
    kernel reads each window with plain strides, and once the small kernel axis is unrolled every STACK branch is a
    constant choice. An axis too short for o*s elements from the last start is padded first (with `value`; those
    elements are never read)."""
    nd = len(kernel)
    lead = self.shape[:self.ndim - nd]
    outs = []
    for k, s, d, i in zip(kernel, stride, dilation, self.shape[self.ndim - nd:]):
      o = (i - d * (k - 1) - 1) // s + 1
      if o <= 0: raise TensorError(f"window of {k} (dilation {d}) doesn't fit an axis of {i}")
      outs.append(o)
    need = [(k - 1) * d + o * s for k, s, d, o in zip(kernel, stride, dilation, outs)]
    t = self
    if any(n > i for n, i in zip(need, self.shape[self.ndim - nd:])):
      t = t.pad(tuple(None for _ in lead) + tuple((0, max(0, n - i)) for n, i in zip(need, self.shape[self.ndim - nd:])), value=value)
    views = []
    for pos in itertools.product(*(range(k) for k in kernel)):
      v = t.shrink(tuple(None for _ in lead) + tuple((p * d, p * d + o * s) for p, d, o, s in zip(pos, dilation, outs, stride)))
      for j, (o, s) in enumerate(zip(outs, stride)):
        if s == 1: continue
        ax = len(lead) + j
        v = v.reshape(v.shape[:ax] + (o, s) + v.shape[ax + 1:])
        v = v.shrink(tuple((0, 1) if a == ax + 1 else None for a in range(v.ndim))).reshape(v.shape[:ax + 1] + v.shape[ax + 2:])
      views.append(v)
    return views[0].unsqueeze(-1) if len(views) == 1 else Tensor.stack(*views, dim=-1)

  def contiguous(self) -> Tensor:
    """The same value, materialized in its own row-major layout when it is next computed (a STAGE): its consumers read
    a buffer instead of recomputing it through views (a convolution's padded input)."""
    return self._new(UOp(Ops.STAGE, (self.uop,)), self)

  def conv2d(self, weight: Tensor, bias: Tensor | None = None, stride=1, padding=0, dilation=1, groups: int = 1) -> Tensor:
    """Convolution (cross-correlation) over the last weight.ndim - 2 axes, so conv1d, conv2d and conv3d in one: input
    (N, C, *spatial) or unbatched (C, *spatial), weight (O, C/groups, *kernel), as torch.nn.functional's. padding: an int,
    one int per spatial axis, F.pad's flat tuple (a before and after per axis, the last axis first), 'same' or 'valid'."""
    weight = _tensor_arg(weight, "conv2d: weight")
    _check_window_args("conv", stride=stride, dilation=dilation, groups=groups)   # a negative padding crops (tinygrad's)
    nd = weight.ndim - 2
    if nd < 1 or self.ndim not in (nd + 1, nd + 2):
      raise TensorError(f"conv: input {self.shape} and weight {weight.shape}: expected weight (O, C/groups, *kernel) and input "
                        f"(N, C, *spatial) or (C, *spatial) with {max(nd, 1)} spatial axes")
    x = self.unsqueeze(0) if self.ndim == nd + 1 else self
    N, C = x.shape[:2]
    O, Cg, kernel = weight.shape[0], weight.shape[1], weight.shape[2:]
    if not isinstance(groups, int) or groups < 1 or C % groups or O % groups or C // groups != Cg:
      raise TensorError(f"conv2d: input {self.shape} with {groups} group(s) needs weight (O, {C // max(groups, 1)}, ...) with O divisible "
                        f"by {groups}, got {weight.shape}")
    stride, dilation = _spatial(stride, nd, "conv stride"), _spatial(dilation, nd, "conv dilation")
    if padding == "same" and any(st != 1 for st in stride): raise TensorError("conv: padding='same' needs stride 1, as in torch")
    pads = _padding_pairs(padding, nd, kernel, dilation, "conv")
    # the padded input is stored once (padding through views costs index arithmetic in every read of every window)
    if any(p != (0, 0) for p in pads):
      x = x.pad(((0, 0), (0, 0)) + pads)
      if any(b > 0 or a > 0 for b, a in pads): x = x.contiguous()
    win = x._windows(kernel, stride, dilation)                            # (N, C, *out, K)
    out_sp, K = win.shape[2:-1], prod(kernel)
    # out[n, o, *p] = sum over (c, window position): the window positions innermost, a small axis to unroll
    win = win.reshape((N, groups, 1, Cg) + out_sp + (K,)).permute((0, 1, 2) + tuple(range(4, 4 + nd)) + (3, 4 + nd))
    wt = weight.reshape((1, groups, O // groups) + (1,) * nd + (Cg, K))
    # f16 products are summed in f32 and rounded once, as matmul's (an f16 product rounded before the sum loses bits)
    d = _promote(win.dtype, wt.dtype, *((bias.dtype,) if bias is not None else ()))
    if d is dtypes.f16: win, wt = win.float(), wt.float()
    out = (win * wt).sum((-2, -1)).reshape((N, O) + out_sp)
    if bias is not None: out = out + bias.cast(out.dtype).reshape((1, O) + (1,) * nd)
    out = out.cast(d) if d is dtypes.f16 else out
    return out if self.ndim == nd + 2 else out.squeeze(0)
  conv1d = conv3d = conv2d   # the rank comes from the weight

  def conv_transpose2d(self, weight: Tensor, bias: Tensor | None = None, stride=1, padding=0, output_padding=0, groups: int = 1,
                       dilation=1) -> Tensor:
    """The transposed convolution (the gradient of conv2d with respect to its input) over the last weight.ndim - 2 axes,
    as torch's conv_transpose1d/2d/3d: input (N, Cin, *spatial), weight (Cin, Cout/groups, *kernel). It is a convolution of
    the input spread out by the stride (stride - 1 zeros between neighbours), padded by dilation * (kernel - 1) - padding,
    with the flipped kernel whose in and out channels trade places."""
    weight = _tensor_arg(weight, "conv_transpose2d: weight")
    _check_window_args("conv_transpose", stride=stride, padding=padding, output_padding=output_padding, dilation=dilation, groups=groups)
    nd = weight.ndim - 2
    if nd < 1 or self.ndim not in (nd + 1, nd + 2):
      raise TensorError(f"conv_transpose: input {self.shape} and weight {weight.shape}: expected weight (Cin, Cout/groups, *kernel) "
                        f"and input (N, Cin, *spatial) or (Cin, *spatial) with {max(nd, 1)} spatial axes")
    x = self.unsqueeze(0) if self.ndim == nd + 1 else self
    Cin, Og, kernel = weight.shape[0], weight.shape[1], weight.shape[2:]
    if not isinstance(groups, int) or groups < 1 or x.shape[1] != Cin or Cin % groups:
      raise TensorError(f"conv_transpose: input {self.shape} with {groups} group(s) needs weight ({x.shape[1]}, Cout/groups, ...), "
                        f"got {weight.shape}")
    stride, dilation = _spatial(stride, nd, "conv_transpose stride"), _spatial(dilation, nd, "conv_transpose dilation")
    padding, output_padding = _spatial(padding, nd, "conv_transpose padding"), _spatial(output_padding, nd, "conv_transpose output_padding")
    if any(op >= max(st, d) for op, st, d in zip(output_padding, stride, dilation)):
      raise TensorError(f"conv_transpose: output_padding {output_padding} must be smaller than stride {stride} or dilation {dilation}")
    for a, st in enumerate(stride):   # spread: (.., L, ..) -> (.., L, st, ..) with zeros after each element, merged, cut to (L-1)*st + 1
      if st == 1: continue
      ax, L = 2 + a, x.shape[2 + a]
      x = x.unsqueeze(ax + 1).pad(tuple((0, st - 1) if k == ax + 1 else None for k in range(x.ndim + 1)))
      x = x.reshape(x.shape[:ax] + (L * st,) + x.shape[ax + 2:])
      x = x.shrink(tuple((0, (L - 1) * st + 1) if k == ax else None for k in range(x.ndim)))
    w = weight.reshape((groups, Cin // groups, Og) + kernel).transpose(1, 2).reshape((groups * Og, Cin // groups) + kernel)
    w = w.flip(tuple(range(2, 2 + nd)))
    pads = [(d * (k - 1) - p, d * (k - 1) - p + op) for k, d, p, op in zip(kernel, dilation, padding, output_padding)]
    out = x.conv2d(w, bias, 1, tuple(v for pair in reversed(pads) for v in pair), dilation, groups)
    return out if self.ndim == nd + 2 else out.squeeze(0)
  conv_transpose1d = conv_transpose3d = conv_transpose2d

  # ---- pooling
  def _pool(self, kernel_size, stride, padding, dilation, ceil_mode: bool, value, nd: int):
    """Windows for pooling over the last len(kernel) axes: (..., *out, K), with the padding added (value) and, in ceil
    mode, the extra room for a last partial window (torch's rule: it must start inside the input or the left padding).
    Returns the windows, the padding pairs and the extra right padding per axis."""
    if stride is None or (isinstance(stride, (tuple, list)) and not stride): stride = None   # tinygrad's [] too: the kernel size
    _check_window_args("pooling", kernel_size=kernel_size, padding=padding, dilation=dilation, **({} if stride is None else {"stride": stride}))
    kernel = (kernel_size,) * nd if isinstance(kernel_size, int) else tuple(kernel_size)   # a tuple sets the rank itself
    nd = len(kernel)
    if self.ndim < nd: raise TensorError(f"pooling with a {nd}-D kernel {kernel} needs at least {nd} dimensions, got {self.shape}")
    stride = kernel if stride is None else _spatial(stride, nd, "pool stride")
    dilation = _spatial(dilation, nd, "pool dilation")
    pads = _padding_pairs(padding, nd, kernel, dilation, "pool")
    extra = []
    for L, k, st, d, (b, a) in zip(self.shape[-nd:], kernel, stride, dilation, pads):
      span = L + b + a - d * (k - 1) - 1
      if span < 0: raise TensorError(f"pool: a window of {k} (dilation {d}) doesn't fit an axis of {L} padded by ({b}, {a})")
      out = (-(-span // st) if ceil_mode else span // st) + 1
      if ceil_mode and (out - 1) * st >= L + b: out -= 1
      extra.append(max(0, (out - 1) * st + d * (k - 1) + 1 - (L + b + a)))
    full = [(b, a + e) for (b, a), e in zip(pads, extra)]
    x = self
    if any(p != (0, 0) for p in full):
      x = x.pad(tuple(None for _ in range(self.ndim - nd)) + tuple(full), value=value)
      if any(b > 0 or a > 0 for b, a in full): x = x.contiguous()
    return x._pool_windows(kernel, stride, dilation), (kernel, stride, dilation, pads, extra)

  def _pool_windows(self, kernel, stride, dilation) -> Tensor:
    """Sliding windows over the last len(kernel) axes as (..., *out, K), from movement ops alone, so the backward pass is
    movement ops and one reduction too. (conv's _windows stacks one view per window position; its backward is a sum of
    one padded piece per position, 25 for 5x5, slow to compile.) Windows that tile the axes (stride = kernel, no
    dilation: the usual pooling) are a reshape that splits each axis into (windows, kernel). Otherwise each axis of
    length i is repeated e times and read flat: element j of window t is flat[j * (i + d) + t * s], which is
    x[j * d + t * s] because j * i is a whole number of repeats."""
    nd, lead = len(kernel), self.shape[:self.ndim - len(kernel)]
    ins, L = self.shape[len(lead):], len(lead)
    outs = tuple((i - d * (k - 1) - 1) // s + 1 for i, k, s, d in zip(ins, kernel, stride, dilation))
    if any(o <= 0 for o in outs): raise TensorError(f"pool: a window of {kernel} (dilation {dilation}) doesn't fit {ins}")
    keep = lambda rest: tuple(None for _ in lead) + tuple(rest)
    if all(s == k for s, k in zip(stride, kernel)) and all(d == 1 for d in dilation):
      x = self.shrink(keep((0, o * k) for o, k in zip(outs, kernel))).reshape(lead + tuple(v for o, k in zip(outs, kernel) for v in (o, k)))
      x = x.permute(list(range(L)) + [L + 2 * a for a in range(nd)] + [L + 2 * a + 1 for a in range(nd)])
      return x.reshape(lead + outs + (prod(kernel),))
    reps = [-(-k * (i + d) // i) for k, i, d in zip(kernel, ins, dilation)]
    x = self.reshape(lead + (1,) * nd + ins).expand(lead + tuple(reps) + ins)
    x = x.permute(list(range(L)) + [v for a in range(nd) for v in (L + a, L + nd + a)]).reshape(lead + tuple(e * i for e, i in zip(reps, ins)))
    x = x.shrink(keep((0, k * (i + d)) for k, i, d in zip(kernel, ins, dilation)))
    x = x.reshape(lead + tuple(v for k, i, d in zip(kernel, ins, dilation) for v in (k, i + d)))
    # each row is cut (or, with a stride beyond the window, padded: those elements are never read) to o * s
    x = x.pad(keep(v for o, s, i, d in zip(outs, stride, ins, dilation) for v in (None, (0, o * s - (i + d)))))
    x = x.reshape(lead + tuple(v for k, o, s in zip(kernel, outs, stride) for v in (k, o, s)))
    x = x.shrink(keep(v for _ in kernel for v in (None, None, (0, 1)))).reshape(lead + tuple(v for k, o in zip(kernel, outs) for v in (k, o)))
    x = x.permute(list(range(L)) + [L + 2 * a + 1 for a in range(nd)] + [L + 2 * a for a in range(nd)])
    return x.reshape(lead + outs + (prod(kernel),))

  def max_pool2d(self, kernel_size=2, stride=None, padding=0, dilation=1, ceil_mode: bool = False, return_indices: bool = False):
    """Max over windows of the last 2 axes (or len(kernel_size) axes), keeping the dtype. With return_indices also the flat
    index (within the pooled axes) of each window's first maximum, as torch's max_pool2d gives for max_unpool2d."""
    return self._max_pool(kernel_size, stride, padding, dilation, ceil_mode, return_indices, 2)
  def max_pool1d(self, kernel_size, stride=None, padding=0, dilation=1, ceil_mode=False, return_indices=False):
    return self._max_pool(kernel_size, stride, padding, dilation, ceil_mode, return_indices, 1)
  def max_pool3d(self, kernel_size, stride=None, padding=0, dilation=1, ceil_mode=False, return_indices=False):
    return self._max_pool(kernel_size, stride, padding, dilation, ceil_mode, return_indices, 3)
  def _max_pool(self, kernel_size, stride, padding, dilation, ceil_mode: bool, return_indices: bool, nd: int):
    win, (kernel, stride, dilation, pads, extra) = self._pool(kernel_size, stride, padding, dilation, ceil_mode, dtypes.min(self.dtype), nd)
    grad = self.requires_grad and self.dtype.is_float
    if not (return_indices or grad): return win.max(-1)
    # each window's first maximum among the input's own elements (padding never wins a tie, as in torch); the gradient
    # goes to it alone, as torch's: MAX would split it among ties (a window of zeros after a ReLU)
    sp = self.shape[-len(kernel):]
    where_from = Tensor(np.arange(prod(sp), dtype=np.int32).reshape(sp), device=self.device)
    where_from = where_from.pad(tuple((b, a + e) for (b, a), e in zip(pads, extra)), value=-1)._pool_windows(kernel, stride, dilation)
    w, K = win._stop_gradient(), win.shape[-1]
    hit = (w.eq(w.max(-1, keepdim=True)) | (w.ne(w) if self.dtype.is_float else False)) & (where_from >= 0)
    rev = Tensor(np.arange(K, 0, -1, dtype=np.int32), device=self.device)
    first = (K - hit.where(rev, 0).max(-1, keepdim=True)).eq(Tensor.arange(K, device=self.device))
    out = first.where(win, 0.0).sum(-1) if grad else win.max(-1)
    return ValuesIndices(out, first.where(where_from, 0).sum(-1)) if return_indices else out

  def avg_pool2d(self, kernel_size=2, stride=None, padding=0, ceil_mode: bool = False, count_include_pad: bool = True,
                 divisor_override: int | None = None, dilation=1) -> Tensor:
    """Mean over windows of the last 2 axes (or len(kernel_size) axes). As in torch, the divisor counts the padding when
    count_include_pad (but never ceil mode's extra room), and only the input's elements otherwise."""
    return self._avg_pool(kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override, dilation, 2)
  def avg_pool1d(self, kernel_size, stride=None, padding=0, ceil_mode=False, count_include_pad=True):
    return self._avg_pool(kernel_size, stride, padding, ceil_mode, count_include_pad, None, 1, 1)
  def avg_pool3d(self, kernel_size, stride=None, padding=0, ceil_mode=False, count_include_pad=True, divisor_override=None):
    return self._avg_pool(kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override, 1, 3)
  @_f16_in_f32
  def _avg_pool(self, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override, dilation, nd: int) -> Tensor:
    x = self if self.dtype.is_float else self.float()
    win, (kernel, stride, dilation, pads, extra) = x._pool(kernel_size, stride, padding, dilation, ceil_mode, 0.0, nd)
    total = win.sum(-1)
    if divisor_override is not None: return total / divisor_override
    counts = np.ones((), np.float32)
    for L, k, st, d, (b, a), e, o in zip(self.shape[-len(kernel):], kernel, stride, dilation, pads, extra, total.shape[-len(kernel):]):
      pos = np.arange(o)[:, None] * st + np.arange(k)[None, :] * d - b          # window o's element positions, in input coordinates
      lo, hi = (-b, L + a) if count_include_pad else (0, L)
      counts = counts[..., None] * ((pos >= lo) & (pos < hi)).sum(-1).astype(np.float32)
    return total / Tensor(counts, device=self.device)

  def max_unpool2d(self, indices: Tensor, kernel_size=2, stride=None, padding=0, output_size=None, dilation=1) -> Tensor:
    """max_pool2d's partial inverse: each value put back at its index within the pooled axes, zeros elsewhere. The output
    size is output_size's last axes, or (in - 1) * stride - 2 * padding + dilation * (kernel - 1) + 1 per axis."""
    kernel = (kernel_size,) * 2 if isinstance(kernel_size, int) else tuple(kernel_size)
    nd = len(kernel)
    stride = kernel if stride is None else _spatial(stride, nd, "max_unpool stride")
    padding, dilation = _spatial(padding, nd, "max_unpool padding"), _spatial(dilation, nd, "max_unpool dilation")
    if indices.shape != self.shape: raise TensorError(f"max_unpool2d: indices {indices.shape} for values {self.shape}")
    sp = tuple(output_size)[-nd:] if output_size is not None else \
      tuple((n - 1) * st - 2 * p + d * (k - 1) + 1 for n, st, p, d, k in zip(self.shape[-nd:], stride, padding, dilation, kernel))
    lead = self.shape[:-nd]
    out = Tensor.zeros(*lead, prod(sp), dtype=self.dtype, device=self.device)
    return out.scatter(-1, indices.reshape(lead + (-1,)), self.reshape(lead + (-1,))).reshape(lead + sp)

  # ---- resampling and einsum
  @_f16_in_f32
  def interpolate(self, size=None, scale_factor=None, mode: str = "nearest", align_corners: bool | None = None) -> Tensor:
    """Resample the axes after the first two to `size` (or by scale_factor), as torch.nn.functional.interpolate: "nearest"
    and "nearest-exact" pick source elements, "linear" ("bilinear", "trilinear") mixes the two neighbours on each axis in
    turn. The source positions are computed once in f32 as torch does, so the same elements are picked."""
    nd = self.ndim - 2
    if nd < 1: raise TensorError(f"interpolate needs (N, C, *spatial), got shape {self.shape}")
    if mode not in ("nearest", "nearest-exact", "linear", "bilinear", "trilinear"):
      raise TensorTypeError(f"interpolate: mode must be 'nearest', 'nearest-exact', 'linear', 'bilinear' or 'trilinear', got {mode!r}")
    if (size is None) == (scale_factor is None): raise TensorError("interpolate: give exactly one of size and scale_factor")
    if align_corners is not None and mode.startswith("nearest"): raise TensorError("interpolate: align_corners is for the linear modes")
    ins = self.shape[2:]
    if size is not None:
      _check_window_args("interpolate", size=size)   # sizes of at least 1 (0 was a ZeroDivisionError)
      outs, scales = _spatial(size, nd, "interpolate size"), [None] * nd
    else:
      scales = list(scale_factor) if isinstance(scale_factor, (tuple, list)) else [scale_factor] * nd
      if len(scales) != nd or not all(isinstance(f, (int, float, np.integer, np.floating)) and not isinstance(f, bool) and math.isfinite(f)
                                      and f > 0 for f in scales):
        raise TensorError(f"interpolate: scale_factor must be a positive finite number or {nd} of them, got {scale_factor!r}")
      scales = [float(f) for f in scales]
      outs = tuple(int(math.floor(n * f)) for n, f in zip(ins, scales))
      if any(o < 1 for o in outs): raise TensorError(f"interpolate: scale_factor {scale_factor} makes an empty axis of {ins}")
    _check_size(self.shape[:2] + tuple(outs), "interpolate")
    x = self
    for a, (n, o, sc) in enumerate(zip(ins, outs, scales)):
      ax = 2 + a
      if n == o and sc is None: continue
      scale = np.float32(1.0 / sc if sc is not None else n / o)
      dst = np.arange(o, dtype=np.float32)
      t = x.transpose(ax, -1)
      if mode.startswith("nearest"):
        src = np.floor(((dst + np.float32(0.5)) if mode == "nearest-exact" else dst) * scale).astype(np.int64)
        t = t[..., np.minimum(src, n - 1).astype(np.int32)]
      else:
        if align_corners: pos = dst * np.float32((n - 1) / (o - 1) if o > 1 else 0.0)
        else: pos = np.maximum(scale * (dst + np.float32(0.5)) - np.float32(0.5), np.float32(0))
        i0 = np.minimum(np.floor(pos).astype(np.int64), n - 1)
        i1 = np.minimum(i0 + 1, n - 1)
        w1 = Tensor((pos - i0).astype(np.float32), device=self.device)
        t = t.float()
        t = t[..., i0.astype(np.int32)] * (1 - w1) + t[..., i1.astype(np.int32)] * w1
      x = t.transpose(ax, -1)
    return x

  @staticmethod
  def einsum(formula: str, *operands) -> Tensor:
    """Einstein summation, as torch.einsum: "ij,jk->ik", an implicit output (the letters used once, sorted; the ellipsis
    first), "..." for broadcast leading axes, and a repeated letter in one operand for its diagonal. The operands are
    aligned on one order of letters, multiplied, and summed over the letters the output doesn't keep."""
    if len(operands) == 1 and isinstance(operands[0], (list, tuple)): operands = tuple(operands[0])
    if not operands or not all(isinstance(t, Tensor) for t in operands): raise TensorError("einsum takes a formula and Tensors")
    lhs, arrow, rhs = formula.replace(" ", "").partition("->")
    specs = lhs.split(",")
    if len(specs) != len(operands): raise TensorError(f"einsum: {formula!r} names {len(specs)} operands, got {len(operands)}")
    ell = [t.ndim - len(sp.replace("...", "")) if "..." in sp else 0 for sp, t in zip(specs, operands)]
    n_ell = max(ell)
    ell_letters = [chr(0x3B1 + k) for k in range(n_ell)]   # greek letters stand for the ellipsis axes, right-aligned
    labels = []
    for sp, t, k in zip(specs, operands, ell):
      if sp.count("...") > 1: raise TensorIndexError(f"einsum: {sp!r} has more than one ellipsis")
      if any(not (c.isascii() and c.isalpha()) for c in sp.replace("...", "")): raise TensorError(f"einsum: {sp!r}: subscripts are letters a-z, A-Z")
      if k < 0 or ("..." not in sp and len(sp) != t.ndim):
        raise TensorError(f"einsum: {sp!r} names {len(sp.replace('...', ''))} axes of an operand of shape {t.shape}")
      head, _, tail = sp.partition("...")
      labels.append(list(head) + ell_letters[n_ell - k:] + list(tail))
    counts = {c: sum(lab.count(c) for lab in labels) for lab in labels for c in lab}
    if arrow: out = [c for c in rhs.replace("...", "".join(ell_letters))]
    else: out = ell_letters + sorted(c for c, n in counts.items() if n == 1 and c not in ell_letters)
    if len(set(out)) != len(out) or any(c not in counts for c in out): raise TensorError(f"einsum: bad output subscripts in {formula!r}")
    ts = []
    for lab, t in zip(labels, operands):
      while len(set(lab)) != len(lab):   # a repeated letter: its diagonal, as a new last axis
        c = next(c for c in lab if lab.count(c) > 1)
        a, b = lab.index(c), lab.index(c, lab.index(c) + 1)
        if t.shape[a] != t.shape[b]: raise TensorError(f"einsum: the diagonal of {c!r} needs equal sizes, got {t.shape[a]} and {t.shape[b]}")
        t, lab = t.diagonal(0, a, b), [x for k, x in enumerate(lab) if k not in (a, b)] + [c]
      ts.append((lab, t))
    order = out + sorted({c for lab, _ in ts for c in lab} - set(out))
    sizes: dict[str, int] = {}
    for lab, t in ts:   # a size of 1 broadcasts, as in torch
      for c, n in zip(lab, t.shape):
        if n != 1 and sizes.setdefault(c, n) != n: raise TensorError(f"einsum: subscript {c!r} has sizes {sizes[c]} and {n} in {formula!r}")
    full = tuple(sizes.get(c, 1) for c in order)
    # f16 operands are multiplied and summed in f32 and rounded once, as matmul's
    f16 = _promote(*(t.dtype for _, t in ts)) is dtypes.f16
    if f16: ts = [(lab, t.float()) for lab, t in ts]
    prod_t = None
    for lab, t in ts:
      t = t.permute([lab.index(c) for c in order if c in lab]).reshape(tuple(t.shape[lab.index(c)] if c in lab else 1 for c in order))
      t = t._broadcast_to(full)
      prod_t = t if prod_t is None else prod_t * t
    out_t = prod_t.sum(tuple(range(len(out), len(order)))) if len(order) > len(out) else prod_t
    return out_t.half() if f16 else out_t

  @_f16_in_f32
  def softmax(self, axis: int = -1) -> Tensor:
    if self.numel() == 0: return self.float()   # nothing to normalize (and no max of an empty axis to take)
    m = self.max(axis, keepdim=True)._stop_gradient()
    e = (self - m).exp()
    return e / e.sum(axis, keepdim=True)
  @_f16_in_f32
  def log_softmax(self, axis: int = -1) -> Tensor:
    if self.numel() == 0: return self.float()
    m = self.max(axis, keepdim=True)._stop_gradient()
    s = self - m
    return s - s.exp().sum(axis, keepdim=True).log()

  def softmin(self, axis: int = -1) -> Tensor: return (-self).softmax(axis)

  # ---- losses, as torch.nn.functional's (reduction "mean", "sum" or "none")
  def _reduced(self, reduction: str, what: str) -> Tensor:
    if reduction == "none": return self
    if reduction == "sum": return self.sum()
    if reduction == "mean": return self.mean()
    raise TensorTypeError(f"{what}: reduction must be 'mean', 'sum' or 'none', got {reduction!r}")
  @_f16_in_f32
  def mse_loss(self, target: Tensor, reduction: str = "mean") -> Tensor: return ((self - target) ** 2)._reduced(reduction, "mse_loss")
  @_f16_in_f32
  def l1_loss(self, target: Tensor, reduction: str = "mean") -> Tensor: return (self - target).abs()._reduced(reduction, "l1_loss")
  @_f16_in_f32
  def smooth_l1_loss(self, target: Tensor, reduction: str = "mean", beta: float = 1.0) -> Tensor:
    """0.5 d^2 / beta where |d| < beta, |d| - beta / 2 beyond (the L1 loss for beta 0)."""
    d = (self - target).abs()
    loss = d if beta == 0 else (d < beta).where(0.5 * d * d / beta, d - 0.5 * beta)
    return loss._reduced(reduction, "smooth_l1_loss")
  @_f16_in_f32
  def huber_loss(self, target: Tensor, reduction: str = "mean", delta: float = 1.0) -> Tensor:
    d = (self - target).abs()
    return (d < delta).where(0.5 * d * d, delta * (d - 0.5 * delta))._reduced(reduction, "huber_loss")
  @_f16_in_f32
  def kl_div(self, target: Tensor, reduction: str = "mean", log_target: bool = False) -> Tensor:
    """target * (log target - self) with self the log-probabilities (0 where target is 0); "batchmean" divides the sum by
    the batch size, as the KL divergence's definition wants."""
    if log_target: loss = target.exp() * (target - self)
    else: loss = target.eq(0).where(0.0, target * target.eq(0).where(1.0, target).log()) - target * self
    if reduction == "batchmean": return loss.sum() / (self.shape[0] if self.ndim else 1)
    return loss._reduced(reduction, "kl_div")
  @_f16_in_f32
  def binary_cross_entropy(self, target: Tensor, weight: Tensor | None = None, reduction: str = "mean") -> Tensor:
    """-(t log p + (1 - t) log(1 - p)) of probabilities p = self, each log clamped at -100, with torch's gradients:
    (p - t) / max(p (1 - p), 1e-12) for p (finite at p = 0 and 1, where the clamp would give 0) and log(1 - p) - log p for t."""
    target = target if isinstance(target, Tensor) else Tensor.full((), float(target), device=self.device)
    p, t = self._stop_gradient(), target._stop_gradient()
    loss = -(t * p.log().clip(min_=-100) + (1 - t) * (-p).log1p().clip(min_=-100))
    loss = loss._with_gradient((self, (p - t) / (p * (1 - p)).clip(min_=1e-12)), (target, (-p).log1p() - p.log()))
    return (loss * weight if weight is not None else loss)._reduced(reduction, "binary_cross_entropy")
  @_f16_in_f32
  def binary_cross_entropy_with_logits(self, target: Tensor, weight: Tensor | None = None, reduction: str = "mean",
                                       pos_weight: Tensor | None = None) -> Tensor:
    """binary_cross_entropy(sigmoid(self), target) without forming the sigmoid: (1 - t) x + (1 + (pw - 1) t) softplus(-x),
    with softplus(-x) = log(1 + e^-|x|) + max(-x, 0), which never overflows."""
    lw = 1 + (pos_weight - 1) * target if pos_weight is not None else 1
    loss = (1 - target) * self + lw * ((-self.abs()).exp().log1p() + (-self).clip(min_=0))
    return (loss * weight if weight is not None else loss)._reduced(reduction, "binary_cross_entropy_with_logits")
  binary_crossentropy, binary_crossentropy_logits = binary_cross_entropy, binary_cross_entropy_with_logits   # tinygrad's names
  def _class_last(self) -> Tensor:
    """Scores (N, C, d...) as (N * d..., C), and (C,) as (1, C): the class axis last, one row per prediction."""
    if self.ndim == 1: return self.reshape(1, -1)
    return (self if self.ndim == 2 else self.permute([0] + list(range(2, self.ndim)) + [1])).reshape(-1, self.shape[1])
  def _class_targets(self, target, what: str, ignore_index: int) -> Tensor:
    """Class indices for scores (N, C, d...) or (C,): i32 of shape (N, d...) or (), each in [0, C) or ignore_index (checked
    on the values, as torch does: an index past the classes would pick nothing and give a finite loss)."""
    target = target if isinstance(target, Tensor) else Tensor(target, device=self.device)
    if target.dtype is not dtypes.i32: raise TensorError(f"{what}: target must hold class indices (i32), got {target.dtype.name}")
    want = self.shape[:1] + self.shape[2:] if self.ndim > 1 else ()
    if target.shape != want: raise TensorError(f"{what}: scores {self.shape} need class indices of shape {want}, got {target.shape}")
    C = self.shape[1 if self.ndim > 1 else 0]
    _check_indices(target, 0, C, f"{what}: target {{}} is out of range for {C} classes", ignore_index)
    return target
  @_f16_in_f32
  def nll_loss(self, target: Tensor, weight: Tensor | None = None, ignore_index: int = -100, reduction: str = "mean") -> Tensor:
    """-self[target] (times weight[target]) for log-probabilities (N, C, d...) or (C,) and class indices (N, d...) or ();
    "mean" divides by the summed weights of the targets not ignored, as torch does."""
    return self._nll(self._class_targets(target, "nll_loss", ignore_index), weight, ignore_index, reduction)
  def _nll(self, target: Tensor, weight: Tensor | None, ignore_index: int, reduction: str) -> Tensor:
    logp, t = self._class_last(), target.reshape(-1)
    onehot = t.unsqueeze(-1).eq(Tensor.arange(logp.shape[1], device=self.device))
    w = t.ne(ignore_index).float()
    if weight is not None: w = onehot.where(weight, 0.0).sum(-1) * w
    loss = -onehot.where(logp, 0.0).sum(-1) * w
    if reduction == "none": return loss.reshape(target.shape)
    if reduction == "sum": return loss.sum()
    if reduction != "mean": raise TensorTypeError(f"nll_loss: reduction must be 'mean', 'sum' or 'none', got {reduction!r}")
    return loss.sum() / w.sum()
  @_f16_in_f32
  def cross_entropy(self, target: Tensor, weight: Tensor | None = None, ignore_index: int = -100, reduction: str = "mean",
                    label_smoothing: float = 0.0) -> Tensor:
    """torch.nn.functional.cross_entropy of logits (N, C, d...) or (C,) with class indices (N, d...) or (), or with class
    probabilities of the logits' shape. label_smoothing mixes the targets with the uniform distribution."""
    if not 0 <= label_smoothing <= 1: raise TensorError(f"cross_entropy: label_smoothing must be in [0, 1], got {label_smoothing}")
    target = target if isinstance(target, Tensor) else Tensor(target, device=self.device)
    cdim = 0 if self.ndim == 1 else 1
    C = self.shape[cdim]
    logp = self.log_softmax(cdim)
    wshape = tuple(C if k == cdim else 1 for k in range(self.ndim))
    if target.dtype.is_float:   # class probabilities
      if target.shape != self.shape: raise TensorError(f"cross_entropy: probabilities {target.shape} for logits {self.shape}")
      p = target * (1 - label_smoothing) + label_smoothing / C if label_smoothing else target
      loss = -(logp * p * (weight.reshape(wshape) if weight is not None else 1)).sum(cdim)
      return loss._reduced(reduction, "cross_entropy")
    target = self._class_targets(target, "cross_entropy", ignore_index)
    nll = logp._nll(target, weight, ignore_index, "none")
    if not label_smoothing: return nll if reduction == "none" else logp._nll(target, weight, ignore_index, reduction)
    keep = target.ne(ignore_index).float()
    smooth = -(logp * (weight.reshape(wshape) if weight is not None else 1)).sum(cdim) * keep
    loss = (1 - label_smoothing) * nll + (label_smoothing / C) * smooth
    if reduction == "none": return loss
    if reduction == "sum": return loss.sum()
    if reduction != "mean": raise TensorTypeError(f"cross_entropy: reduction must be 'mean', 'sum' or 'none', got {reduction!r}")
    t = target.reshape(-1)
    w = t.unsqueeze(-1).eq(Tensor.arange(C, device=self.device)).where(weight, 0.0).sum(-1) if weight is not None else 1.0
    return loss.sum() / (w * t.ne(ignore_index).float()).sum()
  def sparse_categorical_crossentropy(self, target: Tensor, ignore_index: int = -1, label_smoothing: float = 0.0,
                                      reduction: str = "mean") -> Tensor:
    """tinygrad's cross entropy with the classes on the last axis of the logits (..., C) and targets (...)."""
    target = target if isinstance(target, Tensor) else Tensor(target, device=self.device)
    loss = self.reshape(-1, self.shape[-1]).cross_entropy(target.reshape(-1), ignore_index=ignore_index, reduction=reduction,
                                                          label_smoothing=label_smoothing)
    return loss.reshape(target.shape) if reduction == "none" else loss

  @_f16_in_f32
  def layernorm(self, axis=-1, eps: float = 1e-5) -> Tensor:
    """(x - mean) / sqrt(var + eps) over `axis` (no affine parameters: nn.LayerNorm adds them)."""
    x = self.float()
    d = x - x.mean(axis, keepdim=True)
    return d * ((d * d).mean(axis, keepdim=True) + eps).rsqrt()

  def embedding(self, weight: Tensor) -> Tensor:
    """Rows of weight (V, D) picked by this integer tensor: shape self.shape + (D,)."""
    if self.dtype is not dtypes.i32: raise TensorError(f"embedding: indices must be i32, got {self.dtype.name}")
    weight = _tensor_arg(weight, "embedding: weight")
    if weight.ndim != 2: raise TensorError(f"embedding: weight must be (num_embeddings, dim), got {weight.shape}")
    _check_indices(self, 0, weight.shape[0], f"embedding: index {{}} is out of range for {weight.shape[0]} embeddings")
    return weight[self]

  def dropout(self, p: float = 0.5, training: bool = True) -> Tensor:
    if not 0 <= _number_arg(p, "dropout: p") <= 1: raise TensorError(f"dropout: p must be in [0, 1], got {p}")
    if not training or p == 0: return self
    if p == 1: return self * 0
    keep = Tensor._drawn(lambda g, shape=self.shape: g.random(shape) >= p, dtypes.bool, self.device)
    return keep.where(self * (1 / (1 - p)), 0)

  def scaled_dot_product_attention(self, key: Tensor, value: Tensor, attn_mask: Tensor | None = None, dropout_p: float = 0.0,
                                   is_causal: bool = False, scale: float | None = None, enable_gqa: bool = False) -> Tensor:
    """softmax(q @ k^T * scale + mask) @ v, with q = self (..., L, E), key (..., S, E), value (..., S, Ev). With enable_gqa,
    key and value may have fewer heads (axis -3) than the query, each shared by a group of query heads."""
    key, value = _tensor_arg(key, "attention: key"), _tensor_arg(value, "attention: value")
    if _promote(self.dtype, key.dtype, value.dtype) is dtypes.f16:   # in f32, rounded once (see _f16_in_f32): f16 scores
      f32 = self.float().scaled_dot_product_attention(key.float(), value.float(), attn_mask, dropout_p, is_causal, scale, enable_gqa)
      return f32.half()                                               # rounded before the softmax were 10x further off
    if attn_mask is not None: attn_mask = _tensor_arg(attn_mask, "attention: attn_mask")
    if is_causal and attn_mask is not None: raise TensorError("attention: give attn_mask or is_causal, not both (as torch)")
    if self.ndim < 2 or key.ndim < 2 or value.ndim < 2:
      raise TensorError(f"attention: query {self.shape}, key {key.shape}, value {value.shape} must be at least 2-D")
    if enable_gqa and self.ndim >= 3 and key.ndim >= 3 and key.shape[-3] != self.shape[-3]:
      hq, hk = self.shape[-3], key.shape[-3]
      if hk == 0 or hq % hk or value.shape[-3] != hk:
        raise TensorError(f"attention: {hq} query heads can't share {hk} key heads ({value.shape[-3]} value heads)")
      key, value = key.repeat_interleave(hq // hk, -3), value.repeat_interleave(hq // hk, -3)
    if self.shape[-1] != key.shape[-1]: raise TensorError(f"attention: query {self.shape} and key {key.shape} disagree on the last axis")
    L, S = self.shape[-2], key.shape[-2]
    s = (self @ key.transpose(-1, -2)) * (scale if scale is not None else 1 / math.sqrt(self.shape[-1]))
    if is_causal:
      causal = Tensor(np.tril(np.ones((L, S), dtype=bool)), device=self.device)
      s = causal.where(s, float("-inf"))
    if attn_mask is not None: s = attn_mask.where(s, float("-inf")) if attn_mask.dtype is dtypes.bool else s + attn_mask
    return s.softmax(-1).dropout(dropout_p) @ value

  # ---- gradients
  def backward(self, gradient: Tensor | None = None) -> None:
    """Accumulate d self / d t into t.grad for every tensor t that requires a gradient and that self depends on."""
    if gradient is None and (self.numel() != 1 or not self.dtype.is_float):
      raise TensorError(f"backward() on a {self.dtype.name}{self.shape} tensor needs a gradient (only a float scalar defaults to 1)")
    if not self.requires_grad:   # torch refuses it too: there is no graph to go back through, so every gradient would be 0
      raise TensorError("backward(): nothing in this graph requires a gradient: this tensor was computed from tensors that "
                        "don't, detached, or returned by a uopc.jit replay (which keeps no graph: call backward() inside the function)")
    leaves = [t for r in list(Tensor._grad_leaves.values()) if (t := r()) is not None and t.requires_grad]
    root = self._seen_through(leaves)
    nodes = set(root.toposort())
    leaves = [t for t in leaves if t.uop in nodes]
    if not leaves: raise TensorError("backward(): nothing in this graph requires a gradient")
    for t, gt in zip(leaves, self._gradients(root, leaves, gradient)):
      t.grad = gt if t.grad is None else t.grad + gt

  def gradient(self, *targets: Tensor, gradient: Tensor | None = None) -> list[Tensor]:
    """d self / d t for each target t, as new tensors (zeros for a target self doesn't depend on), without touching any
    .grad. The targets need not require gradients: this is tinygrad's Tensor.gradient (torch.autograd.grad). A value
    realized on the way is seen through only when it was computed from tensors that require gradients (realize keeps
    the graph of those alone); otherwise the realized value is a constant here."""
    if gradient is None and (self.numel() != 1 or not self.dtype.is_float):
      raise TensorError(f"gradient() of a {self.dtype.name}{self.shape} tensor needs a gradient (only a float scalar defaults to 1)")
    if not all(isinstance(t, Tensor) for t in targets): raise TensorTypeError("gradient() takes the Tensors to differentiate by")
    return self._gradients(self._seen_through(list(targets)), list(targets), gradient)

  def _seen_through(self, leaves: list[Tensor]) -> UOp:
    """self's graph with values realized earlier (loss.item() before backward, ...) replaced by the graphs they came from,
    down to the leaves."""
    root = self.uop
    leaf_buffers = {t.uop.src[0] if t.uop.op is Ops.RESHAPE else t.uop for t in leaves}
    while hist := {u: _history[u] for u in root.toposort() if u.op is Ops.BUFFER and u in _history and u not in leaf_buffers}:
      root = root.substitute(hist)
    return root

  def _gradients(self, root: UOp, leaves: list[Tensor], gradient: Tensor | None) -> list[Tensor]:
    seed = gradient.cast(self.dtype).uop if gradient is not None else root.const_like(1.0)
    if seed.shape != self.shape: raise TensorError(f"backward: gradient {seed.shape} for a tensor of shape {self.shape}")
    grads = grad_of(root, [t.uop for t in leaves], seed)
    return [Tensor(g if g.dtype is t.dtype else g.cast(t.dtype), device=self.device) for t, g in zip(leaves, grads)]


__all__ = ["Tensor", "TensorError", "TensorIndexError", "TensorTypeError", "JitError", "broadcast_shape"]
