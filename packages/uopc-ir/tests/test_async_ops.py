"""A GPU's asynchronous copies and matrix loads in the IR (ASYNC_COPY, ASYNC_COMMIT, ASYNC_WAIT, LDMATRIX: what
uopc.gpulower's pipelined tensor-core GEMM is made of): type-checked at construction, refused by the evaluator (they
are effects on memory), written and read back by the .uir format."""
import pytest
from uopc.dtype import dtypes, AddrSpace
from uopc.uop import UOp, Ops, ParamArg, UOpError, buf
from uopc.evaluate import run, EvalError
from uopc.uir import parse, to_uir

SHARED = UOp(Ops.ALLOC, (), ParamArg(0, dtypes.f16, (256,), AddrSpace.SHARED))
GLOBAL = buf(0, 1024, dtypes.f16)


def wide(mem: UOp, at: int, d=dtypes.f16.vec(8)) -> UOp: return UOp(Ops.INDEX, (mem, UOp.const(at)), d)


def test_a_pipeline_step_is_well_typed_and_round_trips_through_uir():
  copy = UOp(Ops.ASYNC_COPY, (wide(SHARED, 8), wide(GLOBAL, 16), UOp.const(True)))
  wait = UOp(Ops.ASYNC_WAIT, (UOp(Ops.ASYNC_COMMIT, (copy,)),), 1)
  frag = UOp(Ops.LDMATRIX, (wide(SHARED.after(wait), 0),), (4, True))
  assert copy.dtype is dtypes.void and wait.dtype is dtypes.void and (frag.dtype, frag.shape, frag.addrspace) == (dtypes.f16, (8,), AddrSpace.ALU)
  program = UOp(Ops.SINK, (frag.index(3).cast(dtypes.f32),))
  assert parse(to_uir(program)) is program


@pytest.mark.parametrize("make, message", [
  (lambda: UOp(Ops.ASYNC_COPY, (wide(GLOBAL, 8), wide(GLOBAL, 16), UOp.const(True))), "destination is a vector INDEX of SHARED memory"),
  (lambda: UOp(Ops.ASYNC_COPY, (wide(SHARED, 8), wide(SHARED, 16), UOp.const(True))), "source is a vector INDEX of GLOBAL memory"),
  (lambda: UOp(Ops.ASYNC_COPY, (wide(SHARED, 8, dtypes.f16.vec(4)), wide(GLOBAL, 16, dtypes.f16.vec(4)), UOp.const(True))), "moves 16 bytes"),
  (lambda: UOp(Ops.ASYNC_COPY, (wide(SHARED, 8), wide(GLOBAL, 16), UOp.const(1))), "valid is a bool scalar"),
  (lambda: UOp(Ops.ASYNC_COPY, (wide(SHARED, 8), wide(GLOBAL, 16))), "3"),
  (lambda: UOp(Ops.ASYNC_WAIT, (), -1), "an int >= 0"),
  (lambda: UOp(Ops.ASYNC_WAIT, (), None), "an int >= 0"),
  (lambda: UOp(Ops.LDMATRIX, (wide(SHARED, 0),), (3, False)), r"\(matrices: 1, 2 or 4, trans: bool\)"),
  (lambda: UOp(Ops.LDMATRIX, (wide(SHARED, 0),), (4, 1)), r"\(matrices: 1, 2 or 4, trans: bool\)"),
  (lambda: UOp(Ops.LDMATRIX, (wide(GLOBAL, 0),), (4, False)), "row is a vector INDEX of SHARED memory"),
  (lambda: UOp(Ops.LDMATRIX, (wide(SHARED, 0, dtypes.f16.vec(4)),), (4, False)), "of 8 lanes"),
])
def test_malformed_async_ops_are_refused_at_construction(make, message):
  with pytest.raises(UOpError, match=message): make()


def test_the_evaluator_refuses_them():
  frag = UOp(Ops.LDMATRIX, (wide(SHARED, 0),), (1, False))
  with pytest.raises(EvalError): run(frag.index(0))
