"""Differential: the evaluator (uopc.evaluate.run, pure Python) and the compiled C agree bit for bit on random
memory-free programs built from exact operations (+, *, max, comparisons, where, 1/x, sqrt, casts, floor div/mod)."""
import math
import numpy as np
from hypothesis import given, settings, strategies as st, HealthCheck
from uopc.dtype import dtypes
from uopc.uop import UOp, Ops
from uopc.evaluate import literal, to_python
from uopc.testing import run_shaped
from uopc.rangeify import Opts

F32_VALUES = [0.0, -0.0, 1.0, -1.5, 0.1, 3.0e38, -3.0e38, 1e-40, math.inf, -math.inf, math.nan, 7.25, -2.0]
I32_VALUES = [0, 1, -1, 7, -7, 2**31 - 1, -2**31, 3, -100, 65536]


@st.composite
def programs(draw):
  shape = draw(st.sampled_from([(3,), (2, 3), (2, 2, 2)]))
  n = int(np.prod(shape))
  def arr(d):
    vals = draw(st.lists(st.sampled_from(F32_VALUES if d is dtypes.f32 else I32_VALUES), min_size=n, max_size=n))
    return literal(vals, shape, d)
  pool = [arr(dtypes.f32), arr(dtypes.f32), arr(dtypes.i32), arr(dtypes.i32)]
  for _ in range(draw(st.integers(1, 8))):
    a = draw(st.sampled_from(pool))
    same = [u for u in pool if u.shape == a.shape and u.dtype is a.dtype]
    b = draw(st.sampled_from(same))
    k = draw(st.integers(0, 11))
    if k == 0: u = a + b
    elif k == 1: u = a * b
    elif k == 2: u = a.maximum(b)
    elif k == 3: u = (a < b).where(a, b)
    elif k == 4: u = a.ne(b).where(b, a)
    elif k == 5 and a.dtype is dtypes.f32: u = draw(st.sampled_from([a.recip(), UOp(Ops.SQRT, (a,)), a.cast(dtypes.i32), -a]))
    elif k == 5: u = draw(st.sampled_from([a.cast(dtypes.f32), a.cast(dtypes.bool).cast(dtypes.i32), -a]))
    elif k == 6 and a.dtype is dtypes.i32:
      c = draw(st.sampled_from([1, 2, 3, -3, 7, -1, 100]))
      u = (a // c) if draw(st.booleans()) else (a % c)
    elif k == 7 and len(a.shape) >= 2: u = a.permute(tuple(reversed(range(len(a.shape)))))
    elif k == 8 and len(a.shape) >= 1 and a.shape[-1] > 1: u = a.shrink(tuple((0, s) for s in a.shape[:-1]) + ((1, a.shape[-1]),))
    elif k == 9 and len(a.shape) >= 2: u = a.reduce(draw(st.sampled_from([Ops.ADD, Ops.MAX])), 1)
    elif k == 10: u = a.reshape((int(np.prod(a.shape)),))
    elif k == 11: u = UOp(Ops.STACK, (a, b))
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


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(programs())
def test_run_and_compiled_c_agree_bit_for_bit(prog):
  expected = np.array(to_python(prog), dtype={dtypes.f32: np.float32, dtypes.i32: np.int32, dtypes.bool: np.bool_}[prog.dtype])
  got = run_shaped(prog, [], opts=Opts())   # the plain lowering: optimized ones add in another order, by design
  assert got.shape == expected.shape
  np.testing.assert_array_equal(bits(got), bits(expected.reshape(got.shape)))


def test_non_exact_functions_agree_to_an_ulp():
  vals = [0.0, 0.5, 1.0, 2.5, -3.25, 10.0, 100.0]
  x = literal(vals, (7,), dtypes.f32)
  for op in (Ops.EXP2, Ops.SIN):
    np.testing.assert_allclose(run_shaped(UOp(op, (x,)), []), np.array(to_python(UOp(op, (x,))), np.float32), rtol=2e-7, atol=1e-7)
  pos = literal([0.5, 1.0, 2.5, 10.0], (4,), dtypes.f32)
  np.testing.assert_allclose(run_shaped(UOp(Ops.LOG2, (pos,)), []), np.array(to_python(UOp(Ops.LOG2, (pos,))), np.float32), rtol=2e-7)
