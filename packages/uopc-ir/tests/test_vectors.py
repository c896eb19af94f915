"""Vector dtypes and the two vector ops (VECTORIZE, GEP) in the IR: interned like the scalars, type-checked at
construction, evaluated lane by lane with the scalar semantics (the oracle: each lane's scalar op), bounded by the
union of their lanes, and written and read back by the .uir format."""
import copy
import pickle
import numpy as np
import pytest
from uopc.dtype import dtypes
from uopc.uop import UOp, Ops, ParamArg, AddrSpace, UOpError, buf
from uopc.evaluate import run, to_python, exec_alu
from uopc.symbolic import bounds
from uopc.uir import parse, to_uir


def vec(*xs) -> UOp: return UOp(Ops.VECTORIZE, tuple(UOp.const(x) for x in xs))


def test_a_vector_dtype_is_interned_and_knows_its_lanes():
  v = dtypes.f32.vec(8)
  assert v is dtypes.f32.vec(8) and v.count == 8 and v.scalar() is dtypes.f32 and v.name == "f32x8" and v.itemsize == 32
  assert pickle.loads(pickle.dumps(v)) is v and copy.deepcopy(v) is v and repr(v) == "dtypes.f32.vec(8)"
  assert dtypes.i32.vec(1) is dtypes.i32 and dtypes.i32.scalar() is dtypes.i32 and dtypes.i32.count == 1
  assert v.fmt is None and v.is_float and dtypes.i32.vec(4).is_int        # memory holds scalars: a vector has no NumPy format
  for bad in (lambda: v.vec(2), lambda: dtypes.void.vec(2), lambda: dtypes.f32.vec(0)):
    with pytest.raises(ValueError): bad()


def test_vector_ops_are_type_checked_at_construction():
  x, m = vec(1.0, 2.0, 3.0, 4.0), vec(1, 2, 3, 4)
  assert (x + x).dtype is dtypes.f32.vec(4) and (x < x).dtype is dtypes.bool.vec(4) and (m // m).dtype is dtypes.i32.vec(4)
  assert UOp(Ops.GEP, (x,), 3).dtype is dtypes.f32 and x.cast(dtypes.i32.vec(4)).dtype is dtypes.i32.vec(4)
  assert (x < x).where(x, x).dtype is dtypes.f32.vec(4) and UOp(Ops.MULACC, (x, x, x)).dtype is dtypes.f32.vec(4)
  assert UOp.const(2.5, dtypes.f32.vec(4)) is UOp(Ops.VECTORIZE, (UOp.const(2.5),) * 4)    # a constant in every lane
  cases = [
    (lambda: UOp(Ops.VECTORIZE, (UOp.const(1.0),)), "VECTORIZE makes a vector of 2 or more lanes, got 1"),
    (lambda: UOp(Ops.VECTORIZE, (UOp.const(1.0), UOp.const(1))), "VECTORIZE lanes are scalars of one dtype"),
    (lambda: UOp(Ops.VECTORIZE, (x, x)), "VECTORIZE lanes are scalar values, got f32x4"),
    (lambda: UOp(Ops.GEP, (x,), 4), "GEP: lane 4 of a f32x4 (lanes 0..3)"),
    (lambda: UOp(Ops.GEP, (UOp.const(1.0),), 0), "GEP takes a lane of a vector, got a f32"),
    (lambda: x + vec(1.0, 2.0), "dtype mismatch"),
    (lambda: x + UOp.const(1.0), "dtype mismatch"),                      # a scalar is broadcast explicitly
    (lambda: x.cast(dtypes.i32), "CAST of f32x4 to i32: a cast keeps the lanes"),
    (lambda: (m < m).where(UOp.const(1.0), UOp.const(2.0)), "WHERE condition must be bool"),
    (lambda: UOp.const(True).where(x, x), "WHERE of f32x4: the condition must be boolx4, got bool"),
    (lambda: x // x, "integer only"),
    (lambda: UOp(Ops.BUFFER, (), ParamArg(0, dtypes.f32.vec(4), (8,))), "a BUFFER holds scalars, got f32x4"),
  ]
  for build, message in cases:
    with pytest.raises(UOpError, match=message.replace("(", r"\(").replace(")", r"\)")): build()


def test_a_vector_index_reads_consecutive_elements_of_flat_memory():
  b = buf(0, 16)
  at = UOp(Ops.INDEX, (b, UOp.const(4)), dtypes.f32.vec(4))
  assert at.dtype is dtypes.f32.vec(4) and at.addrspace is AddrSpace.GLOBAL and at.load().dtype is dtypes.f32.vec(4)
  assert at.store(vec(1.0, 2.0, 3.0, 4.0)).dtype is dtypes.void
  with pytest.raises(UOpError, match="the arg is a vector of the memory's f32 elements"): UOp(Ops.INDEX, (b, UOp.const(4)), dtypes.i32.vec(4))
  with pytest.raises(UOpError, match="a vector is read from flat memory at one index"):
    UOp(Ops.INDEX, (UOp(Ops.STACK, (UOp.const(1.0),) * 4), UOp.const(0)), dtypes.f32.vec(2))     # a register array is no memory
  with pytest.raises(UOpError, match=r"STORE of dtypes.f32 into dtypes.f32.vec\(4\)"): at.store(UOp.const(1.0))


def test_the_evaluator_runs_vectors_lane_by_lane():
  rng = np.random.default_rng(0)
  a, b = rng.standard_normal((2, 8)).astype(np.float32)
  va, vb = vec(*map(float, a)), vec(*map(float, b))
  for op in (Ops.ADD, Ops.MUL, Ops.MAX, Ops.CMPLT):
    want = [exec_alu(op, dtypes.bool if op is Ops.CMPLT else dtypes.f32, float(x), float(y)) for x, y in zip(a, b)]
    assert to_python(UOp(op, (va, vb))) == want
  assert to_python(UOp(Ops.GEP, (va * vb,), 5)) == exec_alu(Ops.MUL, dtypes.f32, float(a[5]), float(b[5]))
  assert to_python(va.cast(dtypes.i32.vec(8))) == [int(x) for x in a]
  assert to_python(vec(7, -7).__floordiv__(vec(2, 2))) == [3, -4]
  assert run(va + vb).op is Ops.VECTORIZE          # a vector's literal: a VECTORIZE of its lanes' literals


def test_bounds_of_a_vector_hold_for_every_lane():
  lanes = vec(0, 1, 2, 3)
  assert bounds(lanes) == (0, 3) and bounds(lanes * UOp.const(4, dtypes.i32.vec(4)) + vec(5, 5, 5, 5)) == (5, 17)
  assert bounds(UOp(Ops.GEP, (lanes,), 2)) == (0, 3) and bounds(lanes < vec(2, 2, 2, 2)) == (False, True)


def test_vector_programs_round_trip_through_uir():
  b = buf(0, 16)
  acc = UOp(Ops.ALLOC, (), ParamArg(1, dtypes.f32.vec(4), (1,), AddrSpace.LOCAL))
  wide = UOp(Ops.INDEX, (b, UOp.const(4)), dtypes.f32.vec(4)).load()
  g = UOp(Ops.SINK, (acc.index(0).store(wide + UOp.const(1.0, dtypes.f32.vec(4))), b.index(0).store(UOp(Ops.GEP, (wide,), 3)),
                     buf(2, 4, dtypes.i32).index(0).store(UOp(Ops.GEP, (wide.cast(dtypes.i32.vec(4)),), 1))))
  text = to_uir(g)
  assert "dtype=f32x4" in text and "dtype=i32x4" in text and "gep" in text and "vectorize" in text
  assert parse(text) is g
