"""uopc.tensor.pooling: max and average pooling (1-3 spatial axes), max_unpool2d, and interpolate (resampling).

Pooling reads windows made from movement ops alone (`_pool_windows`): windows that tile the axes are a reshape that
splits each axis into (windows, kernel); other strides and dilations repeat the axis and read it flat, so the
backward pass is movement ops and one reduction too. max pooling's gradient (and its indices) go to each window's
first maximum, as torch's. interpolate resamples each spatial axis in turn, computing source positions in f32 as
torch does so the same elements are picked.
"""
from __future__ import annotations
import math
import numpy as np
from uopc.dtype import dtypes
from uopc.uop import prod
from uopc.tensor.errors import TensorError, TensorTypeError
from uopc.tensor.args import check_size, per_axis, padding_pairs, check_window_args
from uopc.tensor.core import TensorCore, ValuesIndices, f16_in_f32
from uopc.tensor.creation import positions


class PoolingMixin:
  """max_pool, avg_pool and max_unpool over the last spatial axes, and interpolate."""
  __slots__ = ()

  # ---- pooling
  def _pool(self, kernel_size, stride, padding, dilation, ceil_mode: bool, value, nd: int):
    """Windows for pooling over the last len(kernel) axes: (..., *out, K), with the padding added (value) and, in ceil
    mode, the extra room for a last partial window (torch's rule: it must start inside the input or the left padding).
    Returns the windows, the padding pairs and the extra right padding per axis."""
    if stride is None or (isinstance(stride, (tuple, list)) and not stride): stride = None   # tinygrad's [] too: the kernel size
    check_window_args("pooling", kernel_size=kernel_size, padding=padding, dilation=dilation, **({} if stride is None else {"stride": stride}))
    kernel = (kernel_size,) * nd if isinstance(kernel_size, int) else tuple(kernel_size)   # a tuple sets the rank itself
    nd = len(kernel)
    if self.ndim < nd: raise TensorError(f"pooling with a {nd}-D kernel {kernel} needs at least {nd} dimensions, got {self.shape}")
    stride = kernel if stride is None else per_axis(stride, nd, "pool stride")
    dilation = per_axis(dilation, nd, "pool dilation")
    pads = padding_pairs(padding, nd, kernel, dilation, "pool")
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

  def _pool_windows(self, kernel, stride, dilation) -> TensorCore:
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
    where_from = positions(self, prod(sp)).reshape(sp)
    where_from = where_from.pad(tuple((b, a + e) for (b, a), e in zip(pads, extra)), value=-1)._pool_windows(kernel, stride, dilation)
    w, K = win._stop_gradient(), win.shape[-1]
    hit = (w.eq(w.max(-1, keepdim=True)) | (w.ne(w) if self.dtype.is_float else False)) & (where_from >= 0)
    rev = K - positions(self, K)
    first = (K - hit.where(rev, 0).max(-1, keepdim=True)).eq(positions(self, K))
    out = first.where(win, 0.0).sum(-1) if grad else win.max(-1)
    return ValuesIndices(out, first.where(where_from, 0).sum(-1)) if return_indices else out

  def avg_pool2d(self, kernel_size=2, stride=None, padding=0, ceil_mode: bool = False, count_include_pad: bool = True,
                 divisor_override: int | None = None, dilation=1) -> TensorCore:
    """Mean over windows of the last 2 axes (or len(kernel_size) axes). As in torch, the divisor counts the padding when
    count_include_pad (but never ceil mode's extra room), and only the input's elements otherwise."""
    return self._avg_pool(kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override, dilation, 2)
  def avg_pool1d(self, kernel_size, stride=None, padding=0, ceil_mode=False, count_include_pad=True):
    return self._avg_pool(kernel_size, stride, padding, ceil_mode, count_include_pad, None, 1, 1)
  def avg_pool3d(self, kernel_size, stride=None, padding=0, ceil_mode=False, count_include_pad=True, divisor_override=None):
    return self._avg_pool(kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override, 1, 3)
  @f16_in_f32
  def _avg_pool(self, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override, dilation, nd: int) -> TensorCore:
    x = self if self.dtype.is_float else self.float()
    win, (kernel, stride, dilation, pads, extra) = x._pool(kernel_size, stride, padding, dilation, ceil_mode, 0.0, nd)
    total = win.sum(-1)
    if divisor_override is not None: return total / divisor_override
    counts = np.ones((), np.float32)
    for L, k, st, d, (b, a), e, o in zip(self.shape[-len(kernel):], kernel, stride, dilation, pads, extra, total.shape[-len(kernel):]):
      pos = np.arange(o)[:, None] * st + np.arange(k)[None, :] * d - b          # window o's element positions, in input coordinates
      lo, hi = (-b, L + a) if count_include_pad else (0, L)
      counts = counts[..., None] * ((pos >= lo) & (pos < hi)).sum(-1).astype(np.float32)
    return total / type(self)(counts, device=self.device)

  def max_unpool2d(self, indices: TensorCore, kernel_size=2, stride=None, padding=0, output_size=None, dilation=1) -> TensorCore:
    """max_pool2d's partial inverse: each value put back at its index within the pooled axes, zeros elsewhere. The output
    size is output_size's last axes, or (in - 1) * stride - 2 * padding + dilation * (kernel - 1) + 1 per axis."""
    kernel = (kernel_size,) * 2 if isinstance(kernel_size, int) else tuple(kernel_size)
    nd = len(kernel)
    stride = kernel if stride is None else per_axis(stride, nd, "max_unpool stride")
    padding, dilation = per_axis(padding, nd, "max_unpool padding"), per_axis(dilation, nd, "max_unpool dilation")
    if indices.shape != self.shape: raise TensorError(f"max_unpool2d: indices {indices.shape} for values {self.shape}")
    sp = tuple(output_size)[-nd:] if output_size is not None else \
      tuple((n - 1) * st - 2 * p + d * (k - 1) + 1 for n, st, p, d, k in zip(self.shape[-nd:], stride, padding, dilation, kernel))
    lead = self.shape[:-nd]
    out = type(self).zeros(*lead, prod(sp), dtype=self.dtype, device=self.device)
    return out.scatter(-1, indices.reshape(lead + (-1,)), self.reshape(lead + (-1,))).reshape(lead + sp)

  # ---- resampling
  @f16_in_f32
  def interpolate(self, size=None, scale_factor=None, mode: str = "nearest", align_corners: bool | None = None) -> TensorCore:
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
      check_window_args("interpolate", size=size)   # sizes of at least 1 (0 was a ZeroDivisionError)
      outs, scales = per_axis(size, nd, "interpolate size"), [None] * nd
    else:
      scales = list(scale_factor) if isinstance(scale_factor, (tuple, list)) else [scale_factor] * nd
      if len(scales) != nd or not all(isinstance(f, (int, float, np.integer, np.floating)) and not isinstance(f, bool) and math.isfinite(f)
                                      and f > 0 for f in scales):
        raise TensorError(f"interpolate: scale_factor must be a positive finite number or {nd} of them, got {scale_factor!r}")
      scales = [float(f) for f in scales]
      outs = tuple(int(math.floor(n * f)) for n, f in zip(ins, scales))
      if any(o < 1 for o in outs): raise TensorError(f"interpolate: scale_factor {scale_factor} makes an empty axis of {ins}")
    check_size(self.shape[:2] + tuple(outs), "interpolate")
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
        w1 = type(self)((pos - i0).astype(np.float32), device=self.device)
        t = t.float()
        t = t[..., i0.astype(np.int32)] * (1 - w1) + t[..., i1.astype(np.int32)] * w1
      x = t.transpose(ax, -1)
    return x
