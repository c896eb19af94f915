"""uopc.tensor.activations: the activation functions of torch.nn.functional, each with torch's gradient at its kinks.

Every one is a composite of elementwise ops and the transcendental functions, written so that no unused branch of a
WHERE reads an input that would put inf or NaN into the backward pass (a branch reads a safe value where it isn't
taken): the gradient at a kink or at the infinities is torch's, not an artifact of the formula.
"""
from __future__ import annotations
import math
from uopc.dtype import dtypes
from uopc.uop import UOp, Ops
from uopc.tensor.errors import TensorTypeError
from uopc.tensor.core import TensorCore, f16_in_f32, broadcast_uop
from uopc.tensor.creation import const_uop


_LOG2E = 1 / math.log(2)
_EXP2_MAX = 126.0


def _sigmoid_uop(z: UOp) -> UOp:
  """sigmoid of an f32 z (see ActivationMixin.sigmoid) as UOps, the graph of its Tensor expression (t = z * -log2 e,
  far = t > 126, far.where(0, 1 / (1 + 2^far.where(126, t)))) built directly: in Tensor ops a plain GPT step's GELUs
  were 0.1 ms of Python."""
  t = UOp(Ops.MUL, (z, z.const_like(-_LOG2E)))
  far = UOp(Ops.CMPLT, (t.const_like(_EXP2_MAX), t))
  e = UOp(Ops.EXP2, (UOp(Ops.WHERE, (far, broadcast_uop(const_uop(_EXP2_MAX, dtypes.f32), t.shape), t)),))
  r = UOp(Ops.RECIP, (UOp(Ops.ADD, (e.const_like(1.0), e)),))
  return UOp(Ops.WHERE, (far, broadcast_uop(const_uop(0.0, dtypes.f32), t.shape), r))


class ActivationMixin:
  """relu, gelu, silu, sigmoid, elu, softplus, mish and the rest of torch.nn.functional's activations."""
  __slots__ = ()

  @f16_in_f32
  def sigmoid(self) -> TensorCore:
    # 1/(1+e^-x) with e^-x = 2^t, t = -x log2 e, and 0 where t > 126 (x below about -87.3, where sigmoid is under the
    # smallest normal f32): the plain form's e^-x overflowed there and its gradient, r^2 e^-x, met 0 * inf (NaN), so t
    # is clamped under the branch not taken. sigmoid(-inf) is 0 (x * sigmoid(x) is NaN there, as torch's), a NaN stays
    # NaN. One formula, not one for each sign: the gradient is a third of the ops the two branches' was (a GPT's GELU
    # gradient took 40% of its GEMM's time)
    return self._new(_sigmoid_uop(self.float().uop))

  def relu(self) -> TensorCore: return ((self > 0) | self.ne(self)).where(self, 0) if self.dtype.is_float else (self > 0).where(self, 0)   # NaN stays
  def leaky_relu(self, neg_slope: float = 0.01) -> TensorCore: return (self > 0).where(self, self * neg_slope)
  @f16_in_f32
  def gelu(self, approximate: str = "tanh") -> TensorCore:
    """GELU: the tanh approximation by default (uopc.tensor's convention, and tinygrad's), x * Phi(x) through erf with
    approximate="none"."""
    if approximate == "none": return 0.5 * self * (1 + (self * (1 / math.sqrt(2))).erf())
    if approximate != "tanh": raise TensorTypeError(f"gelu: approximate must be 'tanh' or 'none', got {approximate!r}")
    # 0.5 x (1 + tanh(u)) as x sigmoid(2u), the same function: 1 + tanh(u) cancelled for negative x (gelu(-5.5) was 0)
    # x * sigmoid(2 sqrt(2/pi) (x + 0.044715 x^3)), built as its UOps directly (a test holds them to the Tensor ops' graph)
    x = self.float().uop
    u = UOp(Ops.ADD, (x, UOp(Ops.MUL, (UOp(Ops.MUL, (UOp(Ops.MUL, (x.const_like(0.044715), x)), x)), x))))
    return self._new(UOp(Ops.MUL, (x, _sigmoid_uop(UOp(Ops.MUL, (u.const_like(2 * math.sqrt(2 / math.pi)), u))))))
  @f16_in_f32
  def silu(self) -> TensorCore: return self * self.sigmoid()

  def relu6(self) -> TensorCore: return self.hardtanh(0.0, 6.0)
  def hardtanh(self, min_val: float = -1.0, max_val: float = 1.0) -> TensorCore:
    # the bounds themselves get no gradient (torch's hardtanh_backward), unlike clip's
    return (self <= min_val).where(min_val, (self >= max_val).where(max_val, self))
  @f16_in_f32
  def hardsigmoid(self) -> TensorCore: return ((self + 3) / 6).hardtanh(0.0, 1.0)
  @f16_in_f32
  def hardswish(self) -> TensorCore:
    # torch's gradient: 0 below -3, x/3 + 1/2 in [-3, 3], 1 above
    lo, hi = self <= -3, self >= 3   # torch's slope is 0 at -3 and 1 at 3
    mid = (lo | hi).where(0.0, self)   # the middle piece reads 0 where unused: no inf * 0 in its backward at the infinities
    return lo.where(self * 0, hi.where(self, mid * (mid + 3) / 6))   # -inf * 0: NaN, as torch's x * relu6(x + 3) / 6
  @f16_in_f32
  def elu(self, alpha: float = 1.0) -> TensorCore:
    pos = self > 0
    return pos.where(self, alpha * pos.where(0.0, self).expm1())   # expm1 reads 0 where unused: no inf in its backward
  @f16_in_f32
  def celu(self, alpha: float = 1.0) -> TensorCore:
    pos = self > 0
    return pos.where(self, alpha * (pos.where(0.0, self) / alpha).expm1())
  @f16_in_f32
  def selu(self) -> TensorCore: return 1.0507009873554804934193349852946 * self.elu(1.6732632423543772848170429916717)
  @f16_in_f32
  def softplus(self, beta: float = 1.0, threshold: float = 20.0) -> TensorCore:
    """log(1 + e^(beta x)) / beta, and x itself where beta x > threshold (torch's rule)."""
    bx = self * beta
    lin = bx > threshold
    return lin.where(self, lin.where(0.0, bx).exp().log1p() / beta)
  @f16_in_f32
  def softsign(self) -> TensorCore: return self / (1 + self.abs())
  @f16_in_f32
  def mish(self) -> TensorCore: return self * self.softplus().tanh()
  @f16_in_f32
  def logsigmoid(self) -> TensorCore: return -(-self).softplus()
  @f16_in_f32
  def quick_gelu(self) -> TensorCore: return self * (self * 1.702).sigmoid()
  def swish(self) -> TensorCore: return self.silu()
