"""uopc.tensor.creation: new tensors from shapes and values (full, zeros, arange, eye, ...) and from the random generator.

A constant tensor is one CONST expanded to the shape (nothing is stored until it is used); arange, linspace and eye are
computed on the host with NumPy and copied in. Random tensors are drawn on the host from one generator
(storage.generator, reset by manual_seed) and copied in: `_drawn` records each draw under a uopc.jit capture, so a
replay draws the same numbers a plain call would. dropout is here too: it is a random mask.
"""
from __future__ import annotations
import math
import threading
from collections import OrderedDict
from typing import Callable
import numpy as np
from uopc.dtype import DType, dtypes, I32_MIN, I32_MAX
from uopc.uop import UOp
from uopc.evaluate import to_python
from uopc.runtime import np_dtype
from uopc.backends import get_backend
from uopc.tensor.errors import TensorError
from uopc.tensor.args import NP_TO_DTYPE, to_dtype, number_arg, shape_arg, check_size, new_shape
from uopc.tensor.storage import buffer_of, generator, seed_generator
from uopc.tensor.capture import capturing
from uopc.tensor.core import TensorCore


def const_uop(value, dtype=None) -> UOp:
  """The scalar CONST of python (or NumPy) number `value` in `dtype` (its own when None), refused when it has no value
  there: what full() and where()'s number branches hold."""
  if isinstance(value, np.generic): value = value.item()
  if not isinstance(value, (int, float, bool)): raise TensorError(f"full: the value must be a number, got {value!r:.60}")
  dtype = to_dtype(dtype) or dtypes.from_py(value)
  if dtype is dtypes.i32 and not (isinstance(value, float) and math.isfinite(value) or isinstance(value, int)):
    raise TensorError(f"full: {value} has no i32 value")
  if dtype is dtypes.i32 and not I32_MIN <= int(value) <= I32_MAX: raise TensorError(f"full: {value} doesn't fit in i32")
  return UOp.const(value, dtype)


# the constants composites build at every call (attention's causal mask, a gather's positions to compare the indices
# with, triangles, bit weights, an identity for diag), made with NumPy once per backend and shape and shared: no one
# outside the composite sees them, so nothing writes them. Made afresh, each was a Buffer filled from NumPy every call
# (24 us each, 2 a GPT layer's plain step). The most recent SHARED_CONSTANTS are kept, and no more than
# SHARED_CONSTANT_BYTES of them (a long context's masks)
SHARED_CONSTANTS = 64
SHARED_CONSTANT_BYTES = 64 << 20
_shared: OrderedDict[tuple, tuple[UOp, int]] = OrderedDict()
_shared_bytes = 0
_shared_lock = threading.Lock()


def shared_constant(like: TensorCore, key: tuple, make: Callable[[], np.ndarray]) -> TensorCore:
  """A tensor on like's device holding make()'s array, requiring no gradient, made once for each `key` (which must say
  everything the array depends on) and backend, and shared by every call since. Only for tensors no caller can write."""
  global _shared_bytes
  backend = get_backend(like.device)
  with _shared_lock:
    if (hit := _shared.get((key, backend))) is not None: _shared.move_to_end((key, backend))
  if hit is None:
    arr = make()
    hit = (TensorCore._from_numpy(arr, NP_TO_DTYPE[arr.dtype], like.device), arr.nbytes)
    with _shared_lock:
      if (key, backend) not in _shared: _shared_bytes += hit[1]
      hit = _shared.setdefault((key, backend), hit)
      while len(_shared) > 1 and (len(_shared) > SHARED_CONSTANTS or _shared_bytes > SHARED_CONSTANT_BYTES):
        _shared_bytes -= _shared.popitem(last=False)[1][1]
  t = object.__new__(type(like))
  t.uop, t.grad, t.device, t.requires_grad = hit[0], None, like.device, False
  return t


def positions(like: TensorCore, n: int) -> TensorCore:
  """0, 1, ..., n - 1 (i32) on like's device, shared (see shared_constant): what a one-hot, a scatter, a sort or a
  running max compares indices with inside its own graph (n - positions counts down). Never handed out: Tensor.arange
  makes a tensor of the caller's own, and so does a composite whose result could be these positions themselves (a sort
  network's indices, nonzero's coordinates)."""
  return shared_constant(like, ("arange", n), lambda: np.arange(n, dtype=np.int32))


def triangle(like: TensorCore, rows: int, cols: int, diagonal: int = 0, upper: bool = False) -> TensorCore:
  """The (rows, cols) bool mask of the elements on and below `diagonal` (on and above: upper) on like's device, shared
  (see shared_constant): attention's causal mask, tril and triu, a scan's or a sort's triangle."""
  return shared_constant(like, ("triu" if upper else "tril", rows, cols, diagonal),
                         lambda: (np.triu if upper else np.tril)(np.ones((rows, cols), dtype=bool), diagonal))


class CreationMixin:
  """Constructors (class methods: Tensor.zeros(2, 3)), their *_like forms, and random tensors."""
  __slots__ = ()

  def _positions_uop(self, n: int) -> UOp:
    """positions(self, n) as a UOp: what autodiff compares a GATHER's indices with (TensorCore._gradients asks the
    composed tensor for it, since uopc.tensor.creation builds on uopc.tensor.core and not the other way round)."""
    return positions(self, n).uop

  @classmethod
  def full(cls, shape, value, dtype=None, requires_grad: bool = False, device: str | None = None) -> TensorCore:
    shape = new_shape(shape, "full")
    c = const_uop(value, dtype)
    # a leaf that requires grad is a buffer of its own: filled from NumPy, not by a fill kernel compiled and scheduled
    # alone (a GPT's layer norms asked for two, with a cold compile cache 45 ms each); lazy otherwise, to fuse
    # (the constant's value is the IR's, which a fill kernel would write: f16's is the f32 constant's cast)
    if requires_grad and c.dtype.is_float: return cls(np.full(shape, to_python(c), np_dtype(c.dtype)), device=device).requires_grad_()
    t = cls(c.reshape((1,) * len(shape)).expand(shape) if shape else c, device=device)
    return t.requires_grad_() if requires_grad else t
  @classmethod
  def zeros(cls, *shape, dtype=None, **kw) -> TensorCore: return cls.full(shape_arg(shape), 0.0, dtype or dtypes.f32, **kw)
  @classmethod
  def ones(cls, *shape, dtype=None, **kw) -> TensorCore: return cls.full(shape_arg(shape), 1.0, dtype or dtypes.f32, **kw)
  @classmethod
  def arange(cls, start, stop=None, step=1, dtype=None, device: str | None = None) -> TensorCore:
    if stop is None: start, stop = 0, start
    for v in (start, stop, step): number_arg(v, "arange: start, stop and step")
    if step == 0: raise TensorError("arange: step must not be 0")
    if not all(math.isfinite(v) for v in (start, stop, step)): raise TensorError(f"arange: ({start}, {stop}, {step}) must be finite")
    check_size((max(0, math.ceil((stop - start) / step)),), "arange")
    dtype = to_dtype(dtype) or (dtypes.f32 if any(isinstance(v, float) for v in (start, stop, step)) else dtypes.i32)
    n = max(0, math.ceil((stop - start) / step))
    if dtype is dtypes.i32 and n and not (I32_MIN <= start <= I32_MAX and I32_MIN <= start + (n - 1) * step <= I32_MAX):
      raise TensorError(f"arange({start}, {stop}, {step}): values from {start} to {start + (n - 1) * step} don't fit in i32 (they would wrap)")
    return cls(np.arange(start, stop, step).astype(np_dtype(dtype)), dtype=dtype, device=device)
  @classmethod
  def linspace(cls, start, stop, steps: int, dtype=None, device: str | None = None) -> TensorCore:
    """steps values from start to stop, evenly spaced (torch's: the first half counted from start, the rest back from
    stop, so both ends are exact)."""
    if not isinstance(steps, (int, np.integer)) or steps < 0: raise TensorError(f"linspace: steps must be an int >= 0, got {steps!r}")
    dtype = to_dtype(dtype) or dtypes.f32
    if dtype is dtypes.bool: raise TensorError("linspace: a bool range isn't supported")
    f = np.float32
    step = f((stop - start) / (steps - 1)) if steps > 1 else f(0)
    i = np.arange(steps, dtype=np.float32)
    vals = np.where(i < steps // 2, f(start) + step * i, f(stop) - step * (f(steps - 1) - i)) if steps > 1 else np.full(steps, start, f)
    return cls(vals.astype(np_dtype(dtype)), dtype=dtype, device=device)
  @classmethod
  def empty(cls, *shape, dtype=None, **kw) -> TensorCore:
    """A tensor whose values don't matter (zeros here: uopc has no uninitialized memory to hand out)."""
    return cls.zeros(*shape, dtype=dtype, **kw)
  @classmethod
  def eye(cls, n: int, m: int | None = None, dtype=None, device: str | None = None) -> TensorCore:
    shape = new_shape((n, n if m is None else m), "eye")
    return cls(np.eye(*shape, dtype=np_dtype(to_dtype(dtype) or dtypes.f32)), device=device)
  @staticmethod
  def manual_seed(seed: int = 0) -> None:
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
      raise TensorError(f"manual_seed: a seed is an int >= 0, got {seed!r}")
    seed_generator(seed)
  @classmethod
  def _drawn(cls, draw: Callable[[np.random.Generator], np.ndarray], dtype: DType, device: str | None,
             requires_grad: bool = False) -> TensorCore:
    """A tensor of random numbers that `draw` makes on the host from the generator (storage.generator, which manual_seed
    resets). Under a uopc.jit capture the draw is recorded, and every replay draws again with it from the same generator:
    a replayed call gets the numbers a plain call would have drawn at that point, bit for bit."""
    t = cls(np.asarray(draw(generator())).astype(np_dtype(dtype)), dtype=dtype, device=device)
    if (cap := capturing()) is not None and t.numel(): cap.draws.append((buffer_of(t.uop), draw))
    return t.requires_grad_() if requires_grad else t
  @classmethod
  def rand(cls, *shape, dtype=None, requires_grad: bool = False, device: str | None = None) -> TensorCore:
    shape = new_shape(shape, "rand")
    return cls._drawn(lambda g: g.random(shape, dtype=np.float32), to_dtype(dtype) or dtypes.f32, device, requires_grad)
  @classmethod
  def randn(cls, *shape, dtype=None, requires_grad: bool = False, device: str | None = None) -> TensorCore:
    shape = new_shape(shape, "randn")
    return cls._drawn(lambda g: g.standard_normal(shape, dtype=np.float32), to_dtype(dtype) or dtypes.f32, device, requires_grad)
  @classmethod
  def uniform(cls, *shape, low: float = 0.0, high: float = 1.0, dtype=None, requires_grad: bool = False, device: str | None = None) -> TensorCore:
    shape, low, high = new_shape(shape, "uniform"), number_arg(low, "uniform: low"), number_arg(high, "uniform: high")
    draw = lambda g: (g.random(shape) * (high - low) + low).astype(np.float32)
    return cls._drawn(draw, to_dtype(dtype) or dtypes.f32, device, requires_grad)
  def zeros_like(self, **kw) -> TensorCore: return type(self).zeros(*self.shape, dtype=kw.pop("dtype", self.dtype), device=self.device, **kw)
  def ones_like(self, **kw) -> TensorCore: return type(self).ones(*self.shape, dtype=kw.pop("dtype", self.dtype), device=self.device, **kw)
  def full_like(self, value, **kw) -> TensorCore:
    return type(self).full(self.shape, value, dtype=kw.pop("dtype", self.dtype), device=self.device, **kw)
  def rand_like(self, **kw) -> TensorCore: return type(self).rand(*self.shape, dtype=kw.pop("dtype", self.dtype), device=self.device, **kw)
  def randn_like(self, **kw) -> TensorCore: return type(self).randn(*self.shape, dtype=kw.pop("dtype", self.dtype), device=self.device, **kw)

  def dropout(self, p: float = 0.5, training: bool = True) -> TensorCore:
    if not 0 <= number_arg(p, "dropout: p") <= 1: raise TensorError(f"dropout: p must be in [0, 1], got {p}")
    if not training or p == 0: return self
    if p == 1: return self * 0
    keep = type(self)._drawn(lambda g, shape=self.shape: g.random(shape) >= p, dtypes.bool, self.device)
    return keep.where(self * (1 / (1 - p)), 0)
