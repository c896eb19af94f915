"""Tensor: the frontend. A thin, lazy layer that builds shaped UOp graphs as you call methods.

A Tensor holds one shaped UOp. Nothing runs until a value is asked for: `realize()` (or numpy/item/tolist)
kernelizes the graph, lowers and compiles each kernel (cached by its structure, so a training loop compiles once),
runs the kernels on the backend, and replaces the tensor's graph by the BUFFER that holds its value.
`schedule()` returns the kernels realize() would run, without running them.

Everything is the IR's primitives: broadcasting is RESHAPE + EXPAND, a reduction over any axes is a PERMUTE
that moves them last and a REDUCE, `x - y` is `x + y*-1`, exp is exp2, a gather with an integer Tensor is a
one-hot mask and a sum, a convolution is a window view (movement ops only) times the weights, summed. The
gradients come from uopc.grad on the same graph, so backward passes fuse and compile like forward ones.

Conventions follow PyTorch where DESIGN.md is silent, and tinygrad's where they differ and the IR's sugar
agrees: `cond.where(a, b)`, `max(axis)` returns values only, `pad(((before, after), ...))` takes numpy.pad's
pairs, `Tensor.cat(*ts, dim=)`, `layernorm` has no affine parameters, `gelu` is the tanh approximation,
`//` on integers floors. Dtypes promote bool < i32 < f16 < f32; a python scalar adopts the tensor's dtype
(a float scalar with an integer tensor gives f32). Shape errors name the shapes.
"""
from __future__ import annotations
import itertools, math, operator, os, weakref
from typing import Any, NamedTuple
import numpy as np
from uopc.dtype import DType, dtypes, I32_MIN, I32_MAX
from uopc.uop import UOp, Ops, ParamArg, prod
from uopc.composite import pad as _pad_uop, flip_axis
from uopc.kernelize import kernelize, Kernel
from uopc.backends import get_backend
from uopc.runtime import Buffer, run_schedule, np_dtype
from uopc.grad import gradient as grad_of

_PROMOTION = (dtypes.bool, dtypes.i32, dtypes.f16, dtypes.f32)
_NP_TO_DTYPE = {np.dtype(np.float32): dtypes.f32, np.dtype(np.float64): dtypes.f32, np.dtype(np.float16): dtypes.f16,
                np.dtype(np.int32): dtypes.i32, np.dtype(np.int64): dtypes.i32, np.dtype(np.int16): dtypes.i32,
                np.dtype(np.int8): dtypes.i32, np.dtype(np.uint8): dtypes.i32, np.dtype(np.uint16): dtypes.i32,
                np.dtype(np.bool_): dtypes.bool}


class TensorError(ValueError):
  """A Tensor operation called with shapes, dtypes or arguments it can't take."""


class JitError(TensorError):
  """A function uopc.jit can't capture or replay faithfully (see uopc.jit)."""


class _Capture:
  """What uopc.jit records while it runs a call: every launch the call makes, and every tensor whose value it replaced
  (assign), with the value the tensor held before. `strict` while it captures (the call a replay will repeat), when
  reading values and drawing random numbers are refused; not on the first call, which runs normally."""
  def __init__(self, strict: bool):
    self.strict = strict
    self.launches: list = []
    self.assigned: list[tuple[Tensor, UOp]] = []
    self.index_checks: list[tuple[int, IndexCheck]] = []   # (launches made before it, the check): a replay repeats it there


_capture: _Capture | None = None   # the jit call in progress (uopc.jit sets and clears it); None almost always


def _not_while_capturing(what: str) -> None:
  if _capture is not None and _capture.strict:
    raise JitError(f"{what} inside a function uopc.jit is capturing: a replay runs only the captured kernels, so "
                   f"{'the value read here' if 'item' in what or 'numpy' in what else 'the numbers drawn here'} would be "
                   "the capture's on every call. Return the tensor (or pass random numbers in as an argument) instead")


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
  if _capture is not None: _capture.index_checks.append((len(_capture.launches), check))
  check.run()


# ---- storage: the data behind realized BUFFERs -------------------------------------------------------------------
# the only state here is keyed by UOps: a BUFFER's memory (a uopc.runtime.Buffer on the tensor's backend) dies with the
# last graph that mentions the BUFFER. Data stays on the backend between kernels and crosses to NumPy only in numpy().

_storage: weakref.WeakKeyDictionary[UOp, Buffer] = weakref.WeakKeyDictionary()
# a realized tensor that depends on gradient leaves keeps the graph it came from, so backward() can still see through it
_history: weakref.WeakKeyDictionary[UOp, UOp] = weakref.WeakKeyDictionary()
_buffer_ids = itertools.count(1 << 20)   # BUFFER slots of tensors; kernels renumber their own buffers from 0


def _new_buffer(n: int, dtype: DType) -> UOp:
  return UOp(Ops.BUFFER, (), ParamArg(next(_buffer_ids), dtype, (max(1, n),)))


def _default_device() -> str: return os.environ.get("UOPC_DEVICE", "").strip().upper() or "C"


def _realized(u: UOp) -> bool:
  if prod(u.shape) == 0: return True   # an empty tensor has no data to compute (numpy() makes it from the shape)
  b = u.src[0] if u.op is Ops.RESHAPE else u
  return b.op is Ops.BUFFER and b in _storage and (u.op is not Ops.RESHAPE or prod(u.shape) == b.shape[0])


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


def _pair(v) -> tuple[int, int]:
  """A (height, width) argument given as one int or a pair."""
  return (v, v) if isinstance(v, int) else tuple(v)


def _check_window_args(what: str, **args) -> None:
  """kernel_size, stride, dilation and groups are at least 1 and padding at least 0, each an int or (groups excepted) a
  pair of ints: a 0 was a ZeroDivisionError, a float a silently truncated size."""
  for name, v in args.items():
    least = 0 if name == "padding" else 1
    pair = (v, v) if not isinstance(v, (tuple, list)) or name == "groups" else tuple(v)
    if len(pair) != 2 or not all(isinstance(x, (int, np.integer)) and not isinstance(x, bool) and x >= least for x in pair):
      raise TensorError(f"{what}: {name} must be {'an int' if name == 'groups' else 'an int or a pair of ints'} of at least {least}, got {v!r}")


def _promote(*ds: DType) -> DType: return max(ds, key=_PROMOTION.index)


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
      arr = data if isinstance(data, np.ndarray) else np.asarray(data)
      _check_size(arr.shape, "Tensor")
      if arr.dtype.kind in "USV": raise TensorError(f"can't make a Tensor of {arr.dtype} data {str(data)[:60]!r}: not numbers")
      if arr.dtype == object: raise TensorError(f"can't make a Tensor from {type(data).__name__} {str(data)[:60]!r}: ragged or not numbers")
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
    """Compute this tensor (and `others`, in the same schedule so they share work); returns self."""
    todo: dict[UOp, list[Tensor]] = {}
    for t in (self, *others):
      if not _realized(t.uop): todo.setdefault(t.uop, []).append(t)
    if not todo: return self
    outs = [(u, _new_buffer(prod(u.shape), u.dtype)) for u in todo]
    launches = run_schedule(kernelize(outs, _new_buffer), get_backend(self.device), _storage)
    if _capture is not None: _capture.launches += launches
    for (u, b) in outs:
      view = b.reshape(u.shape) if u.shape != b.shape else b
      # a value computed from gradient leaves (not a leaf itself: an optimizer's update is a fresh start) keeps its graph
      if any(t.requires_grad and id(t) not in Tensor._grad_leaves for t in todo[u]): _history[b] = u.reshape(b.shape) if u.shape != b.shape else u
      for t in todo[u]: t.uop = view
    return self

  def numpy(self) -> np.ndarray:
    _not_while_capturing(".numpy() / .item() / .tolist()")
    if self.numel() == 0: return np.zeros(self.shape, np_dtype(self.dtype))
    self.realize()
    b = self.uop.src[0] if self.uop.op is Ops.RESHAPE else self.uop
    return _storage[b].numpy()[:self.numel()].reshape(self.shape)

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
    """The same value with no gradient flowing back (a same-dtype CAST is the stop-gradient marker)."""
    return self._new(UOp(Ops.CAST, (self.uop,), self.dtype)) if self.dtype.is_float else self._new(self.uop)

  def _write(self, value) -> Tensor:
    """Overwrite a realized tensor's buffer in place with `value` (array-like of its shape), as torch's copy_ does:
    every view of the buffer sees it, and so does a uopc.jit capture that reads or rotates the buffer (an assign would
    move the tensor to a new buffer the capture never saw). A tensor that isn't realized yet is assigned instead."""
    arr = np.asarray(value)
    if arr.shape != self.shape: raise TensorError(f"write: a value of shape {arr.shape} into a tensor of shape {self.shape}")
    if self.numel() and _realized(self.uop):
      _storage[self.uop.src[0] if self.uop.op is Ops.RESHAPE else self.uop].copyin(arr)
      return self
    return self.assign(Tensor(arr, dtype=self.dtype, device=self.device)).realize()

  def assign(self, other: Tensor | Any) -> Tensor:
    """Make this tensor hold `other`'s value (same shape and dtype); its gradient is reset."""
    other = other if isinstance(other, Tensor) else Tensor(other, dtype=self.dtype, device=self.device)
    if other.shape != self.shape or other.dtype is not self.dtype:
      raise TensorError(f"assign: {other.dtype.name}{other.shape} into {self.dtype.name}{self.shape}")
    if _capture is not None: _capture.assigned.append((self, self.uop))
    self.uop = other.uop
    return self

  # ---- creation
  @staticmethod
  def full(shape, value, dtype=None, requires_grad: bool = False, device: str | None = None) -> Tensor:
    shape = _new_shape(shape, "full")
    dtype = _to_dtype(dtype) or dtypes.from_py(value)
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
    vals = np.arange(start, stop, step)
    dtype = _to_dtype(dtype) or (dtypes.f32 if any(isinstance(v, float) for v in (start, stop, step)) else dtypes.i32)
    return Tensor(vals.astype(np_dtype(dtype)), dtype=dtype, device=device)
  @staticmethod
  def eye(n: int, m: int | None = None, dtype=None, device: str | None = None) -> Tensor:
    shape = _new_shape((n, n if m is None else m), "eye")
    return Tensor(np.eye(*shape, dtype=np_dtype(_to_dtype(dtype) or dtypes.f32)), device=device)
  @staticmethod
  def manual_seed(seed: int = 0) -> None: Tensor._rng = np.random.default_rng(seed)
  @staticmethod
  def rand(*shape, dtype=None, requires_grad: bool = False, device: str | None = None) -> Tensor:
    _not_while_capturing("Tensor.rand")
    d = _to_dtype(dtype) or dtypes.f32
    return Tensor(Tensor._rng.random(_new_shape(shape, "rand"), dtype=np.float32).astype(np_dtype(d)), requires_grad=requires_grad, device=device)
  @staticmethod
  def randn(*shape, dtype=None, requires_grad: bool = False, device: str | None = None) -> Tensor:
    _not_while_capturing("Tensor.randn")
    d = _to_dtype(dtype) or dtypes.f32
    values = Tensor._rng.standard_normal(_new_shape(shape, "randn"), dtype=np.float32)
    return Tensor(values.astype(np_dtype(d)), requires_grad=requires_grad, device=device)
  @staticmethod
  def uniform(*shape, low: float = 0.0, high: float = 1.0, **kw) -> Tensor:
    _not_while_capturing("Tensor.uniform")
    return Tensor((Tensor._rng.random(_new_shape(shape, "uniform")) * (high - low) + low).astype(np.float32), **kw)
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
    return q.cast(self.dtype if self.dtype.is_float else dtypes.f32).detach()
  def __pow__(self, x): return self.pow(x)
  def __rpow__(self, x): return (self._new(self._operands(x, True)[0])).pow(self)
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
  def __invert__(self): return self.logical_not()
  def __and__(self, x): return self.cast(dtypes.bool)._binop(Ops.MUL, self._logical_operand(x))
  def __or__(self, x): return self.cast(dtypes.bool)._binop(Ops.ADD, self._logical_operand(x))
  def _logical_operand(self, x):
    if isinstance(x, (np.ndarray, list, tuple)): x = Tensor(x, device=self.device)
    return x.cast(dtypes.bool) if isinstance(x, Tensor) else bool(_number_arg(x, "a logical operand"))
  __rand__, __ror__ = __and__, __or__

  def cast(self, dtype) -> Tensor:
    if dtype is None: raise TensorError("cast needs a dtype, got None")
    d = _to_dtype(dtype)
    return self if d is self.dtype else self._new(self.uop.cast(d))
  def float(self) -> Tensor: return self.cast(dtypes.f32)
  def half(self) -> Tensor: return self.cast(dtypes.f16)
  def int(self) -> Tensor: return self.cast(dtypes.i32)
  def bool(self) -> Tensor: return self.cast(dtypes.bool)
  to = cast

  def _float_unary(self, op: Ops) -> Tensor:
    x = self if self.dtype.is_float else self.float()
    return self._new(UOp(op, (x.uop,)))
  def recip(self) -> Tensor: return self._float_unary(Ops.RECIP)
  def exp2(self) -> Tensor: return self._float_unary(Ops.EXP2)
  def log2(self) -> Tensor: return self._float_unary(Ops.LOG2)
  def sqrt(self) -> Tensor: return self._float_unary(Ops.SQRT)
  def sin(self) -> Tensor: return self._float_unary(Ops.SIN)
  def exp(self) -> Tensor: return (self * (1 / math.log(2))).exp2()
  def log(self) -> Tensor: return self.log2() * math.log(2)
  def rsqrt(self) -> Tensor: return self.sqrt().recip()
  def cos(self) -> Tensor: return (self + math.pi / 2).sin()
  def tan(self) -> Tensor: return self.sin() / self.cos()
  def sigmoid(self) -> Tensor:
    # 1/(1+e^-x) for x >= 0 and e^x/(1+e^x) below, both through e = e^-|x| <= 1: no exp overflows, so neither the value
    # nor the gradient (which would meet 0 * inf in the plain form for x below about -88) is ever NaN
    x = self.float()
    pos = x >= 0
    e = pos.where(-x, x).exp()
    r = (1.0 + e).recip()
    return pos.where(r, e * r)
  def tanh(self) -> Tensor: return 2.0 * (2.0 * self.float()).sigmoid() - 1.0
  def relu(self) -> Tensor: return ((self > 0) | self.ne(self)).where(self, 0) if self.dtype.is_float else (self > 0).where(self, 0)   # NaN stays
  def leaky_relu(self, neg_slope: float = 0.01) -> Tensor: return (self > 0).where(self, self * neg_slope)
  def gelu(self) -> Tensor: return 0.5 * self * (1 + (math.sqrt(2 / math.pi) * (self + 0.044715 * self * self * self)).tanh())
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
    if not isinstance(x, Tensor) and self.dtype.is_float: return -((-self).maximum(-x))
    a, b, parents = self._operands(x)
    return self._new(a, *parents)._reversed().maximum(self._new(b, *parents)._reversed())._reversed()
  def _reversed(self) -> Tensor:
    """An order-reversing bijection of the dtype, so a min is a max in disguise: -x for floats (NaN stays NaN), not x for
    bools, and -x - 1 for i32 (-x alone maps INT_MIN to itself, so min([INT_MIN, 5]) was 5)."""
    return -self - 1 if self.dtype is dtypes.i32 else -self
  def clip(self, min_=None, max_=None) -> Tensor:
    # WHERE, not maximum/minimum: torch.clamp gives self the whole gradient on a bound too (MAX would split the tie),
    # and a NaN stays NaN
    t = self
    if min_ is not None: t = (t < min_).where(min_, t)
    if max_ is not None: t = (t > max_).where(max_, t)
    return t
  clamp = clip
  def trunc(self) -> Tensor:
    if not self.dtype.is_float: return self
    # floats of magnitude 2**23 and more (and inf, nan) are integers already, and don't survive the round trip through i32
    # (piecewise constant: no gradient, as in torch)
    return (self.abs() < 2**23).where(self.cast(dtypes.i32).cast(self.dtype), self).detach()
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

  def pow(self, x) -> Tensor:
    if not isinstance(x, Tensor):
      x = _number_arg(x.item() if isinstance(x, np.generic) else x, "pow: the exponent")
      if x != x or math.isinf(x): return (self.float().log2() * float(x)).exp2()   # nan and inf exponents: IEEE's answers
      t = self.cast(self._scalar_dtype(x))   # as in the other ops: an int exponent keeps an int tensor int, a float one gives f32
      if x == 0.5: return t.sqrt()
      if float(x).is_integer():   # exponentiation by squaring: exact, and right for negative bases
        n, sq, out = abs(int(x)), (t if x > 0 else t.float()), None
        if n == 0: return t.ones_like()
        while True:
          if n & 1: out = sq if out is None else out * sq
          n >>= 1
          if not n: break
          sq = sq * sq
        return out if x > 0 else out.recip()
      return (t.log2() * float(x)).exp2()
    t = self if self.dtype.is_float else self.float()
    mag = x.eq(0).where(1.0, (t.abs().log2() * x).exp2())   # x**0 is 1, also for 0 and inf where log2 * 0 is nan
    # a negative base with an integral exponent: |t|^x, negated for odd x; otherwise NaN like torch
    odd = (x.float() % 2).abs().eq(1)
    integral = x.float().eq(x.float().floor())
    return (t < 0).where(integral.where(odd.where(-mag, mag), float("nan")), mag)

  def where(self, a, b) -> Tensor:
    """cond.where(a, b): a where self is true, b elsewhere, broadcast together."""
    cond = self.cast(dtypes.bool)
    a, b = (Tensor(x, device=self.device) if isinstance(x, (np.ndarray, list, tuple)) else x for x in (a, b))
    for x in (a, b):
      if not isinstance(x, Tensor): _number_arg(x, "where: a branch")
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
    if axis is None: return list(range(self.ndim))
    return sorted({self._dim(a) for a in (axis if isinstance(axis, (tuple, list)) else [axis])})

  def _dim(self, d: int, extra: int = 0) -> int:
    d = _int_arg(d, "a dimension")
    n = self.ndim + extra
    if not -max(n, 1) <= d < max(n, 1): raise TensorError(f"dimension {d} out of range for a tensor of shape {self.shape}")
    return d % max(n, 1)

  def _reduce(self, op: Ops, axis=None, keepdim: bool = False) -> Tensor:
    """REDUCE pops the last axes, so the reduced axes are PERMUTEd to the end first (a free index map)."""
    axes = self._axes(axis)
    order = [a for a in range(self.ndim) if a not in axes] + axes
    t = self.permute(order) if order != list(range(self.ndim)) else self
    out = self._new(t.uop.reduce(op, len(axes)))
    if not keepdim: return out
    return out.reshape(tuple(1 if a in axes else n for a, n in enumerate(self.shape)))

  def sum(self, axis=None, keepdim: bool = False, dtype=None) -> Tensor:
    t = self.cast(dtype) if dtype is not None else (self.cast(dtypes.i32) if self.dtype is dtypes.bool else self)
    return t._reduce(Ops.ADD, axis, keepdim)
  def max(self, axis=None, keepdim: bool = False) -> Tensor: return self._valued("max", axis)._reduce(Ops.MAX, axis, keepdim)
  def min(self, axis=None, keepdim: bool = False) -> Tensor: return self._valued("min", axis)._reversed()._reduce(Ops.MAX, axis, keepdim)._reversed()
  def _valued(self, what: str, axis) -> Tensor:
    """A max, min or argmax over nothing has no value (-inf, or the index INT_MIN, would be made up): refused as NumPy
    and PyTorch refuse it."""
    if self.numel() == 0 and prod(self.shape[a] for a in self._axes(axis)) == 0:
      raise TensorError(f"{what} over an axis of size 0 (shape {self.shape}) has no value")
    return self
  def mean(self, axis=None, keepdim: bool = False) -> Tensor:
    n = prod(self.shape[a] for a in self._axes(axis))
    return self.float().sum(axis, keepdim) * (1.0 / n if n else float("nan"))
  def var(self, axis=None, keepdim: bool = False, correction: int = 1) -> Tensor:
    correction = _number_arg(correction, "var: correction")
    n = prod(self.shape[a] for a in self._axes(axis))
    d = self.float() - self.float().mean(axis, keepdim=True)
    return (d * d).sum(axis, keepdim) * (1.0 / max(n - correction, 0) if n - correction > 0 else float("nan"))
  def std(self, axis=None, keepdim: bool = False, correction: int = 1) -> Tensor: return self.var(axis, keepdim, correction).sqrt()
  def argmax(self, axis=None, keepdim: bool = False) -> Tensor:
    """The index of the (first) maximum, as i32; over the flattened tensor when axis is None."""
    if axis is None: return self.reshape(-1).argmax(0)
    ax = self._valued("argmax", axis)._dim(axis)
    n = self.shape[ax]
    hit = self.eq(self.max(ax, keepdim=True))
    if self.dtype.is_float: hit = hit | self.ne(self)   # a NaN is the maximum, as in NumPy and torch: the first NaN wins
    rev = Tensor(np.arange(n, 0, -1, dtype=np.int32), device=self.device).reshape(tuple(n if i == ax else 1 for i in range(self.ndim)))
    return (n - hit.where(rev, 0).max(ax, keepdim)).cast(dtypes.i32)
  def argmin(self, axis=None, keepdim: bool = False) -> Tensor: return self._valued("argmin", axis)._reversed().argmax(axis, keepdim)
  # a bool MAX starts from False: through i32 an empty any() started from INT_MIN, which is True
  def any(self, axis=None, keepdim: bool = False) -> Tensor: return self.bool()._reduce(Ops.MAX, axis, keepdim)
  def all(self, axis=None, keepdim: bool = False) -> Tensor: return self.bool().logical_not().any(axis, keepdim).logical_not()

  # ---- movement
  def reshape(self, *shape) -> Tensor:
    shape = _shape_arg(shape)
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
    return self.broadcast_to(tuple(s if n == -1 else n for s, n in zip(src, shape)))
  def broadcast_to(self, *shape) -> Tensor: return self._broadcast_to(_new_shape(_shape_arg(shape), f"expand of {self.shape}"))
  def squeeze(self, dim: int | None = None) -> Tensor:
    if dim is None: return self.reshape(tuple(s for s in self.shape if s != 1))
    d = self._dim(dim)
    return self if self.shape[d] != 1 else self.reshape(self.shape[:d] + self.shape[d + 1:])
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
  def pad(self, arg, value: float = 0.0) -> Tensor:
    """Pad each axis by (before, after) (None for none); negative amounts crop. Like numpy.pad with a constant."""
    arg = tuple((0, 0) if a is None else a for a in _pairs_arg(arg, self.ndim, f"pad of {self.shape}"))
    t = self.shrink(tuple((max(0, -b), s - max(0, -a)) for (b, a), s in zip(arg, self.shape)))
    widths = tuple((max(0, b), max(0, a)) for b, a in arg)
    if all(w == (0, 0) for w in widths): return t
    _check_size(tuple(s + b + a for s, (b, a) in zip(t.shape, widths)), f"pad of {self.shape}")
    if t.numel() == 0 and any(w != (0, 0) for w in widths):
      return Tensor.full(tuple(s + b + a for s, (b, a) in zip(t.shape, widths)), value, t.dtype, device=self.device)
    out = t._new(_pad_uop(t.uop, widths))
    if value != 0:
      inside = t._new(_pad_uop(t.ones_like(dtype=dtypes.bool).uop, widths))
      out = inside.where(out, value)
    return out
  def flip(self, axis) -> Tensor:
    t = self
    for a in self._axes(axis): t = t._new(flip_axis(t.uop, a))
    return t
  def cat(*tensors: Tensor, dim: int = 0) -> Tensor:
    """Concatenate along dim (all other axes equal). Tensor.cat(a, b, dim=1) and a.cat(b, dim=1) are the same."""
    ts = [t for t in tensors if isinstance(t, Tensor)]
    if len(ts) != len(tensors) or not ts: raise TensorError("cat takes one or more Tensors")
    first = ts[0]
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
    ts = list(tensors)
    if not ts or not all(isinstance(t, Tensor) for t in ts): raise TensorError("stack takes one or more Tensors")
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
    base = (1,) * (len(reps) - self.ndim) + self.shape
    t = self.reshape(base)
    inter = tuple(x for s in base for x in (1, s))
    t = t.reshape(inter).expand(tuple(x for r, s in zip(reps, base) for x in (r, s)))
    return t.reshape(tuple(r * s for r, s in zip(reps, base)))

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
    idx = tuple(Tensor(np.asarray(i), device=self.device) if isinstance(i, (list, np.ndarray)) else i for i in idx)
    if sum(1 for i in idx if i is Ellipsis) > 1: raise TensorError("an index can hold only one Ellipsis")
    n_real = sum(1 for i in idx if i is not None and i is not Ellipsis)
    if n_real > self.ndim: raise TensorError(f"too many indices ({n_real}) for a tensor of shape {self.shape}")
    if any(i is Ellipsis for i in idx):   # `in` would compare Tensors with ==
      k = next(j for j, i in enumerate(idx) if i is Ellipsis)
      idx = idx[:k] + (slice(None),) * (self.ndim - n_real) + idx[k + 1:]
    else: idx = idx + (slice(None),) * (self.ndim - n_real)
    t, axis, tensor_axes = self, 0, []
    for i in idx:
      if i is None: t = t.unsqueeze(axis); axis += 1; continue
      if isinstance(i, Tensor):
        if i.dtype is dtypes.bool: raise TensorError("boolean mask indexing isn't supported (its result shape depends on the data)")
        if i.dtype is not dtypes.i32: raise TensorError(f"index tensors must be integers, got {i.dtype.name}")
        tensor_axes.append((axis, i)); axis += 1; continue
      if isinstance(i, (bool, np.bool_)): raise TensorError("a bool index isn't supported")
      if isinstance(i, (int, np.integer)):
        n = t.shape[axis]
        j = int(i) + n if i < 0 else int(i)
        if not 0 <= j < n: raise TensorError(f"index {i} is out of range for axis {axis} of size {n} (shape {self.shape})")
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
      raise TensorError(f"can't index a Tensor with {type(i).__name__} {i!r}")
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
    n = self.shape[d]
    if index.dtype is not dtypes.i32: raise TensorError(f"gather: index must be i32, got {index.dtype.name}")
    if any(a > b for i, (a, b) in enumerate(zip(index.shape, self.shape)) if i != d):
      raise TensorError(f"gather: index of shape {index.shape} is larger than the tensor {self.shape} outside dim {d}")
    _check_indices(index, 0, n, f"gather: index {{}} is out of range for dim {d} of size {n} (shape {self.shape})")
    x = self.shrink(tuple(None if i == d else (0, s) for i, s in enumerate(index.shape)))
    oh = index.unsqueeze(-1).eq(Tensor.arange(n, device=self.device))
    xe = x.unsqueeze(-1).transpose(d, -1)
    return oh.where(xe._broadcast_to(oh.shape), 0).sum(-1)

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
    n, k, m = x.shape[-2], x.shape[-1], y.shape[-1]
    a = x.cast(d).reshape(x.shape[:-2] + (n, 1, k))._broadcast_to(batch + (n, m, k))
    b = y.cast(d).transpose(-1, -2).reshape(y.shape[:-2] + (1, m, k))._broadcast_to(batch + (n, m, k))
    out = (a * b).sum(-1)
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
    """2-D convolution (cross-correlation) of (N, C, H, W) with weight (O, C/groups, KH, KW), as torch.nn.functional.conv2d."""
    weight = _tensor_arg(weight, "conv2d: weight")
    if isinstance(padding, str): raise TensorError("conv2d: give padding as numbers")
    _check_window_args("conv2d", stride=stride, padding=padding, dilation=dilation, groups=groups)
    stride, dilation = _pair(stride), _pair(dilation)
    if self.ndim != 4 or weight.ndim != 4: raise TensorError(f"conv2d: input {self.shape} and weight {weight.shape} must both be 4-D")
    N, C, H, W = self.shape
    O, Cg, KH, KW = weight.shape
    if C % groups or O % groups or C // groups != Cg:
      raise TensorError(f"conv2d: input {self.shape} with {groups} group(s) needs weight (O, {C // max(groups, 1)}, KH, KW) with O divisible "
                        f"by {groups}, got {weight.shape}")
    if isinstance(padding, str): raise TensorError("conv2d: give padding as numbers")
    ph, pw = _pair(padding)
    # the padded input is stored once (padding through views costs index arithmetic in every read of every window)
    x = self.pad((None, None, (ph, ph), (pw, pw))).contiguous() if ph or pw else self
    win = x._windows((KH, KW), stride, dilation)                         # (N, C, Ho, Wo, KH*KW)
    Ho, Wo = win.shape[2], win.shape[3]
    # out[n, o, h, w] = sum over (c, window position): the window positions innermost, a small axis to unroll
    win = win.reshape(N, groups, 1, Cg, Ho, Wo, KH * KW).permute(0, 1, 2, 4, 5, 3, 6)      # (N, G, 1, Ho, Wo, Cg, K)
    wt = weight.reshape(1, groups, O // groups, 1, 1, Cg, KH * KW)
    out = (win * wt).sum((-2, -1)).reshape(N, O, Ho, Wo)
    return out + bias.reshape(1, O, 1, 1) if bias is not None else out

  def _pool(self, kernel, stride, padding, value: float) -> Tensor:
    _check_window_args("pooling", kernel_size=kernel, stride=kernel if stride is None else stride, padding=padding)
    kernel = _pair(kernel)
    stride = _pair(stride) if stride is not None else kernel
    ph, pw = _pair(padding)
    if self.ndim < 2: raise TensorError(f"pooling needs at least 2 dimensions, got {self.shape}")
    x = self.pad(tuple(None for _ in range(self.ndim - 2)) + ((ph, ph), (pw, pw)), value=value).contiguous() if ph or pw else self
    return x._windows(kernel, stride, (1, 1), value)
  def max_pool2d(self, kernel_size=2, stride=None, padding=0) -> Tensor:
    return self._pool(kernel_size, stride, padding, float("-inf")).max(-1)
  def avg_pool2d(self, kernel_size=2, stride=None, padding=0) -> Tensor:
    return self._pool(kernel_size, stride, padding, 0.0).mean(-1)

  def softmax(self, axis: int = -1) -> Tensor:
    if self.numel() == 0: return self.float()   # nothing to normalize (and no max of an empty axis to take)
    m = self.max(axis, keepdim=True).detach()
    e = (self - m).exp()
    return e / e.sum(axis, keepdim=True)
  def log_softmax(self, axis: int = -1) -> Tensor:
    if self.numel() == 0: return self.float()
    m = self.max(axis, keepdim=True).detach()
    s = self - m
    return s - s.exp().sum(axis, keepdim=True).log()

  def cross_entropy(self, target: Tensor, ignore_index: int = -100, reduction: str = "mean", label_smoothing: float = 0.0) -> Tensor:
    """torch.nn.functional.cross_entropy of logits (N, C) (or (N, C, d...)) with integer class targets (N,) (or (N, d...))."""
    logits = self if self.ndim == 2 else self.permute([0] + list(range(2, self.ndim)) + [1]).reshape(-1, self.shape[1])
    target = target if isinstance(target, Tensor) else Tensor(target, device=self.device)
    tgt = target.reshape(-1)
    if tgt.shape[0] != logits.shape[0]:
      raise TensorError(f"cross_entropy: logits {self.shape} and target {target.shape} disagree on the batch")
    if tgt.dtype is not dtypes.i32: raise TensorError(f"cross_entropy: target must hold class indices (i32), got {tgt.dtype.name}")
    C = logits.shape[1]
    _check_indices(tgt, 0, C, f"cross_entropy: target {{}} is out of range for {C} classes", ignore_index)
    logp = logits.log_softmax(-1)
    onehot = tgt.unsqueeze(-1).eq(Tensor.arange(C, device=self.device)).float()
    if label_smoothing: onehot = onehot * (1 - label_smoothing) + label_smoothing / C
    nll = -(logp * onehot).sum(-1)
    keep = tgt.ne(ignore_index).float()
    nll = nll * keep
    if reduction == "none": return nll.reshape(target.shape)
    if reduction == "sum": return nll.sum()
    if reduction != "mean": raise TensorError(f"cross_entropy: reduction must be 'mean', 'sum' or 'none', got {reduction!r}")
    return nll.sum() / keep.sum()

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
    _not_while_capturing("dropout (training, p > 0)")
    keep = Tensor(Tensor._rng.random(self.shape) >= p, device=self.device)
    return keep.where(self * (1 / (1 - p)), 0)

  def scaled_dot_product_attention(self, key: Tensor, value: Tensor, attn_mask: Tensor | None = None, is_causal: bool = False,
                                   scale: float | None = None) -> Tensor:
    """softmax(q @ k^T * scale + mask) @ v, with q = self (..., L, E), key (..., S, E), value (..., S, Ev)."""
    key, value = _tensor_arg(key, "attention: key"), _tensor_arg(value, "attention: value")
    if attn_mask is not None: attn_mask = _tensor_arg(attn_mask, "attention: attn_mask")
    if self.ndim < 2 or key.ndim < 2: raise TensorError(f"attention: query {self.shape} and key {key.shape} need at least 2 dimensions")
    if self.shape[-1] != key.shape[-1]: raise TensorError(f"attention: query {self.shape} and key {key.shape} disagree on the last axis")
    L, S = self.shape[-2], key.shape[-2]
    s = (self @ key.transpose(-1, -2)) * (scale if scale is not None else 1 / math.sqrt(self.shape[-1]))
    if is_causal:
      causal = Tensor(np.tril(np.ones((L, S), dtype=bool)), device=self.device)
      s = causal.where(s, float("-inf"))
    if attn_mask is not None: s = attn_mask.where(s, float("-inf")) if attn_mask.dtype is dtypes.bool else s + attn_mask
    return s.softmax(-1) @ value

  # ---- gradients
  def backward(self, gradient: Tensor | None = None) -> None:
    """Accumulate d self / d t into t.grad for every tensor t that requires a gradient and that self depends on."""
    if gradient is None and (self.numel() != 1 or not self.dtype.is_float):
      raise TensorError(f"backward() on a {self.dtype.name}{self.shape} tensor needs a gradient (only a float scalar defaults to 1)")
    leaves = [t for r in list(Tensor._grad_leaves.values()) if (t := r()) is not None and t.requires_grad]
    root = self.uop
    leaf_buffers = {t.uop.src[0] if t.uop.op is Ops.RESHAPE else t.uop for t in leaves}
    while hist := {u: _history[u] for u in root.toposort() if u.op is Ops.BUFFER and u in _history and u not in leaf_buffers}:
      root = root.substitute(hist)   # see through values realized earlier (loss.item() before backward, ...)
    nodes = set(root.toposort())
    leaves = [t for t in leaves if t.uop in nodes]
    if not leaves: raise TensorError("backward(): nothing in this graph requires a gradient")
    seed = gradient.cast(self.dtype).uop if gradient is not None else root.const_like(1.0)
    if seed.shape != self.shape: raise TensorError(f"backward: gradient {seed.shape} for a tensor of shape {self.shape}")
    for t, g in zip(leaves, grad_of(root, [t.uop for t in leaves], seed)):
      gt = Tensor(g, device=self.device)
      t.grad = gt if t.grad is None else t.grad + gt


__all__ = ["Tensor", "TensorError", "JitError", "broadcast_shape"]
