"""uopc.tensor.transcendental: exp, log, the trigonometric and hyperbolic functions, erf and pow, accurate to f32.

The IR's float primitives are EXP2, LOG2, SQRT, SIN and RECIP; everything else is built from them, each with the
reduction or series that keeps it accurate where the plain formula cancels or overflows: cos and tan reduce by pi/2
in three parts (Cody and Waite), log1p and expm1 switch to a series near 0, sinh and cosh avoid e^x's overflow,
atan reduces into [0, tan(pi/8)], erf is a series and Abramowitz & Stegun. Where PyTorch's gradient is a formula of
its own at the edges (pow at 0 and at the infinities, asin, acos, erf), value and slope are computed apart and joined
by TensorCore._with_gradient. f16 inputs are computed in f32 and rounded once (f16_in_f32).
"""
from __future__ import annotations
import math
import numpy as np
from uopc.dtype import dtypes
from uopc.uop import UOp, Ops
from uopc.tensor.errors import TensorError, TensorTypeError
from uopc.tensor.core import TensorCore, f16_in_f32

# pi/2 as C1 + C2 + C3 (to 2e-21): C1 to 12 bits, so q * C1 is exact for the quarter-turn counts q < 2^12 that cos and tan
# reduce by (TranscendentalMixin._quarter_turns), C2 and C3 f32 roundings of what is left
PIO2_PARTS = (1.57080078125, -4.454454938240815e-06, -1.6513995574653217e-13)
TRIG_REDUCE_MAX = 4096.0


class TranscendentalMixin:
  """The float functions beyond the ALU: exponentials and logarithms, trigonometry, hyperbolic functions, erf, pow."""
  __slots__ = ()

  # ---- the IR's float primitives, exp and log, and trigonometry reduced by quarter turns
  def _float_unary(self, op: Ops) -> TensorCore:
    x = self if self.dtype.is_float else self.float()
    return self._new(UOp(op, (x.uop,)))
  def recip(self) -> TensorCore: return self._float_unary(Ops.RECIP)
  def exp2(self) -> TensorCore: return self._float_unary(Ops.EXP2)
  def log2(self) -> TensorCore: return self._float_unary(Ops.LOG2)
  def sqrt(self) -> TensorCore: return self._float_unary(Ops.SQRT)
  def sin(self) -> TensorCore: return self._float_unary(Ops.SIN)
  @f16_in_f32
  def exp(self) -> TensorCore: return (self * (1 / math.log(2))).exp2()
  @f16_in_f32
  def log(self) -> TensorCore: return self.log2() * math.log(2)
  @f16_in_f32
  def rsqrt(self) -> TensorCore: return self.sqrt().recip()
  def _quarter_turns(self) -> tuple[TensorCore, TensorCore, TensorCore, TensorCore]:
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
  @f16_in_f32
  def cos(self) -> TensorCore:
    """cos of the reduced argument (see _quarter_turns) up to TRIG_REDUCE_MAX; past it 1 - 2 sin(x/2)^2 (halving is exact and
    sinf reduces a large argument exactly; sin(x + pi/2) rounded x + pi/2 first, which at |x| = 1e6 was 5% off)."""
    near, quarter, s, c = self._quarter_turns()
    h = (self * 0.5).sin()
    far = 1 - 2 * h * h
    return near.where(quarter.eq(0).where(c, quarter.eq(1).where(-s, quarter.eq(2).where(-c, s))), far)
  @f16_in_f32
  def tan(self) -> TensorCore:
    """sin r / cos r, or -cos r / sin r an odd number of quarter turns away (see _quarter_turns): accurate beside the poles
    too, where sin(x) / cos(x) divided by a cos that 1 - 2 sin(x/2)^2 had cancelled to its last bits (27% off at 1e-7 from
    pi/2). Past TRIG_REDUCE_MAX, sin(x) / cos(x)."""
    near, quarter, s, c = self._quarter_turns()
    odd = (quarter.eq(1) | quarter.eq(3))
    far = self.sin() / self.cos()
    return near.where(odd.where(-c / odd.where(s, 1.0), s / c), far)

  @f16_in_f32
  def tanh(self) -> TensorCore:
    """-expm1(-2|x|) / (2 + expm1(-2|x|)) with x's sign: nothing overflows, and near 0 no cancellation (2 sigmoid(2x) - 1
    was 7% off at x = 1e-6 and 150% at 5e-8, where sigmoid is 1/2 plus a few of its last bits)."""
    x = self.float()
    neg = x < 0
    t = (-2 * neg.where(-x, x)).expm1()   # |x| with slope 1 at 0 (abs would split it)
    r = -t / (t + 2)
    return neg.where(-r, r)

  # ---- more exponentials and logarithms
  @f16_in_f32
  def log10(self) -> TensorCore: return self.log2() * (math.log(2) / math.log(10))
  @f16_in_f32
  def log1p(self) -> TensorCore:
    """log(1 + x), accurate near 0: there log(1 + x) loses the low bits of x, so a series takes over."""
    x = self if self.dtype.is_float else self.float()
    small = x.abs() < 0.1
    xs = small.where(x, 0.0)
    series = xs * (1 - xs * (1 / 2 - xs * (1 / 3 - xs * (1 / 4 - xs * (1 / 5 - xs * (1 / 6 - xs * (1 / 7 - xs * (1 / 8 - xs / 9))))))))
    return small.where(series, (1 + small.where(0.0, x)).log())
  @f16_in_f32
  def expm1(self) -> TensorCore:
    """e^x - 1, accurate near 0: a series up to |x| = 1/2 (its first term left out, x^9/9!, is 1e-8 of the value there;
    e^x - 1 cancels, 6e-7 off at 0.1)."""
    x = self if self.dtype.is_float else self.float()
    small = x.abs() < 0.5
    xs = small.where(x, 0.0)
    series = xs * (1 + xs * (1 / 2 + xs * (1 / 6 + xs * (1 / 24 + xs * (1 / 120 + xs * (1 / 720 + xs * (1 / 5040 + xs / 40320)))))))
    return small.where(series, small.where(0.0, x).exp() - 1)
  @f16_in_f32
  def logaddexp(self, other) -> TensorCore:
    """log(e^self + e^other), shifted by the larger so nothing overflows."""
    other = other if isinstance(other, TensorCore) else type(self).full((), float(other), device=self.device)
    m = self.maximum(other)._stop_gradient()
    m = m.isinf().where(0.0, m)   # both -inf (or an inf): no shift, the log of the sum is the answer
    return ((self - m).exp() + (other - m).exp()).log() + m

  # ---- hyperbolic and inverse trigonometric functions
  def _half_exp(self) -> TensorCore:
    """e^x / 2 for x >= 0 as (e^(x/2))^2 / 2, finite wherever the result is: e^x itself overflows past 88.7, where sinh
    and cosh (to 89.4) don't yet."""
    h = (self * 0.5).exp()
    return h * (h * 0.5)
  @f16_in_f32
  def sinh(self) -> TensorCore:
    """(expm1(x) - expm1(-x)) / 2, and sign(x) e^|x| / 2 past |x| = 20 (where e^-|x| is below the last bit)."""
    x = self if self.dtype.is_float else self.float()
    big = x.abs() > 20
    xs = big.where(0.0, x)   # each branch reads a safe value where the other is taken: no inf * 0 in the backward pass
    xb = big.where(x, 20.0)
    far = (xb < 0).where(-(-xb)._half_exp(), xb._half_exp())
    return big.where(far, (xs.expm1() - (-xs).expm1()) * 0.5)
  @f16_in_f32
  def cosh(self) -> TensorCore:
    """(e^x + e^-x) / 2, and e^|x| / 2 past |x| = 20."""
    x = self if self.dtype.is_float else self.float()
    big = x.abs() > 20
    xs = big.where(0.0, x)
    e = xs.exp()
    return big.where(big.where(x.abs(), 20.0)._half_exp(), (e + e.recip()) * 0.5)
  @f16_in_f32
  def atan(self) -> TensorCore:
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
  @f16_in_f32
  def asin(self) -> TensorCore:
    """atan(x / sqrt(1 - x^2)), with torch's slope 1 / sqrt(1 - x^2) attached (through atan it was inf * 0 = NaN at +-1)."""
    x = self if self.dtype.is_float else self.float()
    xd = x._stop_gradient()
    return (xd / ((1 - xd) * (1 + xd)).sqrt()).atan()._with_gradient((x, ((1 - xd) * (1 + xd)).sqrt().recip()))
  @f16_in_f32
  def acos(self) -> TensorCore:
    """2 atan(sqrt((1 - x) / (1 + x))), with asin's slope negated: pi/2 - asin(x) cancelled near x = 1 (1e-4 off at
    0.99999994, where acos is 3.5e-4)."""
    x = self if self.dtype.is_float else self.float()
    xd = x._stop_gradient()
    return (2 * ((1 - xd) / (1 + xd)).sqrt().atan())._with_gradient((x, -((1 - xd) * (1 + xd)).sqrt().recip()))
  @f16_in_f32
  def asinh(self) -> TensorCore:
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
  @f16_in_f32
  def acosh(self) -> TensorCore:
    """log1p(d + sqrt(d (x + 1))) with d = x - 1 (exact near 1, where x^2 - 1 lost the low bits), and log(x) + log(2) past
    2^12 (x^2 overflowed past 1.8e19)."""
    x = self if self.dtype.is_float else self.float()
    big = x > 2.0**12
    m = big.where(2.0, x)
    d = m - 1
    return big.where(big.where(x, 2.0).log() + math.log(2), (d + (d * (m + 1)).sqrt()).log1p())
  @f16_in_f32
  def atanh(self) -> TensorCore: return (self.log1p() - (-self).log1p()) * 0.5
  @f16_in_f32
  def erf(self) -> TensorCore:
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

  # ---- pow: PyTorch's values and gradients also at 0, at the infinities and for negative bases
  def __pow__(self, x): return self.pow(x)
  def __rpow__(self, x): return self.pow(x, reverse=True)
  @f16_in_f32
  def pow(self, x, reverse: bool = False) -> TensorCore:
    """self ** x (x ** self when reverse). An integer exponent is exact repeated squaring (right for negative bases and for
    integer tensors); otherwise the value follows C's pow and the gradients are PyTorch's formulas, attached with
    _with_gradient because differentiating exp2(x * log2 b) gives NaN where torch has 0 or inf (b = 0, b = inf)."""
    if isinstance(x, np.generic): x = x.item()
    if not isinstance(x, (TensorCore, int, float)): raise TensorTypeError(f"pow: can't raise to a {type(x).__name__}")
    if not reverse and not isinstance(x, TensorCore):
      c = int(x) if isinstance(x, bool) else x
      t = self.int() if self.dtype is dtypes.bool else self
      if not t.dtype.is_float and isinstance(c, int):
        if c < 0: raise TensorError(f"pow: integers to negative integer powers are not allowed ({t.dtype.name} tensor ** {c}), as in PyTorch")
        return t._power_of(c)
      t = t if t.dtype.is_float else t.float()
      if float(c).is_integer() and abs(c) <= 64:
        if c >= -1: return t._power_of(int(c)) if c >= 0 else t.recip()
        # 1 / x**n: its derivative through the products is 0 * inf = NaN at x = 0, where torch has c * 0**(c-1) = inf
        return t._power_of(-int(c)).recip()._with_gradient((t, c * type(self)._pow_value(t, c - 1)))
      if c == 0.5: return t.sqrt()   # as torch computes it (so (-inf) ** 0.5 is NaN); sqrt's gradient is torch's at 0 too
      return type(self)._pow_value(t, c)._with_gradient((t, c * type(self)._pow_value(t, c - 1)))
    base, exp = (self, x) if not reverse else (x, self)
    if isinstance(base, TensorCore) and isinstance(exp, TensorCore) and not base.dtype.is_float and not exp.dtype.is_float:
      b, e, _ = base._operands(exp)
      return base._new(b, base, exp)._int_pow(base._new(e, base, exp))
    ref = base if isinstance(base, TensorCore) else exp
    b, e, _ = (ref.float() if not ref.dtype.is_float else ref)._operands(exp if ref is base else base, reverse=ref is not base)
    b, e = ref._new(b, ref), ref._new(e, ref)
    value = type(self)._pow_value(b, e)
    pairs = []
    # torch: d/db = e * b**(e-1), 0 where e == 0; d/de = b**e * log(b), 0 where b == 0 and e >= 0
    if isinstance(base, TensorCore): pairs.append((base, e.eq(0).where(0.0, e * type(self)._pow_value(b, e - 1))))
    if isinstance(exp, TensorCore): pairs.append((exp, (b.eq(0) & (e >= 0)).where(0.0, value * b.log())))
    return value._with_gradient(*pairs)

  def _power_of(self, n: int) -> TensorCore:
    """self ** n for a python int n >= 0 by repeated squaring: exact on integers, right for negative bases. x ** 0 is 1 but
    keeps x in the graph, so x gets a zero gradient as in torch."""
    if n == 0: return self.ne(self).where(1, 1).cast(self.dtype)
    out, sq = None, self
    while True:
      if n & 1: out = sq if out is None else out * sq
      n >>= 1
      if not n: return out
      sq = sq * sq

  def _int_pow(self, e: TensorCore) -> TensorCore:
    """self ** e elementwise on i32 tensors: square and multiply over the 31 bits of e (wrapping like i32 products). A
    negative e gives 1 / self**|e| truncated toward zero (torch refuses it): 0 unless self is 1 or -1."""
    out, sq, rest = self.ones_like(), self, e.maximum(0)
    for _ in range(31):
      out = (rest % 2).eq(1).where(out * sq, out)
      sq, rest = sq * sq, rest // 2
    unit = self.eq(1) | self.eq(-1)
    return (e < 0).where(unit.where(self.eq(1).where(1, 1 - 2 * (e % 2)), 0), out)

  @staticmethod
  def _pow_value(b: TensorCore, e) -> TensorCore:
    """b ** e by C's pow rules (a negative base needs an integral exponent, except -inf; anything ** 0 and 1 ** anything are
    1), as exp2(e * log2|b|), with no gradient of its own: pow attaches PyTorch's. e is a float tensor or a python number."""
    b = b._stop_gradient()
    neg = (b < 0) | (b.recip() < 0)   # -0.0 too, as C's pow: (-0.0) ** -3 is -inf
    mag = (neg.where(-b, b).log2() * (e._stop_gradient() if isinstance(e, TensorCore) else e)).exp2()
    if isinstance(e, TensorCore):
      e = e._stop_gradient()
      integral, odd = e.eq(e.floor()), ((e * 0.5).floor() * 2).ne(e)
      negative = integral.where(odd.where(-mag, mag), (b.eq(float("-inf")) | b.eq(0)).where(mag, float("nan")))
      return (e.eq(0) | b.eq(1)).where(1.0, neg.where(negative, mag))
    if e == 0: return b.ne(b).where(1.0, 1.0)
    if float(e).is_integer(): negative = -mag if int(e) % 2 else mag
    else: negative = (b.eq(float("-inf")) | b.eq(0)).where(mag, float("nan"))
    return b.eq(1).where(1.0, neg.where(negative, mag))
