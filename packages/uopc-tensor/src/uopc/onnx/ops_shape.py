"""uopc.onnx.ops_shape: ONNX's movement, indexing and creation ops (Reshape to Resize) on the Tensor API.

Shape-like inputs (Reshape's shape, Slice's starts and ends, Pad's pads, TopK's k, ...) arrive as NumPy arrays (`const`
in the registry), so every output shape is known when the graph is built. Gathers and scatters take their indices as
Tensors: negative indices count from the end as ONNX says, and an index out of range is a TensorError from the Tensor
methods' checks (on the realized values), never a silently zero element. Ops that only move values are `exact`: a
narrow integer type needs no wrapping after them.
"""
from __future__ import annotations
import numpy as np
from uopc.dtype import dtypes
from uopc.uop import prod
from uopc.tensor import Tensor
from uopc.onnx.registry import op
from uopc.onnx.dtypes import OnnxError, np_type, to_tensor, check


def _ints(a) -> list[int]: return [int(v) for v in np.asarray(a).reshape(-1)]
def _axis(axis: int, ndim: int) -> int:
  if not -max(ndim, 1) <= axis < max(ndim, 1): raise OnnxError(f"axis {axis} is out of range for rank {ndim}")
  return axis % max(ndim, 1)
def _indices(idx: Tensor, n: int) -> Tensor:
  """ONNX's indices, negative ones counting from the end, checked against n."""
  check((idx < -n) | (idx >= n), f"an index is out of range for an axis of {n}")
  return (idx < 0).where(idx + n, idx)


@op("Identity", since=1, exact=True)
def identity(ctx, x): return x
@op("Constant", since=1)
def constant(ctx, value=None, value_float=None, value_floats=None, value_int=None, value_ints=None, value_string=None, value_strings=None,
             sparse_value=None):
  if value is not None: return value
  if value_float is not None: return np.array(value_float, np.float32)
  if value_floats is not None: return np.array(value_floats, np.float32)
  if value_int is not None: return np.array(value_int, np.int64)
  if value_ints is not None: return np.array(value_ints, np.int64)
  raise NotImplementedError("uopc.onnx: Constant with strings or a sparse value is not supported")
@op("Shape", since=1)
def shape(ctx, x, start=0, end=None): return np.array(x.shape[start:end], np.int64)
@op("Size", since=1)
def size(ctx, x): return np.array(x.numel(), np.int64)
@op("Reshape", since=5, const=(1,), exact=True)
def reshape(ctx, x, shape, allowzero=0):
  dims = _ints(shape)
  if not allowzero: dims = [x.shape[i] if d == 0 else d for i, d in enumerate(dims)]
  return x.reshape(dims)
@op("Flatten", since=1, exact=True)
def flatten(ctx, x, axis=1):
  a = axis + x.ndim if axis < 0 else axis
  return x.reshape(prod(x.shape[:a]), prod(x.shape[a:]))
@op("Transpose", since=1, exact=True)
def transpose(ctx, x, perm=None): return x.permute(perm if perm is not None else list(reversed(range(x.ndim))))
@op("Squeeze", since=1, exact=True)
def squeeze_1(ctx, x, axes=None): return x.squeeze(tuple(axes)) if axes is not None and len(axes) else x.squeeze()
@op("Squeeze", since=13, const=(1,), exact=True)
def squeeze_13(ctx, x, axes=None):
  if axes is None or not np.asarray(axes).size: return x.squeeze()
  ax = [_axis(a, x.ndim) for a in _ints(axes)]
  if any(x.shape[a] != 1 for a in ax): raise OnnxError(f"Squeeze: axes {ax} of shape {x.shape} are not all of size 1")
  return x.squeeze(tuple(ax))
@op("Unsqueeze", since=1, exact=True)
def unsqueeze_1(ctx, x, axes): return unsqueeze_13(ctx, x, np.array(axes))
@op("Unsqueeze", since=13, const=(1,), exact=True)
def unsqueeze_13(ctx, x, axes):
  rank = x.ndim + np.asarray(axes).size
  ax = sorted(_axis(a, rank) for a in _ints(axes))
  if len(set(ax)) != len(ax): raise OnnxError(f"Unsqueeze: axes {_ints(axes)} repeat")
  shape, it = [], iter(x.shape)
  for k in range(rank): shape.append(1 if k in ax else next(it))
  return x.reshape(shape)
@op("Concat", since=4, exact=True)
def concat(ctx, *xs, axis):
  xs = [x for x in xs if x is not None]
  full = [x for x in xs if x.numel()]
  a = _axis(axis, xs[0].ndim)
  if not full:
    shape = list(xs[0].shape)
    shape[a] = sum(x.shape[a] for x in xs)
    return Tensor.zeros(*shape, dtype=xs[0].dtype, device=ctx.device)
  return Tensor.cat(*full, dim=a) if len(full) > 1 else full[0]
def _split(ctx, x, sizes, axis, num_outputs=None):
  a = _axis(axis, x.ndim)
  n = x.shape[a]
  if sizes is None:
    parts = num_outputs or ctx.n_outputs
    step = -(-n // parts)
    sizes = [min(step, n - k * step) for k in range(parts)] if num_outputs else [n // parts] * parts
    if not num_outputs and n % parts: raise OnnxError(f"Split: axis {a} of {n} doesn't split into {parts} equal parts")
  return tuple(x.split([int(s) for s in sizes], a))
@op("Split", since=2, exact=True)
def split_2(ctx, x, axis=0, split=None): return _split(ctx, x, split, axis)
@op("Split", since=13, const=(1,), exact=True)
def split_13(ctx, x, split=None, axis=0, num_outputs=None):
  return _split(ctx, x, None if split is None or not np.asarray(split).size else _ints(split), axis, num_outputs)
def _slice(x: Tensor, starts, ends, axes, steps) -> Tensor:
  starts, ends = _ints(starts), _ints(ends)
  axes = list(range(len(starts))) if axes is None else [_axis(a, x.ndim) for a in _ints(axes)]
  steps = [1] * len(starts) if steps is None else _ints(steps)
  index = [slice(None)] * x.ndim
  for a, s, e, st in zip(axes, starts, ends, steps):
    if st == 0: raise OnnxError("Slice: a step of 0")
    index[a] = slice(s, e, st)
  return x[tuple(index)]
@op("Slice", since=1, exact=True)
def slice_1(ctx, x, starts, ends, axes=None): return _slice(x, starts, ends, axes, None)
@op("Slice", since=10, const=(1, 2, 3, 4), exact=True)
def slice_10(ctx, x, starts, ends, axes=None, steps=None): return _slice(x, starts, ends, axes, steps)
@op("Gather", since=1, exact=True)
def gather(ctx, x, indices, axis=0):
  a = _axis(axis, x.ndim)
  idx = _indices(indices, x.shape[a])
  return x[(slice(None),) * a + (idx,)]
@op("GatherElements", since=11, exact=True)
def gather_elements(ctx, x, indices, axis=0):
  a = _axis(axis, x.ndim)
  return x.gather(a, _indices(indices, x.shape[a]))
def _nd_flat(data_shape: tuple, indices: Tensor, batch_dims: int) -> tuple[Tensor, int, int]:
  """GatherND's and ScatterND's indices (..., k) as one flat index into the k axes after the batch axes, per batch."""
  k = indices.shape[-1]
  dims = data_shape[batch_dims:batch_dims + k]
  flat = None
  for j, n in enumerate(dims):
    i = _indices(indices[..., j], n)
    flat = i if flat is None else flat * n + i
  return flat, prod(dims), k
@op("GatherND", since=11, exact=True)
def gather_nd(ctx, x, indices, batch_dims=0):
  B = prod(x.shape[:batch_dims])
  flat, D, k = _nd_flat(x.shape, indices, batch_dims)
  rest = x.shape[batch_dims + k:]
  data = x.reshape(B, D, prod(rest))
  mid = indices.shape[batch_dims:-1]
  f = flat.reshape(B, prod(mid)) if flat is not None else Tensor.zeros(B, prod(mid), dtype=dtypes.i32, device=ctx.device)
  b = Tensor.arange(B, device=ctx.device).reshape(B, 1)
  out = data[b, f]                                  # (B, M, R)
  return out.reshape(tuple(x.shape[:batch_dims]) + tuple(mid) + tuple(rest))
_SCATTER_REDUCE = {"add": "sum", "mul": "prod", "max": "amax", "min": "amin"}
@op("ScatterND", since=11, exact=False)
def scatter_nd(ctx, x, indices, updates, reduction="none"):
  flat, D, k = _nd_flat(x.shape, indices, 0)
  rest = x.shape[k:]
  R, M = prod(rest), prod(indices.shape[:-1])
  data = x.reshape(D, R)
  idx = flat.reshape(M, 1).expand(M, R)
  u = updates.reshape(M, R).cast(x.dtype)
  if reduction == "none": out = data.scatter(0, idx, u)
  elif reduction in _SCATTER_REDUCE: out = data.scatter_reduce(0, idx, u, _SCATTER_REDUCE[reduction])
  else: raise OnnxError(f"ScatterND: reduction must be none, add, mul, max or min, got {reduction!r}")
  return out.reshape(x.shape)
@op("ScatterElements", since=11)
def scatter_elements(ctx, x, indices, updates, axis=0, reduction="none"):
  a = _axis(axis, x.ndim)
  idx = _indices(indices, x.shape[a])
  if reduction == "none": return x.scatter(a, idx, updates.cast(x.dtype))
  if reduction not in _SCATTER_REDUCE: raise OnnxError(f"ScatterElements: reduction must be none, add, mul, max or min, got {reduction!r}")
  return x.scatter_reduce(a, idx, updates.cast(x.dtype), _SCATTER_REDUCE[reduction])
@op("Scatter", since=9)
def scatter(ctx, x, indices, updates, axis=0): return scatter_elements(ctx, x, indices, updates, axis)
@op("Expand", since=8, const=(1,), exact=True)
def expand(ctx, x, shape):
  dims = _ints(shape)
  n = max(len(dims), x.ndim)
  a = (1,) * (n - x.ndim) + x.shape
  b = (1,) * (n - len(dims)) + tuple(dims)
  out = []
  for p, q in zip(a, b):
    if p != q and p != 1 and q != 1: raise OnnxError(f"Expand: shape {x.shape} doesn't broadcast with {tuple(dims)}")
    out.append(q if p == 1 else p)
  return x.reshape(a).expand(tuple(out))
@op("Tile", since=6, const=(1,), exact=True)
def tile(ctx, x, repeats): return x.repeat(_ints(repeats)) if x.ndim else x
def _pad(ctx, x, pads, value, mode, axes=None):
  pads = _ints(pads)
  axes = list(range(x.ndim)) if axes is None else [_axis(a, x.ndim) for a in _ints(axes)]
  if len(pads) != 2 * len(axes): raise OnnxError(f"Pad: {len(pads)} pads for {len(axes)} axes")
  pairs = [(0, 0)] * x.ndim
  for k, a in enumerate(axes): pairs[a] = (pads[k], pads[k + len(axes)])
  mode = {"edge": "replicate", "wrap": "circular"}.get(mode, mode)
  if mode not in ("constant", "reflect", "replicate", "circular"): raise OnnxError(f"Pad: unknown mode {mode!r}")
  if mode == "constant":
    v = float(value) if x.dtype.is_float else (bool(value) if x.dtype is dtypes.bool else int(value))
    return x.pad(tuple(pairs), value=v)
  return x.pad(tuple(pairs), mode=mode)
@op("Pad", since=2)
def pad_2(ctx, x, pads, mode="constant", value=0.0): return _pad(ctx, x, pads, value, mode)
@op("Pad", since=11, const=(1, 2, 3))
def pad_11(ctx, x, pads, constant_value=None, axes=None, mode="constant"):
  v = 0 if constant_value is None or not np.asarray(constant_value).size else np.asarray(constant_value).reshape(-1)[0].item()
  return _pad(ctx, x, pads, v, mode, axes)
@op("DepthToSpace", since=1, exact=True)
def depth_to_space(ctx, x, blocksize, mode="DCR"):
  N, C, H, W = x.shape
  b = blocksize
  if mode == "DCR": return x.reshape(N, b, b, C // (b * b), H, W).permute(0, 3, 4, 1, 5, 2).reshape(N, C // (b * b), H * b, W * b)
  return x.reshape(N, C // (b * b), b, b, H, W).permute(0, 1, 4, 2, 5, 3).reshape(N, C // (b * b), H * b, W * b)
@op("SpaceToDepth", since=1, exact=True)
def space_to_depth(ctx, x, blocksize, mode="DCR"):
  """The inverse of DepthToSpace: DCR puts the block offsets before the channel in the new channel axis, CRD after it."""
  N, C, H, W = x.shape
  b = blocksize
  order = {"DCR": (0, 3, 5, 1, 2, 4), "CRD": (0, 1, 3, 5, 2, 4)}
  if mode not in order: raise OnnxError(f"SpaceToDepth: mode must be DCR or CRD, got {mode!r}")
  return x.reshape(N, C, H // b, b, W // b, b).permute(*order[mode]).reshape(N, C * b * b, H // b, W // b)
@op("Trilu", since=14, const=(1,), exact=True)
def trilu(ctx, x, k=None, upper=1):
  kk = 0 if k is None else _ints(k)[0]
  return x.triu(kk) if upper else x.tril(kk)
@op("NonZero", since=9)
def nonzero(ctx, x):
  if x.ndim == 0: x = x.reshape(1)
  return x.nonzero().transpose(0, 1) if x.numel() else Tensor.zeros(x.ndim, 0, dtype=dtypes.i32, device=ctx.device)
@op("OneHot", since=9, const=(1,))
def one_hot(ctx, indices, depth, values, axis=-1):
  d = int(np.asarray(depth).reshape(-1)[0])
  idx = indices.trunc().cast(dtypes.i32) if indices.dtype.is_float else indices
  idx = (idx < 0).where(idx + d, idx)
  a = _axis(axis, indices.ndim + 1)
  classes = Tensor.arange(d, device=ctx.device).reshape(tuple(d if k == a else 1 for k in range(indices.ndim + 1)))
  hot = idx.unsqueeze(a).eq(classes)
  return hot.where(values[1], values[0])
def _scan(ctx, x, axis, exclusive, reverse, product: bool):
  from uopc.onnx.ops_math import guard_wide
  a = _axis(int(np.asarray(axis).reshape(-1)[0]), x.ndim)
  def run(t):
    if reverse: t = t.flip(a)
    if exclusive: t = t.pad(tuple((1, -1) if k == a else (0, 0) for k in range(t.ndim)), value=1 if product else 0)
    out = t.cumprod(a) if product else t.cumsum(a)
    return out.flip(a) if reverse else out
  return guard_wide(ctx, run(x), lambda: run(x.float()))
@op("CumSum", since=11, const=(1,))
def cumsum(ctx, x, axis, exclusive=0, reverse=0): return _scan(ctx, x, axis, exclusive, reverse, False)
@op("CumProd", since=26, const=(1,))
def cumprod(ctx, x, axis, exclusive=0, reverse=0): return _scan(ctx, x, axis, exclusive, reverse, True)
@op("Range", since=11, const=(0, 1, 2))
def range_(ctx, start, limit, delta):
  s, l, d = (np.asarray(v).reshape(-1)[0] for v in (start, limit, delta))
  if d == 0: raise OnnxError("Range: delta is 0")
  n = max(int(np.ceil((l - s) / d)), 0)
  return (s + np.arange(n) * d).astype(np.asarray(start).dtype) if np.asarray(start).dtype.kind == "f" else np.arange(s, l, d).astype(start.dtype)
@op("ConstantOfShape", since=9, const=(0,))
def constant_of_shape(ctx, shape, value=None):
  v = np.zeros(1, np.float32) if value is None else np.asarray(value).reshape(-1)
  dims = _ints(shape)
  t = to_tensor(v[:1].reshape(()), v.dtype, ctx.device, "ConstantOfShape's value")
  return t.reshape(()).expand(tuple(dims)) if dims else t.reshape(())
@op("EyeLike", since=9)
def eye_like(ctx, x, dtype=None, k=0):
  want = np_type(dtype) if dtype is not None else (ctx.in_types[0] or np.dtype(np.float32))
  return to_tensor(np.eye(x.shape[0], x.shape[1], k, dtype=want), want, ctx.device, "EyeLike")
@op("Compress", since=11, const=(1,), exact=True)
def compress(ctx, x, condition, axis=None):
  if axis is None: x, axis = x.reshape(-1), 0
  a = _axis(axis, x.ndim)
  keep = np.nonzero(np.asarray(condition).reshape(-1)[:x.shape[a]])[0].astype(np.int32)
  if not keep.size: return x.shrink(tuple((0, 0) if k == a else None for k in range(x.ndim)))
  return x[(slice(None),) * a + (Tensor(keep, device=ctx.device),)]
@op("ReverseSequence", since=10, exact=True)
def reverse_sequence(ctx, x, lens, batch_axis=1, time_axis=0):
  T = x.shape[time_axis]
  shape = [1] * x.ndim
  shape[time_axis] = T
  t = Tensor.arange(T, device=ctx.device).reshape(shape)
  bshape = [1] * x.ndim
  bshape[batch_axis] = x.shape[batch_axis]
  n = lens.reshape(bshape)
  idx = (t < n).where(n - 1 - t, t).expand(x.shape)
  return x.gather(time_axis, idx)
@op("CenterCropPad", since=18, const=(1,), exact=True)
def center_crop_pad(ctx, x, shape, axes=None):
  axes = list(range(x.ndim)) if axes is None else [_axis(a, x.ndim) for a in axes]
  for s, a in zip(_ints(shape), axes):
    n = x.shape[a]
    if s < n:
      b = (n - s) // 2
      x = x.shrink(tuple((b, b + s) if k == a else None for k in range(x.ndim)))
    elif s > n:
      b = (s - n) // 2
      x = x.pad(tuple((b, s - n - b) if k == a else (0, 0) for k in range(x.ndim)))
  return x
@op("TopK", since=10, const=(1,))
def topk(ctx, x, k, axis=-1, largest=1, sorted=1):   # noqa: A002
  values, indices = x.topk(int(np.asarray(k).reshape(-1)[0]), _axis(axis, x.ndim), bool(largest))
  return values, indices
@op("TopK", since=1)
def topk_1(ctx, x, k, axis=-1): return topk(ctx, x, np.array([k]), axis)

@op("TensorScatter", since=24, exact=True)
def tensor_scatter(ctx, past, update, write_indices=None, mode="linear", axis=-2):
  """A KV cache's update: for each batch b, update's rows along axis written into past from position write_indices[b]
  (wrapping around the cache in circular mode). Position p takes update row p - write_indices[b] where that is a row."""
  a = _axis(axis, past.ndim)
  if a == 0: raise OnnxError("TensorScatter: axis can't be the batch axis 0")
  if mode not in ("linear", "circular"): raise OnnxError(f"TensorScatter: mode must be linear or circular, got {mode!r}")
  S, L, B = past.shape[a], update.shape[a], past.shape[0]
  w = write_indices if write_indices is not None else Tensor.zeros(B, dtype=dtypes.i32, device=ctx.device)
  u = Tensor.arange(S, device=ctx.device).reshape(tuple(S if k == a else 1 for k in range(past.ndim))) - w.reshape((B,) + (1,) * (past.ndim - 1))
  if mode == "circular": u = u % S
  valid = ((u >= 0) & (u < L)).expand(past.shape)
  return valid.where(update.gather(a, valid.where(u.expand(past.shape), 0)), past)
