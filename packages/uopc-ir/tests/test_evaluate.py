"""uopc.evaluate: run / to_python / exec_alu / cast_value, checked against NumPy or exact values.

The scalar semantics are the C backend's: i32 wraps, FLOORDIV/FLOORMOD are floor division, f32 and f16 results
are rounded to their type, CAST truncates toward zero, bool arithmetic is C's _Bool. The oracles are NumPy
arrays of the matching dtype (array arithmetic, which wraps and rounds like C), or values written out by hand.
A differential test runs random programs (literal tensors, elementwise chains with broadcasting, movement ops,
reductions) through `to_python` and through a NumPy model of the same semantics, and compares bit for bit.
"""
import math
import warnings
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st
from uopc.dtype import dtypes
from uopc.uop import UOp, Ops, ParamArg, CallArg, AddrSpace, UOpError, stack, buf, sink, range_
from uopc.evaluate import run, to_python, exec_alu, cast_value, EvalError, SUM_CHUNK
from uopc.composite import pad, flip_axis, anti_eye, concat2

I32_MIN, I32_MAX = -2**31, 2**31 - 1
NP_DTYPE = {dtypes.f32: np.float32, dtypes.i32: np.int32, dtypes.bool: np.bool_, dtypes.f16: np.float16}
i32s = st.integers(I32_MIN, I32_MAX)
f32s = st.floats(width=32, allow_nan=True, allow_infinity=True)
f16s = st.floats(width=16, allow_nan=True, allow_infinity=True)


# ---- helpers -----------------------------------------------------------------------------------------------------

def lit(a) -> UOp:
  """A NumPy array as nested STACKs of CONSTs (f16 elements as CAST(CONST, f16)). Recursion is on the rank only."""
  a = np.asarray(a)
  if a.ndim == 0:
    if a.dtype == np.float16: return UOp.const(float(a), dtypes.f16)
    return UOp.const(a.item())
  return UOp(Ops.STACK, tuple(lit(x) for x in a))

def param(slot: int, dtype=dtypes.i32, shape=()) -> UOp: return UOp(Ops.PARAM, (), ParamArg(slot, dtype, shape))
def call(body: UOp, *args) -> UOp: return UOp(Ops.CALL, (body, *args), CallArg("f"))

def value(u: UOp) -> np.ndarray:
  """to_python(u) as an array of u's dtype (non-empty shapes only: to_python stops at the first empty axis)."""
  return np.array(to_python(u), dtype=NP_DTYPE[u.dtype]).reshape(u.shape)

def assert_bits_equal(got: np.ndarray, want: np.ndarray):
  """Exact equality: same dtype and shape, floats bit for bit (so -0.0 != 0.0), any NaN equal to any NaN."""
  assert got.dtype == want.dtype and got.shape == want.shape, (got.dtype, got.shape, want.dtype, want.shape)
  if want.dtype.kind == "f":
    nan = np.isnan(want)
    assert np.array_equal(np.isnan(got), nan), (got, want)
    ui = np.uint32 if want.dtype == np.float32 else np.uint16
    assert np.array_equal(got[~nan].view(ui), want[~nan].view(ui)), (got, want)
  else: assert np.array_equal(got, want), (got, want)

def assert_evaluates_to(u: UOp, want: np.ndarray):
  assert u.shape == want.shape and NP_DTYPE[u.dtype] == want.dtype.type, (u.dtype, u.shape, want.dtype, want.shape)
  if want.size == 0:
    assert run(u).shape == want.shape and to_python(u) == want.tolist()
  else: assert_bits_equal(value(u), want)

def np_quiet(): return np.errstate(all="ignore")

def f32(x) -> float: return float(np.float32(x))


# ---- scalar semantics: i32 ---------------------------------------------------------------------------------------

def test_i32_add_and_mul_wrap_modulo_2_32_at_the_edges():
  assert to_python(UOp.const(I32_MAX) + 1) == I32_MIN
  assert to_python(UOp.const(I32_MIN) + -1) == I32_MAX
  assert to_python(UOp.const(65536) * 65536) == 0
  assert to_python(UOp.const(I32_MIN) * -1) == I32_MIN
  assert to_python(-UOp.const(I32_MIN)) == I32_MIN
  assert to_python(UOp.const(I32_MIN) // -1) == I32_MIN      # the one i32 quotient that overflows
  assert to_python(UOp.const(I32_MIN) % -1) == 0

@settings(max_examples=300, deadline=None)
@given(i32s, i32s)
def test_i32_add_and_mul_match_numpy_int32_arrays(a, b):
  x, y = np.array([a], np.int32), np.array([b], np.int32)
  assert to_python(UOp.const(a) + UOp.const(b)) == int((x + y)[0])
  assert to_python(UOp.const(a) * UOp.const(b)) == int((x * y)[0])
  assert to_python(UOp.const(a).maximum(UOp.const(b))) == int(np.maximum(x, y)[0])
  assert to_python(UOp.const(a) < UOp.const(b)) is bool((x < y)[0])
  assert to_python(UOp.const(a).ne(UOp.const(b))) is bool((x != y)[0])

def test_floordiv_and_floormod_are_floor_division_for_every_sign_combination():
  nums = [-9, -7, -6, -5, -1, 0, 1, 5, 6, 7, 9, I32_MIN, I32_MIN + 1, I32_MAX]
  dens = [-7, -3, -2, -1, 1, 2, 3, 7, I32_MIN, I32_MAX]
  pairs = [(a, b) for a in nums for b in dens if (a, b) != (I32_MIN, -1)]   # numpy's INT_MIN // -1 is checked above
  a, b = np.array([p[0] for p in pairs], np.int32), np.array([p[1] for p in pairs], np.int32)
  assert_evaluates_to(lit(a) // lit(b), np.floor_divide(a, b))
  assert_evaluates_to(lit(a) % lit(b), np.mod(a, b))
  assert to_python(UOp.const(-7) // 2) == -4 and to_python(UOp.const(-7) % 2) == 1      # not C's -3 and -1
  assert to_python(UOp.const(7) // -2) == -4 and to_python(UOp.const(7) % -2) == -1

@settings(max_examples=300, deadline=None)
@given(i32s, i32s.filter(lambda b: b != 0))
def test_floordiv_and_floormod_match_numpy_on_random_i32(a, b):
  x, y = np.array([a], np.int32), np.array([b], np.int32)
  with np_quiet(): q, r = int(np.floor_divide(x, y)[0]), int(np.mod(x, y)[0])
  if (a, b) == (I32_MIN, -1): q = I32_MIN
  assert to_python(UOp.const(a) // UOp.const(b)) == q
  assert to_python(UOp.const(a) % UOp.const(b)) == r


# ---- scalar semantics: floats --------------------------------------------------------------------------------------

def test_f32_results_are_rounded_to_f32_not_double():
  assert to_python(UOp.const(0.1) + UOp.const(0.2)) == float(np.float32(0.1) + np.float32(0.2)) != 0.1 + 0.2
  assert to_python(UOp.const(16777216.0) + 1.0) == 16777216.0
  assert to_python(UOp.const(0.1)) == f32(0.1)                           # an f32 CONST means `0.1f`
  assert to_python(UOp.const(1.0) * (1.0 / 3.0)) == f32(1 / 3)
  assert to_python(UOp.const(3.0e38) * 10.0) == math.inf                 # overflows f32, not double
  assert to_python(UOp.const(1e-45) * 0.5) == 0.0                        # the smallest subnormal halves to zero (ties to even)
  assert to_python(UOp.const(3.0).recip()) == f32(1 / 3)

@settings(max_examples=300, deadline=None)
@given(f32s, f32s)
def test_f32_arithmetic_matches_numpy_float32_bit_for_bit(a, b):
  x, y = np.array([a], np.float32), np.array([b], np.float32)
  ua, ub = UOp.const(a), UOp.const(b)
  with np_quiet():
    assert_evaluates_to(UOp(Ops.STACK, (ua + ub,)), x + y)
    assert_evaluates_to(UOp(Ops.STACK, (ua * ub,)), x * y)
    assert_evaluates_to(UOp(Ops.STACK, (ua.recip(),)), np.float32(1) / x)
    assert_evaluates_to(UOp(Ops.STACK, (UOp(Ops.SQRT, (ua,)),)), np.sqrt(x))
    assert_evaluates_to(UOp(Ops.STACK, (ua < ub,)), x < y)
    assert_evaluates_to(UOp(Ops.STACK, (ua.ne(ub),)), x != y)

def test_f16_results_are_rounded_to_f16():
  h = lambda v: UOp.const(v, dtypes.f16)
  assert to_python(h(0.1)) == float(np.float16(0.1))
  assert to_python(h(2048.0) + h(1.0)) == 2048.0                         # f16 has an 11-bit significand
  assert to_python(h(0.1) + h(0.2)) == float(np.float16(0.1) + np.float16(0.2))
  assert to_python(h(65504.0) + h(16.0)) == math.inf                     # 65520 rounds (to even) past the largest f16
  assert to_python(h(65504.0) + h(15.0)) == 65504.0
  assert to_python(h(1.0) * h(1.0 / 3.0)) == float(np.float16(1 / 3))
  assert to_python(UOp.const(0.1).cast(dtypes.f16)) == float(np.float32(0.1).astype(np.float16))

@settings(max_examples=300, deadline=None)
@given(f16s, f16s)
def test_f16_arithmetic_matches_numpy_float16_bit_for_bit(a, b):
  x, y = np.array([a], np.float16), np.array([b], np.float16)
  ua, ub = UOp.const(a, dtypes.f16), UOp.const(b, dtypes.f16)
  with np_quiet():
    assert_evaluates_to(UOp(Ops.STACK, (ua + ub,)), x + y)
    assert_evaluates_to(UOp(Ops.STACK, (ua * ub,)), x * y)
    assert_evaluates_to(UOp(Ops.STACK, (ua.recip(),)), np.float16(1) / x)

def test_f16_values_made_from_bool_and_int_are_floats():
  # CAST(CONST True, f16) once passed for an f16 literal (True == 1.0), so f16 True + True was C's _Bool "or"
  one = UOp.const(True).cast(dtypes.f16)
  assert to_python(one + one) == 2.0
  assert to_python(one * UOp.const(3.0, dtypes.f16)) == 3.0
  three = UOp.const(3).cast(dtypes.f16)
  assert type(to_python(three)) is float and to_python(three + three) == 6.0
  assert type(to_python(UOp.const(False).cast(dtypes.f16))) is float

def test_recip_of_signed_zero_is_signed_infinity():
  with np_quiet(): want = np.float32(1) / np.array([0.0, -0.0, np.inf, -np.inf], np.float32)
  assert_evaluates_to(lit(np.array([0.0, -0.0, np.inf, -np.inf], np.float32)).recip(), want)
  assert to_python(UOp.const(0.0).recip()) == math.inf and to_python(UOp.const(-0.0).recip()) == -math.inf
  assert to_python(UOp.const(0.0, dtypes.f16).recip()) == math.inf

def test_log2_and_sqrt_of_negatives_are_nan_like_numpy():
  x = np.array([-1.0, -np.inf, -1e-45, np.nan, 0.0, -0.0, 0.25, 8.0, np.inf], np.float32)
  with np_quiet(): want_log, want_sqrt = np.log2(x), np.sqrt(x)
  assert_evaluates_to(UOp(Ops.LOG2, (lit(x),)), want_log)                 # log2(+-0) = -inf, log2 of powers of 2 exact
  assert_evaluates_to(UOp(Ops.SQRT, (lit(x),)), want_sqrt)                # sqrt(-0.0) = -0.0
  assert math.isnan(to_python(UOp(Ops.LOG2, (UOp.const(-1.0, dtypes.f16),))))

def test_exp2_is_exact_on_integers_and_overflows_to_inf():
  x = np.array([-150.0, -149.0, -126.0, -1.0, 0.0, 1.0, 10.0, 127.0, 128.0, 200.0, 5000.0, np.inf, -np.inf, np.nan], np.float32)
  # the oracle computes in float64 and rounds once: numpy's float32 exp2(127) is an ulp above 2**127
  with np_quiet(): want = np.exp2(x.astype(np.float64)).astype(np.float32)
  assert_evaluates_to(UOp(Ops.EXP2, (lit(x),)), want)
  assert to_python(UOp(Ops.EXP2, (UOp.const(127.0),))) == 2.0 ** 127
  assert to_python(UOp(Ops.EXP2, (UOp.const(16.0, dtypes.f16),))) == math.inf    # 65536 is past the largest f16
  assert math.isnan(to_python(UOp(Ops.SIN, (UOp.const(math.inf),))))

def test_exp2_log2_sin_are_within_an_ulp_of_numpy():
  x = np.random.default_rng(1).uniform(0.01, 20.0, 64).astype(np.float32)
  for op, fn in [(Ops.EXP2, np.exp2), (Ops.LOG2, np.log2), (Ops.SIN, np.sin)]:
    got, want = value(UOp(op, (lit(x),))), fn(x.astype(np.float64)).astype(np.float32)
    assert got.dtype == np.float32
    assert np.all(np.abs(got.view(np.int32) - want.view(np.int32)) <= 1), op

def test_max_propagates_nan_like_numpy_maximum():
  a = np.array([np.nan, 1.0, np.nan, -np.inf, np.nan, 2.0, 1.0, np.inf], np.float32)
  b = np.array([1.0, np.nan, np.nan, np.nan, -np.inf, 1.0, 2.0, -np.inf], np.float32)
  assert_evaluates_to(lit(a).maximum(lit(b)), np.maximum(a, b))
  assert_evaluates_to(lit(b).maximum(lit(a)), np.maximum(b, a))
  assert_evaluates_to(lit(a).reduce(Ops.MAX, 1), np.array(np.nan, np.float32))   # a reduction carries a NaN through

def test_nan_compares_false_except_cmpne():
  n = UOp.const(math.nan)
  assert to_python(n < 1.0) is False and to_python(UOp.const(1.0) < n) is False
  assert to_python(n.ne(n)) is True and to_python(n.eq(n)) is False


# ---- CAST ------------------------------------------------------------------------------------------------------------

def test_cast_float_to_i32_truncates_toward_zero():
  x = np.array([-2.5, -1.5, -0.99, -0.5, -0.0, 0.0, 0.5, 0.99, 1.5, 2.5, 2.7, -2.7, 1e9, -1e9, 2147483520.0, -2147483648.0], np.float32)
  assert_evaluates_to(lit(x).cast(dtypes.i32), np.trunc(x).astype(np.int32))
  h = np.array([-2.5, 0.75, 65504.0, -3.5], np.float16)
  assert_evaluates_to(lit(h).cast(dtypes.i32), np.trunc(h).astype(np.int32))

def test_cast_of_nan_inf_or_out_of_range_float_to_i32_is_int_min():
  # C leaves it undefined; uopc fixes it to x86's cvttss2si answer, as cast_value documents
  for v in [math.nan, math.inf, -math.inf, 2147483648.0, 3e9, -3e9]:
    assert to_python(UOp.const(v).cast(dtypes.i32)) == I32_MIN, v
    assert cast_value(v, dtypes.i32) == I32_MIN

@settings(max_examples=300, deadline=None)
@given(i32s)
def test_cast_int_to_float_rounds_to_nearest_like_numpy(v):
  x = np.array([v], np.int32)
  assert_evaluates_to(UOp(Ops.STACK, (UOp.const(v).cast(dtypes.f32),)), x.astype(np.float32))
  with np_quiet(): assert_evaluates_to(UOp(Ops.STACK, (UOp.const(v).cast(dtypes.f16),)), x.astype(np.float16))

def test_cast_int_to_float_edge_values():
  assert to_python(UOp.const(16777217).cast(dtypes.f32)) == 16777216.0
  assert to_python(UOp.const(16777219).cast(dtypes.f32)) == 16777220.0      # ties to even
  assert to_python(UOp.const(I32_MAX).cast(dtypes.f32)) == 2147483648.0
  assert to_python(UOp.const(2049).cast(dtypes.f16)) == 2048.0
  assert to_python(UOp.const(70000).cast(dtypes.f16)) == math.inf

@settings(max_examples=200, deadline=None)
@given(f32s)
def test_cast_f32_to_f16_rounds_like_numpy(v):
  with np_quiet(): want = np.array([v], np.float32).astype(np.float16)
  assert_evaluates_to(UOp(Ops.STACK, (UOp.const(v).cast(dtypes.f16),)), want)

def test_cast_to_bool_is_nonzero_and_nan_is_true():
  x = np.array([0.0, -0.0, np.nan, 1e-45, -3.0, np.inf, -np.inf], np.float32)
  assert_evaluates_to(lit(x).cast(dtypes.bool), x.astype(np.bool_))
  assert to_python(UOp.const(math.nan).cast(dtypes.bool)) is True
  i = np.array([0, 1, -1, I32_MIN, 2], np.int32)
  assert_evaluates_to(lit(i).cast(dtypes.bool), i.astype(np.bool_))

def test_cast_from_bool_gives_zero_or_one():
  b = np.array([False, True], np.bool_)
  assert_evaluates_to(lit(b).cast(dtypes.i32), b.astype(np.int32))
  assert_evaluates_to(lit(b).cast(dtypes.f32), b.astype(np.float32))
  assert_evaluates_to(lit(b).cast(dtypes.f16), b.astype(np.float16))
  assert [type(v) for v in to_python(lit(b).cast(dtypes.f32))] == [float, float]


# ---- bool: C's _Bool -------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("a", [False, True])
@pytest.mark.parametrize("b", [False, True])
def test_bool_arithmetic_is_c_bool_add_is_or_mul_is_and(a, b):
  ua, ub = UOp.const(a), UOp.const(b)
  assert to_python(ua + ub) is (a or b)            # (_Bool)(a + b)
  assert to_python(ua * ub) is (a and b)
  assert to_python(ua.maximum(ub)) is max(a, b)
  assert to_python(ua < ub) is (a < b)
  assert to_python(ua.ne(ub)) is (a != b)
  assert to_python(UOp(Ops.WHERE, (ua, UOp.const(1), UOp.const(2)))) == (1 if a else 2)
  assert exec_alu(Ops.ADD, dtypes.bool, a, b) is (a or b)

def test_bool_reductions_are_any():
  b = np.array([[False, False], [False, True], [True, True]], np.bool_)
  assert_evaluates_to(lit(b).reduce(Ops.ADD, 1), b.any(axis=1))
  assert_evaluates_to(lit(b).reduce(Ops.MAX, 2), np.array(True))


# ---- division by zero and programs run refuses ----------------------------------------------------------------------

@pytest.mark.parametrize("op", [Ops.FLOORDIV, Ops.FLOORMOD])
def test_integer_division_by_zero_is_an_eval_error_not_zerodivisionerror(op):
  assert not issubclass(EvalError, ZeroDivisionError)
  for u in [UOp(op, (UOp.const(7), UOp.const(0))), UOp(op, (lit(np.array([1, 2, 3], np.int32)), lit(np.array([1, 0, 1], np.int32))))]:
    with pytest.raises(EvalError, match="by zero") as e: run(u)
    assert "0" in str(e.value)
  with pytest.raises(EvalError, match="by zero"): exec_alu(op, dtypes.i32, 5, 0)

@pytest.mark.parametrize("make, op", [
  (lambda: buf(0, 4), "BUFFER"),
  (lambda: buf(0, 4).load(), "BUFFER"),
  (lambda: buf(0, 4).index(UOp.const(1)).load(), "BUFFER"),
  (lambda: buf(0, 4).store(lit(np.zeros(4, np.float32))), "BUFFER"),
  (lambda: UOp(Ops.ALLOC, (), ParamArg(0, dtypes.f32, (4,), AddrSpace.LOCAL)), "ALLOC"),
  (lambda: range_(4, 0), "RANGE"),
  (lambda: range_(4, 0) * 2 + 1, "RANGE"),
  (lambda: param(0), "PARAM"),
  (lambda: param(0) + 1, "PARAM"),
  (lambda: sink(UOp.const(1)), "SINK"),
])
def test_run_refuses_memory_loops_and_unbound_params_naming_the_op(make, op):
  with pytest.raises(EvalError, match=rf"Ops\.{op}\b"): run(make())
  with pytest.raises(EvalError, match=rf"Ops\.{op}\b"): to_python(make())

def test_run_says_why_it_refuses():
  with pytest.raises(EvalError, match="memory"): run(buf(0, 4).load())
  with pytest.raises(EvalError, match="loop"): run(range_(4, 0))
  with pytest.raises(EvalError, match="unbound PARAM"): run(param(0))

def test_run_takes_a_uop():
  with pytest.raises(EvalError, match="UOp"): run(3)


# ---- CALL ------------------------------------------------------------------------------------------------------------

def test_call_is_inlined_by_binding_its_params_by_slot():
  p0, p1 = param(0), param(1)
  f = call(p0 * 10 + p1, UOp.const(4), UOp.const(7))
  assert to_python(f) == 47
  assert to_python(call(p0 * 10 + p1, UOp.const(7), UOp.const(4))) == 74     # slots, not the order of appearance

def test_call_with_tensor_params():
  v = np.array([1.5, -2.0, 3.25], np.float32)
  p = param(0, dtypes.f32, (3,))
  assert_evaluates_to(call(p * p + p, lit(v)), v * v + v)
  assert_evaluates_to(call(p.reduce(Ops.ADD, 1), lit(v)), np.array(v[0] + v[1] + v[2], np.float32))

def test_same_call_body_with_different_arguments():
  p0 = param(0)
  body = p0 * p0 + 1
  assert to_python(call(body, UOp.const(3)) + call(body, UOp.const(5))) == (3 * 3 + 1) + (5 * 5 + 1)
  assert to_python(call(body, call(body, UOp.const(2)))) == (2 * 2 + 1) ** 2 + 1     # a CALL as an argument

def test_nested_call_reusing_param_slot_0_binds_the_inner_param_to_the_inner_call():
  p0 = param(0)                                   # hash consed: the outer and the inner body share this very node
  inner = call(p0 * 10, p0 + 1)                   # g(y) = f(y + 1) with f(x) = 10 x
  outer = call(inner + p0, UOp.const(5))          # h(y) = g(y) + y
  assert inner.src[0].src[0] is outer.src[0].src[1] is p0
  assert to_python(outer) == (5 + 1) * 10 + 5

def test_nested_call_whose_inner_param_has_another_dtype():
  p_i, p_f = param(0, dtypes.i32), param(0, dtypes.f32)
  inner = call(p_f * 0.5, p_i.cast(dtypes.f32))
  assert to_python(call(inner.cast(dtypes.i32) + p_i, UOp.const(9))) == 4 + 9

def test_three_levels_of_calls_all_using_slot_0():
  p0 = param(0)
  u = call(call(call(p0 + 1, p0 * 2), p0 * 3) + p0, UOp.const(2))   # ((2*3)*2 + 1) + 2
  assert to_python(u) == (2 * 3 * 2 + 1) + 2


# ---- movement ops, STACK, INDEX, REDUCE on literal arrays -----------------------------------------------------------

X234 = np.arange(24, dtype=np.int32).reshape(2, 3, 4) * 7 - 50
F234 = np.random.default_rng(0).standard_normal((2, 3, 4)).astype(np.float32)

@pytest.mark.parametrize("shape", [(24,), (4, 6), (6, 4), (2, 12), (1, 2, 1, 12), (2, 3, 4), (3, 2, 2, 2)])
def test_reshape_matches_numpy(shape):
  assert_evaluates_to(lit(X234).reshape(shape), X234.reshape(shape))

@pytest.mark.parametrize("src, shape", [((1, 3, 1), (2, 3, 4)), ((1,), (5,)), ((3, 1), (3, 3)), ((1, 1, 1), (2, 1, 3)), ((2, 3, 4), (2, 3, 4))])
def test_expand_matches_numpy_broadcast_to(src, shape):
  x = np.arange(np.prod(src), dtype=np.int32).reshape(src) + 1
  assert_evaluates_to(lit(x).expand(shape), np.broadcast_to(x, shape).copy())

@pytest.mark.parametrize("perm", [(0, 1, 2), (0, 2, 1), (1, 0, 2), (1, 2, 0), (2, 0, 1), (2, 1, 0)])
def test_permute_of_rank_3_matches_numpy_transpose(perm):
  # the rotations (1, 2, 0) and (2, 0, 1) are each other's inverses: a gather with the inverse permutation fails them
  assert_evaluates_to(lit(X234).permute(perm), np.transpose(X234, perm))
  assert_evaluates_to(lit(F234).permute(perm), np.transpose(F234, perm))

def test_permute_of_rank_4_and_round_trip():
  x = np.arange(120, dtype=np.int32).reshape(2, 3, 4, 5)
  for perm in [(1, 2, 3, 0), (3, 0, 1, 2), (2, 3, 0, 1), (1, 3, 0, 2)]:
    assert_evaluates_to(lit(x).permute(perm), np.transpose(x, perm))
    inv = tuple(int(i) for i in np.argsort(perm))
    assert_evaluates_to(lit(x).permute(perm).permute(inv), x)

@pytest.mark.parametrize("arg", [((0, 2), (0, 3), (0, 4)), ((1, 2), (1, 3), (2, 4)), ((0, 1), (2, 3), (3, 4)), ((0, 2), (1, 2), (0, 4))])
def test_shrink_matches_numpy_slicing(arg):
  assert_evaluates_to(lit(X234).shrink(arg), X234[tuple(slice(b, e) for b, e in arg)])

@pytest.mark.parametrize("arg", [((1, 1), (0, 3), (0, 4)), ((0, 2), (2, 2), (0, 4)), ((0, 2), (0, 3), (4, 4)), ((0, 0), (3, 3), (0, 0))])
def test_shrink_to_an_empty_tensor(arg):
  want = X234[tuple(slice(b, e) for b, e in arg)]
  u = lit(X234).shrink(arg)
  assert_evaluates_to(u, want)
  assert_evaluates_to(u.reshape((0,)), want.reshape(0))
  assert_evaluates_to(UOp(Ops.STACK, (u, u)), np.stack([want, want]))
  assert_evaluates_to(u.reduce(Ops.ADD, 3), np.zeros((), np.int32))               # an empty sum is the identity
  assert_evaluates_to(u.reduce(Ops.MAX, 3), np.array(I32_MIN, np.int32))
  assert_evaluates_to((u.cast(dtypes.f32) + 1.0).reduce(Ops.MAX, 3), np.array(-np.inf, np.float32))

def test_index_pops_axes_off_the_left():
  x = lit(X234)
  assert_evaluates_to(x.index(1), X234[1])
  assert_evaluates_to(x.index(1, 2), X234[1, 2])
  assert_evaluates_to(x.index(0, 2, 3), X234[0, 2, 3])
  assert_evaluates_to(x.index(UOp.const(3) - 2, UOp.const(4) // 2), X234[1, 2])       # computed indices
  assert_evaluates_to(x.index(), X234)

@pytest.mark.parametrize("idx", [(2,), (-1,), (0, 3), (1, -1), (0, 0, 4), (1, 2, I32_MIN)])
def test_index_out_of_range_is_an_eval_error(idx):
  with pytest.raises(EvalError, match="out of range"): run(lit(X234).index(*idx))

def test_stack_matches_numpy_stack():
  a, b, c = X234[0], X234[1], X234[0] * -1
  assert_evaluates_to(UOp(Ops.STACK, (lit(a), lit(b), lit(c))), np.stack([a, b, c]))
  assert_evaluates_to(stack(lit(a) + 1, lit(b)), np.stack([a + 1, b]))
  assert to_python(stack(1, 2, 3)) == [1, 2, 3]
  assert_evaluates_to(UOp(Ops.STACK, (UOp.const(2.5),)), np.array([2.5], np.float32))

def seq_reduce(x: np.ndarray, op: Ops, n: int) -> np.ndarray:
  """The oracle for REDUCE: the last n axes in row-major order, accumulated left to right from the identity
  (0 for ADD; -inf or INT_MIN for MAX) in x's dtype, with MAX as C's (a > b || a != a) ? a : b."""
  out_shape, inner = x.shape[:x.ndim - n], int(np.prod(x.shape[x.ndim - n:]))
  flat = x.reshape(int(np.prod(out_shape)), inner)
  if op is Ops.ADD: acc = np.zeros(flat.shape[0], x.dtype)
  else: acc = np.full(flat.shape[0], -np.inf if x.dtype.kind == "f" else I32_MIN, x.dtype)
  with np_quiet():
    for j in range(inner):
      v = flat[:, j]
      acc = acc + v if op is Ops.ADD else np.where((acc > v) | (acc != acc), acc, v)
  return acc.reshape(out_shape)

@pytest.mark.parametrize("op", [Ops.ADD, Ops.MAX])
@pytest.mark.parametrize("n", [0, 1, 2, 3])
def test_reduce_over_the_last_n_axes_matches_numpy(op, n):
  axes = tuple(range(3 - n, 3))
  want_i = (np.sum(X234, axis=axes, dtype=np.int32) if op is Ops.ADD else np.max(X234, axis=axes)).astype(np.int32)
  assert_evaluates_to(lit(X234).reduce(op, n), want_i)
  assert_evaluates_to(lit(F234).reduce(op, n), seq_reduce(F234, op, n))
  if op is Ops.MAX: assert_evaluates_to(lit(F234).reduce(op, n), np.max(F234, axis=axes))
  else: np.testing.assert_allclose(value(lit(F234).reduce(op, n)), np.sum(F234, axis=axes), rtol=1e-5, atol=1e-5)

def test_f32_reduce_add_sums_left_to_right_from_zero():
  x = np.array([1e8, 1.0, -1e8, 1.0], np.float32)               # left to right: ((1e8 + 1) - 1e8) + 1 = 1, pairwise may differ
  assert to_python(lit(x).reduce(Ops.ADD, 1)) == float(seq_reduce(x, Ops.ADD, 1)) == 1.0
  assert_evaluates_to(lit(np.array([-0.0, -0.0], np.float32)).reduce(Ops.ADD, 1), np.array(0.0, np.float32))   # 0.0 + -0.0 is +0.0
  assert to_python(lit(np.array([16777216.0, 1.0, 1.0], np.float32)).reduce(Ops.ADD, 1)) == 16777216.0

def chunked_sum(rows: np.ndarray) -> np.ndarray:
  """The oracle for a float sum of more than SUM_CHUNK terms (each row of `rows` one output's terms, its innermost axis
  the row): partial sums over SUM_CHUNK terms, left to right from zero, added to the total in order, then the terms
  that fill no chunk one by one."""
  out = []
  for row in rows:
    total, full = row.dtype.type(0), len(row) - len(row) % SUM_CHUNK
    for start in range(0, full, SUM_CHUNK): total = total + seq_reduce(row[start:start + SUM_CHUNK], Ops.ADD, 1)
    for v in row[full:]: total = total + v
    out.append(total)
  return np.array(out, rows.dtype)

def test_a_float_sum_of_more_than_sum_chunk_terms_adds_partial_sums_over_chunks():
  # one accumulator for all of them stops growing at 2**24: 2**24 followed by 8193 ones summed to 2**24 (and `uopc run`
  # of a sum of 2**25 ones printed 16777216); partials over SUM_CHUNK terms, as the lowered loops add them, keep the ones
  x = np.array([2.0**24] + [1.0] * (2 * SUM_CHUNK + 1), np.float32)
  assert to_python(lit(x).reduce(Ops.ADD, 1)) == float(chunked_sum(x[None])[0]) == 2.0**24 + SUM_CHUNK
  assert float(seq_reduce(x, Ops.ADD, 1)) == 2.0**24                                  # the single accumulator's answer
  # two reduced axes of at most SUM_CHUNK: a partial per row, the rows' partials into the total
  y = np.random.default_rng(4).standard_normal((3, SUM_CHUNK // 2 + 3)).astype(np.float32) * 1000
  total = np.float32(0)
  for row in y: total = total + seq_reduce(row, Ops.ADD, 1)
  assert_evaluates_to(lit(y).reduce(Ops.ADD, 2), np.array(total, np.float32))
  assert_evaluates_to(lit(y).reduce(Ops.ADD, 1), seq_reduce(y, Ops.ADD, 1))        # each output alone is short: unchanged

def test_i32_reduce_add_wraps():
  x = np.array([I32_MAX, 1, 5], np.int32)
  assert to_python(lit(x).reduce(Ops.ADD, 1)) == int(np.sum(x, dtype=np.int32)) == I32_MIN + 5


# ---- composites through the evaluator -----------------------------------------------------------------------------

def test_anti_eye_4_is_the_seeds_matrix():
  assert to_python(run(anti_eye(4, dtypes.f32))) == [[0.0, 0.0, 0.0, 1.0], [0.0, 0.0, 1.0, 0.0], [0.0, 1.0, 0.0, 0.0], [1.0, 0.0, 0.0, 0.0]]
  for n in range(1, 7): assert_evaluates_to(anti_eye(n, dtypes.i32), np.fliplr(np.eye(n, dtype=np.int32)))

@pytest.mark.parametrize("widths", [((1, 5), (2, 0)), ((0, 0), (0, 0)), ((3, 3), (9, 1)), ((0, 7), (4, 0))])
def test_pad_matches_numpy_pad(widths):
  assert_evaluates_to(pad(lit(F234[0]), widths), np.pad(F234[0], widths))
  assert_evaluates_to(pad(lit(X234[1]), widths), np.pad(X234[1], widths))

@pytest.mark.parametrize("axis", [0, 1, 2, -1])
def test_flip_axis_matches_numpy_flip(axis):
  assert_evaluates_to(flip_axis(lit(X234), axis), np.flip(X234, axis))
  assert_evaluates_to(flip_axis(lit(F234), axis), np.flip(F234, axis))

@pytest.mark.parametrize("axis", [0, 1, 2])
def test_concat2_matches_numpy_concatenate(axis):
  b = X234 * 3 + 1
  assert_evaluates_to(concat2(lit(X234), lit(b), axis), np.concatenate([X234, b], axis))


# ---- differential: random programs against a NumPy model of the same semantics -------------------------------------

class ProgramGen:
  """Random programs as (UOp, ndarray) pairs built side by side. Elementwise ops get a second operand that is a
  fresh literal of a broadcastable shape, brought to the full shape by RESHAPE + EXPAND; the NumPy side follows
  the C semantics op by op (float32 arrays round each step, int32 arrays wrap)."""
  def __init__(self, seed: int):
    self.rng = np.random.default_rng(seed)

  def shape(self, rank: int) -> tuple[int, ...]: return tuple(int(d) for d in self.rng.integers(1, 5, rank))

  def values(self, shape, dtype) -> np.ndarray:
    r = self.rng
    if dtype == np.int32:
      small = r.integers(-20, 21, shape)
      big = r.integers(I32_MIN, I32_MAX, shape, endpoint=True)
      return np.where(r.random(shape) < 0.7, small, big).astype(np.int32)
    mag = np.exp2(r.uniform(-30, 30, shape)) * r.choice([-1.0, 1.0], shape)
    small = r.integers(-8, 9, shape).astype(np.float64) * 0.25
    special = r.choice(np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 1e-45, 3e38, 16777216.0], np.float64), shape)
    pick = r.random(shape)
    return np.where(pick < 0.45, mag, np.where(pick < 0.9, small, special)).astype(np.float32)

  def operand(self, x: np.ndarray) -> tuple[UOp, np.ndarray]:
    """A second operand for x: a literal of a broadcastable shape (some axes 1, maybe fewer leading axes)."""
    keep = len(x.shape) - int(self.rng.integers(0, len(x.shape) + 1))
    small = tuple(1 if d == 0 or self.rng.random() < 0.4 else d for d in x.shape[len(x.shape) - keep:])
    v = self.values(small, x.dtype.type)
    u = lit(v).reshape((1,) * (len(x.shape) - keep) + small).expand(x.shape)
    return u, np.broadcast_to(v.reshape((1,) * (len(x.shape) - keep) + small), x.shape).copy()

  def step(self, u: UOp, x: np.ndarray) -> tuple[UOp, np.ndarray]:
    r, is_int = self.rng, x.dtype == np.int32
    kinds = ["add", "mul", "max", "cmp", "neg", "cast", "reshape", "permute", "expand", "shrink", "stack", "reduce", "index"]
    kinds += ["div", "mod"] if is_int else ["recip", "sqrt"]
    kind = str(r.choice(kinds))
    if kind in ("add", "mul", "max", "div", "mod"):
      v, y = self.operand(x)
      if kind == "add": return u + v, x + y
      if kind == "mul": return u * v, x * y
      if kind == "max": return u.maximum(v), np.where((x > y) | (x != x), x, y)
      v = UOp(Ops.WHERE, (v.ne(0), v, v.const_like(1)))           # no division by zero: WHERE picks 1 instead
      y = np.where(y != 0, y, np.int32(1))
      if kind == "div": return u // v, np.floor_divide(x, y)      # INT_MIN // -1 wraps in numpy too (with a warning)
      return u % v, np.mod(x, y)
    if kind == "cmp":
      v, y = self.operand(x)
      c, m = (u < v, x < y) if r.random() < 0.5 else (u.ne(v), x != y)
      if r.random() < 0.5: return UOp(Ops.WHERE, (c, u, v)), np.where(m, x, y)
      return c.cast(dtypes.i32 if is_int else dtypes.f32), m.astype(x.dtype)
    if kind == "neg": return -u, x * x.dtype.type(-1)
    if kind == "recip": return u.recip(), x.dtype.type(1) / x
    if kind == "sqrt": return UOp(Ops.SQRT, (u,)), np.sqrt(x)
    if kind == "cast":
      if is_int: return u.cast(dtypes.f32), x.astype(np.float32)
      t = np.trunc(x.astype(np.float64))
      ok = (t >= I32_MIN) & (t <= I32_MAX)                         # NaN, inf and out of range become INT_MIN
      return u.cast(dtypes.i32), np.where(ok, np.where(ok, t, 0).astype(np.int64), I32_MIN).astype(np.int32)
    if kind == "reshape":
      flat = [d for d in x.shape if d != 1] + [1] * int(r.integers(0, 2))
      r.shuffle(flat)
      return u.reshape(tuple(flat)), x.reshape(tuple(flat))
    if kind == "permute":
      perm = tuple(int(p) for p in r.permutation(len(x.shape)))
      return u.permute(perm), np.transpose(x, perm)
    if kind == "expand":
      k = int(r.integers(0, len(x.shape) + 1))
      ones = x.shape[:k] + (1,) + x.shape[k:]
      new = ones[:k] + (int(r.integers(1, 4)),) + ones[k + 1:]
      return u.reshape(ones).expand(new), np.broadcast_to(x.reshape(ones), new).copy()
    if kind == "shrink":
      arg = []
      for d in x.shape:
        if d == 0 or r.random() < 0.1: b = int(r.integers(0, d + 1)); arg.append((b, b))    # rarely an empty axis
        else: b = int(r.integers(0, d)); arg.append((b, int(r.integers(b + 1, d + 1))))
      return u.shrink(tuple(arg)), x[tuple(slice(b, e) for b, e in arg)]
    if kind == "stack":
      n = int(r.integers(1, 4))
      parts = [(u, x)] + [(lit(v), v) for v in (self.values(x.shape, x.dtype.type) for _ in range(n - 1))] if x.size else [(u, x)] * n
      order = r.permutation(len(parts))
      return UOp(Ops.STACK, tuple(parts[i][0] for i in order)), np.stack([parts[i][1] for i in order])
    if kind == "reduce":
      n = int(r.integers(0, len(x.shape) + 1))
      op = Ops.ADD if r.random() < 0.5 else Ops.MAX
      return u.reduce(op, n), seq_reduce(x, op, n)
    # index: a random position in a random number of leading axes (none when an axis is empty)
    k = int(r.integers(0, len(x.shape) + 1))
    if any(d == 0 for d in x.shape[:k]): k = 0
    pos = tuple(int(r.integers(0, d)) for d in x.shape[:k])
    return u.index(*pos), x[pos] if pos else x

  def program(self, steps: int) -> tuple[UOp, np.ndarray]:
    dtype = np.int32 if self.rng.random() < 0.5 else np.float32
    x = self.values(self.shape(int(self.rng.integers(0, 4))), dtype)
    u = lit(x)
    for _ in range(steps):
      if len(x.shape) > 4 or x.size > 200: u, x = u.reduce(Ops.ADD, 1), seq_reduce(x, Ops.ADD, 1)
      u, x = self.step(u, x)
      x = np.asarray(x)
    return u, x

@pytest.mark.parametrize("seed", range(8))
def test_random_programs_match_a_numpy_model_bit_for_bit(seed):
  gen = ProgramGen(seed)
  with warnings.catch_warnings(), np_quiet():
    warnings.simplefilter("ignore")
    for _ in range(60):
      u, want = gen.program(int(gen.rng.integers(1, 9)))
      assert_evaluates_to(u, want)


# ---- deep graphs -----------------------------------------------------------------------------------------------------

def test_a_50000_node_chain_runs_without_recursion_error():
  x = UOp.const(0)
  for _ in range(50_000): x = x + 1
  assert to_python(x) == 50_000

def test_a_deep_call_body_and_a_deep_literal_stack_run():
  p0 = param(0)
  body = p0
  for _ in range(50_000): body = body * 1 + 2
  assert to_python(call(body, UOp.const(1))) == 1 + 2 * 50_000
  wide = UOp(Ops.STACK, tuple(UOp.const(i) for i in range(10_000)))
  assert to_python(wide.reduce(Ops.ADD, 1)) == sum(range(10_000))


# ---- MULACC: a fused multiply-add, rounded once ----------------------------------------------------------------------

def test_mulacc_rounds_once_where_a_multiply_then_add_rounds_twice():
  # (1 + 2**-12)**2 = 1 + 2**-11 + 2**-24 lies exactly between two f32s; a tiny c decides the tie for the fused result,
  # while the product rounded first (to even, down) loses it
  a = UOp.const(1 + 2**-12)
  c = UOp.const(2**-60)
  fused = to_python(run(UOp(Ops.MULACC, (a, a, c))))
  separate = to_python(run(a * a + c))
  assert fused == 1 + 2**-11 + 2**-23 and separate == 1 + 2**-11


@pytest.mark.parametrize("abc, want", [((0.0, -1.0, 0.0), 0.0), ((-0.0, 1.0, -0.0), -0.0), ((math.inf, 0.0, 1.0), math.nan),
                                      ((3e38, 3.0, -1e38), math.inf), ((1e-30, 1e-15, 0.0), 1.401298464324817e-45)])
def test_mulacc_follows_ieee_at_the_edges(abc, want):
  got = to_python(run(UOp(Ops.MULACC, tuple(UOp.const(v) for v in abc))))
  assert (math.isnan(got) and math.isnan(want)) or (got == want and math.copysign(1, got) == math.copysign(1, want))


def test_mulacc_is_f32_only():
  with pytest.raises(UOpError, match="MULACC is f32 only"): UOp(Ops.MULACC, (UOp.const(1), UOp.const(2), UOp.const(3)))


def test_an_integer_past_f16_or_f32_rounds_to_infinity_as_numpy():
  # found by the eval-vs-C fuzzer: CAST(CONST 65536, f16) raised struct.error (an int, unlike a float, isn't rounded)
  from uopc.evaluate import round_f16, round_f32
  assert round_f16(65536) == np.float16(65536) == math.inf and round_f16(-70000) == -math.inf
  assert round_f16(65504) == 65504.0 and round_f32(2**128) == math.inf and round_f32(-(10**400)) == -math.inf
  assert run(UOp(Ops.CAST, (UOp(Ops.CAST, (UOp.const(65536),), dtypes.f16),), dtypes.f32)).arg == math.inf


# ---- GATHER: rows picked by computed indices ------------------------------------------------------------------------

@pytest.mark.parametrize("rows", [[1, 0, 1], [[0, 1], [1, 1]], 1])
def test_gather_picks_rows_as_numpy_fancy_indexing(rows):
  want_rows = np.array(rows, np.int32).reshape(np.shape(rows))
  idx = lit(want_rows)
  assert_evaluates_to(lit(X234).gather(idx), X234[want_rows])
  assert_evaluates_to(lit(X234).reshape((24,)).gather(idx), X234.reshape(24)[want_rows])   # single elements of a flat x

def test_gather_by_computed_indices_and_of_a_computed_value():
  x, idx = lit(X234), lit(np.array([1, 0], np.int32))
  assert_evaluates_to((x * 2).gather(1 - idx), (X234 * 2)[[0, 1]])
  assert_evaluates_to(x.gather(idx).reduce(Ops.ADD, 1), X234[[1, 0]].sum(2).astype(np.int32))

def test_a_batched_gather_picks_along_its_axis_within_each_batch_entry_as_take_along_axis():
  idx = np.array([[[2, 0, 1, 1], [0, 0, 2, 1]], [[1, 1, 1, 0], [2, 2, 0, 0]]], np.int32)   # (2, 2, 4): 2 batch axes
  want = np.take_along_axis(X234.transpose(0, 2, 1), idx.transpose(0, 2, 1), 2).transpose(0, 2, 1)
  assert_evaluates_to(lit(X234).permute((0, 2, 1)).gather(lit(idx.transpose(0, 2, 1)), 2).permute((0, 2, 1)), want)
  assert_evaluates_to(lit(X234).gather(lit(np.array([[2, 2], [0, 1]], np.int32)), 1), np.stack([X234[0][[2, 2]], X234[1][[0, 1]]]))

@pytest.mark.parametrize("bad", [2, -1, I32_MIN])
def test_gather_out_of_range_is_an_eval_error(bad):
  with pytest.raises(EvalError, match="GATHER index .* out of range for axis 0 of size 2"): run(lit(X234).gather(lit(np.array([0, bad], np.int32))))
