"""Differential: the evaluator (uopc.evaluate.run, pure Python) and the compiled C agree bit for bit on random
memory-free shaped programs built from exact operations (+, *, max, fused multiply-add, comparisons, where, bool
and/or, 1/x, sqrt, casts among f32/i32/bool/f16, f16 arithmetic, floor div/mod by constants and arrays) and movement ops, reductions,
STACK and INDEX. A failure prints the program as .uir. UOPC_FUZZ_ITERS=N draws N programs (CI: 150)."""
import math, os
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st, HealthCheck
from uopc.dtype import dtypes
from uopc.uop import UOp, Ops
from uopc.evaluate import literal, to_python
from uopc.uir import to_uir
from uopc.testing import run_shaped
from uopc.rangeify import Opts

F32_VALUES = [0.0, -0.0, 1.0, -1.5, 0.1, 3.0e38, -3.0e38, 1e-40, math.inf, -math.inf, math.nan, 7.25, -2.0]
I32_VALUES = [0, 1, -1, 7, -7, 2**31 - 1, -2**31, 3, -100, 65536]
DIVISORS = [1, 2, 3, -3, 7, -1, 100, 2**31 - 1, -2**31]
SHAPES = [(), (1,), (3,), (1, 3), (3, 1), (2, 3), (2, 2, 2), (1, 1, 4)]
ITERS = int(os.environ.get("UOPC_FUZZ_ITERS", "150"))


@st.composite
def programs(draw):
  """A random memory-free shaped graph of exact operations over literal arrays of f32, i32 and bool: every ALU op the
  evaluator and the C renderer share (MULACC, division by non-zero arrays, casts among f32/i32/bool/f16 and f16
  arithmetic included),
  broadcasting EXPANDs of size-1 axes, PERMUTE, SHRINK, RESHAPE, STACK, constant INDEX and REDUCE over any number of
  trailing axes, on shapes with size-1 axes and scalars, with -0.0, denormals, inf and NaN among the values."""
  shape = draw(st.sampled_from(SHAPES))
  n = int(np.prod(shape))
  def arr(d, values=None):
    pool = values or (F32_VALUES if d is dtypes.f32 else I32_VALUES if d is dtypes.i32 else [True, False])
    return literal(draw(st.lists(st.sampled_from(pool), min_size=n, max_size=n)), shape, d)
  pool = [arr(dtypes.f32), arr(dtypes.f32), arr(dtypes.i32), arr(dtypes.i32), arr(dtypes.bool)]
  for _ in range(draw(st.integers(1, 8))):
    a = draw(st.sampled_from(pool))
    same = [u for u in pool if u.shape == a.shape and u.dtype is a.dtype]
    b = draw(st.sampled_from(same))
    k = draw(st.integers(0, 17))
    f, i, boolean = a.dtype is dtypes.f32, a.dtype is dtypes.i32, a.dtype is dtypes.bool
    if k == 0: u = a + b
    elif k == 1: u = a * b
    elif k == 2: u = a.maximum(b)
    elif k == 3: u = (a < b).where(a, b) if not boolean else a.where(b, a.ne(a))
    elif k == 4: u = a.ne(b).where(b, a)
    elif k == 5 and f:
      u = draw(st.sampled_from([a.recip(), UOp(Ops.SQRT, (a,)), a.cast(dtypes.i32), -a, a.cast(dtypes.bool), a.cast(dtypes.f16).cast(dtypes.f32)]))
    elif k == 5 and i:
      u = draw(st.sampled_from([a.cast(dtypes.f32), a.cast(dtypes.bool).cast(dtypes.i32), -a, a.cast(dtypes.f16).cast(dtypes.i32)]))
    elif k == 5: u = draw(st.sampled_from([a.cast(dtypes.i32), a.cast(dtypes.f32), a.ne(True)]))
    elif k == 6 and i:
      if draw(st.booleans()):
        c = draw(st.sampled_from(DIVISORS))
        u = (a // c) if draw(st.booleans()) else (a % c)
      else:   # an array of divisors, none of them 0 (run refuses x // 0; the compiled code gives NumPy's 0)
        d = literal(draw(st.lists(st.sampled_from(DIVISORS), min_size=int(np.prod(a.shape)), max_size=int(np.prod(a.shape)))), a.shape, dtypes.i32)
        u = (a // d) if draw(st.booleans()) else (a % d)
    elif k == 7 and len(a.shape) >= 2: u = a.permute(tuple(reversed(range(len(a.shape)))))
    elif k == 8 and len(a.shape) >= 1 and a.shape[-1] > 1: u = a.shrink(tuple((0, s) for s in a.shape[:-1]) + ((1, a.shape[-1]),))
    elif k == 9 and len(a.shape) >= 1 and not boolean: u = a.reduce(draw(st.sampled_from([Ops.ADD, Ops.MAX])), draw(st.integers(1, len(a.shape))))
    elif k == 9 and len(a.shape) >= 1: u = a.reduce(Ops.MAX, 1)
    elif k == 10: u = a.reshape((int(np.prod(a.shape)),))
    elif k == 11: u = UOp(Ops.STACK, (a, b))
    elif k == 12 and f: u = UOp(Ops.MULACC, (a, b, draw(st.sampled_from(same))))
    elif k == 13 and 1 in a.shape:   # broadcast a size-1 axis
      u = a.expand(tuple(3 if s == 1 else s for s in a.shape))
    elif k == 14 and a.shape: u = a.index(*(draw(st.integers(0, s - 1)) for s in a.shape[:draw(st.integers(1, len(a.shape)))]))
    elif k == 15: u = (a < b) * a.ne(b) + (a.ne(b)).ne(True) if not boolean else a * b + a.ne(b)   # bool and/or
    elif k == 16: u = UOp(Ops.CMPLT, (a, b)).cast(dtypes.i32)
    elif k == 17 and f:   # f16 arithmetic, each op rounded to f16
      h, g = a.cast(dtypes.f16), b.cast(dtypes.f16)
      u = draw(st.sampled_from([h * g + h, (h + g) * g, h.maximum(g) * h, (h < g).where(h * g, h + h)])).cast(dtypes.f32)
    else: continue
    pool.append(u)
  return pool[-1]


def bits(x: np.ndarray) -> np.ndarray:
  """Compare floats by their bits, with every NaN the same (C and python may give NaNs different payloads)."""
  if x.dtype == np.float32:
    x = x.copy()
    x[np.isnan(x)] = np.float32(np.nan)
    return x.view(np.int32)
  return x


@settings(max_examples=ITERS, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(programs())
def test_run_and_compiled_c_agree_bit_for_bit(prog):
  expected = np.array(to_python(prog), dtype={dtypes.f32: np.float32, dtypes.i32: np.int32, dtypes.bool: np.bool_}[prog.dtype])
  got = run_shaped(prog, [], opts=Opts())   # the plain lowering: optimized ones add in another order, by design
  reproducer = f"the program, as .uir (uopc run FILE --device C gives the compiled side):\n{to_uir(prog)}"
  assert got.shape == prog.shape and expected.size == got.size, reproducer
  np.testing.assert_array_equal(bits(got), bits(expected.reshape(got.shape)), err_msg=reproducer)


def test_non_exact_functions_agree_to_an_ulp():
  vals = [0.0, 0.5, 1.0, 2.5, -3.25, 10.0, 100.0]
  x = literal(vals, (7,), dtypes.f32)
  for op in (Ops.EXP2, Ops.SIN):
    np.testing.assert_allclose(run_shaped(UOp(op, (x,)), []), np.array(to_python(UOp(op, (x,))), np.float32), rtol=2e-7, atol=1e-7)
  pos = literal([0.5, 1.0, 2.5, 10.0], (4,), dtypes.f32)
  np.testing.assert_allclose(run_shaped(UOp(Ops.LOG2, (pos,)), []), np.array(to_python(UOp(Ops.LOG2, (pos,))), np.float32), rtol=2e-7)


def test_regressions_the_fuzzer_found_stay_fixed():
  from uopc.uir import parse
  # GCC 12 at -O2 got ((a < b) & c) | (c != 1) wrong with c a _Bool temporary: all False, where the answer is F, T, F
  bools = parse("%0 = stack 0, 0, 7\n%1 = stack -1, 1, 1\n%2 = cmplt %0, %1\n%3 = cmpne %0, %1\n%4 = mul %2, %3\n"
                "%5 = reshape true, (1,)\n%6 = expand %5, (3,)\n%7 = cmpne %3, %6\n%8 = add %4, %7\n")
  # an int past f16 rounded in the evaluator raised struct.error (C says inf, and inf cast to i32 is INT_MIN)
  f16 = UOp(Ops.CAST, (UOp(Ops.CAST, (UOp.const(65536),), dtypes.f16),), dtypes.i32)
  # f16 a * b + a kept the product's float bits (gcc rounds _Float16 arithmetic to f16 only at a cast or an assignment
  # where the CPU has no f16 arithmetic, and the product was pasted into the sum): 2.0029306, not 2.0039062
  h = literal([1.001, 0.1], (2,), dtypes.f32).cast(dtypes.f16)
  mul_add = (h * literal([1.001, 0.2], (2,), dtypes.f32).cast(dtypes.f16) + h).cast(dtypes.f32)
  # an f32 constant cast to f16 was rendered as its double rounded to f16 once: 2**-25 * (1 + 2**-30) is 2**-25 in f32,
  # a tie that f16 rounds to 0, not the 2**-24 C gave
  tie = UOp.const(2.0 ** -25 * (1 + 2.0 ** -30)).cast(dtypes.f16).cast(dtypes.f32)
  for prog in (bools, f16, mul_add, tie):
    for opts in (Opts(), None):
      assert run_shaped(prog, [], opts=opts).tolist() == np.array(to_python(prog)).tolist(), to_uir(prog)


@pytest.mark.parametrize("shape, pop", [((3 * 4096 + 5,), 1), ((2 * 4096 + 1,), 1), ((2, 3000), 2), ((4097, 1), 2), ((3, 2, 4103), 2)],
                         ids=["chunks-and-a-tail", "one-last-step", "a-partial-per-row", "a-size-1-axis-inside", "per-output"])
def test_long_float_sums_add_their_chunks_in_the_evaluators_order(shape, pop):
  # a float sum of more than SUM_CHUNK terms adds partial sums over chunks (one accumulator stopped at 2**24): the C loops
  # and the evaluator must split it the same way, bit for bit
  from uopc.evaluate import SUM_CHUNK
  from uopc.uop import buf
  assert np.prod(shape[len(shape) - pop:]) > SUM_CHUNK
  x = (np.random.default_rng(7).standard_normal(shape) * 1000).astype(np.float32)
  expected = np.array(to_python(literal(x.reshape(-1).tolist(), shape, dtypes.f32).reduce(Ops.ADD, pop)), np.float32)
  got = run_shaped(buf(0, x.size).reshape(shape).reduce(Ops.ADD, pop), [x], opts=Opts())
  np.testing.assert_array_equal(bits(got), bits(expected.reshape(got.shape)))
