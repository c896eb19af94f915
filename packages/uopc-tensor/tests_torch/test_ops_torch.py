"""PyTorch as the oracle for the rest of the Tensor API users reach for (issue 12): torch-named ops and aliases, unary
math and activations, rounding modes, pow at its edges, reductions, scans and sorting, each forward and backward, on
shapes with 0- and 1-sized axes and 0-d tensors, with NaN, inf, -0.0 and i32 extremes where the op takes them; the
errors, of the kinds torch raises; and the edges a review found. Movement, gathers and scatters are in
test_shapes_torch, convolutions, pooling, resampling, einsum, the losses and attention in test_functional_torch.

The helpers come from test_grad_torch (same data, same tolerances): check() runs an op on the same arrays in both
libraries and compares the outputs and every float input's gradient. exact() compares integer and bool results bit for
bit, forward() float results without gradients (for values where the gradient is not defined or not the point).
"""
import numpy as np
import pytest
import torch
import torch.nn.functional as F
from uopc.tensor import Tensor, TensorError
from test_grad_torch import check, assert_close, randn, positive

INF, NAN = float("inf"), float("nan")
I32_MIN, I32_MAX = -2**31, 2**31 - 1
SPECIAL = np.array([-INF, INF, NAN, -0.0, 0.0], dtype=np.float32)
ints = lambda *v: np.array(v, dtype=np.int32)
floats = lambda *v: np.array(v, dtype=np.float32)


def exact(u: Tensor, t: torch.Tensor, what: str = "") -> None:
  """Integer or bool results equal exactly (uopc's i32 against torch's int64)."""
  a, b = u.numpy(), t.detach().numpy()
  assert a.shape == b.shape, f"{what}: shape {a.shape}, torch has {b.shape}"
  assert (a.dtype == bool) == (b.dtype == bool) and (a.dtype.kind in "iu") == (b.dtype.kind in "iu"), f"{what}: dtype {a.dtype} vs {b.dtype}"
  np.testing.assert_array_equal(a.astype(b.dtype), b, err_msg=what)


def forward(f_uopc, f_torch, *arrays: np.ndarray, tol: float = 1e-4) -> None:
  """Outputs only: float results close (NaN where torch has NaN), integer and bool ones exact."""
  us = [Tensor(a) for a in arrays]
  ts = [torch.tensor(a.astype(np.int64) if a.dtype.kind in "iu" else a) for a in arrays]
  out_u, out_t = f_uopc(*us), f_torch(*ts)
  for k, (ou, ot) in enumerate(zip(*(o if isinstance(o, (tuple, list)) else (o,) for o in (out_u, out_t)))):
    if ot.dtype.is_floating_point: assert_close(ou.numpy(), ot.detach().numpy(), f"output {k}", tol)
    else: exact(ou, ot, f"output {k}")


def raises_like_torch(f_uopc, f_torch, *arrays: np.ndarray, kind=RuntimeError) -> None:
  """Both libraries refuse the input, with an error of `kind` (uopc's is a TensorError too)."""
  with pytest.raises(kind): f_torch(*[torch.tensor(a.astype(np.int64) if a.dtype.kind in "iu" else a) for a in arrays])
  with pytest.raises(kind) as e: f_uopc(*[Tensor(a) for a in arrays])
  assert isinstance(e.value, TensorError), f"{type(e.value).__name__}: {e.value}"


# ---- unary math and activations -------------------------------------------------------------------------------------

REALS = floats(-3.5, -1.0, -0.3, -0.0, 0.0, 1e-4, 0.7, 2.5, 9.0)
UNIT = floats(-0.99, -0.5, -0.1, -0.0, 0.0, 1e-4, 0.3, 0.8, 0.97)       # (-1, 1): asin, acos, atanh
ABOVE_ONE = floats(1.001, 1.2, 2.0, 3.5, 10.0, 50.0, 300.0, 1.5, 7.0)  # acosh

UNARY = {  # name: (uopc, torch, finite values for forward and backward)
  "erf": (lambda x: x.erf(), torch.erf, REALS),
  "expm1": (lambda x: x.expm1(), torch.expm1, REALS),
  "log1p": (lambda x: x.log1p(), torch.log1p, floats(-0.9, -0.3, -1e-5, -0.0, 0.0, 1e-4, 0.05, 2.0, 30.0)),
  "log10": (lambda x: x.log10(), torch.log10, np.abs(REALS) + 0.1),
  "log2": (lambda x: x.log2(), torch.log2, np.abs(REALS) + 0.1),
  "exp2": (lambda x: x.exp2(), torch.exp2, REALS),
  "reciprocal": (lambda x: x.reciprocal(), torch.reciprocal, REALS + 0.05),
  "neg": (lambda x: x.neg(), torch.neg, REALS),
  "sinh": (lambda x: x.sinh(), torch.sinh, REALS),
  "cosh": (lambda x: x.cosh(), torch.cosh, REALS),
  "atan": (lambda x: x.atan(), torch.atan, floats(-300.0, -2.0, -0.5, -0.0, 0.0, 0.3, 0.9, 1.1, 297.0)),
  "asin": (lambda x: x.asin(), torch.asin, UNIT),
  "acos": (lambda x: x.acos(), torch.acos, UNIT),
  "asinh": (lambda x: x.asinh(), torch.asinh, floats(-300.0, -2.0, -0.05, -0.0, 0.0, 1e-3, 0.5, 3.0, 303.0)),
  "acosh": (lambda x: x.acosh(), torch.acosh, ABOVE_ONE),
  "atanh": (lambda x: x.atanh(), torch.atanh, UNIT),
  "softplus": (lambda x: x.softplus(), F.softplus, floats(-400.0, -20.0, -1.0, -0.0, 0.0, 0.5, 19.0, 21.0, 400.0)),
  "softplus_beta": (lambda x: x.softplus(beta=3), lambda t: F.softplus(t, beta=3), REALS),
  "softsign": (lambda x: x.softsign(), F.softsign, REALS),
  "elu": (lambda x: x.elu(0.5), lambda t: F.elu(t, 0.5), floats(-400.0, -3.0, -0.5, -0.0, 0.0, 0.5, 2.0, 88.0, 400.0)),
  "selu": (lambda x: x.selu(), F.selu, REALS),
  "celu": (lambda x: x.celu(2.0), lambda t: F.celu(t, 2.0), REALS),
  "hardswish": (lambda x: x.hardswish(), F.hardswish, floats(-5.0, -2.5, -1.0, -0.0, 0.0, 0.5, 2.9, 3.5, 7.0)),
  "hardsigmoid": (lambda x: x.hardsigmoid(), F.hardsigmoid, floats(-400.0, -2.5, -1.0, -0.0, 0.0, 0.5, 2.9, 3.5, 400.0)),
  "hardtanh": (lambda x: x.hardtanh(-2.0, 2.0), lambda t: F.hardtanh(t, -2.0, 2.0), REALS),
  "relu6": (lambda x: x.relu6(), F.relu6, floats(-3.0, -0.5, -0.0, 0.0, 1.0, 5.9, 6.5, 10.0, 2.0)),
  "mish": (lambda x: x.mish(), F.mish, REALS),
  "logsigmoid": (lambda x: x.logsigmoid(), F.logsigmoid, floats(-400.0, -20.0, -1.0, -0.0, 0.0, 0.5, 19.0, 21.0, 400.0)),
  "gelu_erf": (lambda x: x.gelu(approximate="none"), F.gelu, floats(-400.0, -3.0, -1.0, -0.0, 0.0, 0.5, 2.0, 5.0, 400.0)),
  "quick_gelu": (lambda x: x.quick_gelu(), lambda t: t * torch.sigmoid(1.702 * t), REALS),
  "cos_far": (lambda x: x.cos(), torch.cos, floats(1e6, -1e6, 1e5, -3e4, 12345.6, 0.0, -0.0, 3.0, 1e7)),
  "tan_far": (lambda x: x.tan(), torch.tan, floats(1e6, -1e6, 1e5, -3e4, 12345.6, 0.0, -0.0, 1.5, 1e7)),
  "sin_far": (lambda x: x.sin(), torch.sin, floats(1e6, -1e6, 1e5, -3e4, 12345.6, 0.0, -0.0, 3.0, 1e7)),
}


@pytest.mark.parametrize("name", list(UNARY))
def test_unary_op_value_and_gradient_on_a_row_a_scalar_and_an_empty_tensor(name):
  f_u, f_t, vals = UNARY[name]
  check(f_u, f_t, vals.reshape(1, -1).copy())                   # a 1-sized axis, -0.0 and values at the edges
  check(f_u, f_t, np.array(vals[6], dtype=np.float32))           # 0-d
  check(f_u, f_t, np.zeros((0, 3), dtype=np.float32))           # empty


# torch's CPU gelu (approximate="none") gives NaN at +inf, where x * Phi(x) is +inf (uopc's value)
@pytest.mark.parametrize("name", [n for n in UNARY if n != "gelu_erf"])
def test_unary_op_takes_nan_and_the_infinities_like_torch(name):
  f_u, f_t, _ = UNARY[name]
  forward(f_u, f_t, SPECIAL)


def test_activations_saturate_without_nan_gradients_far_out():
  x = floats(-400, -350, -300, -100, 100, 300, 350, 400)
  for f_u, f_t in [(lambda t: t.tanh(), torch.tanh), (lambda t: t.sigmoid(), torch.sigmoid), (lambda t: t.softplus(), F.softplus),
                   (lambda t: t.erf(), torch.erf), (lambda t: t.gelu(approximate="none"), F.gelu), (lambda t: t.hardsigmoid(), F.hardsigmoid),
                   (lambda t: t.quick_gelu(), lambda t: t * torch.sigmoid(1.702 * t))]:
    check(f_u, f_t, x)


# ---- arithmetic, rounding modes, comparisons ------------------------------------------------------------------------

def test_torch_named_arithmetic_methods():
  a, b = randn(3, 4, seed=1), positive(4, seed=2)
  check(lambda x, y: x.add(y, alpha=2), lambda x, y: x.add(y, alpha=2), a, b)
  check(lambda x, y: x.sub(y, alpha=0.5), lambda x, y: x.sub(y, alpha=0.5), a, b)
  check(lambda x, y: x.mul(y), lambda x, y: x.mul(y), a, b)
  check(lambda x, y: x.div(y), lambda x, y: x.div(y), a, b)
  check(lambda x: x.clone() * 2, lambda x: x.clone() * 2, a)
  check(lambda x, y: x.lerp(y, 0.3), lambda x, y: x.lerp(y, 0.3), a, b)
  check(lambda x, y, w: x.lerp(y, w), lambda x, y, w: x.lerp(y, w), a, b, floats(0.0, 0.4, 0.5, 1.0))


@pytest.mark.parametrize("mode", [None, "trunc", "floor"])
def test_div_rounding_modes_on_integers_and_floats(mode):
  n, d = ints(7, -7, 6, -6, 0, I32_MAX, I32_MIN + 1, 5), ints(2, 2, -4, -4, 3, 3, 7, -1)
  forward(lambda a, b: a.div(b, rounding_mode=mode), lambda a, b: a.div(b, rounding_mode=mode), n, d)
  forward(lambda a, b: a.div(b, rounding_mode=mode), lambda a, b: a.div(b, rounding_mode=mode), n.astype(np.float32), d.astype(np.float32))
  forward(lambda a: a.div(-3, rounding_mode=mode), lambda a: a.div(-3, rounding_mode=mode), n)
  with pytest.raises(TypeError): Tensor(n).div(Tensor(d), rounding_mode="typo")


def test_fmod_and_remainder_take_the_sign_of_the_dividend_and_the_divisor():
  a, b = ints(-4, 7, 5, 4, -7, 8, -9, 0), ints(2, -3, 8, -2, 3, 5, -5, 3)
  for fa, fb in [(a, b), (a.astype(np.float32), b.astype(np.float32)), (a, b.astype(np.float32))]:
    forward(lambda x, y: x.fmod(y), lambda x, y: x.fmod(y), fa, fb)
    forward(lambda x, y: x.remainder(y), lambda x, y: x.remainder(y), fa, fb)


def test_copysign_logaddexp_and_isclose_at_the_edges():
  v = floats(-1.0, -0.0, 0.0, 1.0, 2.5)
  a, b = np.repeat(v, 5), np.tile(v, 5)
  check(lambda x, y: x.copysign(y), torch.copysign, a, b)
  forward(lambda x, y: x.copysign(y), torch.copysign, np.repeat(SPECIAL, 5), np.tile(SPECIAL, 5))
  check(lambda x, y: x.logaddexp(y), torch.logaddexp, floats(-1.0, -100, 1.0, 2000, 0.0), floats(-1.0, 2, 30000, 3, -INF))
  forward(lambda x, y: x.logaddexp(y), torch.logaddexp, floats(-INF, INF, -INF, NAN), floats(-INF, 1.0, 0.0, 1.0))
  x, y = np.repeat(SPECIAL, 5), np.tile(SPECIAL, 5)
  for kw in ({}, {"equal_nan": True}, {"rtol": 0.0, "atol": 0.0}):
    forward(lambda p, q: p.isclose(q, **kw), lambda p, q: p.isclose(q, **kw), x, y)
  forward(lambda p, q: p.isclose(q), lambda p, q: p.isclose(q), floats(1e-7, 1e-8, 1e-9, 1.0), floats(0.0, 0.0, 0.0, 1.0 + 1e-6))
  assert Tensor(v).allclose(Tensor(v + 1e-9)) == torch.allclose(torch.tensor(v), torch.tensor(v + 1e-9))
  for f in ("isnan", "isinf", "isfinite"): forward(lambda t: getattr(t, f)(), getattr(torch, f), SPECIAL)


def test_bitwise_ops_are_bitwise_on_integers_and_logical_on_bools():
  a = ints(3, -8, 0, I32_MIN, I32_MAX, -1, 0x1337, 5)
  b = ints(5, 3, -1, -1, I32_MIN, 12345, -77, 5)
  for op in ("__and__", "__or__", "__xor__"):
    forward(lambda x, y: getattr(x, op)(y), lambda x, y: getattr(x, op)(y), a, b)
    forward(lambda x: getattr(x, op)(0x1337), lambda x: getattr(x, op)(0x1337), a)
  forward(lambda x: 0x1337 ^ x, lambda x: 0x1337 ^ x, a)
  forward(lambda x: ~x, lambda x: ~x, a)
  forward(lambda x: x.bitwise_not(), lambda x: x.bitwise_not(), a)
  p, q = np.array([True, True, False, False]), np.array([True, False, True, False])
  for op in ("__and__", "__or__", "__xor__"): forward(lambda x, y: getattr(x, op)(y), lambda x, y: getattr(x, op)(y), p, q)
  forward(lambda x: ~x, lambda x: ~x, p)
  assert (Tensor([3]) & 5).tolist() == [1]   # was True: & on integers was logical
  with pytest.raises(TypeError): Tensor([1.5]) & 1
  with pytest.raises(TensorError, match="doesn't fit"): Tensor([0]) | 0xFFFFFFFF


def test_shifts_wrap_and_shift_arithmetically_like_torch_int32():
  a = ints(-1, -3, 1, 7, 0, I32_MIN, I32_MAX, -1)
  t = lambda v: torch.tensor(v, dtype=torch.int32)
  for k in (0, 2, 8, 31):
    exact(Tensor(a) << k, t(a) << k, f"<< {k}")
    exact(Tensor(a) >> k, t(a) >> k, f">> {k}")
  s = ints(0, 2, 8, 31, 1, 31, 30, 5)
  exact(Tensor(a) << Tensor(s), t(a) << t(s), "<< tensor")
  exact(Tensor(a) >> Tensor(s), t(a) >> t(s), ">> tensor")
  with pytest.raises(TypeError): Tensor([4.0]) >> 1
  with pytest.raises(TypeError): Tensor([4]) << 1.0


def test_min_max_minimum_maximum_at_the_i32_extremes_and_on_bools():
  a = ints(0, I32_MIN, I32_MAX, -1, 5)
  forward(lambda x: x.min(), lambda x: x.min(), a)
  forward(lambda x: x.max(), lambda x: x.max(), a)
  forward(lambda x: x.argmin(), lambda x: x.argmin(), a)
  forward(lambda x: x.argmin(), lambda x: x.argmin(), ints(I32_MIN, 0))
  for other in (I32_MAX, I32_MIN, 3):
    forward(lambda x: x.minimum(other), lambda x: torch.minimum(x, torch.tensor(other)), a)
    forward(lambda x: x.maximum(other), lambda x: torch.maximum(x, torch.tensor(other)), a)
  bools = np.array([True, False, False])
  forward(lambda x: x.minimum(3), lambda x: torch.minimum(x, torch.tensor(3)), bools)   # was [0, -1, -1]: promote first
  forward(lambda x: x.minimum(1.2), lambda x: torch.minimum(x, torch.tensor(1.2)), bools)
  forward(lambda x, y: x.minimum(y), torch.minimum, bools, np.array([True, True, False]))
  forward(lambda x: x.min(), lambda x: x.min(), bools)


# ---- pow at its edges ------------------------------------------------------------------------------------------------

EDGE_BASES = floats(-INF, -2.0, -1.0, -0.5, 0.0, 0.5, 1.0, 2.0, INF)


@pytest.mark.parametrize("c", [-1.0, -2.0, -0.3, 0.0, 0.3, 0.5, 1.0, 2.0])
def test_pow_with_a_scalar_exponent_at_zero_infinity_and_negative_bases(c):
  check(lambda x: x ** c, lambda x: x ** c, EDGE_BASES)


def test_pow_of_an_infinite_base_by_a_fraction_above_one():
  # torch's gradient c * b ** (c - 1) is inf at b = +-inf; uopc's is 0 there (see Tensor._with_gradient: no graph of b
  # has a finite value and an infinite slope at an infinite b). The values agree, and the gradients at finite bases.
  forward(lambda x: x ** 3.3, lambda x: x ** 3.3, EDGE_BASES)
  check(lambda x: x ** 3.3, lambda x: x ** 3.3, EDGE_BASES[1:-1].copy())


@pytest.mark.parametrize("base", [0.0, 0.7, -2.0, 2.0])
def test_scalar_base_to_a_tensor_power(base):
  check(lambda x: base ** x, lambda x: base ** x, floats(-2, -1, -0.5, 0, 0.3, 1, 2, 3))


def test_tensor_pow_tensor_at_the_edges():
  b = floats(0.0, 0.0, 0.0, 0.0, -INF, INF, 0.0, -2.0, -2.0, 1.0, 1.5, -1.5)
  e = floats(0.0, 0.3, -0.3, 2.0, 0.0, 0.0, -2.0, 3.0, 0.5, NAN, -1.2, 2.0)
  check(lambda x, y: x ** y, lambda x, y: x ** y, b, e)
  check(lambda x, y: x ** y, lambda x, y: x ** y, positive(3, 4, seed=3), randn(4, seed=4))


def test_integer_pow():
  a = ints(-2, 0, 2, 11, -3, 1)
  for c in (0, 1, 2, 7):
    forward(lambda x: x ** c, lambda x: x ** c, a)
  forward(lambda x: x ** 29, lambda x: x ** 29, ints(-2, 0, 2, 1, -1))
  forward(lambda x: x ** 0.5, lambda x: x ** 0.5, np.abs(a))
  forward(lambda x, y: x ** y, lambda x, y: x ** y, a, ints(3, 5, 0, 7, 3, 30))
  raises_like_torch(lambda x: x ** -2, lambda x: x ** -2, a)


# ---- reductions ------------------------------------------------------------------------------------------------------

def test_prod_with_zeros_over_axes_keepdim_scalars_and_empty_axes():
  x = randn(3, 4, 5, seed=5)
  x[0, 1, :2] = 0.0   # one zero and two zeros in a row: the gradient is the product of the others
  x[1, 2, 3] = 0.0
  for axis, kw in [(None, {}), (2, {}), (1, {"keepdim": True}), (0, {})]:
    check(lambda t: t.prod(axis, **kw), lambda t: t.prod() if axis is None else t.prod(axis, **kw), x)
  check(lambda t: t.prod(0), lambda t: t.prod(0), np.array(2.5, dtype=np.float32))
  check(lambda t: t.prod(-1), lambda t: t.prod(-1), np.array(2.5, dtype=np.float32))
  check(lambda t: t.prod(1), lambda t: t.prod(1), np.zeros((2, 0), dtype=np.float32))
  forward(lambda t: t.prod(), lambda t: t.prod(), ints(3, -7, 11, 2, 5))


def test_logsumexp_softmin_and_normalize():
  x = randn(3, 5, seed=6) * 4
  x[1] = -INF   # an all -inf row: -inf, not NaN
  for axis, kd in [(1, False), (0, True), (-1, True)]:
    check(lambda t: t.logsumexp(axis, kd), lambda t: t.logsumexp(axis, kd), randn(3, 5, seed=7) * 30)
  forward(lambda t: t.logsumexp(1), lambda t: t.logsumexp(1), x)
  check(lambda t: t.logsumexp(0), lambda t: t.logsumexp(0), np.array(1.5, dtype=np.float32))
  check(lambda t: t.softmin(1), lambda t: F.softmin(t, 1), randn(3, 5, seed=8))
  for p, dim in [(2, 1), (1, 0), (3, 1), (0, 1), (INF, 1)]:
    check(lambda t: t.normalize(p, dim), lambda t: F.normalize(t, p, dim), randn(4, 6, seed=9))


def test_var_and_std_with_no_degrees_of_freedom_left_are_infinite():
  x = randn(2, 3, seed=10)
  forward(lambda t: t.var(correction=7), lambda t: t.var(correction=7), x)
  forward(lambda t: t.std(1, correction=5), lambda t: t.std(1, correction=5), x)
  check(lambda t: t.var(1, correction=0), lambda t: t.var(1, correction=0), randn(3, 1, seed=11))
  s_u, m_u = Tensor(x).std_mean(1)
  s_t, m_t = torch.std_mean(torch.tensor(x), 1)
  assert_close(s_u.numpy(), s_t.numpy(), "std_mean std")
  assert_close(m_u.numpy(), m_t.numpy(), "std_mean mean")


def test_reductions_of_a_0d_tensor_over_axis_0_and_minus_1():
  x = np.array(1.5, dtype=np.float32)
  for op in ("sum", "mean", "max", "min", "prod", "logsumexp", "softmax", "log_softmax"):
    for axis in (0, -1):
      t_op = getattr(torch, "a" + op if op in ("max", "min") else op)   # torch.amax/amin: values only, like uopc's max/min
      check(lambda t: getattr(t, op)(axis), lambda t: t_op(t, axis), x)
  forward(lambda t: t.argmax(0), lambda t: t.argmax(0), x)
  with pytest.raises(IndexError): Tensor(x).sum(1)


def test_reductions_over_an_empty_axis_give_their_identity():
  x = np.zeros((2, 0, 3), dtype=np.float32)
  forward(lambda t: t.sum(1), lambda t: t.sum(1), x)
  forward(lambda t: t.prod(1), lambda t: t.prod(1), x)
  forward(lambda t: t.mean(1), lambda t: t.mean(1), x)
  forward(lambda t: t.any(1), lambda t: t.any(1), x)
  forward(lambda t: t.all(1), lambda t: t.all(1), x)
  forward(lambda t: t.int().sum(1), lambda t: t.int().sum(1), x)
  forward(lambda t: t.logsumexp(1), lambda t: t.logsumexp(1), x)
  forward(lambda t: t.cumsum(1), lambda t: t.cumsum(1), x)
  assert np.array_equal(Tensor(x).max(1).numpy(), np.full((2, 3), -INF))   # torch refuses; the identity of max
  assert np.array_equal(Tensor(x).int().min(1).numpy(), np.full((2, 3), I32_MAX))
  s, m = Tensor(np.zeros((1, 0, 3, 0, 5), np.float32)).std_mean(axis=(1, 3))   # several empty axes in one kernel
  assert np.isnan(Tensor.stack(s, m).numpy()).all()


# ---- scans ------------------------------------------------------------------------------------------------------------

SCAN_CASES = [((), 0), ((0, 3), 0), ((1,), 0), ((3, 5), 1), ((4, 2, 3), 0), ((2, 70), -1)]   # 70 > one block of 32


@pytest.mark.parametrize("shape,dim", SCAN_CASES, ids=str)
def test_cumsum_cumprod_logcumsumexp(shape, dim):
  x = randn(*shape, seed=12)
  check(lambda t: t.cumsum(dim), lambda t: t.cumsum(dim), x)
  check(lambda t: t.cumprod(dim), lambda t: t.cumprod(dim), (x * 0.3 + 1).astype(np.float32), tol=1e-3)
  check(lambda t: t.logcumsumexp(dim), lambda t: t.logcumsumexp(dim), x * 3)


@pytest.mark.parametrize("shape,dim", SCAN_CASES, ids=str)
def test_cummax_cummin_values_gradients_and_last_index_of_ties(shape, dim):
  x = np.random.default_rng(13).integers(0, 4, shape).astype(np.float32)   # many ties: torch's index is the last one
  for op in ("cummax", "cummin"):
    forward(lambda t: tuple(getattr(t, op)(dim)), lambda t: tuple(getattr(t, op)(dim)), x)
    check(lambda t: getattr(t, op)(dim).values, lambda t: getattr(t, op)(dim).values, randn(*shape, seed=14))


def test_scans_of_integers_and_with_special_values():
  forward(lambda t: t.cumsum(0), lambda t: t.cumsum(0).int(), ints(I32_MAX, 1, -5, 7))   # wraps like i32
  forward(lambda t: t.cumprod(0), lambda t: t.cumprod(0), ints(3, -2, 5, 0, 9))
  forward(lambda t: t.cumsum(0), lambda t: t.cumsum(0), floats(1.0, INF, -INF, 2.0))
  check(lambda t: t.cumprod(0), lambda t: t.cumprod(0), floats(2.0, 0.0, 3.0, 0.0, -1.5))
  check(lambda t: t.logcumsumexp(0), lambda t: t.logcumsumexp(0), floats(0.0, 100.0, -INF, 3.0))


# ---- sorting -----------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("descending", [False, True])
@pytest.mark.parametrize("shape,dim", [((0,), 0), ((1,), 0), ((4, 7), 1), ((4, 7), 0), ((), 0)], ids=str)
def test_sort_values_indices_and_gradient(shape, dim, descending):
  x = np.random.default_rng(15).integers(-3, 3, shape).astype(np.float32)   # ties: stable order
  forward(lambda t: tuple(t.sort(dim, descending)), lambda t: tuple(t.sort(dim=dim, descending=descending, stable=True)), x)
  check(lambda t: t.sort(dim, descending).values, lambda t: t.sort(dim=dim, descending=descending, stable=True).values, randn(*shape, seed=16))
  forward(lambda t: t.argsort(dim, descending), lambda t: t.argsort(dim=dim, descending=descending, stable=True), x)


def test_sort_puts_nan_last_and_keeps_signed_zeros_stable():
  x = floats(3.0, NAN, 1.0, NAN, -0.0, 0.0, -INF, INF)
  for d in (False, True): forward(lambda t: tuple(t.sort(descending=d)), lambda t: tuple(t.sort(descending=d, stable=True)), x)
  forward(lambda t: tuple(t.sort()), lambda t: tuple(t.sort(stable=True)), ints(5, I32_MIN, I32_MAX, 0, -1, 5))


@pytest.mark.parametrize("descending", [False, True])
def test_long_sorts_go_through_a_bitonic_network_with_the_same_results(descending, monkeypatch):
  # the network takes over above SORT_BY_COUNTING_MAX elements; lowered here so rows of 5 to 7 (8 after padding) use it
  import uopc.tensor.sorting
  monkeypatch.setattr(uopc.tensor.sorting, "SORT_BY_COUNTING_MAX", 4)
  x = np.random.default_rng(60).integers(-3, 3, (3, 7)).astype(np.float32)   # ties: still stable
  x[0, ::3], x[1, 2], x[2, 5] = NAN, -INF, INF
  forward(lambda t: tuple(t.sort(1, descending)), lambda t: tuple(t.sort(dim=1, descending=descending, stable=True)), x)
  forward(lambda t: tuple(t.sort(0, descending)), lambda t: tuple(t.sort(dim=0, descending=descending, stable=True)),
          np.random.default_rng(61).integers(I32_MIN, I32_MAX, (7, 2)).astype(np.int32))
  check(lambda t: t.topk(3, 0, descending).values, lambda t: t.topk(3, 0, descending).values, randn(7, 3, seed=63))
  if descending: return
  check(lambda t: t.sort(-1).values, lambda t: t.sort(dim=-1, stable=True).values, randn(2, 6, seed=62))
  m = np.random.default_rng(64).random((5,)) > 0.4   # a long masked_select sorts the selected elements first, through the network
  check(lambda t, k: t.masked_select(k), lambda t, k: t.masked_select(k), randn(3, 5, seed=65), m)


def test_topk_largest_and_smallest_with_gradient():
  x = randn(5, 6, seed=17)
  for k, dim, largest in [(3, -1, True), (2, 0, False), (6, 1, True), (0, 1, True)]:
    forward(lambda t: tuple(t.topk(k, dim, largest)), lambda t: tuple(t.topk(k, dim, largest)), x)
    check(lambda t: t.topk(k, dim, largest).values, lambda t: t.topk(k, dim, largest).values, x)
  v, i = Tensor([1, 1, 0, 1, 0, 1, 0, 0, 1, 0]).topk(3)   # ties: the earlier first (torch leaves the order open)
  assert v.tolist() == [1, 1, 1] and i.tolist() == [0, 1, 3]
  raises_like_torch(lambda t: t.topk(5), lambda t: t.topk(5), randn(4, seed=18))


# ---- gradients that were wrong -----------------------------------------------------------------------------------------

def test_max_over_a_stack_or_a_concatenation_sends_the_gradient_to_the_larger():
  check(lambda x, y: Tensor.stack(x, y).max(axis=0), lambda x, y: torch.stack((x, y)).amax(0), floats(1.0), floats(2.0))
  check(lambda x, y: Tensor.cat(x, y).max(), lambda x, y: torch.cat((x, y)).amax(), floats(1.0), floats(2.0))
  check(lambda x, y: Tensor.stack(x, y).min(axis=0), lambda x, y: torch.stack((x, y)).amin(0), floats(1.0, 5.0, 3.0), floats(2.0, 4.0, 3.0))


def test_backward_when_the_output_does_not_depend_on_an_input():
  x = Tensor(randn(3, seed=91), requires_grad=True)
  (x ** 0).sum().backward()       # torch: zeros; the constant keeps x in the graph
  assert np.array_equal(x.grad.numpy(), np.zeros(3, np.float32))
  a, b = Tensor(randn(3, seed=92)), Tensor(randn(3, seed=93))
  ga, gb = (a * 2).sum().gradient(a, b)
  assert np.array_equal(ga.numpy(), np.full(3, 2, np.float32)) and np.array_equal(gb.numpy(), np.zeros(3, np.float32))


# ---- the kinds of the errors ---------------------------------------------------------------------------------------------

def test_arange_refuses_what_i32_cannot_hold():
  # torch makes these int64; uopc has no int64, and wrapping to negative numbers was the old answer
  with pytest.raises(TensorError, match="don't fit in i32"): Tensor.arange(2**31, 2**31 + 3)
  with pytest.raises(TensorError, match="i32"): Tensor.arange(-2**31 - 2, 0, 1)   # too many elements, too
  assert Tensor.arange(2**31 - 3, 2**31).tolist() == [2**31 - 3, 2**31 - 2, 2**31 - 1]


def test_errors_are_the_kinds_torch_raises():
  x = randn(3, 4, seed=94)
  raises_like_torch(lambda t: t.flip((0, 0)), lambda t: t.flip((0, 0)), x)
  raises_like_torch(lambda t: t.flip((1, -1)), lambda t: t.flip((1, -1)), x)
  raises_like_torch(lambda t: t.clip(None, None), lambda t: t.clip(None, None), x)
  raises_like_torch(lambda t: t.permute(0, 0), lambda t: t.permute(0, 0), x)
  raises_like_torch(lambda t: t.reshape(-1, -1, 2), lambda t: t.reshape(-1, -1, 2), x)
  raises_like_torch(lambda t: t @ t, lambda t: t @ t, x)
  for f in (lambda t: t.sum(5), lambda t: t.squeeze(50), lambda t: t[1, 4], lambda t: t[0, 0, 0], lambda t: t.cumsum(2), lambda t: t.unsqueeze(3)):
    raises_like_torch(f, f, x, kind=IndexError)
  raises_like_torch(lambda t: t.cat(t), lambda t: torch.cat((t, t)), np.array(1.0, np.float32), kind=(RuntimeError, IndexError))
  with pytest.raises(TypeError): Tensor(randn(1, 1, 3, 4)).interpolate((2, 2), mode="bicubic")
  with pytest.raises(TypeError): Tensor(x).sum(1.5)


# ---- edges a review found: ties, zeros, NaN and 0-d tensors, each against torch -----------------------------------------

NAN_, INF_ = float("nan"), float("inf")


def test_max_pool_sends_the_gradient_to_the_first_maximum_of_a_tie():
  # a window of zeros after a ReLU is common: MAX alone would split the gradient four ways
  check(lambda t: t.max_pool2d(2), lambda t: F.max_pool2d(t, 2), np.ones((1, 2, 4, 4), np.float32))
  check(lambda t: t.relu().max_pool2d(2, 1), lambda t: F.max_pool2d(t.relu(), 2, 1), -np.abs(randn(1, 1, 4, 5, seed=90)))
  check(lambda t: t.max_pool1d(3, 2, 1), lambda t: F.max_pool1d(t, 3, 2, 1), np.full((1, 1, 7), -INF_, np.float32))


def test_hardswish_asin_acos_and_norm_at_their_kinks():
  check(lambda t: t.hardswish(), F.hardswish, np.array([-3.0, 3.0, -INF_, INF_, 1.0, -4.0], np.float32))
  check(lambda t: t.asin(), torch.asin, np.array([-1.0, 1.0, 0.5, 0.0], np.float32))
  check(lambda t: t.acos(), torch.acos, np.array([-1.0, 1.0, -0.25], np.float32))
  zero_rows = np.array([[0.0, 0.0, 0.0], [3.0, 0.0, 4.0]], np.float32)
  check(lambda t: t.norm(dim=1), lambda t: torch.linalg.vector_norm(t, dim=1), zero_rows)
  check(lambda t: t.norm(3, dim=1), lambda t: torch.linalg.vector_norm(t, 3, dim=1), zero_rows)
  check(lambda t: t.normalize(dim=1), lambda t: F.normalize(t, dim=1), zero_rows)


@pytest.mark.parametrize("name", ["pow 2.5", "pow 65", "rpow", "erf"])
def test_a_nan_input_gives_a_nan_gradient_as_in_torch(name):
  # the gradients attached with _with_gradient were 0 at NaN: a NaN in training vanished in the backward pass
  f = {"pow 2.5": lambda t: t ** 2.5, "pow 65": lambda t: t ** 65.5, "rpow": lambda t: 2.0 ** t, "erf": lambda t: t.erf()}[name]
  check(f, f, np.array([NAN_, 0.5, 1.25], np.float32))


def test_cummax_and_cummin_indices_follow_a_nan():
  x = np.array([[1.0, NAN_, 3.0, NAN_, 0.0], [2.0, 1.0, 2.0, 5.0, -1.0]], np.float32)
  forward(lambda t: tuple(t.cummax(1)), lambda t: tuple(t.cummax(1)), x)
  forward(lambda t: tuple(t.cummin(1)), lambda t: tuple(t.cummin(1)), x)


def test_gather_and_scatter_take_a_0d_tensor_as_one_element():
  five, zero = np.array(5.0, np.float32), np.array(0, np.int32)
  check(lambda t, i: t.gather(0, i), lambda t, i: t.gather(0, i), five, zero)
  forward(lambda t, i: t.scatter(0, i, 7.0), lambda t, i: t.scatter(0, i, 7.0), five, zero)
  forward(lambda t, i, s: t.scatter_reduce(0, i, s, "sum"), lambda t, i, s: t.scatter_reduce(0, i, s, "sum"), five, zero, np.array(2.0, np.float32))


@pytest.mark.parametrize("e", [-65.0, -3.0, -2.0, -2.5, 3.0, 0.5])
def test_pow_at_negative_zero_keeps_the_sign_as_c_does(e):
  check(lambda t: t ** e, lambda t: t ** e, np.array([-0.0, 0.0, -2.0], np.float32))


def test_fmod_by_an_infinity_is_the_dividend():
  a, b = np.array([-4.0, 4.0, -4.0, 4.0, 5.5, -0.0], np.float32), np.array([INF_, INF_, -INF_, -INF_, 2.0, INF_], np.float32)
  forward(lambda x, y: x.fmod(y), lambda x, y: x.fmod(y), a, b)


def test_logcumsumexp_of_a_long_axis_is_blocked_not_quadratic():
  # an (n, n) mask was 9 s at 32k elements and refused at 64k; the blocked scan is linear
  x = randn(3, 5000, seed=91) * 20
  forward(lambda t: t.logcumsumexp(1), lambda t: t.logcumsumexp(1), x, tol=1e-4)
  check(lambda t: t.logcumsumexp(0), lambda t: t.logcumsumexp(0), np.array([-INF_, -INF_, 1.0, 2.0, -1.0], np.float32))


@pytest.mark.parametrize("reduce", ["amax", "amin"])
@pytest.mark.parametrize("include_self", [True, False])
def test_scatter_reduce_shares_the_gradient_among_tied_extremes_as_torch(reduce, include_self):
  # small integers make ties common; torch splits evenly (and counts self when it equals the result, included or not)
  rng = np.random.default_rng(92)
  for _ in range(6):
    base, src = rng.integers(0, 3, 4).astype(np.float32), rng.integers(0, 3, 7).astype(np.float32)
    idx = rng.integers(0, 4, 7).astype(np.int32)
    check(lambda b, s, i: b.scatter_reduce(0, i, s, reduce, include_self=include_self),
          lambda b, s, i: b.scatter_reduce(0, i, s, reduce, include_self=include_self), base, src, idx)


def test_constant_pad_keeps_the_dtype_as_torch():
  # the pad value takes the tensor's dtype (2.5 pads an i32 with 2, a bool with True); it was promoted to f32
  for x in (np.array([1, 2, -3], np.int32), np.array([True, False]), randn(2, 3, seed=93)):
    forward(lambda t: t.pad((1, 2), value=2.5), lambda t: F.pad(t, (1, 2), value=2.5), x)
