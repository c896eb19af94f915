"""uopc.onnx.ops_math: ONNX's elementwise ops (arithmetic, comparisons, logic and bits, math functions, activations)
and Cast, on the Tensor API.

Broadcasting is NumPy's in ONNX and in Tensor alike. Integer results of a narrow type are wrapped by the interpreter
(dtypes.settle); those of a type wider than i32 (int64, uint32, uint64) are checked here where arithmetic could leave
i32 (`guard_wide`): the op is computed again in f32, and where the two differ by a multiple of 2**32 the i32 result
wrapped, which is an error, never an answer. ONNX's integer Div rounds toward zero; Mod without fmod takes the
divisor's sign (NumPy's), with fmod the dividend's (C's).
"""
from __future__ import annotations
import functools
import numpy as np
from uopc.dtype import dtypes
from uopc.uop import UOp, Ops
from uopc.tensor import Tensor
from uopc.onnx.registry import op
from uopc.onnx.dtypes import WIDE, OnnxError, check, np_type, compute_dtype

I32_LIMIT = 2.0 ** 31


def guard_wide(ctx, r: Tensor, shadow, i: int = 0) -> Tensor:
  """r, an i32 result declared int64/uint32/uint64, refused where the exact value (shadow, the op in f32: its error is far
  below 2**31 wherever r could be right) left i32, or is negative for an unsigned type."""
  d = ctx.out_types[i] if i < len(ctx.out_types) else None
  if d not in WIDE or r.dtype is not dtypes.i32: return r
  bad = ((shadow() - r.float()) * 2.0 ** -32).round().ne(0)
  if d.kind == "u": bad = bad | (r < 0)
  check(bad, f"{ctx.op}: a {d} result doesn't fit the i32 uopc computes {d} in (-2**31 to 2**31 - 1)")
  return r


def _is_int(x: Tensor) -> bool: return x.dtype is dtypes.i32


def true_div(a: Tensor, b: Tensor) -> Tensor:
  """a / b rounded once, as IEEE division (and NumPy) rounds it. Tensor's / is a * (1 / b), which can be an ulp off, and
  an ulp decides a rounding later (DynamicQuantizeLinear's x / scale landed on the wrong side of .5): one Newton step
  with the remainder computed in a fused multiply-add corrects it. Where the quotient isn't finite (or b is 0, inf, NaN)
  the correction would be NaN, so the plain quotient stays."""
  q = a / b
  if q.dtype is not dtypes.f32: return q
  af, bf = a.float(), b.float()
  r = Tensor(UOp(Ops.MULACC, ((-q)._broadcast_to(q.shape).uop, bf._broadcast_to(q.shape).uop, af._broadcast_to(q.shape).uop)), device=q.device)
  fixed = q + r * bf.recip()
  return (fixed.isfinite() & q.isfinite()).where(fixed, q)


# ---- arithmetic
@op("Add", since=7)
def add(ctx, a, b): return guard_wide(ctx, a + b, lambda: a.float() + b.float())
@op("Sub", since=7)
def sub(ctx, a, b): return guard_wide(ctx, a - b, lambda: a.float() - b.float())
@op("Mul", since=7)
def mul(ctx, a, b):
  if a.dtype is dtypes.bool: return a & b
  return guard_wide(ctx, a * b, lambda: a.float() * b.float())
@op("Div", since=7)
def div(ctx, a, b):
  if _is_int(a): return a.div(b, rounding_mode="trunc")   # an i32 quotient never leaves i32 but at INT_MIN / -1 (wraps, as int32)
  return true_div(a, b)
@op("Neg", since=6)
def neg(ctx, x): return guard_wide(ctx, -x, lambda: -x.float())
@op("Abs", since=6)
def abs_(ctx, x): return guard_wide(ctx, x.abs(), lambda: x.float().abs())
@op("Reciprocal", since=6)
def reciprocal(ctx, x): return x.recip()
@op("Mod", since=10)
def mod(ctx, a, b, fmod=0): return a.fmod(b) if fmod else a % b
@op("Pow", since=7)
def pow_(ctx, x, y):
  if _is_int(x):
    if _is_int(y): return guard_wide(ctx, x.pow(y), lambda: x.float().pow(y.float()))
    return guard_wide(ctx, x.float().pow(y).trunc().cast(dtypes.i32), lambda: x.float().pow(y))
  return x.pow(y if not _is_int(y) else y.cast(x.dtype))
@op("Sum", since=6)
def sum_(ctx, *xs):
  out = functools.reduce(lambda a, b: a + b, xs)
  return guard_wide(ctx, out, lambda: functools.reduce(lambda a, b: a + b, (x.float() for x in xs)))
@op("Mean", since=6)
def mean(ctx, *xs): return functools.reduce(lambda a, b: a + b, xs) / len(xs)
@op("Max", since=6)
def max_(ctx, *xs): return functools.reduce(lambda a, b: a.maximum(b), xs)
@op("Min", since=6)
def min_(ctx, *xs): return functools.reduce(lambda a, b: a.minimum(b), xs)
@op("Clip", since=6)
def clip_6(ctx, x, min=-3.4028234663852886e38, max=3.4028234663852886e38): return x.clip(min, max)   # noqa: A002
@op("Clip", since=11)
def clip_11(ctx, x, lo=None, hi=None):
  if lo is None and hi is None: return x
  t = x
  if lo is not None: t = (t < lo).where(lo.cast(t.dtype), t)
  if hi is not None: t = (t > hi).where(hi.cast(t.dtype), t)
  return t

# ---- comparisons and logic
@op("Equal", since=7)
def equal(ctx, a, b): return a.eq(b)
@op("Less", since=7)
def less(ctx, a, b): return a < b
@op("Greater", since=7)
def greater(ctx, a, b): return a > b
@op("LessOrEqual", since=12)
def less_equal(ctx, a, b): return a <= b
@op("GreaterOrEqual", since=12)
def greater_equal(ctx, a, b): return a >= b
@op("Not", since=1)
def not_(ctx, x): return x.logical_not()
@op("And", since=7)
def and_(ctx, a, b): return a.logical_and(b)
@op("Or", since=7)
def or_(ctx, a, b): return a.logical_or(b)
@op("Xor", since=7)
def xor(ctx, a, b): return a.logical_xor(b)
@op("Where", since=9, exact=True)
def where(ctx, c, a, b): return c.where(a, b)
@op("BitwiseAnd", since=18)
def bitwise_and(ctx, a, b): return a & b
@op("BitwiseOr", since=18)
def bitwise_or(ctx, a, b): return a | b
@op("BitwiseXor", since=18)
def bitwise_xor(ctx, a, b): return a ^ b
@op("BitwiseNot", since=18)
def bitwise_not(ctx, x): return guard_wide(ctx, ~x, lambda: -1.0 - x.float())
@op("BitShift", since=11)
def bit_shift(ctx, x, y, direction):
  """ONNX's (NumPy's) shifts: by a negative amount or one of at least the type's width, left gives 0 and right fills with
  the sign bit, where C masks the amount."""
  bits = 8 * (ctx.in_types[0] or np.dtype(np.int64)).itemsize
  outside = (y < 0) | (y >= bits)
  amount = outside.where(0, y.minimum(31))
  if direction == "LEFT":
    out = guard_wide(ctx, x << amount, lambda: x.float() * outside.where(0, y).float().exp2())
    return outside.where(0, (y > 31).where(0, out))
  if direction == "RIGHT": return (outside | (y > 31)).where((x < 0).where(-1, 0), x >> amount)
  raise OnnxError(f"BitShift: direction must be LEFT or RIGHT, got {direction!r}")


# ---- math functions
for _name, _method in [("Sqrt", "sqrt"), ("Exp", "exp"), ("Log", "log"), ("Sin", "sin"), ("Cos", "cos"), ("Tan", "tan"), ("Asin", "asin"),
                       ("Acos", "acos"), ("Atan", "atan"), ("Sinh", "sinh"), ("Cosh", "cosh"), ("Tanh", "tanh"), ("Asinh", "asinh"),
                       ("Acosh", "acosh"), ("Atanh", "atanh"), ("Sigmoid", "sigmoid"), ("Erf", "erf"), ("Softsign", "softsign"),
                       ("Mish", "mish"), ("HardSwish", "hardswish")]:
  op(_name, since=1)(lambda ctx, x, _m=_method: getattr(x, _m)())
@op("Floor", since=6, exact=True)
def floor(ctx, x): return x.floor()
@op("Ceil", since=6, exact=True)
def ceil(ctx, x): return x.ceil()
@op("Round", since=11, exact=True)
def round_(ctx, x): return x.round()
@op("Sign", since=9)
def sign(ctx, x): return x.sign()
@op("IsNaN", since=9)
def isnan(ctx, x): return x.isnan()
@op("IsInf", since=10)
def isinf(ctx, x, detect_negative=1, detect_positive=1): return x.isinf(bool(detect_positive), bool(detect_negative))
@op("Relu", since=6)
def relu(ctx, x): return x.relu()
@op("LeakyRelu", since=6)
def leaky_relu(ctx, x, alpha=0.01): return x.leaky_relu(alpha)
@op("PRelu", since=7)
def prelu(ctx, x, slope): return (x < 0).where(x * slope, x)
@op("ThresholdedRelu", since=10)
def thresholded_relu(ctx, x, alpha=1.0): return (x > alpha).where(x, 0.0)
@op("Elu", since=6)
def elu(ctx, x, alpha=1.0): return x.elu(alpha)
@op("Celu", since=12)
def celu(ctx, x, alpha=1.0): return x.celu(alpha)
@op("Selu", since=6)
def selu(ctx, x, alpha=1.67326319217681884765625, gamma=1.05070102214813232421875):
  return gamma * (x > 0).where(x, alpha * (x > 0).where(0.0, x).expm1())
@op("HardSigmoid", since=6)
def hard_sigmoid(ctx, x, alpha=0.2, beta=0.5): return (x * alpha + beta).clip(0.0, 1.0)
@op("Softplus", since=1)
def softplus(ctx, x):
  xf = x if x.dtype is dtypes.f32 else x.float()
  out = xf.clip(min_=0.0) + (-xf.abs()).exp().log1p()   # log(1 + e^x) without overflow
  return out.cast(x.dtype)
@op("Gelu", since=20)
def gelu(ctx, x, approximate="none"): return x.gelu("none" if approximate == "none" else "tanh")
@op("Swish", since=24)
def swish(ctx, x, alpha=1.0): return x * (x * alpha).sigmoid()
@op("Shrink", since=9)
def shrink(ctx, x, bias=0.0, lambd=0.5):
  xf = x.float() if not x.dtype.is_float else x
  return (xf < -lambd).where(xf + bias, (xf > lambd).where(xf - bias, 0.0))


# ---- casts
def cast_to(ctx, x: Tensor, src: np.dtype | None, dst: np.dtype) -> Tensor:
  """x (of declared type src) as the declared type dst, as ONNX's Cast: floats truncate toward zero into integers (a value
  the i32 can't hold, NaN or an infinity is refused), integers wrap into narrower ones (the interpreter's wrap), and
  anything but zero is true."""
  d = compute_dtype(dst)
  if d is dtypes.bool: return x if x.dtype is dtypes.bool else x.ne(0)
  if x.dtype.is_float and d is dtypes.i32:
    t = x.float().trunc()
    check(t.isnan() | (t < -I32_LIMIT) | (t >= I32_LIMIT),
          f"Cast: a {src or x.dtype.name} value is NaN, infinite or past the i32 uopc computes {dst} in")
    return t.cast(dtypes.i32)
  if src is not None and src.kind == "i" and dst in WIDE and dst.kind == "u":
    check(x < 0, f"Cast: a negative {src} value cast to {dst} wraps past the i32 uopc computes {dst} in")
  return x.cast(d)
@op("Cast", since=6)
def cast(ctx, x, to, saturate=1, round_mode="up"): return cast_to(ctx, x, ctx.in_types[0], np_type(to))
@op("CastLike", since=15)
def cast_like(ctx, x, target, saturate=1, round_mode="up"):
  return cast_to(ctx, x, ctx.in_types[0], ctx.in_types[1] if ctx.in_types[1] is not None else np.dtype(np.float32))
