"""uopc.onnx.ops_nn: ONNX's neural-network ops on the Tensor API: MatMul, Gemm and Einsum, convolutions, pooling, the
normalizations, softmax and its relatives, Dropout, and the reductions.

ONNX gives padding as [begin of every axis..., end of every axis...] or auto_pad (SAME_UPPER puts the odd one out at the
end, SAME_LOWER at the beginning); both become (before, after) pairs per spatial axis here (`_pads`), applied with
Tensor.pad before a convolution (so asymmetric padding is exact) and handed to pooling as F.pad's flat tuple (so padding
never wins a max and never counts in an average unless asked). Statistics are computed in f32 (ONNX's stash_type 1)
and the interpreter casts results back to their declared types.
"""
from __future__ import annotations
import functools
import numpy as np
from uopc.dtype import dtypes, I32_MIN
from uopc.uop import prod
from uopc.tensor import Tensor
from uopc.onnx.registry import op
from uopc.onnx.dtypes import OnnxError
from uopc.onnx.ops_math import guard_wide


def _f32(x: Tensor) -> Tensor: return x if x.dtype is dtypes.f32 else x.float()


def _pads(in_sizes, kernel, strides, dilations, pads, auto_pad: str) -> list[tuple[int, int]]:
  """(before, after) padding per spatial axis from ONNX's pads or auto_pad."""
  nd = len(kernel)
  if auto_pad in ("SAME_UPPER", "SAME_LOWER"):
    out = []
    for i, k, s, d in zip(in_sizes, kernel, strides, dilations):
      total = max((-(-i // s) - 1) * s + (k - 1) * d + 1 - i, 0)
      small = total // 2
      out.append((small, total - small) if auto_pad == "SAME_UPPER" else (total - small, small))
    return out
  if auto_pad == "VALID" or pads is None: return [(0, 0)] * nd
  if auto_pad not in ("NOTSET", ""): raise OnnxError(f"auto_pad must be NOTSET, SAME_UPPER, SAME_LOWER or VALID, got {auto_pad!r}")
  return [(int(pads[a]), int(pads[a + nd])) for a in range(nd)]


def _window_args(x: Tensor, kernel_shape, strides, dilations, pads, auto_pad):
  nd = len(kernel_shape)
  strides = list(strides) if strides is not None else [1] * nd
  dilations = list(dilations) if dilations is not None else [1] * nd
  return strides, dilations, _pads(x.shape[2:], kernel_shape, strides, dilations, pads, auto_pad)


def _flat_pads(pairs) -> tuple[int, ...]: return tuple(v for b, a in reversed(pairs) for v in (b, a))   # F.pad's order, last axis first


# ---- products
@op("MatMul", since=1)
def matmul(ctx, a, b): return guard_wide(ctx, a.matmul(b), lambda: _f32(a).matmul(_f32(b)))
@op("Gemm", since=7)
def gemm(ctx, a, b, c=None, alpha=1.0, beta=1.0, transA=0, transB=0):
  # a weight stored transposed once, not read through a view, when its outputs fill vectors: 10 classes stay rows,
  # each output a dot product of two contiguous rows (transposed: scalar code, 7 us against 1 for an MLP's last layer)
  bt = ctx.transposed_initializer(1) if transB and b.shape[0] % 8 == 0 else None
  out = (a.T if transA else a).matmul(bt if bt is not None else b.T if transB else b)
  if alpha != 1.0: out = out * alpha
  if c is not None: out = out + (c * beta if beta != 1.0 else c)
  return out
@op("Einsum", since=12)
def einsum(ctx, *xs, equation): return Tensor.einsum(equation, *xs)
@op("MatMulInteger", since=10)
def matmul_integer(ctx, a, b, a_zero_point=None, b_zero_point=None):
  if a_zero_point is not None:   # a scalar, or one per row of a
    a = a - (a_zero_point.reshape(-1, 1) if a_zero_point.ndim == 1 and a.ndim >= 2 and a_zero_point.numel() > 1 else a_zero_point)
  if b_zero_point is not None: b = b - b_zero_point
  return a.matmul(b)


# ---- convolutions
@op("Conv", since=1)
def conv(ctx, x, w, b=None, auto_pad="NOTSET", dilations=None, group=1, kernel_shape=None, pads=None, strides=None):
  kernel = list(kernel_shape) if kernel_shape is not None else list(w.shape[2:])
  strides, dilations, pairs = _window_args(x, kernel, strides, dilations, pads, auto_pad)
  # the pads go to conv2d, which stores the padded input once: padded here, the pad stayed a view that the windows read
  # through, and kernelize fused the producer into each of the kernel's window positions (ResNet: every 3x3 conv after a
  # conv computed that conv 9 times)
  return x.conv2d(w, b, stride=tuple(strides), padding=_flat_pads(pairs), dilation=tuple(dilations), groups=group)
@op("ConvInteger", since=10, attrs=("auto_pad", "dilations", "group", "kernel_shape", "pads", "strides"))
def conv_integer(ctx, x, w, x_zero_point=None, w_zero_point=None, **attrs):
  if x_zero_point is not None: x = x - x_zero_point
  if w_zero_point is not None: w = w - (w_zero_point.reshape((-1,) + (1,) * (w.ndim - 1)) if w_zero_point.numel() > 1 else w_zero_point)
  return conv(ctx, x.int(), w.int(), None, **attrs)
@op("ConvTranspose", since=1)
def conv_transpose(ctx, x, w, b=None, auto_pad="NOTSET", dilations=None, group=1, kernel_shape=None, output_padding=None, output_shape=None,
                   pads=None, strides=None):
  kernel = list(kernel_shape) if kernel_shape is not None else list(w.shape[2:])
  nd, ins = len(kernel), x.shape[2:]
  strides = list(strides) if strides is not None else [1] * nd
  dilations = list(dilations) if dilations is not None else [1] * nd
  opad = list(output_padding) if output_padding is not None else [0] * nd
  full = [(i - 1) * s + (k - 1) * d + 1 for i, s, k, d in zip(ins, strides, kernel, dilations)]
  if output_shape is not None or auto_pad in ("SAME_UPPER", "SAME_LOWER"):
    want = list(output_shape)[-nd:] if output_shape is not None else [i * s for i, s in zip(ins, strides)]
    pairs = []
    for f, o, op_ in zip(full, want, opad):
      total = f + op_ - o
      pairs.append((total // 2, total - total // 2) if auto_pad == "SAME_UPPER" else (total - total // 2, total // 2))
  else: pairs = _pads(ins, kernel, strides, dilations, pads, "NOTSET" if auto_pad == "VALID" else auto_pad) if auto_pad != "VALID" else [(0, 0)] * nd
  out = x.conv_transpose2d(w, None, stride=tuple(strides), padding=0, output_padding=0, groups=group, dilation=tuple(dilations))
  out = out.pad(((0, 0), (0, 0)) + tuple((-pb, op_ - pe) for (pb, pe), op_ in zip(pairs, opad)))
  return out + b.reshape((1, -1) + (1,) * nd) if b is not None else out


# ---- pooling
@op("MaxPool", since=1)
def max_pool(ctx, x, kernel_shape, auto_pad="NOTSET", ceil_mode=0, dilations=None, pads=None, storage_order=0, strides=None):
  nd = len(kernel_shape)
  strides, dilations, pairs = _window_args(x, kernel_shape, strides, dilations, pads, auto_pad)
  xf = x if x.dtype.is_float or x.dtype is dtypes.i32 else x.int()
  want_indices = ctx.wants(1)
  out = xf._max_pool(tuple(kernel_shape), tuple(strides), _flat_pads(pairs), tuple(dilations), bool(ceil_mode), want_indices, nd)
  if not want_indices: return out
  values, idx = out
  sp = x.shape[2:]
  if storage_order:   # column-major over the spatial axes
    coords, rest = [], idx
    for n in reversed(sp): coords.append(rest % n); rest = rest // n
    coords = coords[::-1]
    idx, stride = coords[0] * 0, 1
    for c, n in zip(coords, sp): idx, stride = idx + c * stride, stride * n
  lead = Tensor.arange(prod(x.shape[:2]), device=ctx.device).reshape(x.shape[:2] + (1,) * nd) * prod(sp)
  return values, idx + lead
@op("AveragePool", since=1)
def average_pool(ctx, x, kernel_shape, auto_pad="NOTSET", ceil_mode=0, count_include_pad=0, dilations=None, pads=None, strides=None):
  strides, dilations, pairs = _window_args(x, kernel_shape, strides, dilations, pads, auto_pad)
  return x._avg_pool(tuple(kernel_shape), tuple(strides), _flat_pads(pairs), bool(ceil_mode), bool(count_include_pad), None, tuple(dilations),
                     len(kernel_shape))
@op("LpPool", since=1)
def lp_pool(ctx, x, kernel_shape, auto_pad="NOTSET", ceil_mode=0, dilations=None, p=2, pads=None, strides=None):
  strides, dilations, pairs = _window_args(x, kernel_shape, strides, dilations, pads, auto_pad)
  powered = _f32(x).abs() ** p
  s = powered._avg_pool(tuple(kernel_shape), tuple(strides), _flat_pads(pairs), bool(ceil_mode), True, 1, tuple(dilations), len(kernel_shape))
  return s ** (1.0 / p)
@op("GlobalAveragePool", since=1)
def global_average_pool(ctx, x): return x.mean(tuple(range(2, x.ndim)), keepdim=True)
@op("GlobalMaxPool", since=1, exact=True)
def global_max_pool(ctx, x): return x.max(tuple(range(2, x.ndim)), keepdim=True)
@op("GlobalLpPool", since=2)
def global_lp_pool(ctx, x, p=2): return (_f32(x).abs() ** p).sum(tuple(range(2, x.ndim)), keepdim=True) ** (1.0 / p)
@op("MaxUnpool", since=9, const=(2,))
def max_unpool(ctx, x, indices, output_shape=None, kernel_shape=None, pads=None, strides=None):
  nd = len(kernel_shape)
  strides = list(strides) if strides is not None else [1] * nd
  pads = list(pads) if pads is not None else [0] * (2 * nd)
  sp = [(n - 1) * s - pads[a] - pads[a + nd] + k for a, (n, s, k) in enumerate(zip(x.shape[2:], strides, kernel_shape))]
  inferred = x.shape[:2] + tuple(sp)
  out = Tensor.zeros(prod(inferred), dtype=x.dtype, device=ctx.device)
  out = out.scatter(0, indices.reshape(-1), x.reshape(-1)).reshape(inferred)
  if output_shape is None: return out
  # the values land where they would in the inferred shape, which sits in the corner of a larger output_shape (ONNX's reference)
  return out.pad(tuple((0, int(w) - n) for w, n in zip(np.asarray(output_shape).reshape(-1), inferred)))


# ---- normalization
def _channel(t: Tensor, ndim: int) -> Tensor: return t.reshape((1, -1) + (1,) * (ndim - 2)) if ndim > 1 else t
@op("BatchNormalization", since=7)
def batch_norm(ctx, x, scale, bias, mean, var, epsilon=1e-5, momentum=0.9, training_mode=0, spatial=1):
  if spatial != 1: raise NotImplementedError("uopc.onnx: BatchNormalization with spatial=0 is not supported")
  xf = _f32(x)
  if training_mode:
    axes = tuple(k for k in range(x.ndim) if k != 1)
    bm, bv = xf.mean(axes), xf.var(axes, correction=0)
    y = (xf - _channel(bm, x.ndim)) * _channel((bv + epsilon).rsqrt() * _f32(scale), x.ndim) + _channel(_f32(bias), x.ndim)
    return y, _f32(mean) * momentum + bm * (1 - momentum), _f32(var) * momentum + bv * (1 - momentum)
  inv = (_f32(var) + epsilon).rsqrt() * _f32(scale)
  return (xf - _channel(_f32(mean), x.ndim)) * _channel(inv, x.ndim) + _channel(_f32(bias), x.ndim)
def _normalize(x: Tensor, axes: tuple, eps: float) -> tuple[Tensor, Tensor, Tensor]:
  xf = _f32(x)
  mean = xf.mean(axes, keepdim=True)
  d = xf - mean
  inv = ((d * d).mean(axes, keepdim=True) + eps).rsqrt()
  return d * inv, mean, inv
@op("InstanceNormalization", since=6)
def instance_norm(ctx, x, scale, bias, epsilon=1e-5):
  y, _, _ = _normalize(x, tuple(range(2, x.ndim)), epsilon)
  return y * _channel(_f32(scale), x.ndim) + _channel(_f32(bias), x.ndim)
@op("LayerNormalization", since=17)
def layer_norm(ctx, x, scale, bias=None, axis=-1, epsilon=1e-5, stash_type=1):
  a = axis % x.ndim
  y, mean, inv = _normalize(x, tuple(range(a, x.ndim)), epsilon)
  y = y * _f32(scale)
  return (y + _f32(bias) if bias is not None else y), mean, inv
@op("GroupNormalization", since=21)
def group_norm(ctx, x, scale, bias, num_groups, epsilon=1e-5, stash_type=1):
  N, C = x.shape[:2]
  y, _, _ = _normalize(x.reshape((N, num_groups, -1)), (2,), epsilon)
  return y.reshape(x.shape) * _channel(_f32(scale), x.ndim) + _channel(_f32(bias), x.ndim)
@op("GroupNormalization", since=18)
def group_norm_18(ctx, x, scale, bias, num_groups, epsilon=1e-5):
  N, C = x.shape[:2]
  per = C // num_groups
  return group_norm(ctx, x, scale.reshape(-1, 1).expand(num_groups, per).reshape(C), bias.reshape(-1, 1).expand(num_groups, per).reshape(C),
                    num_groups, epsilon)
@op("RMSNormalization", since=23)
def rms_norm(ctx, x, scale, axis=-1, epsilon=1e-5, stash_type=1):
  xf = _f32(x)
  axes = tuple(range(axis % x.ndim, x.ndim))
  return xf * ((xf * xf).mean(axes, keepdim=True) + epsilon).rsqrt() * _f32(scale)
@op("LpNormalization", since=1)
def lp_normalization(ctx, x, axis=-1, p=2):
  xf = _f32(x)
  norm = xf.abs().sum(axis, keepdim=True) if p == 1 else (xf * xf).sum(axis, keepdim=True).sqrt()
  return norm.eq(0).where(0.0, xf / norm.eq(0).where(1.0, norm))
@op("LRN", since=1)
def lrn(ctx, x, size, alpha=1e-4, beta=0.75, bias=1.0):
  xf = _f32(x)
  sq = (xf * xf).pad(((0, 0), ((size - 1) // 2, size - 1 - (size - 1) // 2)) + ((0, 0),) * (x.ndim - 2))
  C = x.shape[1]
  total = functools.reduce(lambda a, b: a + b, (sq.shrink(((0, x.shape[0]), (k, k + C)) + tuple((0, s) for s in x.shape[2:])) for k in range(size)))
  return xf / (bias + (alpha / size) * total) ** beta


# ---- softmax and relatives
def _coerced(fn):
  """Versions 1 to 12 of Softmax, LogSoftmax and Hardmax: the input as a 2-D matrix split at axis, fn over its rows."""
  def run(ctx, x, axis=1):
    a = axis % max(x.ndim, 1)
    return fn(x.reshape(prod(x.shape[:a]), prod(x.shape[a:])), 1).reshape(x.shape)
  return run
def _hardmax(x: Tensor, axis: int) -> Tensor:
  n = x.shape[axis]
  pos = Tensor.arange(n, device=x.device).reshape(tuple(n if k == axis % x.ndim else 1 for k in range(x.ndim)))
  return x.argmax(axis, keepdim=True).eq(pos).cast(x.dtype)
op("Softmax", since=1)(_coerced(lambda x, a: x.softmax(a)))
op("LogSoftmax", since=1)(_coerced(lambda x, a: x.log_softmax(a)))
op("Hardmax", since=1)(_coerced(_hardmax))
@op("Softmax", since=13)
def softmax(ctx, x, axis=-1): return x.softmax(axis)
@op("LogSoftmax", since=13)
def log_softmax(ctx, x, axis=-1): return x.log_softmax(axis)
@op("Hardmax", since=13)
def hardmax(ctx, x, axis=-1): return _hardmax(x, axis)
@op("Dropout", since=7)
def dropout_7(ctx, x, ratio=0.5): return x, Tensor.ones(*x.shape, dtype=dtypes.bool, device=ctx.device)
@op("Dropout", since=12, const=(1, 2))
def dropout(ctx, x, ratio=None, training_mode=None, seed=None):
  training = bool(np.asarray(training_mode).reshape(-1)[0]) if training_mode is not None else False
  p = float(np.asarray(ratio).reshape(-1)[0]) if ratio is not None else 0.5
  if not training or p == 0: return x, Tensor.ones(*x.shape, dtype=dtypes.bool, device=ctx.device)
  keep = Tensor.rand(*x.shape, device=ctx.device) >= p
  return keep.where(x * (1 / (1 - p)), 0.0), keep


# ---- reductions: axes as an attribute (older versions) or as an input (ReduceSum from 13, the rest from 18)
def _reduce_axes(x: Tensor, axes, noop: int):
  if axes is None or not np.asarray(axes).size: return None if not noop else ()
  return tuple(int(a) % max(x.ndim, 1) for a in np.asarray(axes).reshape(-1))
def _reducer(name: str, fn, attr_since: int, input_since: int, exact: bool = False):
  def run(ctx, x, axes=None, keepdims=1, noop_with_empty_axes=0):
    ax = _reduce_axes(x, axes, noop_with_empty_axes)
    if ax == (): return fn(ctx, x, None, bool(keepdims), noop=True)
    return fn(ctx, x, ax, bool(keepdims))
  op(name, since=attr_since, exact=exact)(run)
  op(name, since=input_since, const=(1,), exact=exact)(run)
def _sum(ctx, x, ax, keep, noop=False):
  if noop: return x
  return guard_wide(ctx, x.sum(ax, keep), lambda: _f32(x).sum(ax, keep))
def _mean(ctx, x, ax, keep, noop=False):
  if noop: return x
  m = _f32(x).mean(ax, keep)
  return m.trunc().int() if x.dtype is dtypes.i32 else m
def _prod(ctx, x, ax, keep, noop=False):
  if noop: return x
  return guard_wide(ctx, x.prod(ax, keep), lambda: _f32(x).prod(ax, keep))
def _max(ctx, x, ax, keep, noop=False): return x if noop else x.max(ax, keep)
def _min(ctx, x, ax, keep, noop=False): return x if noop else x.min(ax, keep)
def _l1(ctx, x, ax, keep, noop=False): return x.abs() if noop else guard_wide(ctx, x.abs().sum(ax, keep), lambda: _f32(x).abs().sum(ax, keep))
def _l2(ctx, x, ax, keep, noop=False):
  xf = _f32(x)
  out = xf.abs() if noop else (xf * xf).sum(ax, keep).sqrt()
  return out.round().int() if x.dtype is dtypes.i32 else out
def _sum_square(ctx, x, ax, keep, noop=False):
  if noop: return x * x
  return guard_wide(ctx, (x * x).sum(ax, keep), lambda: (_f32(x) * _f32(x)).sum(ax, keep))
def _log_sum(ctx, x, ax, keep, noop=False): return _f32(x).log() if noop else _f32(x).sum(ax, keep).log()
def _log_sum_exp(ctx, x, ax, keep, noop=False): return _f32(x) if noop else _f32(x).logsumexp(ax, keep)
for _name, _fn, _exact in [("ReduceMax", _max, True), ("ReduceMin", _min, True), ("ReduceMean", _mean, False), ("ReduceProd", _prod, False),
                           ("ReduceL1", _l1, False), ("ReduceL2", _l2, False), ("ReduceSumSquare", _sum_square, False),
                           ("ReduceLogSum", _log_sum, False), ("ReduceLogSumExp", _log_sum_exp, False)]:
  _reducer(_name, _fn, 1, 18, _exact)
_reducer("ReduceSum", _sum, 1, 13)
def _arg(reverse_order: bool):
  def run(ctx, x, axis=0, keepdims=1, select_last_index=0):
    a = axis % max(x.ndim, 1)
    t = x._order_reversed() if reverse_order else x
    if select_last_index: return (x.shape[a] - 1) - t.flip(a).argmax(a, keepdim=bool(keepdims))
    return t.argmax(a, keepdim=bool(keepdims))
  return run
op("ArgMax", since=1)(_arg(False))
op("ArgMin", since=1)(_arg(True))



@op("NegativeLogLikelihoodLoss", since=13)
def nll_loss(ctx, x, target, weight=None, ignore_index=None, reduction="mean"):
  ignore = I32_MIN if ignore_index is None else int(ignore_index)
  return _f32(x).nll_loss(target, _f32(weight) if weight is not None else None, ignore_index=ignore, reduction=reduction)
