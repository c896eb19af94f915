"""The numbers themselves: f16 reductions and math against NumPy computing in f32 and rounding once, and the unary
functions' accuracy where a formula breaks down (asinh and acosh past 1.8e19, tan and cos beside their poles and
zeros, tanh and acos where a difference cancels, sinh and cosh where e^x overflows first), and clip with a NaN bound.

f16 holds 11 significant bits, so its integers stop at 2048: an f16 accumulator summing 3000 ones stops there (2049
rounds back to 2048). Every reduction here runs over 3000 or 5000 elements so that one accumulating in f16 fails, and
compares with NumPy in f32 rounded to f16 at the end, within one f16 ulp (an f32 sum in another order may land on the
other side of an f16 rounding boundary). The f32 accuracy bounds are stated beside each test, in f32 ulps (2^-23 ~
1.2e-7 relative) or as a relative error against NumPy in float64 on the same f32 inputs.
"""
import math
import numpy as np
import pytest
from uopc.dtype import dtypes
from uopc.tensor import Tensor

RNG = np.random.default_rng(2021)
F16_ULP = 2.0**-10   # an f16 ulp relative to the value, at most


def f16_close(got: Tensor, ref_f32: np.ndarray, what: str, atol: float = 0.0) -> None:
  """got is f16 and within one f16 ulp (or atol) of the f32 reference rounded to f16."""
  assert got.dtype is dtypes.f16, f"{what}: dtype {got.dtype.name}, expected f16"
  g, r = got.numpy().astype(np.float64), np.asarray(ref_f32, np.float32).astype(np.float16).astype(np.float64)
  assert g.shape == r.shape, f"{what}: shape {g.shape}, expected {r.shape}"
  ulp = np.spacing(np.abs(r).astype(np.float16)).astype(np.float64)
  np.testing.assert_array_equal(np.isnan(g), np.isnan(r), err_msg=what)
  ok = np.isnan(r) | (g == r) | (np.abs(g - r) <= np.maximum(ulp, atol))
  assert ok.all(), f"{what}: {g[~ok][:4]} where f32-then-f16 gives {r[~ok][:4]}"


# ---- f16 reductions: summed in f32, rounded once --------------------------------------------------------------------

def _log_softmax(x, axis):
  s = x - x.max(axis, keepdims=True)
  return s - np.log(np.exp(s).sum(axis, keepdims=True))


def _attention(q):
  return np.exp(_log_softmax(q @ q.transpose(0, 2, 1) / np.sqrt(q.shape[-1]), -1)) @ q


N = 3000   # past 2048, f16's last exact integer
POS = RNG.uniform(0.5, 1.5, (2, N)).astype(np.float16)                # sums of these in f16 drift by several percent
LOGITS = (RNG.standard_normal((4, N)) * 2).astype(np.float16)
NEAR_ONE = (1 + RNG.uniform(-0.01, 0.01, (2, N))).astype(np.float16)  # products stay finite
TARGETS = RNG.integers(0, N, 4).astype(np.int32)

REDUCTIONS = {   # name: (uopc, NumPy in f32, f16 input)
  "sum of ones": (lambda t: t.sum(), lambda x: x.sum(), np.ones(N, np.float16)),
  "sum": (lambda t: t.sum(1), lambda x: x.sum(1), POS),
  "sum of f32 as f16": (lambda t: t.float().sum(1, dtype="f16"), lambda x: x.sum(1), POS),
  "mean": (lambda t: t.mean(1), lambda x: x.mean(1), POS),
  "var": (lambda t: t.var(1), lambda x: x.var(1, ddof=1), LOGITS),
  "std": (lambda t: t.std(1), lambda x: x.std(1, ddof=1), LOGITS),
  "prod": (lambda t: t.prod(1), lambda x: x.prod(1), NEAR_ONE),
  "softmax": (lambda t: t.softmax(1), lambda x: np.exp(_log_softmax(x, 1)), LOGITS),
  "softmax of zeros": (lambda t: t.softmax(0), lambda x: np.exp(_log_softmax(x, 0)), np.zeros(N, np.float16)),
  "log_softmax": (lambda t: t.log_softmax(1), lambda x: _log_softmax(x, 1), LOGITS),
  "logsumexp": (lambda t: t.logsumexp(1), lambda x: np.log(np.exp(x).sum(1)), LOGITS),
  "cumsum": (lambda t: t.cumsum(1), lambda x: np.cumsum(x, 1), POS),
  "cumprod": (lambda t: t.cumprod(1), lambda x: np.cumprod(x, 1), NEAR_ONE),
  "logcumsumexp": (lambda t: t.logcumsumexp(1), lambda x: np.logaddexp.accumulate(x, 1), LOGITS),
  "norm": (lambda t: t.norm(dim=1), lambda x: np.sqrt((x * x).sum(1)), LOGITS),
  "norm 1": (lambda t: t.norm(1, dim=1), lambda x: np.abs(x).sum(1), LOGITS),
  "norm 3": (lambda t: t.norm(3, dim=1), lambda x: (np.abs(x) ** 3).sum(1) ** (1 / 3), LOGITS),
  "norm 0": (lambda t: t.norm(0, dim=1), lambda x: (x != 0).sum(1).astype(np.float32), LOGITS),
  "cross_entropy": (lambda t: t.cross_entropy(Tensor(TARGETS)), lambda x: -_log_softmax(x, 1)[np.arange(4), TARGETS].mean(), LOGITS),
  "cross_entropy sum": (lambda t: t.cross_entropy(Tensor(TARGETS), reduction="sum"),
                        lambda x: -_log_softmax(x, 1)[np.arange(4), TARGETS].sum(), LOGITS),
  "nll_loss": (lambda t: t.nll_loss(Tensor(TARGETS)), lambda x: -x[np.arange(4), TARGETS].mean(), LOGITS),
  "mse_loss": (lambda t: t.mse_loss(t * 0.5), lambda x: ((x - x * 0.5) ** 2).mean(), LOGITS),
  "layernorm": (lambda t: t.layernorm(), lambda x: (x - x.mean(1, keepdims=True)) / np.sqrt(x.var(1, keepdims=True) + 1e-5), LOGITS),
  "avg_pool": (lambda t: t.reshape(1, 1, -1).avg_pool1d(N), lambda x: x.reshape(1, 1, 2, N).mean(-1), POS),
  "matmul": (lambda t: t @ t.T, lambda x: x @ x.T, LOGITS),
  "einsum": (lambda t: Tensor.einsum("ij,kj->ik", t, t), lambda x: x @ x.T, LOGITS),
  "attention": (lambda t: t.reshape(4, 100, 30).scaled_dot_product_attention(t.reshape(4, 100, 30), t.reshape(4, 100, 30)),
                lambda x: _attention(x.reshape(4, 100, 30)), LOGITS),
  "conv1d": (lambda t: t.reshape(1, 4, N).conv1d(t[:, :5].reshape(1, 4, 5)),
             lambda x: np.stack([(x[:, k:k + 5] * x[:, :5]).sum() for k in range(N - 4)]).reshape(1, 1, -1), LOGITS),
}


@pytest.mark.parametrize("name", REDUCTIONS)
def test_f16_reductions_accumulate_in_f32_and_round_once(name):
  """Each against NumPy on the same f16 values in f32, rounded to f16 once; an f16 accumulator misses by far more."""
  op, ref, x = REDUCTIONS[name]
  with np.errstate(over="ignore"):
    f16_close(op(Tensor(x)), ref(x.astype(np.float32)), name)


def test_an_f16_sum_of_3000_ones_is_3000_and_their_softmax_a_third_of_a_thousandth():
  assert Tensor(np.ones(3000, np.float16)).sum().item() == 3000          # was 2048
  assert Tensor(np.ones(5000, np.float16)).sum().item() == 5000
  assert Tensor(np.ones(3000, np.float16)).cumsum(0).numpy()[-1] == 3000
  np.testing.assert_array_equal(Tensor(np.zeros(3000, np.float16)).softmax().numpy(), np.float16(1 / 3000))   # was 1/2048


def test_f16_cross_entropy_against_f32_logits_is_within_f16_rounding():
  # the third example: f16 logits gave a loss 5% off the same loss from f32 logits
  x = (RNG.standard_normal((8, 4000)) * 3).astype(np.float16)
  t = RNG.integers(0, 4000, 8).astype(np.int32)
  half, full = Tensor(x).cross_entropy(Tensor(t)), Tensor(x.astype(np.float32)).cross_entropy(Tensor(t))
  assert half.dtype is dtypes.f16
  assert abs(half.item() - full.item()) <= F16_ULP * abs(full.item())


def test_an_f32_result_is_kept_where_a_float_argument_promotes_it():
  x16 = Tensor(LOGITS[:1, :8])
  probs32 = Tensor(np.full((1, 8), 1 / 8, np.float32))
  assert x16.cross_entropy(probs32).dtype is dtypes.f32      # f16 < f32: the promoted dtype, as torch gives
  assert x16.mse_loss(probs32).dtype is dtypes.f32 and x16.logaddexp(probs32).dtype is dtypes.f32
  assert x16.sum(dtype=dtypes.f32).dtype is dtypes.f32 and Tensor([1, 2]).mean().dtype is dtypes.f32


# ---- f16 math stays f16, computed in f32 -----------------------------------------------------------------------------

def _erf(x): return np.vectorize(math.erf)(x)


_GELU_TANH = lambda x: x / (1 + np.exp(-2 * np.sqrt(2 / np.pi) * (x + 0.044715 * x ** 3)))   # 0.5 x (1 + tanh u), not cancelling
_SOFTPLUS = lambda x: np.where(x > 20, x, np.log1p(np.exp(np.minimum(x, 20))))
REALS = np.linspace(-6, 6, 241)
UNIT = np.linspace(-0.99, 0.99, 199)
UNARY_F16 = {   # name: (uopc, NumPy in float64, inputs)
  "exp": (lambda t: t.exp(), np.exp, np.linspace(-9, 10, 400)),
  "exp2": (lambda t: t.exp2(), np.exp2, np.linspace(-14, 15, 400)),
  "expm1": (lambda t: t.expm1(), np.expm1, REALS),
  "log": (lambda t: t.log(), np.log, np.geomspace(1e-3, 6e4, 400)),
  "log2": (lambda t: t.log2(), np.log2, np.geomspace(1e-3, 6e4, 400)),
  "log10": (lambda t: t.log10(), np.log10, np.geomspace(1e-3, 6e4, 400)),
  "log1p": (lambda t: t.log1p(), np.log1p, np.linspace(-0.9, 20, 400)),
  "sqrt": (lambda t: t.sqrt(), np.sqrt, np.geomspace(1e-3, 6e4, 400)),
  "rsqrt": (lambda t: t.rsqrt(), lambda x: 1 / np.sqrt(x), np.geomspace(1e-3, 6e4, 400)),
  "recip": (lambda t: t.recip(), lambda x: 1 / x, np.geomspace(1e-3, 6e4, 400)),
  "sin": (lambda t: t.sin(), np.sin, np.linspace(-20, 20, 401)),
  "cos": (lambda t: t.cos(), np.cos, np.linspace(-20, 20, 401)),
  "tan": (lambda t: t.tan(), np.tan, np.linspace(-1.56, 1.56, 401)),
  "sinh": (lambda t: t.sinh(), np.sinh, np.linspace(-11, 11, 401)),
  "cosh": (lambda t: t.cosh(), np.cosh, np.linspace(-11, 11, 401)),
  "tanh": (lambda t: t.tanh(), np.tanh, REALS),
  "asin": (lambda t: t.asin(), np.arcsin, UNIT),
  "acos": (lambda t: t.acos(), np.arccos, UNIT),
  "atan": (lambda t: t.atan(), np.arctan, np.linspace(-50, 50, 401)),
  "asinh": (lambda t: t.asinh(), np.arcsinh, np.linspace(-6e4, 6e4, 401)),
  "acosh": (lambda t: t.acosh(), np.arccosh, np.geomspace(1.001, 6e4, 400)),
  "atanh": (lambda t: t.atanh(), np.arctanh, UNIT),
  "erf": (lambda t: t.erf(), _erf, REALS),
  "sigmoid": (lambda t: t.sigmoid(), lambda x: 1 / (1 + np.exp(-x)), np.linspace(-12, 12, 401)),
  "silu": (lambda t: t.silu(), lambda x: x / (1 + np.exp(-x)), REALS),
  "swish": (lambda t: t.swish(), lambda x: x / (1 + np.exp(-x)), REALS),
  "gelu": (lambda t: t.gelu(), _GELU_TANH, REALS),
  "gelu none": (lambda t: t.gelu("none"), lambda x: 0.5 * x * (1 + _erf(x / np.sqrt(2))), REALS),
  "quick_gelu": (lambda t: t.quick_gelu(), lambda x: x / (1 + np.exp(-1.702 * x)), REALS),
  "softplus": (lambda t: t.softplus(), _SOFTPLUS, np.linspace(-15, 30, 401)),
  "softsign": (lambda t: t.softsign(), lambda x: x / (1 + np.abs(x)), REALS),
  "mish": (lambda t: t.mish(), lambda x: x * np.tanh(_SOFTPLUS(x)), REALS),
  "logsigmoid": (lambda t: t.logsigmoid(), lambda x: -_SOFTPLUS(-x), REALS),
  "elu": (lambda t: t.elu(), lambda x: np.where(x > 0, x, np.expm1(np.minimum(x, 0))), REALS),
  "celu": (lambda t: t.celu(2.0), lambda x: np.where(x > 0, x, 2 * np.expm1(np.minimum(x, 0) / 2)), REALS),
  "selu": (lambda t: t.selu(), lambda x: 1.0507009873554805 * np.where(x > 0, x, 1.6732632423543772 * np.expm1(np.minimum(x, 0))), REALS),
  "hardswish": (lambda t: t.hardswish(), lambda x: x * np.clip(x + 3, 0, 6) / 6, REALS),
  "hardsigmoid": (lambda t: t.hardsigmoid(), lambda x: np.clip(x / 6 + 0.5, 0, 1), REALS),
  "hardtanh": (lambda t: t.hardtanh(), lambda x: np.clip(x, -1, 1), REALS),
  "relu6": (lambda t: t.relu6(), lambda x: np.clip(x, 0, 6), REALS),
  "relu": (lambda t: t.relu(), lambda x: np.maximum(x, 0), REALS),
  "leaky_relu": (lambda t: t.leaky_relu(), lambda x: np.where(x > 0, x, 0.01 * x), REALS),
  "abs": (lambda t: t.abs(), np.abs, REALS),
  "square": (lambda t: t.square(), np.square, REALS),
  "pow 2.5": (lambda t: t ** 2.5, lambda x: x ** 2.5, np.geomspace(1e-2, 80, 400)),
  "pow -3": (lambda t: t ** -3, lambda x: x ** -3.0, np.geomspace(0.1, 20, 400)),
  "rpow": (lambda t: 3.0 ** t, lambda x: 3.0 ** x, np.linspace(-9, 9, 401)),
  "lerp": (lambda t: t.lerp(t * 3, 0.3), lambda x: x + 0.3 * (x * 3 - x), REALS),
  "copysign": (lambda t: t.copysign(-1.0), lambda x: -np.abs(x), REALS),
  "logaddexp": (lambda t: t.logaddexp(1.5), lambda x: np.logaddexp(x, 1.5), REALS),
}


# where the f32 computation itself is only right to an absolute error, below f16's subnormal ulp (6e-8): erf is Abramowitz
# and Stegun 7.1.26, 1.5e-7 absolute, and gelu's tail 0.5 x (1 + erf(x / sqrt 2)) is that times |x| / 2 (x >= -6 here)
ATOL_F16 = {"gelu none": 4.5e-7}


@pytest.mark.parametrize("name", UNARY_F16)
def test_f16_math_returns_f16_computed_in_f32(name):
  """torch keeps f16 for every float function of an f16 tensor (sigmoid, tanh, gelu, erf and silu gave f32), and rounds
  once: the exact value of the f16 input, rounded to f16, within one f16 ulp (the f32 computation's own error can move
  a value across an f16 rounding boundary, never further)."""
  op, ref, x = UNARY_F16[name]
  x16 = x.astype(np.float16)
  with np.errstate(all="ignore"):
    f16_close(op(Tensor(x16)), ref(x16.astype(np.float64)), name, ATOL_F16.get(name, 0.0))


# ---- f32 accuracy where a formula breaks down ------------------------------------------------------------------------

def rel_err(got: np.ndarray, exact: np.ndarray) -> np.ndarray:
  """|got - exact| / |exact|; where exact is 0, |got| (0 when got is 0 too)."""
  err = np.abs(got.astype(np.float64) - exact)
  return np.where(exact == 0, err, err / np.where(exact == 0, 1, np.abs(exact)))


def test_asinh_and_acosh_of_huge_values_are_finite():
  """log(x + sqrt(x^2 + 1)) overflowed x^2 past 1.8e19 (asinh(1e30) was inf, not 69.77). Relative error against NumPy's
  float64 on the same f32 inputs, from 1e-30 (asinh) or 1 (acosh) to the largest f32: acosh within 2.4e-7 (2 f32 ulps;
  its x - 1 is exact near 1, where x^2 - 1 lost bits), asinh within 1e-6 (log(1 + d) just past its series, at d ~ 0.1,
  rounds 1 + d first: 9e-7 measured there, 1e-7 elsewhere)."""
  big = np.array([1e19, 2e19, 1e20, 1e30, 3.4e38, 4097.0, 5000.0, 4095.0, 100.0, 1.5], np.float32)
  x = np.concatenate([big, -big, np.geomspace(1e-30, 1e5, 3000, dtype=np.float32), -np.geomspace(1e-30, 1e5, 300, dtype=np.float32)])
  assert rel_err(Tensor(x).asinh().numpy(), np.arcsinh(x.astype(np.float64))).max() <= 1e-6
  assert Tensor([1e30]).asinh().item() == pytest.approx(69.77070, rel=1e-6)
  y = np.concatenate([big, np.array([1.0001, 1.001, 1.01, 1.1, 2.0], np.float32), np.geomspace(1.0001, 1e5, 1000, dtype=np.float32)])
  assert rel_err(Tensor(y).acosh().numpy(), np.arccosh(y.astype(np.float64))).max() <= 2.4e-7
  np.testing.assert_array_equal(Tensor([np.inf, -np.inf, np.nan]).asinh().numpy(), [np.inf, -np.inf, np.nan])
  np.testing.assert_array_equal(Tensor([np.inf, 1.0, 0.5, -np.inf, np.nan]).acosh().numpy(), [np.inf, 0.0, np.nan, np.nan, np.nan])


def test_asinh_and_acosh_gradients_at_huge_values_are_finite():
  # the branches not taken read safe values: an inf from x^2 in one of them was a NaN gradient through the WHERE
  x = Tensor(np.array([1e30, -1e20, 3.0], np.float32), requires_grad=True)
  x.asinh().sum().backward()
  np.testing.assert_allclose(x.grad.numpy(), 1 / np.sqrt(np.array([1e30, -1e20, 3.0]) ** 2 + 1), rtol=1e-6)
  y = Tensor(np.array([1e30, 1e20, 3.0], np.float32), requires_grad=True)
  y.acosh().sum().backward()
  np.testing.assert_allclose(y.grad.numpy(), 1 / np.sqrt(np.array([1e30, 1e20, 3.0]) ** 2 - 1), rtol=1e-6)


def _near(points, widths=(1e-3, 1e-4, 1e-5, 1e-6, 1e-7), n=41):
  """f32 values around each point, within each width of it, and the point's three nearest f32s."""
  out = []
  for p in points:
    for w in widths: out.append(p + np.linspace(-w, w, n))
    f = np.float32(p)
    out.append([np.nextafter(f, -np.inf), f, np.nextafter(f, np.inf)])
  return np.concatenate(out).astype(np.float32)


POLES = [math.pi / 2, -math.pi / 2, 3 * math.pi / 2, -3 * math.pi / 2, 101 * math.pi / 2, -2001 * math.pi / 2]


def test_tan_is_accurate_beside_its_poles():
  """Relative error against NumPy's float64 tan of the same f32 inputs at most 1e-6 (8 f32 ulps; measured 2e-7), over
  [-20, 20] and within 1e-3 .. 1e-7 of +-pi/2, +-3pi/2 and farther poles, the f32s next to pi/2 included (tan of the f32
  nearest pi/2 is -2.3e7). sin(x) / cos(x) was 27% off there: cos came from 1 - 2 sin(x/2)^2, which cancels."""
  x = np.concatenate([np.linspace(-20, 20, 4001, dtype=np.float32), _near(POLES)])
  got = Tensor(x).tan().numpy()
  assert rel_err(got, np.tan(x.astype(np.float64))).max() <= 1e-6
  assert abs(Tensor([np.float32(math.pi / 2)]).tan().item() / np.tan(np.float64(np.float32(math.pi / 2))) - 1) <= 1e-6


def test_cos_is_accurate_beside_its_zeros_and_sin_everywhere():
  """cos within 1e-6 relative of NumPy's float64 beside its zeros and over [-20, 20] (its absolute error is what the
  half-angle formula left, 6e-8, which is 100% of cos at the f32 next to pi/2); sin is the C library's sinf."""
  x = np.concatenate([np.linspace(-20, 20, 4001, dtype=np.float32), _near(POLES)])
  assert rel_err(Tensor(x).cos().numpy(), np.cos(x.astype(np.float64))).max() <= 1e-6
  s = np.concatenate([np.linspace(-20, 20, 4001, dtype=np.float32), _near([math.pi, -math.pi, 2 * math.pi])])
  assert rel_err(Tensor(s).sin().numpy(), np.sin(s.astype(np.float64))).max() <= 1e-6


def test_tan_and_cos_past_the_reduction_range_and_at_the_specials():
  # past TRIG_REDUCE_MAX (4096) the half-angle formula stays: right to ~1e-7 absolute for cos, so relative away from zeros
  x = np.array([5000.0, -7777.5, 1e5, 3.3e6, 1e30], np.float32)
  c = np.cos(x.astype(np.float64))
  np.testing.assert_allclose(Tensor(x).cos().numpy(), c, atol=2e-7)
  far = np.abs(c) > 0.1
  assert rel_err(Tensor(x[far]).tan().numpy(), np.tan(x[far].astype(np.float64))).max() <= 5e-6
  special = np.array([0.0, -0.0, np.inf, -np.inf, np.nan], np.float32)
  np.testing.assert_array_equal(Tensor(special).tan().numpy(), [0.0, -0.0, np.nan, np.nan, np.nan])
  assert np.signbit(Tensor(special).tan().numpy()[1])                            # tan(-0.0) is -0.0
  np.testing.assert_array_equal(Tensor(special).cos().numpy(), [1.0, 1.0, np.nan, np.nan, np.nan])


def test_tan_and_cos_gradients_beside_a_pole():
  x = np.array([0.3, 1.5707963, -1.5707, 100.0, 5000.0], np.float32)
  t = Tensor(x, requires_grad=True)
  t.tan().sum().backward()
  np.testing.assert_allclose(t.grad.numpy(), 1 / np.cos(x.astype(np.float64)) ** 2, rtol=1e-5)
  t = Tensor(x, requires_grad=True)
  t.cos().sum().backward()
  np.testing.assert_allclose(t.grad.numpy(), -np.sin(x.astype(np.float64)), rtol=1e-5, atol=1e-7)


def test_tanh_near_zero_keeps_its_relative_accuracy():
  """2 sigmoid(2x) - 1 was 7% off at x = 1e-6 and 150% at 5e-8; within 2.4e-7 relative of NumPy's float64 now, from 1e-30 to 20."""
  x = np.geomspace(1e-30, 20, 600).astype(np.float32)
  x = np.concatenate([x, -x])
  assert rel_err(Tensor(x).tanh().numpy(), np.tanh(x.astype(np.float64))).max() <= 2.4e-7
  np.testing.assert_array_equal(Tensor([np.inf, -np.inf, 0.0]).tanh().numpy(), [1.0, -1.0, 0.0])
  assert np.signbit(Tensor([-0.0]).tanh().numpy()[0])


def test_acos_near_one_keeps_its_relative_accuracy():
  """pi/2 - asin(x) cancelled near 1 (1e-4 off at 0.99999994); within 4e-7 relative of NumPy's float64 over (-1, 1)."""
  x = np.concatenate([np.linspace(-1, 1, 2001), 1 - np.geomspace(6e-8, 0.1, 200), -1 + np.geomspace(6e-8, 0.1, 200)]).astype(np.float32)
  x = x[np.abs(x) < 1]
  assert rel_err(Tensor(x).acos().numpy(), np.arccos(x.astype(np.float64))).max() <= 4e-7
  np.testing.assert_allclose(Tensor([1.0, -1.0]).acos().numpy(), [0.0, np.pi], rtol=1e-7)


def test_sinh_and_cosh_are_finite_until_they_overflow_themselves():
  """e^x overflows at 88.72, sinh and cosh only at 89.42: (e^x - e^-x) / 2 was inf between. Relative error against
  NumPy's float64 within 5e-6 (what exp itself reaches at such arguments: x log2(e) is rounded to f32 first)."""
  x = np.array([88.0, 88.8, 89.0, 89.4, 20.5, 19.5, 5.0, 0.5, 1e-4], np.float32)
  x = np.concatenate([x, -x])
  for op, ref in (("sinh", np.sinh), ("cosh", np.cosh)):
    got = getattr(Tensor(x), op)().numpy()
    assert np.isfinite(got).all(), op
    assert rel_err(got, ref(x.astype(np.float64))).max() <= 5e-6, op
  np.testing.assert_array_equal(Tensor([89.5, -89.5, np.inf]).sinh().numpy(), [np.inf, -np.inf, np.inf])
  np.testing.assert_array_equal(Tensor([89.5, -89.5, -np.inf]).cosh().numpy(), [np.inf, np.inf, np.inf])


# ---- clip with a NaN bound ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("lo, hi", [(np.nan, 2.0), (0.5, np.nan), (np.nan, None), (None, np.nan), (np.float32(np.nan), None), (1.5, 2.5)])
def test_clip_with_a_nan_bound_gives_nan_like_numpy(lo, hi):
  """torch.clamp and NumPy's maximum/minimum: a NaN bound makes every element NaN (it was ignored: t < nan is false)."""
  x = np.array([-1.0, 1.0, 2.0, 3.0, np.nan], np.float32)
  ref = x
  with np.errstate(invalid="ignore"):
    if lo is not None: ref = np.maximum(ref, np.float32(lo))
    if hi is not None: ref = np.minimum(ref, np.float32(hi))
  for t, want in ((Tensor(x), ref), (Tensor(x).half(), ref.astype(np.float16))):
    got = t.clip(lo, hi)
    assert got.dtype is t.dtype
    np.testing.assert_array_equal(got.numpy(), want)


def test_clip_with_nan_in_a_tensor_bound_and_on_integers():
  x = np.array([1.0, 2.0, 3.0], np.float32)
  lo = np.array([np.nan, 0.0, 5.0], np.float32)
  with np.errstate(invalid="ignore"):
    np.testing.assert_array_equal(Tensor(x).clip(Tensor(lo)).numpy(), np.maximum(x, lo))
    np.testing.assert_array_equal(Tensor(x).clip(None, Tensor(lo)).numpy(), np.minimum(x, lo))
  got = Tensor([1, 2, 3]).clip(np.nan)
  assert got.dtype is dtypes.f32 and np.isnan(got.numpy()).all()               # torch: a float bound makes it float
  t = Tensor(x, requires_grad=True)
  t.clip(np.nan).sum().backward()
  np.testing.assert_array_equal(t.grad.numpy(), [0.0, 0.0, 0.0])                # torch's clamp gradient: 0 outside the bounds
