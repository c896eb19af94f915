"""uopc.onnx.fold: shape arithmetic on host values, exactly in the declared types.

An exported model computes shapes with ops: Shape, then Gather, Concat, Unsqueeze, a Mul or a Slice, into Reshape's
shape. Those values are known without reading any input's data (they are *static*: uopc.onnx.graph), so they are
computed here with NumPy in their own types (int64 stays int64), and the op that needs a shape reads a constant. A
fold applies only when every input is a static host value of at most FOLD_MAX elements, and integer or bool for the
arithmetic ops (float arithmetic is the device's job: its rounding is uopc's). Each function takes the op's inputs
(NumPy arrays, None for a missing optional one) and attributes and returns its outputs; one that meets a case it
doesn't handle returns NotImplemented, and the op's handler runs instead.
"""
from __future__ import annotations
import numpy as np
from uopc.onnx.dtypes import np_type

FOLD_MAX = 4096


def _small(*xs) -> bool: return all(x is None or x.size <= FOLD_MAX for x in xs)
def _ints(*xs) -> bool: return all(x is None or x.dtype.kind in "iub" for x in xs)


def _axes(axes, ndim: int) -> list[int]: return sorted(int(a) % ndim if ndim else 0 for a in np.asarray(axes).reshape(-1))


def identity(x): return x


def cast(x, to, saturate=1, round_mode="up"):
  want = np_type(to)
  if x.dtype.kind == "f" and want.kind in "iu": return NotImplemented   # overflow and NaN rules are the handler's
  return x.astype(want)


def shape(x, start=0, end=None):
  return np.array(x.shape[start:end], np.int64)


def size(x): return np.array(x.size, np.int64)


def gather(x, indices, axis=0):
  if x.ndim == 0: return NotImplemented
  n = x.shape[axis]
  if indices.size and (indices.min() < -n or indices.max() >= n): return NotImplemented   # the handler names the bad index
  return np.take(x, np.where(indices < 0, indices + n, indices), axis=axis)


def concat(*xs, axis):
  return np.concatenate([x for x in xs if x is not None], axis=axis)


def unsqueeze(x, axes_in=None, axes=None):
  axes = axes_in if axes_in is not None else axes
  if axes is None: return NotImplemented
  out_rank = x.ndim + np.asarray(axes).size
  return np.expand_dims(x, tuple(_axes(axes, out_rank)))


def squeeze(x, axes_in=None, axes=None):
  axes = axes_in if axes_in is not None else axes
  if axes is None: return np.squeeze(x)
  ax = _axes(axes, x.ndim)
  if any(x.shape[a] != 1 for a in ax): return NotImplemented
  return np.squeeze(x, tuple(ax))


def slice_(data, starts=None, ends=None, axes=None, steps=None):
  starts, ends = np.asarray(starts).reshape(-1), np.asarray(ends).reshape(-1)
  axes = range(len(starts)) if axes is None else [int(a) % data.ndim for a in np.asarray(axes).reshape(-1)]
  steps = [1] * len(starts) if steps is None else np.asarray(steps).reshape(-1)
  index = [slice(None)] * data.ndim
  for a, s, e, st in zip(axes, starts, ends, steps):
    if st == 0: return NotImplemented
    index[a] = slice(int(np.clip(s, -2**62, 2**62)), int(np.clip(e, -2**62, 2**62)), int(st))
  return data[tuple(index)]


def reshape(x, shape_in=None, allowzero=0, shape=None):
  shape = shape_in if shape_in is not None else shape
  if shape is None: return NotImplemented
  dims = [int(d) for d in np.asarray(shape).reshape(-1)]
  if not allowzero: dims = [x.shape[i] if d == 0 else d for i, d in enumerate(dims)]
  try: return x.reshape(dims)
  except ValueError: return NotImplemented


def expand(x, shape):
  try: return np.broadcast_to(x, np.broadcast_shapes(x.shape, tuple(int(d) for d in shape))).copy()
  except ValueError: return NotImplemented


def constant_of_shape(shape, value=None):
  v = np.zeros(1, np.float32) if value is None else value
  return np.full(tuple(int(d) for d in shape), v.reshape(-1)[0], v.dtype)


def _binary(fn, ints_only=True):
  def run(a, b):
    if ints_only and not _ints(a, b): return NotImplemented
    with np.errstate(all="ignore"): out = fn(a, b)
    return out.astype(a.dtype) if out.dtype != a.dtype and out.dtype != np.bool_ else out
  return run


def _div(a, b):
  if (b == 0).any(): return NotImplemented
  q = np.floor_divide(a, b)
  return q + ((np.remainder(a, b) != 0) & ((a < 0) ^ (b < 0))).astype(q.dtype)   # toward zero, as ONNX's integer Div


def _compare(fn):
  def run(a, b): return fn(a, b) if _ints(a, b) else NotImplemented
  return run


def where(c, a, b): return np.where(c, a, b) if _ints(a, b) else NotImplemented


def range_(start, limit, delta):
  if not _ints(start, limit, delta) or delta == 0: return NotImplemented
  return np.arange(start.item(), limit.item(), delta.item(), dtype=start.dtype)


def _reduce(fn):
  def run(x, axes_in=None, keepdims=1, noop_with_empty_axes=0, axes=None):
    if not _ints(x): return NotImplemented
    axes = axes_in if axes_in is not None else axes
    if axes is None or np.asarray(axes).size == 0:
      if noop_with_empty_axes: return x
      axes = range(x.ndim)
    return fn(x, axis=tuple(_axes(axes, x.ndim)), keepdims=bool(keepdims)).astype(x.dtype)
  return run


def _guarded(fn):
  """fn applied only to small inputs (folding a large initializer on the host, every call, would be the slow road)."""
  def run(*xs, **attrs):
    if not _small(*xs): return NotImplemented
    return fn(*xs, **attrs)
  return run


FOLDS = {name: _guarded(fn) for name, fn in {
  "Identity": identity, "Cast": cast, "Shape": shape, "Size": size, "Gather": gather, "Concat": concat, "Unsqueeze": unsqueeze,
  "Squeeze": squeeze, "Slice": slice_, "Reshape": reshape, "Expand": expand, "ConstantOfShape": constant_of_shape, "Range": range_,
  "Add": _binary(np.add), "Sub": _binary(np.subtract), "Mul": _binary(np.multiply), "Div": _binary(_div),
  "Max": _binary(np.maximum), "Min": _binary(np.minimum), "Equal": _compare(np.equal), "Less": _compare(np.less),
  "Greater": _compare(np.greater), "LessOrEqual": _compare(np.less_equal), "GreaterOrEqual": _compare(np.greater_equal),
  "Where": where, "Not": lambda x: np.logical_not(x), "Neg": lambda x: -x if _ints(x) else NotImplemented,
  "Abs": lambda x: np.abs(x) if _ints(x) else NotImplemented,
  "ReduceProd": _reduce(np.prod), "ReduceSum": _reduce(np.sum), "ReduceMax": _reduce(np.max), "ReduceMin": _reduce(np.min),
}.items()}
