"""uopc.grad: each rule of the table against its derivative computed with NumPy, evaluated by the IR's own evaluator
(no compiler involved), plus the conventions: ties, stop-gradient, seeds, and errors."""
import math
import numpy as np
import pytest
from uopc.dtype import dtypes
from uopc.uop import UOp, Ops, UOpError
from uopc.evaluate import literal, to_python
from uopc.composite import pad
from uopc.grad import gradient, GRAD_RULES

X = np.array([[0.5, -1.25, 2.0], [1.5, 0.75, -0.5]], np.float32)
R = np.array([[1.0, -2.0, 0.5], [3.0, 0.25, -1.0]], np.float32)


def lit(a: np.ndarray) -> UOp: return literal([float(v) for v in a.ravel()], a.shape, dtypes.f32)
def val(u: UOp) -> np.ndarray: return np.array(to_python(u), np.float64)


def grad_of(f, x: np.ndarray, weights: np.ndarray) -> np.ndarray:
  """d/dx of sum(f(x) * weights), through uopc.grad, evaluated by uopc.evaluate."""
  xu = lit(x)
  out = f(xu)
  loss = (out * lit(weights)).reduce(Ops.ADD, len(out.shape))
  [g] = gradient(loss, [xu])
  return val(g)


UNARY = [
  ("exp2", lambda u: UOp(Ops.EXP2, (u,)), lambda x: np.exp2(x) * math.log(2)),
  ("log2", lambda u: UOp(Ops.LOG2, (u,)), lambda x: 1 / (x * math.log(2))),
  ("sqrt", lambda u: UOp(Ops.SQRT, (u,)), lambda x: 0.5 / np.sqrt(x)),
  ("sin", lambda u: UOp(Ops.SIN, (u,)), np.cos),
  ("recip", lambda u: u.recip(), lambda x: -1 / (x * x)),
  ("square", lambda u: u * u, lambda x: 2 * x),
  ("affine", lambda u: u * 3.0 + 1.0, lambda x: np.full_like(x, 3.0)),
]

@pytest.mark.parametrize("name,f,df", UNARY, ids=[u[0] for u in UNARY])
def test_unary_rules(name, f, df):
  x = np.abs(X) + 0.25 if name in ("log2", "sqrt") else X
  np.testing.assert_allclose(grad_of(f, x, R), df(x.astype(np.float64)) * R, rtol=2e-5)


def test_max_splits_ties_evenly():
  a = np.array([1.0, 2.0, 3.0], np.float32)
  other = lit(np.array([2.0, 2.0, 2.0], np.float32))
  np.testing.assert_array_equal(grad_of(lambda u: u.maximum(other), a, np.ones(3, np.float32)), [0.0, 0.5, 1.0])
  np.testing.assert_array_equal(grad_of(lambda u: u.maximum(-u), np.array([-1.0, 0.0, 2.0], np.float32), np.ones(3, np.float32)), [-1, 0, 1])


def test_where_sends_the_gradient_to_the_chosen_branch():
  cond = lit(X) < lit(np.zeros_like(X))
  g = grad_of(lambda u: cond.where(u * 2.0, u * 5.0), X, R)
  np.testing.assert_allclose(g, np.where(X < 0, 2.0, 5.0) * R)


def test_movement_rules():
  np.testing.assert_allclose(grad_of(lambda u: u.reshape((3, 2)), X, R.reshape(3, 2)), R)
  np.testing.assert_allclose(grad_of(lambda u: u.permute((1, 0)), X, R.T), R)
  w = np.arange(12, dtype=np.float32).reshape(2, 2, 3)
  np.testing.assert_allclose(grad_of(lambda u: u.reshape((1, 2, 3)).expand((2, 2, 3)), X, w), w.sum(0))   # EXPAND -> a sum
  g = grad_of(lambda u: u.shrink(((0, 2), (1, 3))), X, R[:, :2])
  np.testing.assert_allclose(g, np.pad(R[:, :2], ((0, 0), (1, 0))))                                        # SHRINK -> a pad
  np.testing.assert_allclose(grad_of(lambda u: pad(u, ((1, 0), (0, 2))), X, np.ones((3, 5), np.float32)), np.ones_like(X))


def test_stack_and_index_rules():
  y = lit(np.ones_like(X))
  np.testing.assert_allclose(grad_of(lambda u: UOp(Ops.STACK, (u, y, u * 2.0)), X, np.stack([R, R, R])), R * 3)
  np.testing.assert_allclose(grad_of(lambda u: u.index(1), X, R[1]), np.stack([np.zeros(3), R[1]]))


def test_reduce_rules():
  np.testing.assert_allclose(grad_of(lambda u: u.reduce(Ops.ADD, 1), X, np.array([2.0, -1.0], np.float32)),
                             np.array([[2.0] * 3, [-1.0] * 3]))
  tie = np.array([[1.0, 3.0, 3.0], [5.0, 0.0, 1.0]], np.float32)
  np.testing.assert_allclose(grad_of(lambda u: u.reduce(Ops.MAX, 1), tie, np.array([1.0, 2.0], np.float32)), [[0, 0.5, 0.5], [2, 0, 0]])


def test_comparisons_casts_and_stop_gradient():
  xu = lit(X)
  loss = (xu < xu.const_like(0.0)).cast(dtypes.f32).reduce(Ops.ADD, 2)
  assert val(gradient(loss, [xu])[0]).tolist() == np.zeros_like(X).tolist()
  detached = UOp(Ops.CAST, (xu,), dtypes.f32)               # the same-dtype CAST: Tensor.detach
  assert val(gradient((detached * xu).reduce(Ops.ADD, 2), [xu])[0]).tolist() == X.astype(np.float64).tolist()


def test_unreached_inputs_get_zeros_and_seeds_are_checked():
  a, b = lit(X), lit(R)
  ga, gb = gradient((a * 2.0).reduce(Ops.ADD, 2), [a, b])
  assert val(gb).tolist() == np.zeros_like(R).tolist() and val(ga).tolist() == np.full_like(X, 2.0).tolist()
  with pytest.raises(UOpError, match="needs a seed"): gradient(a * 2.0, [a])
  g = gradient(a * 2.0, [a], seed=b)[0]
  np.testing.assert_allclose(val(g), R * 2)


def test_every_differentiable_op_has_a_rule():
  from uopc.uop import ALU, MOVEMENT
  assert ALU | MOVEMENT | {Ops.STACK, Ops.REDUCE, Ops.INDEX, Ops.STAGE} <= set(GRAD_RULES)


def _gradient_nodes(loss: UOp, grads: list[UOp]) -> list[UOp]:
  forward = set(loss.toposort())
  return [u for u in UOp(Ops.SINK, tuple(grads)).toposort() if u not in forward and u.op is not Ops.SINK]


def test_a_gradients_views_are_not_views_of_views():
  """A matmul's backward reshapes each REDUCE's result to the keepdim shape and back, and transposes a transposed
  operand's gradient twice, unless the rules fold them: one RESHAPE of the source, no PERMUTE of a PERMUTE."""
  A, B = X, np.arange(12, dtype=np.float32).reshape(4, 3) / 7
  a, b = lit(A), lit(B)
  bt = b.permute((1, 0))                                                                        # (3, 4): B.T
  prod = a.reshape((2, 3, 1)).expand((2, 3, 4)) * bt.reshape((1, 3, 4)).expand((2, 3, 4))
  out = prod.permute((0, 2, 1)).reduce(Ops.ADD, 1)                                              # (2, 4): A @ B.T
  w = np.array([[1.0, -2.0, 0.5, 3.0], [0.25, -1.0, 2.0, 1.5]], np.float32)
  loss = (out * lit(w)).reduce(Ops.ADD, 2)
  ga, gb = gradient(loss, [a, b])
  np.testing.assert_allclose(val(ga), w @ B, rtol=1e-6)
  np.testing.assert_allclose(val(gb), w.T @ A, rtol=1e-6)
  made = _gradient_nodes(loss, [ga, gb])
  assert not [u for u in made if u.op is Ops.RESHAPE and u.src[0].op is Ops.RESHAPE and u.src[0] in made]
  assert not [u for u in made if u.op is Ops.PERMUTE and u.src[0].op is Ops.PERMUTE and u.src[0] in made]
  assert not [u for u in made if u.op in (Ops.RESHAPE, Ops.EXPAND) and u.shape == u.src[0].shape]


def test_the_seed_stays_in_the_gradient_so_a_second_gradient_can_be_taken_by_it():
  """gradient(y, [x], seed=v) is v's vector-Jacobian product; differentiated again by v it gives the Jacobian's
  product with the new seed. The folds of views skip the rules' own nodes, never the caller's v, even when v is a view."""
  x = lit(X)
  v = lit(R.T.ravel()).reshape((3, 2))                        # a RESHAPE, as a realized tensor's uop is
  [g] = gradient(x.reshape((3, 2)), [x], seed=v)              # d y / d x applied to v: v viewed back as (2, 3)
  np.testing.assert_allclose(val(g), R.T.reshape(2, 3))
  w = np.arange(6, dtype=np.float32).reshape(2, 3)
  [gv] = gradient((g * lit(w)).reduce(Ops.ADD, 2), [v])
  np.testing.assert_allclose(val(gv), w.reshape(3, 2))
