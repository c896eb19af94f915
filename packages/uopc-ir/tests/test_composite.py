"""Composite ops: PAD and FLIP from primitives, checked against NumPy through the evaluator."""
import numpy as np
import pytest
from uopc.dtype import dtypes
from uopc.uop import UOp, Ops, UOpError, buf
from uopc.evaluate import literal, to_python
from uopc.composite import move_axis, concat2, zeros_like, pad_axis, pad, anti_eye, flip_axis


def lit(a: np.ndarray) -> UOp:
  d = {np.dtype(np.float32): dtypes.f32, np.dtype(np.int32): dtypes.i32}[a.dtype]
  return literal([x.item() for x in a.ravel()], a.shape, d)


def test_anti_eye_is_the_seeds_matrix():
  assert to_python(anti_eye(4, dtypes.f32)) == [[0.0, 0.0, 0.0, 1.0], [0.0, 0.0, 1.0, 0.0], [0.0, 1.0, 0.0, 0.0], [1.0, 0.0, 0.0, 0.0]]
  assert to_python(anti_eye(3, dtypes.i32)) == [[0, 0, 1], [0, 1, 0], [1, 0, 0]]
  assert to_python(anti_eye(1, dtypes.f32)) == [[1.0]]
  for n in range(2, 9): assert np.array_equal(np.array(to_python(anti_eye(n, dtypes.i32))), np.eye(n, dtype=np.int32)[::-1])


@pytest.mark.parametrize("shape", [(5,), (3, 4), (2, 3, 4), (1, 1), (4, 1, 3)])
def test_flip_axis_matches_numpy(shape):
  x = np.arange(np.prod(shape), dtype=np.int32).reshape(shape) * 3 - 7
  for axis in range(len(shape)):
    assert np.array_equal(np.array(to_python(flip_axis(lit(x), axis))), np.flip(x, axis))


def test_flip_is_movement_ops_only():
  u = flip_axis(buf(0, 12).reshape((3, 4)), 1)
  assert {n.op for n in u.toposort()} <= {Ops.BUFFER, Ops.RESHAPE, Ops.EXPAND, Ops.PERMUTE, Ops.SHRINK}


@pytest.mark.parametrize("widths", [((1, 5), (2, 0)), ((0, 0), (0, 0)), ((3, 3), (9, 1)), ((7, 0), (0, 11))])
def test_pad_matches_numpy_including_padding_wider_than_the_axis(widths):
  x = np.random.default_rng(0).standard_normal((3, 4)).astype(np.float32)
  assert np.array_equal(np.array(to_python(pad(lit(x), widths)), dtype=np.float32), np.pad(x, widths))


def test_pad_axis_on_a_vector_builds_the_seeds_graph_shape():
  v = lit(np.array([1.0, 2.0, 3.0], np.float32))
  g = pad_axis(v, 0, 1, 2)
  assert g.shape == (6,) and to_python(g) == [0.0, 1.0, 2.0, 3.0, 0.0, 0.0]
  assert sum(1 for u in g.toposort() if u.op is Ops.STACK and u.shape == (2, 5)) == 1   # the doubling: concat with zeros


def test_concat2_and_move_axis():
  a, b = np.arange(6, dtype=np.int32).reshape(2, 3), np.arange(6, 12, dtype=np.int32).reshape(2, 3)
  for axis in (0, 1):
    assert np.array_equal(np.array(to_python(concat2(lit(a), lit(b), axis))), np.concatenate([a, b], axis))
  x = np.arange(24, dtype=np.int32).reshape(2, 3, 4)
  assert np.array_equal(np.array(to_python(move_axis(lit(x), 0, 2))), np.moveaxis(x, 0, 2))
  assert np.array_equal(np.array(to_python(zeros_like(lit(x)))), np.zeros_like(x))


def test_composite_errors():
  v = lit(np.zeros(3, np.float32))
  with pytest.raises(UOpError, match="concat2 needs equal shapes"): concat2(v, lit(np.zeros(4, np.float32)), 0)
  with pytest.raises(UOpError, match="padding must be non-negative"): pad_axis(v, 0, -1, 0)
  with pytest.raises(UOpError, match="axis 3 out of range"): flip_axis(v, 3)
  with pytest.raises(UOpError, match="1 .before, after. pairs for shape"): pad(lit(np.zeros((2, 2), np.float32)), ((1, 1),))
