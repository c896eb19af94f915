"""The reference interpreter of linearized programs (uopc.interpret): C's semantics, and loud on what C would get wrong."""
import numpy as np
import pytest
from uopc.dtype import dtypes
from uopc.uop import UOp, Ops, ParamArg, buf, range_, sink
from uopc.rangeify import lower, Opts, Ctx
from uopc.linearize import linearize
from uopc.interpret import run_linear, InterpretError
from example_programs import gemm_uir
from uopc.uir import parse


def test_a_gemm_matches_numpy_under_every_opts():
  N = 4
  rng = np.random.default_rng(0)
  a, b = rng.integers(-3, 4, (N, N)).astype(np.float32), rng.integers(-3, 4, (N, N)).astype(np.float32)
  for opts in (Opts(), Opts(upcast={1: 2}, unroll=2), Opts(tile={0: 2}), Opts(thread=0)):
    mem = {0: a.ravel().tolist(), 1: b.ravel().tolist(), 2: [0.0] * (N * N)}
    run_linear(linearize(lower(parse(gemm_uir(N)), buf(2, N * N), Ctx(opts=opts))), mem)
    assert mem[2] == (a @ b).ravel().tolist(), opts


def test_integer_semantics_are_the_c_backends():
  x = buf(0, 4, dtypes.i32)
  mem = {0: [7, -7, 2**31 - 1, -2**31], 1: [0] * 4, 2: [0] * 4, 3: [0] * 4}
  run_linear(linearize(lower(x // 0, buf(1, 4, dtypes.i32))), mem)       # NumPy's x // 0 == 0, as the compiled code
  run_linear(linearize(lower(x + 1, buf(2, 4, dtypes.i32))), mem)        # i32 wraps
  run_linear(linearize(lower(x // -1, buf(3, 4, dtypes.i32))), mem)      # INT_MIN // -1 wraps too
  assert mem[1] == [0, 0, 0, 0] and mem[2] == [8, -6, -2**31, -2**31 + 1] and mem[3] == [-7, 7, -2**31 + 1, -2**31]


def test_an_out_of_bounds_store_is_reported_not_performed():
  r = range_(5, 0)
  prog = sink(buf(0, 4).index(r).store(UOp.const(1.0)).end(r))
  mem = {0: [0.0] * 4}
  with pytest.raises(InterpretError, match="store to element 4 of memory with 4 elements"): run_linear(linearize(prog), mem)


def test_reading_an_accumulator_before_it_is_written_is_reported():
  acc = UOp(Ops.ALLOC, (), ParamArg(0, dtypes.f32, (1,)))
  prog = sink(buf(0, 1).index(0).store(acc.index(0).load()))
  with pytest.raises(InterpretError, match="before anything was stored"): run_linear(linearize(prog), {0: [0.0]})


def test_an_empty_loop_runs_no_iteration():
  r = range_(0, 0)
  prog = sink(buf(0, 1).index(0).store(r.cast(dtypes.f32) + 5.0).end(r), buf(1, 1).index(0).store(UOp.const(2.0)))
  mem = {0: [0.0], 1: [0.0]}
  run_linear(linearize(prog), mem)
  assert mem == {0: [0.0], 1: [2.0]}


def test_missing_memory_is_named():
  with pytest.raises(InterpretError, match="slot 3"): run_linear(linearize(lower(buf(3, 2) + 1.0, buf(0, 2))), {0: [0.0] * 2})
