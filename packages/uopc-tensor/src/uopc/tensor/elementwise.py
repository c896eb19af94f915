"""uopc.tensor.elementwise: arithmetic, comparisons, logic and bits, rounding, where: the elementwise ops of the IR's ALU.

Each binary op meets its operands through TensorCore._operands (broadcast, promoted, a python scalar in the tensor's
dtype) and is one UOp where the IR has it (ADD, MUL, MAX, CMPLT, CMPNE, WHERE, integer // and %). What it has no
primitive for is a composite: `x - y` and `-x` are multiplications by -1, float // and % are floor and a fused
multiply-add rounded once (NumPy's values), min is max under an order-reversing map (-x, or -1 - x on integers, which
never overflows), & | ^ on i32 take the 32 bits apart and sum them back, shifts multiply or floor-divide by powers of
two. Comparisons of floats keep NaN's rules (x <= y is (x < y) | (x == y), not not(x > y)).
"""
from __future__ import annotations
import math
import numpy as np
from uopc.dtype import dtypes, I32_MIN
from uopc.uop import UOp, Ops
from uopc.tensor.errors import TensorError, TensorTypeError
from uopc.tensor.args import number_arg, promote, broadcast_shape
from uopc.tensor.core import TensorCore, f16_in_f32, broadcast_uop
from uopc.tensor.creation import const_uop, positions, shared_constant

_POW2_I32 = np.array([1 << k for k in range(31)] + [I32_MIN], np.int32)   # bit k's weight in an i32 (bit 31: -2**31)


class ElementwiseMixin:
  """Operators (+ - * / // % comparisons & | ^ ~ << >>), their torch names, where, min/max/clip, rounding, float classes."""
  __slots__ = ()

  # ---- arithmetic, comparisons and logic
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
    t = self.float() if not self.dtype.is_float else self
    a, b, parents = t._operands(x if not isinstance(x, TensorCore) or x.dtype.is_float else x.float())
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
  def _finite_by_infinite(self, b: TensorCore, same_sign: bool) -> TensorCore:
    """Where self is finite and b infinite, and their signs agree (or self is 0) or differ, as asked."""
    mixed = (self * b) < 0                                   # 0 * inf is nan: a zero counts as agreeing
    return ((self - self).eq(0) & b.abs().eq(math.inf)) & (mixed.logical_not() if same_sign else mixed)
  def __rmod__(self, x):
    a, b, parents = self._operands(x, True)
    return self._new(a, *parents).__mod__(self._new(b, *parents))
  def _float_floordiv(self, other: TensorCore) -> TensorCore:
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
    return q.cast(self.dtype if self.dtype.is_float else dtypes.f32)._stop_gradient()

  def __lt__(self, x): return self._binop(Ops.CMPLT, x)
  def __gt__(self, x): return self._binop(Ops.CMPLT, x, True)
  # not(x > y) is wrong for NaN (nan <= 1 is false), so floats compare as (x < y) | (x == y)
  def __le__(self, x): return (self < x) | self.eq(x) if self._float_compare(x) else (self > x).logical_not()
  def __ge__(self, x): return (self > x) | self.eq(x) if self._float_compare(x) else (self < x).logical_not()
  def _float_compare(self, x) -> bool: return self.dtype.is_float or isinstance(x, float) or (isinstance(x, TensorCore) and x.dtype.is_float)
  def __eq__(self, x): return self.ne(x).logical_not()   # type: ignore[override]
  def __ne__(self, x): return self.ne(x)                 # type: ignore[override]
  __hash__ = object.__hash__   # a class that defines __eq__ loses its __hash__: a tensor hashes by identity
  def ne(self, x) -> TensorCore: return self._binop(Ops.CMPNE, x)
  def eq(self, x) -> TensorCore: return self.ne(x).logical_not()
  def logical_not(self) -> TensorCore: return self._new(self.cast(dtypes.bool).uop.ne(True))
  def logical_and(self, x) -> TensorCore: return self.bool() & (x.bool() if isinstance(x, TensorCore) else bool(x))
  def logical_or(self, x) -> TensorCore: return self.bool() | (x.bool() if isinstance(x, TensorCore) else bool(x))
  def logical_xor(self, x) -> TensorCore: return self.bool() ^ (x.bool() if isinstance(x, TensorCore) else bool(x))

  # ---- bits: & | ^ ~ << >> are logical on bool and bitwise on i32, as in PyTorch
  def _bitwise(self, x, op: str, reverse: bool = False) -> TensorCore:
    """a & b, a | b, a ^ b. The IR has no bit operations, so an i32 is taken apart into its 32 bits (bit k is
    floor(v / 2**k) mod 2, which is two's complement's bit k for negative v too; bit 31 is v < 0), the bits are combined,
    and the word is summed back with weights 2**k and -2**31 for bit 31 (no partial sum of those can overflow)."""
    a, b, parents = self._operands(x, reverse)
    if a.dtype.is_float: raise TensorTypeError(f"{op} needs bool or integer tensors, got {a.dtype.name}")
    if a.dtype is dtypes.bool:
      return self._new({"&": a * b, "|": UOp(Ops.ADD, (a, b)), "^": a.ne(b)}[op], *parents)
    ta, tb = self._new(a), self._new(b)
    weights = shared_constant(self, ("pow2", 32), lambda: _POW2_I32)
    ba, bb = ta._bits(), tb._bits()
    bits = {"&": ba * bb, "|": ba.maximum(bb), "^": ba.ne(bb).int()}[op]
    return self._new((bits * weights).sum(-1).uop, *parents)
  def _bits(self) -> TensorCore:
    """The 32 bits of an i32 tensor as a new last axis of 0/1 i32s, bit 0 first."""
    low = shared_constant(self, ("pow2", 31), lambda: _POW2_I32[:31])
    return ((self.unsqueeze(-1) // low) % 2).cat((self < 0).int().unsqueeze(-1), dim=-1)
  def __and__(self, x): return self._bitwise(x, "&")
  def __or__(self, x): return self._bitwise(x, "|")
  def __xor__(self, x): return self._bitwise(x, "^")
  def __rand__(self, x): return self._bitwise(x, "&", True)
  def __ror__(self, x): return self._bitwise(x, "|", True)
  def __rxor__(self, x): return self._bitwise(x, "^", True)
  bitwise_and, bitwise_or, bitwise_xor = __and__, __or__, __xor__
  def __invert__(self) -> TensorCore:
    if self.dtype.is_float: raise TensorTypeError(f"~ needs a bool or integer tensor, got {self.dtype.name}")
    return self.logical_not() if self.dtype is dtypes.bool else -1 - self   # ~v is -1 - v in two's complement, and never overflows
  bitwise_not = __invert__
  def _shift_operands(self, x, op: str) -> tuple[TensorCore, TensorCore | int]:
    if self.dtype is not dtypes.i32 or (isinstance(x, TensorCore) and x.dtype is not dtypes.i32) or isinstance(x, (float, bool)):
      got = x.dtype.name if isinstance(x, TensorCore) else repr(x)
      raise TensorTypeError(f"{op} shifts i32 tensors by integers, got {self.dtype.name} {op} {got}")
    if not isinstance(x, TensorCore) and not 0 <= x < 32: raise TensorError(f"{op}: shift by {x}, expected 0 to 31")
    return self, x
  def _pow2(self) -> TensorCore:
    """2**self for an i32 tensor of shift amounts in 0..31 (2**31 wraps to -2**31): a table lookup."""
    table = shared_constant(self, ("pow2", 32), lambda: _POW2_I32)
    return (self.unsqueeze(-1).eq(positions(self, 32))).where(table, 0).sum(-1)
  def __lshift__(self, x) -> TensorCore:
    """self * 2**x, wrapping like the i32 it is."""
    t, x = self._shift_operands(x, "<<")
    return t * (x._pow2() if isinstance(x, TensorCore) else (1 << x if x < 31 else I32_MIN))
  def __rshift__(self, x) -> TensorCore:
    """The arithmetic shift: floor(self / 2**x) (by 31: -1 for negative values, 0 for the rest)."""
    t, x = self._shift_operands(x, ">>")
    if not isinstance(x, TensorCore): return t // (1 << x) if x < 31 else -(t < 0).int()
    return x.eq(31).where(-(t < 0).int(), t // x.minimum(30)._pow2())
  lshift, rshift, bitwise_left_shift, bitwise_right_shift = __lshift__, __rshift__, __lshift__, __rshift__

  # ---- magnitude, extremes and rounding
  def abs(self) -> TensorCore:
    # MAX splits ties, so the gradient at 0 is 0, as in torch; max(0.0, -0.0) is -0.0, and + 0.0 makes it +0.0, so that
    # 1 / abs(0.0) is inf as in NumPy (the fuzzer found -inf)
    return self.maximum(-self) + 0.0 if self.dtype.is_float else self.maximum(-self)
  def sign(self) -> TensorCore:
    s = (self > 0).where(1, (self < 0).where(-1, 0)).cast(self.dtype)
    return self.ne(self).where(self, s) if self.dtype.is_float else s   # sign(nan) is nan (the fuzzer found 0)
  def square(self) -> TensorCore: return self * self
  def maximum(self, x) -> TensorCore: return self._binop(Ops.MAX, x)
  def minimum(self, x) -> TensorCore:
    a, b, parents = self._operands(x)   # promote first: minimum(bool tensor, 3) compares integers, as torch does
    return self._new(a, *parents)._order_reversed().maximum(self._new(b, *parents)._order_reversed())._order_reversed()
  def _order_reversed(self) -> TensorCore:
    """An order-reversing bijection, its own inverse: -x on floats, ~x = -1 - x on integers (-x overflows at INT_MIN), not
    on bools. min is max under it, argmin is argmax."""
    if self.dtype.is_float: return -self
    return self.logical_not() if self.dtype is dtypes.bool else -1 - self
  def clip(self, min_=None, max_=None) -> TensorCore:
    # WHERE, not maximum/minimum: torch.clamp gives self the whole gradient on a bound too (MAX would split the tie),
    # and a NaN stays NaN. A NaN bound gives NaN as in torch.clamp (t < nan is false, so it was ignored)
    if min_ is None and max_ is None: raise TensorError("clip: give min_, max_ or both (torch.clamp refuses neither too)")
    t = self
    for bound, beyond in ((min_, type(self).__lt__), (max_, type(self).__gt__)):
      if bound is None: continue
      if isinstance(bound, (np.ndarray, list, tuple)): bound = type(self)(bound, device=self.device)
      if isinstance(bound, TensorCore): t = (beyond(t, bound) | bound.isnan()).where(bound, t)
      elif isinstance(bound, (float, np.floating)) and math.isnan(bound): t = t.ne(t).where(t, math.nan)   # NaN everywhere, t kept for its 0 gradient
      else: t = beyond(t, bound).where(bound, t)
    return t
  clamp = clip
  def trunc(self) -> TensorCore:
    if not self.dtype.is_float: return self
    # floats of magnitude 2**23 and more (and inf, nan) are integers already, and don't survive the round trip through i32
    # (piecewise constant: no gradient, as in torch)
    return (self.abs() < 2**23).where(self.cast(dtypes.i32).cast(self.dtype), self)._stop_gradient()
  def floor(self) -> TensorCore:
    if not self.dtype.is_float: return self
    t = self.trunc()
    return (self < t).where(t - 1, t)
  def ceil(self) -> TensorCore:
    if not self.dtype.is_float: return self
    t = self.trunc()
    return (self > t).where(t + 1, t)
  def round(self) -> TensorCore:
    """Half to even, like torch.round and numpy.round (floor(x + 0.5) would also be off where x + 0.5 rounds up to an integer)."""
    if not self.dtype.is_float: return self
    f = self.floor()
    d = self - f   # exact
    odd = ((f * 0.5).floor() * 2).ne(f)
    return ((d > 0.5) | (d.eq(0.5) & odd)).where(f + 1, f)

  # ---- torch's names for the arithmetic above
  def add(self, x, alpha=1) -> TensorCore: return self + (x * alpha if alpha != 1 else x)
  def sub(self, x, alpha=1) -> TensorCore: return self - (x * alpha if alpha != 1 else x)
  def mul(self, x) -> TensorCore: return self * x
  def neg(self) -> TensorCore: return -self
  def reciprocal(self) -> TensorCore: return self.recip()
  def mod(self, x) -> TensorCore: return self % x
  remainder = mod
  def div(self, x, rounding_mode: str | None = None) -> TensorCore:
    """self / x: true division (rounding_mode None), rounded toward zero ("trunc") or down ("floor"). Integers stay
    integers under trunc and floor, as in torch."""
    if rounding_mode is None: return self / x
    if rounding_mode not in ("trunc", "floor"):
      raise TensorTypeError(f"div: rounding_mode must be None, 'trunc' or 'floor', got {rounding_mode!r}")
    a, b, parents = self._operands(x)
    ta, tb = self._new(a, *parents), self._new(b, *parents)
    if rounding_mode == "floor": return ta // tb
    if a.dtype.is_float: return (ta / tb).trunc()
    q = ta // tb   # floor; trunc is one more where the exact quotient is negative and not whole
    return ((ta % tb).ne(0) & ((ta < 0).ne(tb < 0))).where(q + 1, q)
  divide = div
  def fmod(self, x) -> TensorCore:
    """C's fmod: the remainder of the division rounded toward zero, with self's sign (% takes the divisor's)."""
    a, b, parents = self._operands(x)
    ta, tb = self._new(a, *parents), self._new(b, *parents)
    r = ta % tb
    r = (r.ne(0) & ((r < 0).ne(ta < 0))).where(r - tb, r)
    # by an infinity the remainder is self itself (% gives the infinity where the signs differ, and r - tb was inf - inf)
    return ta._finite_by_infinite(tb, same_sign=False).where(ta, r) if r.dtype.is_float else r
  @f16_in_f32
  def lerp(self, end, weight) -> TensorCore:
    """self + weight * (end - self); from the end for weights of 1/2 and more, as torch does (exact at weight 1)."""
    w = weight if isinstance(weight, TensorCore) else type(self).full((), float(weight), device=self.device)
    return (w < 0.5).where(self + w * (end - self), end - (end - self) * (1 - w))

  # ---- floating point classes and comparisons
  def isnan(self) -> TensorCore: return self.ne(self)
  def isinf(self, detect_positive: bool = True, detect_negative: bool = True) -> TensorCore:
    t = self.float() if not self.dtype.is_float else self
    if detect_positive and detect_negative: return t.eq(float("inf")) | t.eq(float("-inf"))
    if detect_positive or detect_negative: return t.eq(float("inf") if detect_positive else float("-inf"))
    return type(self).zeros(*self.shape, dtype=dtypes.bool, device=self.device)
  def isfinite(self) -> TensorCore:
    if not self.dtype.is_float: return self.ne(self).logical_not()
    return (self - self).eq(0)   # inf - inf and nan - nan are nan
  def isclose(self, other, rtol: float = 1e-05, atol: float = 1e-08, equal_nan: bool = False) -> TensorCore:
    """|self - other| <= atol + rtol * |other|, elementwise, as torch.isclose (equal infinities are close, NaN is not unless
    equal_nan)."""
    other = other if isinstance(other, TensorCore) else type(self).full((), other, device=self.device)
    close = self.eq(other)
    if equal_nan: close = close | (self.isnan() & other.isnan())
    err = (self - other).abs()
    return close | (err.isfinite() & (err <= atol + (rtol * other).abs()))
  def allclose(self, other, rtol: float = 1e-05, atol: float = 1e-08, equal_nan: bool = False) -> bool:
    return bool(self.isclose(other, rtol, atol, equal_nan).all().item())
  @f16_in_f32
  def copysign(self, other) -> TensorCore:
    """|self| with other's sign, -0.0 included (1 / -0.0 is -inf). torch's gradient: sign(self) * sign(result), 0 at 0."""
    other = other if isinstance(other, TensorCore) else type(self).full((), float(other), device=self.device)
    x = self if self.dtype.is_float else self.float()
    neg = (other < 0) | (other.float().recip() < 0)
    x_neg = (x < 0) | (x.recip() < 0)
    mag = x_neg.where(-x, x)
    return x.eq(0).where(neg.where(-0.0, 0.0), neg.where(-mag, mag))

  # ---- selection
  def where(self, a, b) -> TensorCore:
    """cond.where(a, b): a where self is true, b elsewhere, broadcast together. A python number takes the other branch's
    dtype (both numbers: their own, promoted) and is a CONST, not a tensor of its own."""
    cond = self.cast(dtypes.bool)
    a, b = (type(self)(x, device=self.device) if isinstance(x, (np.ndarray, list, tuple)) else x for x in (a, b))
    for x in (a, b):
      if not isinstance(x, (TensorCore, bool, np.bool_)): number_arg(x, "where: a branch")   # a bool is a value too (tril of a mask)
    ta = a if isinstance(a, TensorCore) else None
    tb = b if isinstance(b, TensorCore) else None
    if ta is None and tb is None: da = db = dtypes.from_py(a) if type(a) is type(b) else promote(dtypes.from_py(a), dtypes.from_py(b))
    else: da, db = (ta.dtype if ta is not None else tb._scalar_dtype(a)), (tb.dtype if tb is not None else ta._scalar_dtype(b))
    d = promote(da, db)
    x = ta.uop.cast(d) if ta is not None else const_uop(a, da).cast(d)
    y = tb.uop.cast(d) if tb is not None else const_uop(b, db).cast(d)
    shape = broadcast_shape(cond.shape, x.shape, y.shape)
    return self._new(UOp(Ops.WHERE, (broadcast_uop(cond.uop, shape), broadcast_uop(x, shape), broadcast_uop(y, shape))),
                     *(t for t in (ta, tb) if t is not None))
