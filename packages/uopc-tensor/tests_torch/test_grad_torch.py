"""PyTorch as the oracle for every Tensor op: forward values and the gradient of every input that requires one.

This directory is the only place in the repository that imports torch (its own nox session installs torch==2.13.0 and
safetensors); the regular tests keep NumPy as their oracle. Each case builds its inputs as NumPy arrays, makes uopc
Tensors and torch tensors from the same data, runs the op on both, reduces each output to a scalar with a random
weighting (sum(out * r), so every output element's gradient is different and a transposed or misplaced gradient
shows), calls backward on both and compares the outputs and every .grad. Float tolerances are 1e-4, relative to the
magnitude of the expected values. Kernels are compiled once per structure, so the cases reuse a few shapes.
"""
import numpy as np
import pytest
import torch
import torch.nn.functional as F
from uopc.tensor import Tensor
from uopc import nn

torch.set_num_threads(1)   # two pytest workers share two cores
torch.manual_seed(0)         # the torch modules' own initial weights are overwritten with uopc's; this keeps the rest fixed
TOL = 1e-4


def randn(*shape, seed: int = 0) -> np.ndarray: return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)
def positive(*shape, seed: int = 0) -> np.ndarray: return np.random.default_rng(seed).uniform(0.5, 2.0, shape).astype(np.float32)
def away_from_zero(*shape, seed: int = 0) -> np.ndarray:
  rng = np.random.default_rng(seed)
  return (rng.uniform(0.5, 2.0, shape) * rng.choice([-1.0, 1.0], shape)).astype(np.float32)


def assert_close(actual: np.ndarray, expected: np.ndarray, what: str, tol: float = TOL) -> None:
  assert actual.shape == expected.shape, f"{what}: shape {actual.shape}, torch has {expected.shape}"
  scale = max(1.0, float(np.abs(expected[np.isfinite(expected)]).max())) if np.isfinite(expected).any() else 1.0
  np.testing.assert_allclose(actual, expected, rtol=tol, atol=tol * scale, err_msg=what)


def _torch_of(a: np.ndarray) -> torch.Tensor:
  if a.dtype == np.float32: return torch.tensor(a, requires_grad=True)
  return torch.tensor(a.astype(np.int64) if a.dtype.kind in "iu" else a)   # torch indexes with int64


def compare(outs_u, outs_t, leaves: dict, seed: int = 1, tol: float = TOL) -> None:
  """Outputs equal, then sum(out * r) backward on both and every leaf's gradient equal. leaves: name -> (uopc, torch)."""
  outs_u = list(outs_u) if isinstance(outs_u, (list, tuple)) else [outs_u]
  outs_t = list(outs_t) if isinstance(outs_t, (list, tuple)) else [outs_t]
  assert len(outs_u) == len(outs_t)
  rng = np.random.default_rng(seed)
  loss_u, loss_t = None, None
  for k, (ou, ot) in enumerate(zip(outs_u, outs_t)):
    assert_close(ou.numpy(), ot.detach().numpy(), f"output {k}", tol)
    if not ot.requires_grad: continue
    r = rng.standard_normal(ot.shape).astype(np.float32)
    lu, lt = (ou * Tensor(r)).sum(), (ot * torch.tensor(r)).sum()
    loss_u, loss_t = (lu, lt) if loss_u is None else (loss_u + lu, loss_t + lt)
  if loss_u is None: return
  loss_u.backward()
  loss_t.backward()
  for name, (lu, lt) in leaves.items():
    if lt.grad is None:
      assert lu.grad is None or not np.any(lu.grad.numpy()), f"{name}: torch has no gradient but uopc's is nonzero"
      continue
    assert lu.grad is not None, f"{name}: uopc computed no gradient"
    assert_close(lu.grad.numpy(), lt.grad.numpy(), f"gradient of {name}", tol)


def check(f_uopc, f_torch, *arrays: np.ndarray, tol: float = TOL) -> None:
  """f on the same arrays in both libraries (float32 arrays require grad, integer and bool ones don't), then compare()."""
  us = [Tensor(a, requires_grad=a.dtype == np.float32) for a in arrays]
  ts = [_torch_of(a) for a in arrays]
  leaves = {f"input {k}": (u, t) for k, (u, t) in enumerate(zip(us, ts)) if t.requires_grad}
  compare(f_uopc(*us), f_torch(*ts), leaves, tol=tol)


# ---- elementwise ---------------------------------------------------------------------------------------------------

BINARY_SHAPES = [((3, 4), (3, 4)), ((3, 4), (4,)), ((2, 1, 4), (3, 1)), ((3, 4), ())]


@pytest.mark.parametrize("shapes", BINARY_SHAPES, ids=str)
@pytest.mark.parametrize("op", ["add", "sub", "mul", "div"])
def test_binary_ops_broadcast_and_reduce_the_gradient_over_expanded_axes(op, shapes):
  fn = {"add": lambda a, b: a + b, "sub": lambda a, b: a - b, "mul": lambda a, b: a * b, "div": lambda a, b: a / b}[op]
  check(fn, fn, randn(*shapes[0], seed=1), away_from_zero(*shapes[1], seed=2))


@pytest.mark.parametrize("op", ["add", "sub", "mul", "div", "rsub", "rdiv", "pow_scalar_base"])
def test_binary_ops_with_a_python_scalar_on_either_side(op):
  fn = {"add": lambda a: a + 1.5, "sub": lambda a: a - 1.5, "mul": lambda a: a * -2.0, "div": lambda a: a / 4.0,
        "rsub": lambda a: 2.0 - a, "rdiv": lambda a: 2.0 / a, "pow_scalar_base": lambda a: 2.0 ** a}[op]
  check(fn, fn, away_from_zero(3, 4, seed=3))


UNARY = {
  "neg": (lambda x: -x, lambda t: -t, randn),
  "exp": (lambda x: x.exp(), torch.exp, randn),
  "exp2": (lambda x: x.exp2(), torch.exp2, randn),
  "log": (lambda x: x.log(), torch.log, positive),
  "log2": (lambda x: x.log2(), torch.log2, positive),
  "sqrt": (lambda x: x.sqrt(), torch.sqrt, positive),
  "rsqrt": (lambda x: x.rsqrt(), torch.rsqrt, positive),
  "recip": (lambda x: x.recip(), torch.reciprocal, away_from_zero),
  "sin": (lambda x: x.sin(), torch.sin, randn),
  "cos": (lambda x: x.cos(), torch.cos, randn),
  "tan": (lambda x: x.tan(), torch.tan, lambda *s, seed: randn(*s, seed=seed) * 0.5),
  "tanh": (lambda x: x.tanh(), torch.tanh, randn),
  "sigmoid": (lambda x: x.sigmoid(), torch.sigmoid, randn),
  "relu": (lambda x: x.relu(), torch.relu, randn),
  "leaky_relu": (lambda x: x.leaky_relu(0.1), lambda t: F.leaky_relu(t, 0.1), randn),
  "gelu": (lambda x: x.gelu(), lambda t: F.gelu(t, approximate="tanh"), randn),   # uopc's gelu is the tanh form by default
  "silu": (lambda x: x.silu(), F.silu, randn),
  "abs": (lambda x: x.abs(), torch.abs, away_from_zero),
  "square": (lambda x: x.square(), torch.square, randn),
}


@pytest.mark.parametrize("name", list(UNARY))
def test_unary_op_and_its_gradient_match_torch(name):
  f_uopc, f_torch, data = UNARY[name]
  check(f_uopc, f_torch, data(3, 4, 5, seed=4) * (3 if data is randn else 1))


@pytest.mark.parametrize("name", ["sigmoid", "tanh", "gelu", "silu"])
def test_saturating_activations_keep_finite_gradients_far_out(name):
  # the plain 1/(1+e^-x) meets 0 * inf in its gradient below about x = -88 (a GPT's MLP reaches there in training)
  f_uopc, f_torch, _ = UNARY[name]
  x = np.array([-1e4, -200, -100, -50, -20, -9, -1e-3, 0, 1e-3, 9, 20, 50, 100, 200, 1e4], np.float32)
  check(f_uopc, f_torch, x)


def test_relu_and_abs_have_zero_gradient_at_zero_like_torch():
  x = np.array([-1.0, 0.0, 0.0, 2.0, -0.0], dtype=np.float32)
  check(lambda t: t.relu(), torch.relu, x)
  check(lambda t: t.abs(), torch.abs, x)


@pytest.mark.parametrize("name", ["floor", "ceil", "trunc", "round", "sign"])
def test_piecewise_constant_ops_have_zero_gradient(name):
  # values stay away from .5 and integers: torch rounds half to even, uopc's round is floor(x + 0.5)
  x = (np.floor(randn(3, 4, 5, seed=5) * 4) + np.random.default_rng(5).uniform(0.1, 0.4, (3, 4, 5))).astype(np.float32)
  check(lambda t: getattr(t, name)(), lambda t: getattr(torch, name)(t), x)


@pytest.mark.parametrize("exponent", [2, 3, 0.5, -1, 2.5, 1, -2])
def test_pow_with_a_scalar_exponent_on_positive_bases(exponent):
  check(lambda t: t ** exponent, lambda t: t ** exponent, positive(3, 4, 5, seed=6))


def test_pow_zero_is_one_with_zero_gradient():
  # uopc's x ** 0 is a constant with no graph behind it (torch keeps a graph with a zero gradient), so the gradient is
  # checked through a sum that keeps x in the graph
  check(lambda t: t ** 0 + t, lambda t: t ** 0 + t, randn(3, 4, 5, seed=6))


def test_pow_with_a_tensor_exponent_differentiates_base_and_exponent():
  check(lambda a, b: a ** b, lambda a, b: a ** b, positive(3, 4, seed=7), randn(4, seed=8))


def test_pow_with_an_odd_integer_exponent_keeps_the_sign_of_negative_bases():
  check(lambda t: t ** 3, lambda t: t ** 3, away_from_zero(3, 4, 5, seed=9))


def test_float_mod_and_floordiv_follow_floor_division():
  a, b = randn(3, 4, seed=10) * 5, away_from_zero(4, seed=11)
  check(lambda x, y: x % y, torch.remainder, a, b)
  # torch.floor_divide has no gradient; uopc's float // is floor(x / y), whose gradient is zero too
  x, y = Tensor(a), Tensor(b)
  assert_close((x // y).numpy(), torch.floor_divide(torch.tensor(a), torch.tensor(b)).numpy(), "floordiv")


@pytest.mark.parametrize("op", ["maximum", "minimum"])
def test_maximum_minimum_split_the_gradient_evenly_on_exact_ties(op):
  a, b = randn(3, 4, seed=12), randn(3, 4, seed=13)
  b[::2] = a[::2]   # half the rows tie exactly: torch sends half the gradient to each side, and so must uopc
  check(lambda x, y: getattr(x, op)(y), getattr(torch, op), a, b)
  check(lambda x, y: getattr(x, op)(y), getattr(torch, op), a, b[0].copy())   # broadcast: the tie shares reduce too


@pytest.mark.parametrize("op", ["maximum", "minimum"])
def test_maximum_minimum_with_a_scalar_tie(op):
  x = np.array([[-1.0, 0.5, 0.5], [0.25, 2.0, 0.5]], dtype=np.float32)
  check(lambda t: getattr(t, op)(0.5), lambda t: getattr(torch, op)(t, torch.tensor(0.5)), x)


def test_clip_passes_the_gradient_inside_and_on_the_bounds_like_torch_clamp():
  x = np.array([[-2.0, -0.5, 0.0, 0.3], [0.5, 0.7, 1.5, -0.5]], dtype=np.float32)   # exact hits of both bounds
  check(lambda t: t.clip(-0.5, 0.5), lambda t: torch.clamp(t, -0.5, 0.5), x)
  check(lambda t: t.clip(min_=0.0), lambda t: torch.clamp(t, min=0.0), x)
  check(lambda t: t.clip(max_=0.3), lambda t: torch.clamp(t, max=0.3), x)


def test_clip_with_tensor_bounds():
  # lo < hi everywhere: where the bounds cross, torch.clamp hands the gradient to both bounds at once
  x, lo, hi = randn(3, 4, seed=14) * 2, -positive(4, seed=15), positive(3, 1, seed=16)
  x[0, :] = lo   # ties with tensor bounds too
  x[1, 0] = hi[1, 0]
  check(lambda t, a, b: t.clip(a, b), lambda t, a, b: torch.clamp(t, a, b), x, lo, hi)


def test_where_sends_the_gradient_to_the_chosen_branch_with_broadcasting():
  cond = np.random.default_rng(17).random((3, 1, 5)) > 0.5
  a, b = randn(3, 4, 5, seed=18), randn(5, seed=19)
  check(lambda c, x, y: c.where(x, y), torch.where, cond, a, b)
  check(lambda c, x: c.where(x, 0.5), lambda c, x: torch.where(c, x, torch.tensor(0.5)), cond, a)
  check(lambda c, y: c.where(-1.0, y), lambda c, y: torch.where(c, torch.tensor(-1.0), y), cond, b)


def test_comparisons_and_logic_match_torch():
  a, b = randn(3, 4, seed=20), randn(4, seed=21)
  a[0] = b
  ta, tb = torch.tensor(a), torch.tensor(b)
  x, y = Tensor(a), Tensor(b)
  pairs = [(x < y, ta < tb), (x > y, ta > tb), (x <= y, ta <= tb), (x >= y, ta >= tb), (x == y, ta == tb), (x != y, ta != tb),
           ((x > 0) & (y > 0), (ta > 0) & (tb > 0)), ((x > 0) | (y > 0), (ta > 0) | (tb > 0)), (~(x > 0), ~(ta > 0))]
  for k, (u, t) in enumerate(pairs): np.testing.assert_array_equal(u.numpy(), t.numpy(), err_msg=f"comparison {k}")


# ---- reductions ----------------------------------------------------------------------------------------------------

AXES = [None, 0, -1, (0, 2), (1,)]


def _dim(axis, ndim): return tuple(range(ndim)) if axis is None else axis


@pytest.mark.parametrize("keepdim", [False, True])
@pytest.mark.parametrize("axis", AXES, ids=str)
@pytest.mark.parametrize("op", ["sum", "mean"])
def test_sum_and_mean_over_axes(op, axis, keepdim):
  x = randn(3, 4, 5, seed=22)
  check(lambda t: getattr(t, op)(axis, keepdim=keepdim), lambda t: getattr(torch, op)(t, _dim(axis, 3), keepdim=keepdim), x)


@pytest.mark.parametrize("keepdim", [False, True])
@pytest.mark.parametrize("axis", AXES, ids=str)
@pytest.mark.parametrize("op", ["max", "min"])
def test_max_and_min_split_the_gradient_evenly_among_tied_extremes(op, axis, keepdim):
  # small integers: many ties. torch.amax/amin split evenly among the extremes (torch.max(dim) would pick one index)
  x = np.random.default_rng(23).integers(0, 3, (3, 4, 5)).astype(np.float32)
  t_op = torch.amax if op == "max" else torch.amin
  check(lambda t: getattr(t, op)(axis, keepdim=keepdim), lambda t: t_op(t, _dim(axis, 3), keepdim=keepdim), x)


@pytest.mark.parametrize("correction", [0, 1])
@pytest.mark.parametrize("axis", AXES, ids=str)
@pytest.mark.parametrize("op", ["var", "std"])
def test_var_and_std_with_correction(op, axis, correction):
  for keepdim in (False, True):
    check(lambda t: getattr(t, op)(axis, keepdim=keepdim, correction=correction),
          lambda t: getattr(torch, op)(t, _dim(axis, 3), keepdim=keepdim, correction=correction), randn(3, 4, 5, seed=24))


def test_argmax_argmin_pick_the_first_extreme_like_torch():
  x = np.random.default_rng(25).integers(0, 3, (3, 4, 5)).astype(np.float32)
  t, u = torch.tensor(x), Tensor(x)
  for axis in (0, 1, -1):
    np.testing.assert_array_equal(u.argmax(axis).numpy(), torch.argmax(t, axis).numpy())
    np.testing.assert_array_equal(u.argmin(axis, keepdim=True).numpy(), torch.argmin(t, axis, keepdim=True).numpy())
  assert u.argmax().item() == torch.argmax(t).item()


def test_any_and_all_match_torch():
  x = np.random.default_rng(26).random((3, 4)) > 0.7
  u, t = Tensor(x), torch.tensor(x)
  for axis in (0, 1):
    np.testing.assert_array_equal(u.any(axis).numpy(), torch.any(t, axis).numpy())
    np.testing.assert_array_equal(u.all(axis).numpy(), torch.all(t, axis).numpy())


# ---- movement ------------------------------------------------------------------------------------------------------

def _torch_slices(t: torch.Tensor, slices: tuple) -> torch.Tensor:
  """t[slices] for slices with any steps (torch refuses negative ones): one index_select per axis."""
  for ax, sl in enumerate(slices): t = t.index_select(ax, torch.tensor(np.arange(t.shape[ax])[sl].copy(), dtype=torch.int64))
  return t


MOVEMENT = {
  "reshape": (lambda x: x.reshape(4, -1, 3), lambda t: t.reshape(4, -1, 3)),
  "permute": (lambda x: x.permute(2, 0, 1), lambda t: t.permute(2, 0, 1)),
  "transpose": (lambda x: x.transpose(0, 2), lambda t: t.transpose(0, 2)),
  "T": (lambda x: x.T, lambda t: t.permute(2, 1, 0)),
  "expand": (lambda x: x[:, :1].expand(2, 3, 5, 4), lambda t: t[:, :1].expand(2, -1, 5, -1)),
  "broadcast_to": (lambda x: x[:1].broadcast_to(2, 3, 5, 4), lambda t: t[:1].broadcast_to(2, 3, 5, 4)),
  "squeeze": (lambda x: x[:, 1:2].squeeze(1), lambda t: t[:, 1:2].squeeze(1)),
  "squeeze_all": (lambda x: x[:1, 1:2].squeeze(), lambda t: t[:1, 1:2].squeeze()),
  "unsqueeze": (lambda x: x.unsqueeze(1).unsqueeze(-1), lambda t: t.unsqueeze(1).unsqueeze(-1)),
  "flatten": (lambda x: x.flatten(1), lambda t: t.flatten(1)),
  "flatten_all": (lambda x: x.flatten(), lambda t: t.flatten()),
  "shrink": (lambda x: x.shrink(((1, 3), None, (2, 4))), lambda t: t[1:3, :, 2:4]),
  "flip": (lambda x: x.flip((0, 2)), lambda t: torch.flip(t, (0, 2))),
  "flip_one": (lambda x: x.flip(1), lambda t: torch.flip(t, (1,))),
  "repeat": (lambda x: x.repeat(2, 1, 1, 2), lambda t: t.repeat(2, 1, 1, 2)),
  "index_int": (lambda x: x[1, :, -1], lambda t: t[1, :, -1]),
  "index_none_ellipsis": (lambda x: x[None, ..., 1:3], lambda t: t[None, ..., 1:3]),
}


@pytest.mark.parametrize("name", list(MOVEMENT))
def test_movement_op_and_its_gradient_match_torch(name):
  check(*MOVEMENT[name], randn(3, 5, 4, seed=27))


STEP_SLICES = [
  (slice(None, None, 2), slice(1, None, 3), slice(None)),
  (slice(None, None, -1), slice(None), slice(3, 0, -2)),
  (slice(2, None, -1), slice(4, 1, -1), slice(None, None, -3)),
  (slice(-1, -4, -2), slice(None, None, 4), slice(1, 2)),
  (slice(0, 0), slice(None), slice(None)),
]


@pytest.mark.parametrize("slices", STEP_SLICES, ids=str)
def test_slicing_with_positive_and_negative_steps_pads_the_gradient_back(slices):
  check(lambda x: x[slices], lambda t: _torch_slices(t, slices), randn(3, 5, 4, seed=28))


PADS = [((1, 2), (0, 0), (0, 3)), ((0, 0), (2, 1), (1, 1)), ((1, -1), (-2, 1), (0, -1))]


@pytest.mark.parametrize("value", [0.0, -1.5])
@pytest.mark.parametrize("pads", PADS, ids=str)
def test_pad_with_numpy_pairs_matches_torch_reversed_pairs(pads, value):
  # uopc takes numpy.pad's (before, after) per axis from the first; F.pad takes flat pairs from the last axis
  flat = [w for pair in reversed(pads) for w in pair]
  check(lambda x: x.pad(pads, value=value), lambda t: F.pad(t, flat, value=value), randn(3, 5, 4, seed=29))


@pytest.mark.parametrize("dim", [0, 1, -1])
def test_cat_of_equal_and_unequal_pieces(dim):
  base = randn(3, 5, 4, seed=30)
  other = list(base.shape)
  other[dim] = 2
  a, b = randn(*base.shape, seed=31), randn(*other, seed=32)
  check(lambda x, y: Tensor.cat(x, y, dim=dim), lambda x, y: torch.cat([x, y], dim), base, a)
  check(lambda x, y, z: x.cat(y, z, dim=dim), lambda x, y, z: torch.cat([x, y, z], dim), base, b, a)


@pytest.mark.parametrize("dim", [0, 1, -1])
def test_stack_sends_each_piece_its_slice_of_the_gradient(dim):
  a, b, c = randn(3, 4, seed=33), randn(3, 4, seed=34), randn(3, 4, seed=35)
  check(lambda x, y, z: Tensor.stack(x, y, z, dim=dim), lambda x, y, z: torch.stack([x, y, z], dim), a, b, c)


def test_split_and_chunk_give_pieces_whose_gradients_reassemble():
  x = randn(7, 3, 4, seed=36)
  check(lambda t: t.split([2, 4, 1]), lambda t: list(torch.split(t, [2, 4, 1])), x)
  check(lambda t: t.split(3), lambda t: list(torch.split(t, 3)), x)
  check(lambda t: t.chunk(3), lambda t: list(torch.chunk(t, 3)), x)
  check(lambda t: t.chunk(2, dim=-1), lambda t: list(torch.chunk(t, 2, dim=-1)), x)


def test_gather_with_an_integer_tensor_accumulates_the_gradient_of_duplicates():
  x = randn(5, 3, 4, seed=37)
  idx = np.array([2, 0, 2, -1, 4, 2], dtype=np.int32)
  check(lambda t, i: t[i], lambda t, i: t[i], x, idx)
  check(lambda t, i: t[:, i], lambda t, i: t[:, i], x, np.array([[0, 1], [1, 1], [2, -3]], dtype=np.int32))
  check(lambda t, i: t[..., i], lambda t, i: t[..., i], x, np.array([3, 3, 0], dtype=np.int32))


def test_gather_with_several_index_tensors_follows_numpy_placement():
  x = randn(5, 3, 4, seed=38)
  i, j = np.array([[0, 4], [4, 1]], dtype=np.int32), np.array([2, 2], dtype=np.int32)
  check(lambda t, a, b: t[a, b], lambda t, a, b: t[a, b], x, i, j)           # adjacent: index dims replace the axes
  check(lambda t, a, b: t[a, :, b], lambda t, a, b: t[a, :, b], x, i, j)     # separated: index dims go first
  check(lambda t, b: t[1:, b], lambda t, b: t[1:, b], x, j)


def test_torch_style_gather_along_a_dim():
  x = randn(4, 5, seed=39)
  idx = np.random.default_rng(39).integers(0, 5, (3, 5)).astype(np.int32)
  check(lambda t, i: t.gather(1, i), lambda t, i: torch.gather(t, 1, i), x, idx[:, :4].copy())
  check(lambda t, i: t.gather(0, i), lambda t, i: torch.gather(t, 0, i), x, np.clip(idx, 0, 3).astype(np.int32))


def test_embedding_scatters_the_gradient_of_repeated_tokens():
  w = randn(6, 4, seed=40)
  idx = np.array([[1, 5, 1], [0, 1, 5]], dtype=np.int32)
  check(lambda i, t: i.embedding(t), lambda i, t: F.embedding(i, t), idx, w)


# ---- linear algebra and nn -----------------------------------------------------------------------------------------

MATMUL_SHAPES = [((3, 4), (4, 5)), ((2, 3, 4), (4, 5)), ((2, 1, 3, 4), (3, 4, 5)), ((4,), (4, 5)), ((2, 3, 4), (4,)), ((4,), (4,)),
                 ((3, 4), (2, 4, 5))]


@pytest.mark.parametrize("shapes", MATMUL_SHAPES, ids=str)
def test_matmul_batched_broadcast_and_vector_operands(shapes):
  check(lambda a, b: a @ b, torch.matmul, randn(*shapes[0], seed=41), randn(*shapes[1], seed=42))


def test_linear_with_and_without_bias():
  x, w, b = randn(2, 3, 4, seed=43), randn(5, 4, seed=44), randn(5, seed=45)
  check(lambda x, w, b: x.linear(w, b), F.linear, x, w, b)
  check(lambda x, w: x.linear(w), F.linear, x, w)


CONVS = [  # (input shape, weight shape, stride, padding, dilation, groups)
  ((2, 4, 7, 7), (6, 4, 3, 3), 1, 0, 1, 1),
  ((2, 4, 7, 7), (6, 4, 3, 3), 2, 1, 1, 1),
  ((2, 4, 7, 6), (6, 2, 3, 3), 1, 1, 1, 2),
  ((2, 4, 8, 8), (8, 1, 3, 3), 2, 2, 2, 4),
  ((1, 3, 7, 6), (4, 3, 3, 2), (2, 1), (1, 0), (1, 2), 1),
]


@pytest.mark.parametrize("case", CONVS, ids=str)
def test_conv2d_gradients_of_input_weight_and_bias(case):
  xs, ws, stride, padding, dilation, groups = case
  x, w, b = randn(*xs, seed=46), randn(*ws, seed=47), randn(ws[0], seed=48)
  check(lambda x, w, b: x.conv2d(w, b, stride, padding, dilation, groups),
        lambda x, w, b: F.conv2d(x, w, b, stride, padding, dilation, groups), x, w, b)


POOLS = [(2, None, 0), (3, 2, 1), ((3, 2), (1, 2), (1, 0))]


@pytest.mark.parametrize("case", POOLS, ids=str)
def test_max_pool2d_sends_the_gradient_to_each_window_maximum(case):
  kernel, stride, padding = case
  x = np.random.default_rng(49).permutation(2 * 3 * 8 * 7).reshape(2, 3, 8, 7).astype(np.float32) / 50   # distinct: no ties
  check(lambda t: t.max_pool2d(kernel, stride, padding), lambda t: F.max_pool2d(t, kernel, stride, padding), x)


@pytest.mark.parametrize("case", POOLS, ids=str)
def test_avg_pool2d_counts_the_padding_like_torch(case):
  kernel, stride, padding = case   # torch's default count_include_pad=True: the window mean includes padded zeros
  check(lambda t: t.avg_pool2d(kernel, stride, padding), lambda t: F.avg_pool2d(t, kernel, stride, padding), randn(2, 3, 8, 7, seed=50))


@pytest.mark.parametrize("axis", [-1, 0, 1])
def test_softmax_and_log_softmax(axis):
  x = randn(3, 4, 5, seed=51) * 3
  check(lambda t: t.softmax(axis), lambda t: torch.softmax(t, axis), x)
  check(lambda t: t.log_softmax(axis), lambda t: torch.log_softmax(t, axis), x)


@pytest.mark.parametrize("label_smoothing", [0.0, 0.1])
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_cross_entropy_with_ignore_index_reduction_and_label_smoothing(reduction, label_smoothing):
  logits = randn(6, 5, seed=52) * 2
  target = np.array([1, 4, -100, 0, 4, 2], dtype=np.int32)
  kw = dict(reduction=reduction, label_smoothing=label_smoothing)
  check(lambda x, y: x.cross_entropy(y, **kw), lambda x, y: F.cross_entropy(x, y, **kw), logits, target)
  target2 = np.array([1, 4, 3, 0, 3, 2], dtype=np.int32)   # a real class as ignore_index
  check(lambda x, y: x.cross_entropy(y, ignore_index=3, **kw), lambda x, y: F.cross_entropy(x, y, ignore_index=3, **kw), logits, target2)


def test_cross_entropy_of_spatial_logits():
  logits, target = randn(2, 5, 3, seed=53), np.array([[0, 4, 2], [1, -100, 3]], dtype=np.int32)
  check(lambda x, y: x.cross_entropy(y), F.cross_entropy, logits, target)
  check(lambda x, y: x.cross_entropy(y, reduction="none"), lambda x, y: F.cross_entropy(x, y, reduction="none"), logits, target)


def test_layernorm_without_affine_matches_torch_layer_norm():
  x = randn(2, 3, 8, seed=54) * 2 + 1
  check(lambda t: t.layernorm(), lambda t: F.layer_norm(t, (8,)), x)
  check(lambda t: t.layernorm((-2, -1), eps=1e-3), lambda t: F.layer_norm(t, (3, 8), eps=1e-3), x)


@pytest.mark.parametrize("is_causal", [False, True])
def test_scaled_dot_product_attention(is_causal):
  q, k, v = randn(2, 3, 5, 8, seed=55), randn(2, 3, 5, 8, seed=56), randn(2, 3, 5, 4, seed=57)
  check(lambda q, k, v: q.scaled_dot_product_attention(k, v, is_causal=is_causal),
        lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=is_causal), q, k, v)


@pytest.mark.parametrize("L, S", [(7, 7), (9, 6), (5, 8)])
def test_causal_attention_in_blocks_of_queries(L, S, monkeypatch):
  # blocks of 2 queries (a long attention's blocks of 64, made small): each block against the keys up to its last query
  import uopc.tensor.attention as attention
  monkeypatch.setattr(attention, "CAUSAL_BLOCK", 2)
  q, k, v = randn(2, 3, L, 8, seed=63), randn(2, 3, S, 8, seed=64), randn(2, 3, S, 4, seed=65)
  check(lambda q, k, v: q.scaled_dot_product_attention(k, v, is_causal=True, scale=0.4),
        lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=0.4), q, k, v)


def test_causal_attention_in_blocks_at_a_size_whose_keys_are_packed_once_for_every_block():
  # nanoGPT's blocks (4 of 64 queries at context 256), big enough that the C backend packs the keys into panels: one pack
  # of the whole keys, which each block's GEMMs read the first panels of (uopc.opt._in_panels)
  q, k, v = randn(2, 2, 256, 64, seed=66), randn(2, 2, 256, 64, seed=67), randn(2, 2, 256, 64, seed=68)
  check(lambda q, k, v: q.scaled_dot_product_attention(k, v, is_causal=True),
        lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True), q, k, v)


def test_scaled_dot_product_attention_with_masks_scale_and_longer_keys():
  q, k, v = randn(2, 4, 8, seed=58), randn(2, 6, 8, seed=59), randn(2, 6, 3, seed=60)
  keep = np.random.default_rng(61).random((4, 6)) > 0.4
  keep[:, 0] = True   # every query sees at least one key
  bias = randn(4, 6, seed=62)
  check(lambda q, k, v, m: q.scaled_dot_product_attention(k, v, attn_mask=m), lambda q, k, v, m: F.scaled_dot_product_attention(q, k, v, m),
        q, k, v, keep)
  check(lambda q, k, v, m: q.scaled_dot_product_attention(k, v, attn_mask=m, scale=0.3),
        lambda q, k, v, m: F.scaled_dot_product_attention(q, k, v, m, scale=0.3), q, k, v, bias)
  check(lambda q, k, v: q.scaled_dot_product_attention(k, v, is_causal=True),   # L < S: torch's mask is tril(ones(L, S)) too
        lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True), q, k, v)


# ---- nn modules: copy uopc's initial weights into torch's modules ------------------------------------------------------

def _module_check(mod_u, mod_t, names: list[str], x: np.ndarray, tol: float = TOL) -> None:
  with torch.no_grad():
    for n in names: getattr(mod_t, n).copy_(torch.tensor(getattr(mod_u, n).numpy()))
  xu, xt = Tensor(x, requires_grad=x.dtype == np.float32), _torch_of(x)
  leaves = {n: (getattr(mod_u, n), getattr(mod_t, n)) for n in names}
  if x.dtype == np.float32: leaves["input"] = (xu, xt)
  compare(mod_u(xu), mod_t(xt), leaves, tol=tol)


def test_linear_module_and_its_parameter_gradients():
  _module_check(nn.Linear(4, 5), torch.nn.Linear(4, 5), ["weight", "bias"], randn(2, 3, 4, seed=63))
  _module_check(nn.Linear(4, 5, bias=False), torch.nn.Linear(4, 5, bias=False), ["weight"], randn(3, 4, seed=64))


def test_layernorm_module_with_affine_parameters():
  mod = nn.LayerNorm(8)
  mod.weight.assign(Tensor(randn(8, seed=65) + 1))   # away from the ones/zeros start, so the forward checks the affine part
  mod.bias.assign(Tensor(randn(8, seed=66)))
  _module_check(mod, torch.nn.LayerNorm(8), ["weight", "bias"], randn(2, 3, 8, seed=67))
  _module_check(nn.LayerNorm((3, 8)), torch.nn.LayerNorm((3, 8)), ["weight", "bias"], randn(2, 3, 8, seed=68))


def test_conv2d_module_and_its_parameter_gradients():
  mu, mt = nn.Conv2d(4, 6, 3, stride=2, padding=1, groups=2), torch.nn.Conv2d(4, 6, 3, stride=2, padding=1, groups=2)
  _module_check(mu, mt, ["weight", "bias"], randn(2, 4, 7, 6, seed=69))


def test_embedding_module_and_its_weight_gradient():
  _module_check(nn.Embedding(6, 4), torch.nn.Embedding(6, 4), ["weight"], np.array([[1, 5, 1], [0, 1, 5]], dtype=np.int32))


# ---- optimizers: same parameters, same losses, same hyperparameters ------------------------------------------------------

OPTIMIZERS = {
  "sgd": (lambda p: nn.SGD(p, lr=0.1), lambda p: torch.optim.SGD(p, lr=0.1)),
  "sgd_momentum": (lambda p: nn.SGD(p, lr=0.05, momentum=0.9), lambda p: torch.optim.SGD(p, lr=0.05, momentum=0.9)),
  "sgd_momentum_decay_nesterov": (lambda p: nn.SGD(p, lr=0.05, momentum=0.8, weight_decay=0.1, nesterov=True),
                                  lambda p: torch.optim.SGD(p, lr=0.05, momentum=0.8, weight_decay=0.1, nesterov=True)),
  "sgd_decay": (lambda p: nn.SGD(p, lr=0.1, weight_decay=0.05), lambda p: torch.optim.SGD(p, lr=0.1, weight_decay=0.05)),
  "adam": (lambda p: nn.Adam(p, lr=0.02), lambda p: torch.optim.Adam(p, lr=0.02)),
  "adam_decay": (lambda p: nn.Adam(p, lr=0.02, betas=(0.8, 0.99), eps=1e-6, weight_decay=0.1),
                 lambda p: torch.optim.Adam(p, lr=0.02, betas=(0.8, 0.99), eps=1e-6, weight_decay=0.1)),
  "adamw": (lambda p: nn.AdamW(p, lr=0.02), lambda p: torch.optim.AdamW(p, lr=0.02)),
  "adamw_decay": (lambda p: nn.AdamW(p, lr=0.02, weight_decay=0.3), lambda p: torch.optim.AdamW(p, lr=0.02, weight_decay=0.3)),
}


@pytest.mark.parametrize("name", list(OPTIMIZERS))
def test_optimizer_steps_move_parameters_like_torch_optim(name):
  make_u, make_t = OPTIMIZERS[name]
  init = [randn(4, 3, seed=70), randn(3, seed=71)]
  x, y = randn(5, 4, seed=72), randn(5, 3, seed=73)
  pu = [Tensor(a, requires_grad=True) for a in init]
  pt = [torch.tensor(a, requires_grad=True) for a in init]
  opt_u, opt_t = make_u(pu), make_t(pt)
  for step in range(4):   # one step, then several: momentum buffers and Adam's moments carry over
    opt_u.zero_grad()
    opt_t.zero_grad()
    loss_u = ((Tensor(x) @ pu[0] + pu[1] - Tensor(y)) ** 2).mean()
    loss_t = ((torch.tensor(x) @ pt[0] + pt[1] - torch.tensor(y)) ** 2).mean()
    loss_u.backward()
    loss_t.backward()
    assert_close(np.array(loss_u.item(), dtype=np.float32), loss_t.detach().numpy(), f"loss before step {step}")
    opt_u.step()
    opt_t.step()
    for k, (a, b) in enumerate(zip(pu, pt)): assert_close(a.numpy(), b.detach().numpy(), f"parameter {k} after step {step + 1}")


# ---- safetensors interop -------------------------------------------------------------------------------------------

def _interop_arrays() -> dict[str, np.ndarray]:
  rng = np.random.default_rng(74)
  return {"f32": rng.standard_normal((3, 4)).astype(np.float32), "f16": rng.standard_normal((2, 5)).astype(np.float16),
          "i32": rng.integers(-1000, 1000, (7,)).astype(np.int32), "bool": rng.random((2, 3)) > 0.5,
          "scalar": np.array(2.5, dtype=np.float32), "scalar_i32": np.array(-7, dtype=np.int32),
          "empty": np.zeros((0, 3), dtype=np.float32), "layers.0.weight": rng.standard_normal((2, 2, 2)).astype(np.float32)}


def test_safe_save_writes_what_the_safetensors_library_reads(tmp_path):
  from safetensors.numpy import load_file
  from safetensors import safe_open
  arrays = _interop_arrays()
  nn.safe_save({k: Tensor(v) for k, v in arrays.items()}, tmp_path / "m.safetensors", metadata={"step": 3})
  loaded = load_file(str(tmp_path / "m.safetensors"))
  assert set(loaded) == set(arrays)
  for k, v in arrays.items():
    assert loaded[k].dtype == v.dtype and loaded[k].shape == v.shape, f"{k}: {loaded[k].dtype}{loaded[k].shape}, expected {v.dtype}{v.shape}"
    np.testing.assert_array_equal(loaded[k], v, err_msg=k)
  with safe_open(str(tmp_path / "m.safetensors"), framework="numpy") as f: assert f.metadata() == {"step": "3"}


def test_safe_load_reads_what_the_safetensors_library_writes(tmp_path):
  from safetensors.numpy import save_file
  arrays = _interop_arrays()
  save_file(arrays, str(tmp_path / "lib.safetensors"), metadata={"format": "np"})
  loaded = nn.safe_load(tmp_path / "lib.safetensors")
  assert set(loaded) == set(arrays)
  for k, v in arrays.items():
    got = loaded[k].numpy()
    assert got.dtype == v.dtype and got.shape == v.shape, f"{k}: {got.dtype}{got.shape}, expected {v.dtype}{v.shape}"
    np.testing.assert_array_equal(got, v, err_msg=k)


def test_state_dict_round_trips_through_safetensors_into_torch(tmp_path):
  from safetensors.numpy import load_file
  mod = nn.Linear(4, 3)
  nn.safe_save(nn.get_state_dict(mod), tmp_path / "lin.safetensors")
  tmod = torch.nn.Linear(4, 3)
  tmod.load_state_dict({k: torch.tensor(v) for k, v in load_file(str(tmp_path / "lin.safetensors")).items()})
  x = randn(2, 4, seed=75)
  assert_close(mod(Tensor(x)).numpy(), tmod(torch.tensor(x)).detach().numpy(), "Linear forward after the round trip")
