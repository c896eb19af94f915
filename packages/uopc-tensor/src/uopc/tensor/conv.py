"""uopc.tensor.conv: convolutions (conv1d/2d/3d in one) and transposed convolutions.

A convolution is a window view times the weights, summed: `_windows` stacks one view per kernel position (movement
ops alone: each starts at p * dilation, takes o * stride elements and keeps every stride-th), so a kernel reads each
window with plain strides and the small kernel axis unrolls. The padded input is stored once (padding through views
costs index arithmetic in every read of every window). A transposed convolution is a convolution of the input spread
out by the stride, with the flipped kernel whose in and out channels trade places.
"""
from __future__ import annotations
import itertools
from uopc.dtype import dtypes
from uopc.uop import UOp, Ops, prod
from uopc.composite import pad as pad_uop
from uopc.tensor.errors import TensorError
from uopc.tensor.args import per_axis, padding_pairs, check_window_args, promote, check_size, broadcast_shape
from uopc.tensor.core import TensorCore, broadcast_uop
from uopc.tensor.movement import stack_uop, refold


def _window_counts(kernel, stride, dilation, sizes) -> list[int]:
  """How many windows fit along each axis (an error naming the axis a window doesn't fit)."""
  outs = []
  for k, s, d, i in zip(kernel, stride, dilation, sizes):
    if (o := (i - d * (k - 1) - 1) // s + 1) <= 0: raise TensorError(f"window of {k} (dilation {d}) doesn't fit an axis of {i}")
    outs.append(o)
  return outs


class ConvMixin:
  """Convolution and transposed convolution over the last weight.ndim - 2 axes, as torch.nn.functional's."""
  __slots__ = ()

  def _windows(self, kernel: tuple[int, ...], stride: tuple[int, ...], dilation: tuple[int, ...], value: float = 0.0) -> TensorCore:
    """Sliding windows over the last len(kernel) axes (see _windows_by_views): stride 1 straight to UOps."""
    if all(s == 1 for s in stride): return self._unit_stride_windows(kernel, dilation)
    return self._windows_by_views(kernel, stride, dilation, value)

  def _unit_stride_windows(self, kernel: tuple[int, ...], dilation: tuple[int, ...]) -> TensorCore:
    """_windows_by_views at stride 1 (every window fits: no padding, no column picked), straight to UOps: its graph
    node for node (a test holds them to it), for a sixth of its Python (a 3x3 convolution's nine shrinks and their
    stack took 95 us a call beside its 2 ms kernel)."""
    nd = len(kernel)
    u = self.uop
    lead, sizes = u.shape[:len(u.shape) - nd], u.shape[len(u.shape) - nd:]
    outs = _window_counts(kernel, (1,) * nd, dilation, sizes)
    whole = tuple((0, s) for s in lead)
    views = []
    for pos in itertools.product(*(range(k) for k in kernel)):
      arg = whole + tuple((p * d, p * d + o) for p, d, o in zip(pos, dilation, outs))
      views.append(u if all(b == 0 and e == s for (b, e), s in zip(arg, u.shape)) else u.shrink(arg))
    if len(views) == 1: return self._new(views[0]).unsqueeze(-1)
    return self._new(stack_uop(views, len(views[0].shape)))

  def _windows_by_views(self, kernel: tuple[int, ...], stride: tuple[int, ...], dilation: tuple[int, ...], value: float = 0.0) -> TensorCore:
    """Sliding windows over the last len(kernel) axes: (..., *in) -> (..., *out, K), K = prod(kernel) window positions,
    as a STACK of shifted views. The view of window position p on an axis (length i, kernel k, dilation d, stride s,
    o outputs) starts at p*d, takes o*s elements, views them as (o, s) and keeps column 0: movement ops alone, so a
    kernel reads each window with plain strides, and once the small kernel axis is unrolled every STACK branch is a
    constant choice. An axis too short for o*s elements from the last start is padded first (with `value`; those
    elements are never read)."""
    nd = len(kernel)
    lead = self.shape[:self.ndim - nd]
    outs = _window_counts(kernel, stride, dilation, self.shape[self.ndim - nd:])
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
    return views[0].unsqueeze(-1) if len(views) == 1 else type(self).stack(*views, dim=-1)

  def _phase_windows(self, kernel: tuple[int, ...], stride: tuple[int, ...], dilation: tuple[int, ...]) -> TensorCore:
    """The windows of a strided convolution, as _windows returns them, read from the input stored split into phases:
    (N, C, *in) -> (N, C, *strides, *in / strides), element i of an axis with stride s at phase i % s, position i // s.
    Window position p then reads phase (p*d) % s from (p*d) // s on with stride 1, as a stride-1 convolution does, so
    its output axis is contiguous in memory and becomes vector lanes (read with stride s, a 3x3 convolution of stride 2
    stayed scalar at 1.5 GFLOP/s). The store costs what storing the padded input costs anyway."""
    nd = len(kernel)
    lead, sp = self.shape[:self.ndim - nd], self.shape[self.ndim - nd:]
    outs = _window_counts(kernel, stride, dilation, sp)
    t = self
    if any(i % s for i, s in zip(sp, stride)):   # whole phases: the elements added are never read
      t = t.pad(tuple(None for _ in lead) + tuple((0, -i % s) for i, s in zip(sp, stride)))
    L = len(lead)
    t = t.reshape(lead + tuple(x for i, s in zip(sp, stride) for x in (-(-i // s), s)))
    t = t.permute(tuple(range(L)) + tuple(L + 2 * j + 1 for j in range(nd)) + tuple(L + 2 * j for j in range(nd))).contiguous()
    views = []
    for pos in itertools.product(*(range(k) for k in kernel)):
      v = t
      for j, (p, s, d) in enumerate(zip(pos, stride, dilation)):   # pick the phase: a size-1 slice of the phase axis, dropped
        ax = L + j
        v = v.shrink(tuple((p * d % s, p * d % s + 1) if a == ax else None for a in range(v.ndim)))
      v = v.reshape(lead + v.shape[L + nd:])
      v = v.shrink(tuple(None for _ in lead) + tuple((p * d // s, p * d // s + o) for p, d, s, o in zip(pos, dilation, stride, outs)))
      views.append(v)
    return views[0].unsqueeze(-1) if len(views) == 1 else type(self).stack(*views, dim=-1)

  def conv2d(self, weight: TensorCore, bias: TensorCore | None = None, stride=1, padding=0, dilation=1, groups: int = 1) -> TensorCore:
    """Convolution (cross-correlation) over the last weight.ndim - 2 axes, so conv1d, conv2d and conv3d in one: input
    (N, C, *spatial) or unbatched (C, *spatial), weight (O, C/groups, *kernel), as torch.nn.functional's. padding: an int,
    one int per spatial axis, F.pad's flat tuple (a before and after per axis, the last axis first), 'same' or 'valid'."""
    weight = self._tensor_arg(weight, "conv2d: weight")
    check_window_args("conv", stride=stride, dilation=dilation, groups=groups)   # a negative padding crops (tinygrad's)
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
    stride, dilation = per_axis(stride, nd, "conv stride"), per_axis(dilation, nd, "conv dilation")
    if padding == "same" and any(st != 1 for st in stride): raise TensorError("conv: padding='same' needs stride 1, as in torch")
    pads = padding_pairs(padding, nd, kernel, dilation, "conv")
    if (fast := x._conv_uops(weight, bias, stride, pads, dilation, groups)) is not None:
      return fast if self.ndim == nd + 2 else fast.squeeze(0)
    # the padded input is stored once (padding through views costs index arithmetic in every read of every window)
    if any(p != (0, 0) for p in pads):
      x = x.pad(((0, 0), (0, 0)) + pads)
      if any(b > 0 or a > 0 for b, a in pads): x = x.contiguous()
    win = x._unit_stride_windows(kernel, dilation) if all(st == 1 for st in stride) else x._phase_windows(kernel, stride, dilation)
    out_sp, K = win.shape[2:-1], prod(kernel)
    # out[n, o, *p] = sum over (c, window position): the window positions innermost, a small axis to unroll
    win = win.reshape((N, groups, 1, Cg) + out_sp + (K,)).permute((0, 1, 2) + tuple(range(4, 4 + nd)) + (3, 4 + nd))
    wt = weight.reshape((1, groups, O // groups) + (1,) * nd + (Cg, K))
    # f16 products are summed in f32 and rounded once, as matmul's (an f16 product rounded before the sum loses bits)
    d = promote(win.dtype, wt.dtype, *((bias.dtype,) if bias is not None else ()))
    if d is dtypes.f16: win, wt = win.float(), wt.float()
    out = (win * wt).sum((-2, -1)).reshape((N, O) + out_sp)
    if bias is not None: out = out + bias.cast(out.dtype).reshape((1, O) + (1,) * nd)
    out = out.cast(d) if d is dtypes.f16 else out
    return out if self.ndim == nd + 2 else out.squeeze(0)
  conv1d = conv3d = conv2d   # the rank comes from the weight

  def _conv_uops(self, weight: TensorCore, bias, stride, pads, dilation, groups: int) -> TensorCore | None:
    """conv2d's common case straight to UOps: one group, stride 1, no cropping, input, weight and bias of one dtype (not
    f16, which is summed in f32), an input with elements. Its graph node for node (a test holds them to it), without
    the Tensors of the reshapes, the product and the sum between (a 3x3 convolution of 8 x 64 x 32 x 32 built its graph
    in ~170 us a call beside its 1.8 ms kernel). None otherwise."""
    u, w = self.uop, weight.uop
    nd = len(pads)
    if groups != 1 or any(s != 1 for s in stride) or any(b < 0 or a < 0 for b, a in pads) or u.dtype is not w.dtype or u.dtype is dtypes.f16:
      return None
    if bias is not None and (not isinstance(bias, TensorCore) or bias.uop.dtype is not u.dtype or bias.shape != (w.shape[0],)): return None
    if 0 in u.shape: return None
    if any(p != (0, 0) for p in pads):
      widths = ((0, 0), (0, 0)) + tuple(pads)
      check_size(tuple(s + b + a for s, (b, a) in zip(u.shape, widths)), f"pad of {u.shape}")
      u = UOp(Ops.STAGE, (pad_uop(u, widths),))
    win = self._new(u)._unit_stride_windows(weight.shape[2:], dilation)
    (N, C), O, K, out_sp = u.shape[:2], w.shape[0], prod(weight.shape[2:]), win.shape[2:-1]
    a = refold(win.uop, win.requires_grad, (N, 1, 1, C) + out_sp + (K,)).permute((0, 1, 2) + tuple(range(4, 4 + nd)) + (3, 4 + nd))
    b = refold(w, weight.requires_grad, (1, 1, O) + (1,) * nd + (C, K))
    full = broadcast_shape(a.shape, b.shape)
    out = self._new(UOp(Ops.MUL, (broadcast_uop(a, full), broadcast_uop(b, full))).reduce(Ops.ADD, 2), weight)
    out = out._new(refold(out.uop, out.requires_grad, (N, O) + out_sp))
    return out if bias is None else out + bias.reshape((1, O) + (1,) * nd)

  def conv_transpose2d(self, weight: TensorCore, bias: TensorCore | None = None, stride=1, padding=0, output_padding=0, groups: int = 1,
                       dilation=1) -> TensorCore:
    """The transposed convolution (the gradient of conv2d with respect to its input) over the last weight.ndim - 2 axes,
    as torch's conv_transpose1d/2d/3d: input (N, Cin, *spatial), weight (Cin, Cout/groups, *kernel). It is a convolution of
    the input spread out by the stride (stride - 1 zeros between neighbours), padded by dilation * (kernel - 1) - padding,
    with the flipped kernel whose in and out channels trade places."""
    weight = self._tensor_arg(weight, "conv_transpose2d: weight")
    check_window_args("conv_transpose", stride=stride, padding=padding, output_padding=output_padding, dilation=dilation, groups=groups)
    nd = weight.ndim - 2
    if nd < 1 or self.ndim not in (nd + 1, nd + 2):
      raise TensorError(f"conv_transpose: input {self.shape} and weight {weight.shape}: expected weight (Cin, Cout/groups, *kernel) "
                        f"and input (N, Cin, *spatial) or (Cin, *spatial) with {max(nd, 1)} spatial axes")
    x = self.unsqueeze(0) if self.ndim == nd + 1 else self
    Cin, Og, kernel = weight.shape[0], weight.shape[1], weight.shape[2:]
    if not isinstance(groups, int) or groups < 1 or x.shape[1] != Cin or Cin % groups:
      raise TensorError(f"conv_transpose: input {self.shape} with {groups} group(s) needs weight ({x.shape[1]}, Cout/groups, ...), "
                        f"got {weight.shape}")
    stride, dilation = per_axis(stride, nd, "conv_transpose stride"), per_axis(dilation, nd, "conv_transpose dilation")
    padding, output_padding = per_axis(padding, nd, "conv_transpose padding"), per_axis(output_padding, nd, "conv_transpose output_padding")
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
