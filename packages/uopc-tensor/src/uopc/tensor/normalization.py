"""uopc.tensor.normalization: softmax and its relatives, layernorm, and normalize (by a p-norm).

Each shifts or scales along an axis by a statistic of that axis: softmax by the (detached) max, so exp never
overflows; layernorm by the mean and variance (no affine parameters: nn.LayerNorm adds them); normalize by the p-norm,
clipped at eps. Computed in f32 for f16 inputs and rounded once (f16_in_f32).
"""
from __future__ import annotations
import math
from uopc.dtype import dtypes
from uopc.uop import UOp, Ops, prod
from uopc.tensor.core import TensorCore, f16_in_f32, broadcast_uop


def _minus_max_uop(u: UOp) -> UOp:
  """u minus its (detached) max over the last axis, as softmax's and log_softmax's Tensor ops build it."""
  m = broadcast_uop(UOp(Ops.CAST, (u.reduce(Ops.MAX, 1).reshape(u.shape[:-1] + (1,)),), dtypes.f32), u.shape)
  return u - m   # (UOp's x - y is x + y * -1, as Tensor's)


def _exp_uop(u: UOp) -> UOp: return UOp(Ops.EXP2, (UOp(Ops.MUL, (u, u.const_like(1 / math.log(2)))),))   # exp() as built
def _sum_last_uop(u: UOp) -> UOp: return u.reduce(Ops.ADD, 1).reshape(u.shape[:-1] + (1,))               # sum(-1, keepdim)


# softmax of this many elements or more stores exp(x - max) (a STAGE) for its sum and its quotient to read, where a
# smaller one computes it twice, once in each of their kernels. An exp is about 25 vector operations, more than writing
# and reading its value back from the cache costs, but a kernel of its own costs a launch: attention's softmax over 512
# x 512 (UOPC_DEBUG, the two exp kernels against exp, sum and quotient) 127 -> 95 us a call, the default GPT's
# (16, 4, 64, 64) about 0.3 ms less a step. A GPT's sampling softmax, (16, 4, 1, 64), keeps its two kernels
SOFTMAX_STAGE_MIN = 1 << 15


def softmax_last_uop(u: UOp) -> UOp:
  """The graph softmax's Tensor ops build over the last axis of an f32 value with elements, built directly (the same
  nodes: a test holds them to it): minus the (detached) max, exp as exp2 (stored when SOFTMAX_STAGE_MIN elements or
  more), over the sum."""
  e = _exp_uop(_minus_max_uop(u))
  if prod(u.shape) >= SOFTMAX_STAGE_MIN: e = UOp(Ops.STAGE, (e,))
  return UOp(Ops.MUL, (e, UOp(Ops.RECIP, (broadcast_uop(_sum_last_uop(e), u.shape),))))


def log_softmax_last_uop(u: UOp) -> UOp:
  """The graph log_softmax's Tensor ops build over the last axis of an f32 value with elements, built directly (a test
  holds them to it): s = u minus the (detached) max, then s - log(sum(exp(s))), log as log2 times ln 2."""
  s = _minus_max_uop(u)
  lse = UOp(Ops.LOG2, (_sum_last_uop(_exp_uop(s)),))
  lse = broadcast_uop(UOp(Ops.MUL, (lse, lse.const_like(math.log(2)))), u.shape)
  return s - lse


class NormalizationMixin:
  """softmax, log_softmax, softmin, layernorm, normalize."""
  __slots__ = ()

  @f16_in_f32
  def softmax(self, axis: int = -1) -> TensorCore:
    if self.numel() == 0: return self.float()   # nothing to normalize (and no max of an empty axis to take)
    if self.dtype is dtypes.f32 and self.ndim and self._dim(axis) == self.ndim - 1: return self._new(softmax_last_uop(self.uop))
    m = self.max(axis, keepdim=True)._stop_gradient()
    e = (self - m).exp()
    if e.numel() >= SOFTMAX_STAGE_MIN: e = e.contiguous()
    return e / e.sum(axis, keepdim=True)
  @f16_in_f32
  def log_softmax(self, axis: int = -1) -> TensorCore:
    if self.numel() == 0: return self.float()
    if self.dtype is dtypes.f32 and self.ndim and self._dim(axis) == self.ndim - 1: return self._new(log_softmax_last_uop(self.uop))
    m = self.max(axis, keepdim=True)._stop_gradient()
    s = self - m
    return s - s.exp().sum(axis, keepdim=True).log()

  def softmin(self, axis: int = -1) -> TensorCore: return (-self).softmax(axis)

  @f16_in_f32
  def layernorm(self, axis=-1, eps: float = 1e-5) -> TensorCore:
    """(x - mean) / sqrt(var + eps) over `axis` (no affine parameters: nn.LayerNorm adds them)."""
    x = self.float()
    d = x - x.mean(axis, keepdim=True)
    return d * ((d * d).mean(axis, keepdim=True) + eps).rsqrt()

  def _layernorm_uops(self, eps: float, weight: TensorCore | None, bias: TensorCore | None) -> TensorCore | None:
    """nn.LayerNorm's common case, layernorm over the last axis of an f32 tensor then * weight + bias (f32, of that
    axis, on its device; or neither), straight to UOps: the graph of the Tensor ops (layernorm above, then the affine
    product and sum), node for node (a test holds them to it), for a quarter of their Python (a GPT's five were 0.4 ms
    of each plain step's 2.4 ms forward). None otherwise."""
    xu = self.uop
    shape = xu.shape
    if xu.dtype is not dtypes.f32 or not shape or 0 in shape or (weight is None) != (bias is None): return None
    c = shape[-1]
    if weight is not None and not all(isinstance(t, TensorCore) and t.uop.dtype is dtypes.f32 and t.uop.shape == (c,) and
                                      t.device == self.device for t in (weight, bias)): return None
    ADD, MUL = Ops.ADD, Ops.MUL
    mean_last = lambda u: UOp(MUL, ((s := _sum_last_uop(u)), s.const_like(1.0 / c)))       # mean(-1, keepdim=True)
    mean = broadcast_uop(mean_last(xu), shape)
    d = xu - mean
    var = mean_last(UOp(MUL, (d, d)))
    rstd = UOp(Ops.RECIP, (UOp(Ops.SQRT, (UOp(ADD, (var, var.const_like(eps))),)),))
    y = UOp(MUL, (d, broadcast_uop(rstd, shape)))
    if weight is None: return self._new(y)
    y = UOp(ADD, (UOp(MUL, (y, broadcast_uop(weight.uop, shape))), broadcast_uop(bias.uop, shape)))
    return self._new(y, weight, bias)

  @f16_in_f32
  def normalize(self, p: float = 2.0, dim: int = 1, eps: float = 1e-12) -> TensorCore:
    """self / max(||self||_p over dim, eps), as torch.nn.functional.normalize."""
    return self / self.norm(p, dim, keepdim=True).clip(min_=eps)
