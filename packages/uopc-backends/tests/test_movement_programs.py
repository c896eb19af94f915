"""Shaped programs of movement ops, compiled to C and run against NumPy: GEMM from movement ops, the syllabus GEMM that
is not a GEMM, the PAD/FLIP composites, and random movement chains (rank 3 and 4) extended with REDUCE, STACK and INDEX."""
import numpy as np
import pytest
from hypothesis import assume, given, settings, strategies as st, HealthCheck
from uopc.dtype import dtypes
from uopc.uop import UOp, Ops, buf
from uopc.uir import parse
from uopc.evaluate import to_python
from uopc.composite import pad, flip_axis, anti_eye
from uopc.rangeify import Opts, LowerError, check_opts
from uopc.testing import run_shaped
from example_programs import gemm_uir, syllabus_uir


def random_matrices(n: int, count: int, seed: int) -> list[np.ndarray]:
  rng = np.random.default_rng(seed)
  return [rng.standard_normal((n, n), dtype=np.float32) for _ in range(count)]


def test_gemm_from_movement_ops():
  n = 16
  a, b = random_matrices(n, 2, seed=0)
  got = run_shaped(parse(gemm_uir(n)), [a.reshape(-1), b.reshape(-1)])
  np.testing.assert_allclose(got, a @ b, atol=1e-4)


def test_syllabus_gemm_is_not_a_gemm():
  """The syllabus' program reads A as (i, j, 1) and B as (i, 1, k): summing k gives A * rowsum(B), not A @ B."""
  n = 8
  a, b = random_matrices(n, 2, seed=1)
  got = run_shaped(parse(syllabus_uir(n)), [a.reshape(-1), b.reshape(-1)])
  np.testing.assert_allclose(got, a * b.sum(axis=1, keepdims=True), atol=1e-4)
  assert not np.allclose(got, a @ b)


def test_pad_flip_composites():
  m = np.random.default_rng(2).standard_normal((3, 4), dtype=np.float32)
  u = buf(0, 12).reshape((3, 4))
  for widths in [((1, 5), (2, 0)), ((4, 0), (0, 9))]:     # padding wider than the axis takes several doublings
    np.testing.assert_array_equal(run_shaped(pad(u, widths), [m]), np.pad(m, widths))
  for axis in (0, 1): np.testing.assert_array_equal(run_shaped(flip_axis(u, axis), [m]), np.flip(m, axis))
  assert to_python(anti_eye(3, u.dtype)) == np.eye(3)[::-1].tolist()


@st.composite
def chains(draw):
  """A random chain over a rank-3 or rank-4 buffer: permute, shrink, expand, reshape (flatten and split), REDUCE ADD/MAX,
  STACK with a scaled copy, INDEX of a leading axis, PAD and FLIP; the same chain on a NumPy array is the oracle."""
  shape = draw(st.sampled_from([(2, 3, 4), (3, 1, 4), (2, 3, 2, 2), (1, 4, 3, 2)]))
  x = np.random.default_rng(draw(st.integers(0, 2**16))).standard_normal(int(np.prod(shape))).astype(np.float32)
  u, ref = buf(0, x.size).reshape(shape), x.reshape(shape)
  for _ in range(draw(st.integers(1, 7))):
    k = draw(st.integers(0, 9))
    if k == 0:
      p = tuple(draw(st.permutations(range(ref.ndim)))); u, ref = u.permute(p), ref.transpose(p)
    elif k == 1 and ref.size:
      arg = []
      for s in ref.shape:
        b = draw(st.integers(0, s - 1)) if s else 0
        arg.append((b, draw(st.integers(b + (1 if s else 0), s))))
      u, ref = u.shrink(tuple(arg)), ref[tuple(slice(b, e) for b, e in arg)]
    elif k == 2 and ref.ndim < 5:
      n = draw(st.integers(2, 3))
      u, ref = u.reshape((1,) + u.shape).expand((n,) + u.shape), np.broadcast_to(ref[None], (n,) + ref.shape)
    elif k == 3:
      u, ref = u.reshape((ref.size,)), ref.reshape(-1)
    elif k == 4 and ref.ndim >= 1 and ref.shape[-1] % 2 == 0 and ref.shape[-1] > 0:
      u, ref = u.reshape(u.shape[:-1] + (2, u.shape[-1] // 2)), ref.reshape(ref.shape[:-1] + (2, ref.shape[-1] // 2))
    elif k == 5 and ref.ndim >= 2 and ref.shape[-1] > 0:
      if draw(st.booleans()): u, ref = u.reduce(Ops.ADD, 1), ref.sum(-1, dtype=np.float64).astype(np.float32)
      else: u, ref = u.reduce(Ops.MAX, 1), ref.max(-1)
    elif k == 6 and ref.ndim < 5:
      u, ref = UOp(Ops.STACK, (u, u * 2.0)), np.stack([ref, ref * np.float32(2)])
    elif k == 7 and ref.ndim >= 2 and ref.shape[0] > 0:
      i = draw(st.integers(0, ref.shape[0] - 1)); u, ref = u.index(i), ref[i]
    elif k == 8 and ref.ndim >= 1 and ref.size:
      ax = draw(st.integers(0, ref.ndim - 1)); w = (draw(st.integers(0, 3)), draw(st.integers(0, 3)))
      widths = tuple(w if a == ax else (0, 0) for a in range(ref.ndim))
      u, ref = pad(u, widths), np.pad(ref, widths)
    elif k == 9 and ref.ndim >= 1:
      ax = draw(st.integers(0, ref.ndim - 1)); u, ref = flip_axis(u, ax), np.flip(ref, ax)
  opts = draw(st.sampled_from([Opts(), Opts(unroll=2), Opts(upcast={0: 2}), Opts(thread=0)]))
  return u, x, np.ascontiguousarray(ref), opts


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(chains())
def test_random_movement_chains_with_reduce_stack_index(case):
  u, x, ref, opts = case
  try: check_opts(u, opts)
  except LowerError: opts = Opts()       # the drawn Opts don't fit this chain's shape (refused, never silently dropped)
  np.testing.assert_allclose(run_shaped(u, [x], opts=opts), ref, rtol=1e-5, atol=1e-5)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(chains())
def test_the_strides_choose_opts_reads_are_what_simplify_folds_the_index_to(case):
  """uopc.opt.analyze reads each load's strides by evaluating its index at loop counters 0, 1 and 2 (_int_at), and only
  where that reaches something else (a loaded index) by simplifying the substituted index, as it did for all: the two
  must read the same Analysis of every kernel."""
  import uopc.opt
  from uopc.kernelize import make_kernel
  u = case[0]
  assume(u.shape and 0 not in u.shape)        # a kernel writes at least one element
  k = make_kernel(u, buf(1, int(np.prod(u.shape))))
  evaluated = uopc.opt.analyze(k)
  real, uopc.opt._int_at = uopc.opt._int_at, lambda *a: None
  try: assert uopc.opt.analyze(k) == evaluated
  finally: uopc.opt._int_at = real


@pytest.mark.parametrize("seed", range(5))
def test_random_movement_chains(seed):
  """A small random chain: six random steps (permute, shrink, a broadcast new axis, flatten) on 24 elements."""
  rng = np.random.default_rng(seed)
  data = rng.standard_normal(24).astype(np.float32)
  u, ref = buf(0, 24).reshape((2, 3, 4)), data.reshape(2, 3, 4)
  for _ in range(6):
    step = int(rng.integers(4))
    if step == 0:
      order = tuple(int(a) for a in rng.permutation(ref.ndim))
      u, ref = u.permute(order), ref.transpose(order)
    elif step == 1:
      lows = [int(rng.integers(0, n)) for n in ref.shape]
      window = tuple((lo, int(rng.integers(lo + 1, n + 1))) for lo, n in zip(lows, ref.shape))
      u, ref = u.shrink(window), ref[tuple(slice(*w) for w in window)]
    elif step == 2:
      u, ref = u.reshape((1,) + u.shape).expand((2,) + u.shape), np.broadcast_to(ref[None], (2,) + ref.shape)
    else:
      u, ref = u.reshape((ref.size,)), ref.reshape(-1)
  np.testing.assert_array_equal(run_shaped(u, [data]), ref)


def test_integer_and_bool_programs():
  a = np.arange(-6, 6, dtype=np.int32)
  x = buf(0, 12, dtypes.i32).reshape((3, 4))
  np.testing.assert_array_equal(run_shaped((x // 3) * 3 + x % 3, [a]), a.reshape(3, 4))
  np.testing.assert_array_equal(run_shaped(x.reduce(Ops.MAX, 1), [a]), a.reshape(3, 4).max(1))
  np.testing.assert_array_equal(run_shaped(x < 0, [a]), a.reshape(3, 4) < 0)
