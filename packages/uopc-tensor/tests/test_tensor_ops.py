"""Tensor forward results against NumPy, and the API around them: creation, the elementwise ops, dtypes, conventions
and error messages. Reductions, movement and indexing are in test_tensor_shapes, matmul, convolution, pooling, the
losses and attention in test_tensor_functional; both take their data and check() from here.

Every numeric result has NumPy as its oracle: the same operation in NumPy, or for convolution, pooling, attention
and the losses a direct NumPy loop or formula. Shapes are reused across tests because kernels compile once per
structure. Gradients are tested elsewhere; here only backward()'s argument check appears.
"""
import numpy as np
import pytest
from uopc.dtype import dtypes
from uopc.kernelize import Kernel
from uopc.tensor import Tensor, TensorError

RNG = np.random.default_rng(1234)
X234 = RNG.standard_normal((2, 3, 4)).astype(np.float32)
X34 = RNG.standard_normal((3, 4)).astype(np.float32)
POS34 = (RNG.random((3, 4)) * 4 + 0.25).astype(np.float32)   # strictly positive, for log/sqrt/pow
I34 = RNG.integers(-9, 10, (3, 4)).astype(np.int32)
A24 = np.arange(24, dtype=np.float32).reshape(2, 3, 4)


def check(t: Tensor, expected, rtol: float = 1e-6, atol: float = 1e-6, dtype=None):
  """t's value equals `expected` (shape exactly; float values within tolerance); `dtype` pins the uopc dtype too."""
  got = t.numpy()
  expected = np.asarray(expected)
  assert got.shape == expected.shape, f"shape {got.shape}, expected {expected.shape}"
  if dtype is not None: assert t.dtype is dtype, f"dtype {t.dtype.name}, expected {dtype.name}"
  if got.dtype.kind in "biu" or expected.dtype == np.bool_: np.testing.assert_array_equal(got, expected)   # ints and bools: exactly
  else: np.testing.assert_allclose(got.astype(np.float64), expected.astype(np.float64), rtol=rtol, atol=atol, equal_nan=True)


# ---- creation -------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("np_dtype, dtype", [(np.float32, dtypes.f32), (np.float64, dtypes.f32), (np.int32, dtypes.i32),
                                             (np.int64, dtypes.i32), (np.bool_, dtypes.bool)])
def test_from_numpy_maps_the_dtype_and_keeps_the_values(np_dtype, dtype):
  arr = (np.arange(12).reshape(3, 4) % 5 - 2).astype(np_dtype)
  check(Tensor(arr), arr, dtype=dtype)


def test_from_numpy_copies_the_array():
  arr = np.arange(4, dtype=np.float32)
  t = Tensor(arr)
  arr[0] = 100
  check(t, [0, 1, 2, 3])


@pytest.mark.parametrize("data, dtype", [([[1, 2], [3, 4]], dtypes.i32), ([1.5, 2], dtypes.f32), ([True, False], dtypes.bool),
                                         (3, dtypes.i32), (2.5, dtypes.f32), (True, dtypes.bool), ([], dtypes.f32)])
def test_from_python_lists_and_scalars(data, dtype):
  t = Tensor(data)
  check(t, np.asarray(data), dtype=dtype)


def test_explicit_dtype_converts_the_data():
  check(Tensor([1.7, -2.2], dtype=dtypes.i32), [1, -2], dtype=dtypes.i32)
  check(Tensor([1, 0, 3], dtype="bool"), [True, False, True], dtype=dtypes.bool)
  check(Tensor([1, 2], dtype=np.float32), [1.0, 2.0], dtype=dtypes.f32)


def test_ragged_lists_are_refused():
  with pytest.raises(TensorError, match="ragged or not numbers"): Tensor([[1, 2], [3]])


@pytest.mark.parametrize("make, expected, dtype", [
  (lambda: Tensor.zeros(2, 3), np.zeros((2, 3)), dtypes.f32),
  (lambda: Tensor.zeros((2, 3)), np.zeros((2, 3)), dtypes.f32),
  (lambda: Tensor.ones(4), np.ones(4), dtypes.f32),
  (lambda: Tensor.ones(2, 2, dtype=dtypes.i32), np.ones((2, 2)), dtypes.i32),
  (lambda: Tensor.full((2, 3), 7), np.full((2, 3), 7), dtypes.i32),
  (lambda: Tensor.full((3,), -1.5), np.full(3, -1.5), dtypes.f32),
  (lambda: Tensor.full((2, 2), True), np.full((2, 2), True), dtypes.bool),
  (lambda: Tensor.full((), 4.0), np.float32(4.0), dtypes.f32),
  (lambda: Tensor.full((2,), 3, dtype=dtypes.f32), np.full(2, 3.0), dtypes.f32),
])
def test_constant_creation(make, expected, dtype):
  check(make(), expected, dtype=dtype)


@pytest.mark.parametrize("args", [(5,), (2, 7), (0, 10, 3), (10, 0, -2), (-3, 4, 2), (0.0, 1.0, 0.25), (0.5, 3), (-3, 3, 1.5), (3, 3)])
def test_arange_matches_numpy(args):
  expected = np.arange(*args)
  dtype = dtypes.f32 if any(isinstance(a, float) for a in args) else dtypes.i32
  check(Tensor.arange(*args), expected, dtype=dtype)


def test_arange_with_explicit_dtype():
  check(Tensor.arange(4, dtype=dtypes.f32), [0.0, 1.0, 2.0, 3.0], dtype=dtypes.f32)


@pytest.mark.parametrize("args", [(3,), (2, 4), (4, 2), (1,)])
def test_eye_matches_numpy(args):
  check(Tensor.eye(*args), np.eye(*args), dtype=dtypes.f32)


def test_rand_with_the_same_seed_gives_the_same_values():
  Tensor.manual_seed(7)
  a, b = Tensor.rand(3, 4).numpy(), Tensor.randn(5).numpy()
  Tensor.manual_seed(7)
  np.testing.assert_array_equal(Tensor.rand(3, 4).numpy(), a)
  np.testing.assert_array_equal(Tensor.randn(5).numpy(), b)
  Tensor.manual_seed(8)
  assert not np.array_equal(Tensor.rand(3, 4).numpy(), a)


def test_rand_is_uniform_in_zero_one_and_randn_is_standard_normal():
  Tensor.manual_seed(0)
  r, n = Tensor.rand(4000), Tensor.randn(4000)
  assert r.dtype is dtypes.f32 and n.dtype is dtypes.f32 and r.shape == (4000,)
  rv, nv = r.numpy(), n.numpy()
  assert rv.min() >= 0 and rv.max() < 1 and abs(rv.mean() - 0.5) < 0.03
  assert abs(nv.mean()) < 0.08 and abs(nv.std() - 1) < 0.08
  assert Tensor.rand((2, 3)).shape == (2, 3) and Tensor.randn(2, 3).shape == (2, 3)


def test_like_constructors_keep_shape_and_dtype():
  f, i = Tensor(X34), Tensor(I34)
  check(f.zeros_like(), np.zeros((3, 4)), dtype=dtypes.f32)
  check(i.ones_like(), np.ones((3, 4)), dtype=dtypes.i32)
  check(i.full_like(5), np.full((3, 4), 5), dtype=dtypes.i32)
  check(f.full_like(2.5), np.full((3, 4), 2.5), dtype=dtypes.f32)
  check(i.zeros_like(dtype=dtypes.f32), np.zeros((3, 4)), dtype=dtypes.f32)
  r = f.rand_like()
  assert r.shape == (3, 4) and r.dtype is dtypes.f32 and 0 <= r.numpy().min() and r.numpy().max() < 1
  assert f.randn_like().shape == (3, 4)


def test_realize_numpy_item_and_tolist():
  t = Tensor(X34) * 2
  assert t.realize() is t
  np.testing.assert_allclose(t.numpy(), X34 * 2)
  assert isinstance(t.numpy(), np.ndarray) and t.numpy().dtype == np.float32
  assert Tensor([[1, 2], [3, 4]]).tolist() == [[1, 2], [3, 4]]
  assert Tensor([True, False]).tolist() == [True, False]
  assert (Tensor(3) + 4).item() == 7 and isinstance(Tensor(3).item(), int)
  assert Tensor([[2.5]]).item() == 2.5 and isinstance(Tensor([[2.5]]).item(), float)
  assert Tensor(True).item() is True
  assert int(Tensor([5])) == 5 and float(Tensor(1.5)) == 1.5


def test_empty_tensors_have_shapes_and_no_data():
  check(Tensor.zeros(0, 3), np.zeros((0, 3)))
  check(Tensor(np.zeros((0, 3), np.float32)) + 1, np.zeros((0, 3)))
  check(Tensor(np.zeros((0, 3), np.float32)).sum(0), np.zeros(3))
  check(Tensor(np.zeros((0, 3), np.float32)).sum(1), np.zeros(0))
  check(Tensor(A24)[:, 2:2].max(-1), A24[:, 2:2].max(-1))
  assert Tensor([]).tolist() == []


def test_iterating_a_tensor_yields_its_rows():
  rows = list(Tensor(X34))
  assert len(rows) == 3
  for r, e in zip(rows, X34): check(r, e)
  assert [int(v) for v in Tensor([4, 5, 6])] == [4, 5, 6]


def test_schedule_returns_kernels_without_running_them():
  a = Tensor(X34)
  t = (a + 1).sum(1) * 2
  before = t.uop
  kernels = t.schedule()
  assert kernels and all(isinstance(k, Kernel) for k in kernels)
  assert t.uop is before   # still the lazy graph: nothing was realized
  check(t, (X34 + 1).sum(1) * 2, rtol=1e-5)
  assert t.uop is not before and t.schedule() == []   # realized now: nothing left to run


def test_realize_of_several_tensors_computes_all_of_them():
  a = Tensor(X34)
  b, c = a + 1, a * 3
  b.realize(c)
  check(b, X34 + 1)
  check(c, X34 * 3)


# ---- elementwise ----------------------------------------------------------------------------------------------------

BINARY = {"add": lambda a, b: a + b, "sub": lambda a, b: a - b, "mul": lambda a, b: a * b, "div": lambda a, b: a / b}


@pytest.mark.parametrize("name", BINARY)
def test_binary_arithmetic_on_floats(name):
  f = BINARY[name]
  check(f(Tensor(X34), Tensor(POS34)), f(X34, POS34), rtol=1e-6, dtype=dtypes.f32)
  check(f(Tensor(X34), 2.5), f(X34, np.float32(2.5)), rtol=1e-6, dtype=dtypes.f32)
  check(f(3.0, Tensor(POS34)), f(np.float32(3.0), POS34), rtol=1e-6, dtype=dtypes.f32)


@pytest.mark.parametrize("name", ["add", "sub", "mul"])
def test_binary_arithmetic_on_ints_stays_int(name):
  f = BINARY[name]
  j = I34[::-1]
  check(f(Tensor(I34), Tensor(j)), f(I34, j), dtype=dtypes.i32)
  check(f(Tensor(I34), 3), f(I34, 3), dtype=dtypes.i32)
  check(f(-2, Tensor(I34)), f(-2, I34), dtype=dtypes.i32)


def test_true_division_on_ints_gives_floats():
  a, b = np.array([7, -7, 3, 0, 9], np.int32), np.array([2, 2, -4, 5, 3], np.int32)
  check(Tensor(a) / Tensor(b), a / b, dtype=dtypes.f32)
  check(Tensor(a) / 2, a / 2, dtype=dtypes.f32)
  check(10 / Tensor(b), 10 / b, dtype=dtypes.f32)
  check(Tensor(a) / Tensor(b.astype(np.float32)), a / b, dtype=dtypes.f32)


def test_neg():
  check(-Tensor(X34), -X34, dtype=dtypes.f32)
  check(-Tensor(I34), -I34, dtype=dtypes.i32)


@pytest.mark.parametrize("exponent", [0, 1, 2, 3, 0.5, -1, 2.5, -2, 1.5, -0.5])
def test_pow_with_scalar_exponents_on_positive_bases(exponent):
  check(Tensor(POS34) ** exponent, np.power(POS34, np.float32(exponent)), rtol=1e-5, dtype=dtypes.f32)


@pytest.mark.parametrize("exponent", [0, 1, 2, 3, -1, -2, 4, 5])
def test_pow_with_integer_exponents_on_negative_bases(exponent):
  x = np.array([-3.0, -1.5, -0.5, 2.0, -2.0], np.float32)
  check(Tensor(x) ** exponent, np.power(x, np.float32(exponent)), rtol=1e-5)


def test_pow_with_large_integer_exponents():
  x = np.array([-1.5, -1.0, 0.5, 1.25, 2.0], np.float32)
  for e in [9, 11, 16, -9, 30]: check(Tensor(x) ** e, np.power(x.astype(np.float64), e), rtol=1e-5)
  check(Tensor([-2, 3]) ** 11, np.power(np.array([-2, 3]), 11), dtype=dtypes.i32)


def test_pow_of_a_negative_base_with_a_fractional_exponent_is_nan():
  assert np.isnan((Tensor([-2.0]) ** 2.5).numpy()).all()
  assert np.isnan((Tensor([-4.0]) ** 0.5).numpy()).all()


def test_pow_of_zero():
  z = Tensor([0.0, 0.0])
  check(z ** 0, [1.0, 1.0])
  check(z ** 2.5, [0.0, 0.0])
  check(z ** 3, [0.0, 0.0])
  check(z ** -1, [np.inf, np.inf])


def test_pow_on_int_tensors_follows_the_scalar_dtype():
  x = np.array([-3, -1, 0, 2, 5], np.int32)
  check(Tensor(x) ** 2, x ** 2, dtype=dtypes.i32)
  check(Tensor(x) ** 3, x ** 3, dtype=dtypes.i32)
  check(Tensor(x) ** 0, np.ones(5), dtype=dtypes.i32)
  check(Tensor(x) ** 1, x, dtype=dtypes.i32)
  check(Tensor(x) ** 2.0, x.astype(np.float32) ** 2, dtype=dtypes.f32)
  check(Tensor(x) ** 1.0, x.astype(np.float32), dtype=dtypes.f32)
  check(Tensor(np.abs(x)) ** 0.5, np.sqrt(np.abs(x)), rtol=1e-6, dtype=dtypes.f32)


def test_pow_with_tensor_exponents():
  base = np.array([2.0, 0.5, 3.0, -2.0, -2.0, -8.0, 0.0, 0.0, 1.5], np.float32)
  exp_ = np.array([3.0, -2.0, 0.5, 2.0, 3.0, -1.0, 2.0, 0.0, 0.0], np.float32)
  check(Tensor(base) ** Tensor(exp_), np.power(base, exp_), rtol=1e-5)
  check(Tensor(base).pow(Tensor(exp_)), np.power(base, exp_), rtol=1e-5)
  assert np.isnan((Tensor([-2.0]) ** Tensor([0.5])).numpy()).all()
  check(2.0 ** Tensor(exp_), np.power(np.float32(2.0), exp_), rtol=1e-5)
  check(Tensor(POS34) ** Tensor(X34), np.power(POS34, X34), rtol=1e-5)


UNARY = {
  "exp": (lambda t: t.exp(), np.exp, X34),
  "log": (lambda t: t.log(), np.log, POS34),
  "sqrt": (lambda t: t.sqrt(), np.sqrt, POS34),
  "rsqrt": (lambda t: t.rsqrt(), lambda x: 1 / np.sqrt(x), POS34),
  "sin": (lambda t: t.sin(), np.sin, X34 * 3),
  "cos": (lambda t: t.cos(), np.cos, X34 * 3),
  "tanh": (lambda t: t.tanh(), np.tanh, X34 * 3),
  "sigmoid": (lambda t: t.sigmoid(), lambda x: 1 / (1 + np.exp(-x)), X34 * 4),
  "relu": (lambda t: t.relu(), lambda x: np.maximum(x, 0), X34),
  "gelu": (lambda t: t.gelu(), lambda x: 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x ** 3))), X34 * 2),
  "silu": (lambda t: t.silu(), lambda x: x / (1 + np.exp(-x)), X34 * 3),
  "abs": (lambda t: t.abs(), np.abs, X34),
  "square": (lambda t: t.square(), np.square, X34),
}


@pytest.mark.parametrize("name", UNARY)
def test_unary_math_matches_numpy(name):
  op, ref, x = UNARY[name]
  # transcendental ops run in f32 (exp2f/log2f/sinf): compare relatively, with a floor for values near zero
  check(op(Tensor(x)), ref(x.astype(np.float64)), rtol=1e-5, atol=1e-6, dtype=dtypes.f32)


def test_unary_math_at_the_edges():
  check(Tensor([0.0, -100.0, 100.0]).sigmoid(), [0.5, 0.0, 1.0], atol=1e-7)
  check(Tensor([-30.0, 30.0, 0.0]).tanh(), [-1.0, 1.0, 0.0], atol=1e-7)
  check(Tensor([0.0, 1.0]).log(), [-np.inf, 0.0])
  assert np.isnan(Tensor([-1.0]).log().numpy()).all() and np.isnan(Tensor([-1.0]).sqrt().numpy()).all()
  check(Tensor([0.0]).exp(), [1.0])


def test_unary_math_on_ints_computes_in_float():
  x = np.array([1, 4, 9], np.int32)
  check(Tensor(x).sqrt(), np.sqrt(x), rtol=1e-6, dtype=dtypes.f32)
  check(Tensor(x).exp(), np.exp(x), rtol=1e-5, dtype=dtypes.f32)
  check(Tensor(I34).relu(), np.maximum(I34, 0), dtype=dtypes.i32)
  check(Tensor(I34).abs(), np.abs(I34), dtype=dtypes.i32)


def test_maximum_minimum_and_clip():
  y = X34[::-1].copy()
  check(Tensor(X34).maximum(Tensor(y)), np.maximum(X34, y))
  check(Tensor(X34).minimum(Tensor(y)), np.minimum(X34, y))
  check(Tensor(X34).maximum(0.25), np.maximum(X34, np.float32(0.25)))
  check(Tensor(X34).minimum(-0.25), np.minimum(X34, np.float32(-0.25)))
  check(Tensor(I34).maximum(Tensor(I34[::-1].copy())), np.maximum(I34, I34[::-1]), dtype=dtypes.i32)
  check(Tensor(X34).maximum(Tensor(X34[0])), np.maximum(X34, X34[0]))
  check(Tensor(X34).clip(-0.5, 0.5), np.clip(X34, -0.5, 0.5))
  check(Tensor(X34).clip(min_=0.1), np.maximum(X34, np.float32(0.1)))
  check(Tensor(X34).clip(max_=0.1), np.minimum(X34, np.float32(0.1)))
  check(Tensor(I34).clip(-3, 4), np.clip(I34, -3, 4), dtype=dtypes.i32)


def test_where_with_tensors_and_scalars():
  cond = X34 > 0
  y = X34 * 10
  check(Tensor(cond).where(Tensor(X34), Tensor(y)), np.where(cond, X34, y), dtype=dtypes.f32)
  check(Tensor(cond).where(Tensor(X34), 0.5), np.where(cond, X34, np.float32(0.5)), dtype=dtypes.f32)
  check(Tensor(cond).where(-1.0, Tensor(X34)), np.where(cond, np.float32(-1.0), X34), dtype=dtypes.f32)
  check(Tensor(cond).where(1, 0), np.where(cond, 1, 0), dtype=dtypes.i32)
  check(Tensor(cond).where(1, 0.5), np.where(cond, 1.0, 0.5), dtype=dtypes.f32)
  check(Tensor(cond).where(Tensor(I34), 2), np.where(cond, I34, 2), dtype=dtypes.i32)
  check(Tensor(cond).where(Tensor(I34), 2.5), np.where(cond, I34, 2.5), dtype=dtypes.f32)
  check(Tensor(I34).where(Tensor(X34), Tensor(y)), np.where(I34 != 0, X34, y))   # a non-bool condition tests != 0


def test_where_broadcasts_condition_and_branches():
  cond = np.array([[True], [False], [True]])
  a, b = np.arange(4, dtype=np.float32), np.float32(-1)
  check(Tensor(cond).where(Tensor(a), -1.0), np.where(cond, a, b))
  check(Tensor(cond).where(Tensor(a.reshape(1, 4)), Tensor(X234)), np.where(cond, a.reshape(1, 4), X234))


COMPARE = {"lt": lambda a, b: a < b, "gt": lambda a, b: a > b, "le": lambda a, b: a <= b, "ge": lambda a, b: a >= b,
           "eq": lambda a, b: a == b, "ne": lambda a, b: a != b}


@pytest.mark.parametrize("name", COMPARE)
def test_comparisons_return_bools(name):
  f = COMPARE[name]
  a, b = np.round(X34), np.round(X34[::-1])   # rounding makes ties, so <= and == are tested on equal values
  check(f(Tensor(a), Tensor(b)), f(a, b), dtype=dtypes.bool)
  check(f(Tensor(a), 0.0), f(a, np.float32(0)), dtype=dtypes.bool)
  check(f(Tensor(I34), 2), f(I34, 2), dtype=dtypes.bool)
  check(f(Tensor(I34), Tensor(a)), f(I34, a), dtype=dtypes.bool)   # promoted to f32 before comparing
  check(f(Tensor(I34), 1.5), f(I34, 1.5), dtype=dtypes.bool)
  check(f(Tensor(a), Tensor(a[0])), f(a, a[0]), dtype=dtypes.bool)


def test_reflected_comparisons_with_a_scalar_on_the_left():
  check(0.0 < Tensor(X34), 0 < X34)
  check(1 >= Tensor(I34), 1 >= I34)


def test_logical_ops_on_bools():
  a, b = X34 > 0, X34 < 0.5
  check(~Tensor(a), ~a)
  check(Tensor(a) & Tensor(b), a & b)
  check(Tensor(a) | Tensor(b), a | b)
  check(Tensor(a).logical_not(), ~a)


def test_torch_names_of_the_logic_bit_and_shift_operators():
  a, b = I34, I34[::-1].copy()
  check(Tensor(a).bitwise_and(Tensor(b)), np.bitwise_and(a, b), dtype=dtypes.i32)
  check(Tensor(a).bitwise_or(Tensor(b)), np.bitwise_or(a, b), dtype=dtypes.i32)
  check(Tensor(a).bitwise_xor(Tensor(b)), np.bitwise_xor(a, b), dtype=dtypes.i32)
  s = np.abs(b) % 8
  for name in ("lshift", "bitwise_left_shift"):
    check(getattr(Tensor(a), name)(Tensor(s)), np.left_shift(a, s), dtype=dtypes.i32)
    check(getattr(Tensor(a), name)(3), np.left_shift(a, 3), dtype=dtypes.i32)
  for name in ("rshift", "bitwise_right_shift"):
    check(getattr(Tensor(a), name)(Tensor(s)), np.right_shift(a, s), dtype=dtypes.i32)
    check(getattr(Tensor(a), name)(2), np.right_shift(a, 2), dtype=dtypes.i32)
  m = X34 > 0   # the logical ops take any dtype as truth values, and a python bool
  check(Tensor(X34).logical_and(Tensor(I34)), np.logical_and(X34, I34), dtype=dtypes.bool)
  check(Tensor(m).logical_or(Tensor(I34)), np.logical_or(m, I34), dtype=dtypes.bool)
  check(Tensor(I34).logical_xor(Tensor(m)), np.logical_xor(I34, m), dtype=dtypes.bool)
  check(Tensor(I34).logical_and(True), np.logical_and(I34, True), dtype=dtypes.bool)
  check(Tensor(m).logical_xor(True), np.logical_xor(m, True), dtype=dtypes.bool)


@pytest.mark.parametrize("x, to", [
  (np.array([-1.7, -0.5, 0.0, 0.5, 1.7, 2.99], np.float32), dtypes.i32),
  (np.array([-1.7, -0.0, 0.0, 0.5, 3.0], np.float32), dtypes.bool),
  (np.array([-3, 0, 1, 7], np.int32), dtypes.f32),
  (np.array([-3, 0, 1, 7], np.int32), dtypes.bool),
  (np.array([True, False], np.bool_), dtypes.i32),
  (np.array([True, False], np.bool_), dtypes.f32),
  (np.array([1.5, -2.25, 1000.0], np.float32), dtypes.f16),
])
def test_cast_matches_numpy_astype(x, to):
  np_to = {dtypes.i32: np.int32, dtypes.bool: np.bool_, dtypes.f32: np.float32, dtypes.f16: np.float16}[to]
  check(Tensor(x).cast(to), x.astype(np_to), dtype=to)


def test_cast_shortcuts_and_dtype_spellings():
  x = np.array([-1.5, 0.0, 2.5], np.float32)
  check(Tensor(x).int(), x.astype(np.int32), dtype=dtypes.i32)
  check(Tensor(x).bool(), x.astype(bool), dtype=dtypes.bool)
  check(Tensor(x).int().float(), x.astype(np.int32).astype(np.float32), dtype=dtypes.f32)
  check(Tensor(x).half().float(), x, dtype=dtypes.f32)
  check(Tensor(x).cast("int32"), x.astype(np.int32), dtype=dtypes.i32)
  check(Tensor(x).cast(np.int32), x.astype(np.int32), dtype=dtypes.i32)
  check(Tensor(x).cast(bool), x.astype(bool), dtype=dtypes.bool)
  t = Tensor(x)
  assert t.float() is t   # casting to the same dtype is a no-op


INT_A = np.array([-7, -6, -5, -1, 0, 1, 5, 6, 7, 13, -13, 2**31 - 1], np.int32)


@pytest.mark.parametrize("divisor", [1, 2, 3, -2, -3, 7, -100])
def test_integer_floordiv_and_mod_floor_like_numpy(divisor):
  check(Tensor(INT_A) // divisor, np.floor_divide(INT_A, divisor), dtype=dtypes.i32)
  check(Tensor(INT_A) % divisor, np.mod(INT_A, divisor), dtype=dtypes.i32)


def test_integer_floordiv_and_mod_with_tensor_divisors():
  b = np.array([3, -3, 2, -2, 5, -5, 4, 3, -4, 6, 6, -7], np.int32)
  check(Tensor(INT_A) // Tensor(b), np.floor_divide(INT_A, b), dtype=dtypes.i32)
  check(Tensor(INT_A) % Tensor(b), np.mod(INT_A, b), dtype=dtypes.i32)
  check(17 // Tensor(b), np.floor_divide(17, b), dtype=dtypes.i32)
  check(-17 % Tensor(b), np.mod(-17, b), dtype=dtypes.i32)


def test_divide_is_div_with_its_rounding_modes():
  check(Tensor(X34).divide(Tensor(POS34)), X34 / POS34, rtol=1e-6, dtype=dtypes.f32)
  check(Tensor(X34).divide(Tensor(POS34), rounding_mode="floor"), np.floor_divide(X34, POS34), dtype=dtypes.f32)
  check(Tensor(X34).divide(0.75, rounding_mode="trunc"), np.trunc(X34 / np.float32(0.75)), dtype=dtypes.f32)
  check(Tensor(INT_A).divide(-3, rounding_mode="trunc"), np.trunc(INT_A / -3).astype(np.int32), dtype=dtypes.i32)
  check(Tensor(INT_A).divide(-3, rounding_mode="floor"), np.floor_divide(INT_A, -3), dtype=dtypes.i32)


def test_float_floordiv_and_mod_floor_like_numpy():
  a = np.array([-5.0, -4.5, -1.5, -0.25, 0.0, 0.25, 1.5, 3.0, 4.5, 7.0, 10.0, 49.0], np.float32)
  for b in [np.float32(1.5), np.float32(-2.0), np.float32(0.75), np.float32(3.0), np.float32(-0.5)]:
    check(Tensor(a) // float(b), np.floor_divide(a, b), dtype=dtypes.f32)
    check(Tensor(a) % float(b), np.mod(a, b), atol=1e-6, dtype=dtypes.f32)
  b = np.array([1.5, -2.0, 0.75, 3.0, -0.5, 2.0, -1.5, 1.5, 1.5, 7.0, -3.0, 49.0], np.float32)
  check(Tensor(a) // Tensor(b), np.floor_divide(a, b), dtype=dtypes.f32)
  check(Tensor(a) % Tensor(b), np.mod(a, b), atol=1e-6, dtype=dtypes.f32)
  check(Tensor(INT_A[:5]) // 2.0, np.floor_divide(INT_A[:5], 2.0), dtype=dtypes.f32)


def test_float_floordiv_of_exact_multiples_is_exact():
  # x * (1/y) lands one ulp below 1 for many y: floor division and modulo must still see the exact quotient
  v = np.arange(1, 400, dtype=np.float32)
  check(Tensor(v) // Tensor(v), np.ones_like(v))
  check(Tensor(v * 3) // Tensor(v), np.full_like(v, 3))
  check(Tensor(v) % Tensor(v), np.zeros_like(v))
  check(Tensor(-v * 2) % Tensor(v), np.zeros_like(v))


def test_floor_ceil_trunc_round():
  x = np.array([-2.5, -1.5, -0.7, -0.0, 0.3, 0.5, 1.5, 2.7, 1e10, -1e10, 3e38], np.float32)
  check(Tensor(x).floor(), np.floor(x))
  check(Tensor(x).ceil(), np.ceil(x))
  check(Tensor(x).trunc(), np.trunc(x))
  check(Tensor(x).round(), np.round(x))   # half to even
  y = np.array([0.5, 1.5, 2.5, -0.5, -1.5, -2.5, 0.49999997, -0.49999997, 8388609.0], np.float32)
  check(Tensor(y).round(), np.round(y))
  check(Tensor([np.inf, -np.inf]).floor(), [np.inf, -np.inf])


@pytest.mark.parametrize("sa, sb", [((3, 1), (1, 4)), ((2, 3, 4), (4,)), ((2, 1, 4), (3, 1)), ((), (2, 3)), ((5, 1, 1), (1, 3, 1)),
                                    ((1,), (3, 4)), ((2, 3, 4), (2, 1, 4)), ((4,), ())])
def test_numpy_broadcasting(sa, sb):
  a = RNG.standard_normal(sa).astype(np.float32)
  b = RNG.standard_normal(sb).astype(np.float32)
  check(Tensor(a) + Tensor(b), a + b)
  check(Tensor(b) * Tensor(a), b * a)
  check(Tensor(a).maximum(Tensor(b)), np.maximum(a, b))


@pytest.mark.parametrize("da, db, expected", [
  (dtypes.bool, dtypes.i32, dtypes.i32), (dtypes.i32, dtypes.f16, dtypes.f16), (dtypes.f16, dtypes.f32, dtypes.f32),
  (dtypes.i32, dtypes.f32, dtypes.f32), (dtypes.bool, dtypes.f32, dtypes.f32), (dtypes.bool, dtypes.f16, dtypes.f16),
])
def test_dtype_promotion_between_tensors(da, db, expected):
  a, b = np.array([1, 0, 1]), np.array([2, 3, 4])
  ta, tb = Tensor(a, dtype=da), Tensor(b, dtype=db)
  expect = a.astype(bool if da is dtypes.bool else np.float64) + b   # exact small integers: any promotion agrees
  for r in (ta + tb, tb + ta):
    check(r, expect, dtype=expected)


def test_python_scalars_adopt_the_tensor_dtype():
  f, i, h, b = Tensor([1.5, -2.0]), Tensor([3, -4]), Tensor([1.5, 2.0]).half(), Tensor([True, False])
  check(f + 2, [3.5, 0.0], dtype=dtypes.f32)        # an int scalar with an f32 tensor stays f32
  check(i + 2, [5, -2], dtype=dtypes.i32)
  check(i + 2.5, [5.5, -1.5], dtype=dtypes.f32)     # a float scalar with an i32 tensor gives f32
  check(i * 0.5, [1.5, -2.0], dtype=dtypes.f32)
  check(h + 2.5, [4.0, 4.5], dtype=dtypes.f16)      # and stays f16 with an f16 tensor
  check(b + 1, [2, 1], dtype=dtypes.i32)
  check(b * 1.5, [1.5, 0.0], dtype=dtypes.f32)
  check(2 - i, [-1, 6], dtype=dtypes.i32)
  check(np.float32(2) * f, [3.0, -4.0], dtype=dtypes.f32)   # NumPy scalars and arrays on the left defer to the Tensor
  check(np.int32(3) + i, [6, -1], dtype=dtypes.i32)
  r = np.array([1.0, 2.0], np.float32) + f
  assert isinstance(r, Tensor)
  check(r, [2.5, 0.0], dtype=dtypes.f32)


# ---- errors name the shapes -----------------------------------------------------------------------------------------

def test_matmul_error_names_both_shapes():
  with pytest.raises(TensorError, match=r"matmul: \(2, 3\) @ \(4, 5\): inner dimensions 3 and 4 differ"):
    Tensor.zeros(2, 3) @ Tensor.zeros(4, 5)
  with pytest.raises(TensorError, match=r"matmul: \(2, 2, 3\) @ \(3, 3, 4\): batch dimensions \(2,\) and \(3,\) don't broadcast"):
    Tensor.zeros(2, 2, 3) @ Tensor.zeros(3, 3, 4)
  with pytest.raises(TensorError, match=r"matmul: \(3,\) @ \(4,\): inner dimensions 3 and 4 differ"):
    Tensor.zeros(3) @ Tensor.zeros(4)


def test_broadcast_error_names_the_shapes():
  with pytest.raises(TensorError, match=r"can't broadcast shapes \(2, 3\) and \(4,\)"): Tensor.zeros(2, 3) + Tensor.zeros(4)
  with pytest.raises(TensorError, match=r"\(3, 1\).*\(2, 4\)"): Tensor.zeros(3, 1).expand(2, 4)
  with pytest.raises(TensorError, match=r"\(2, 3\)"): Tensor(np.ones((2, 3), bool)).where(Tensor.zeros(3, 3), 0.0)


def test_reshape_error_names_the_shapes():
  with pytest.raises(TensorError, match=r"can't reshape \(2, 3\) into \(4,\)"): Tensor.zeros(2, 3).reshape(4)
  with pytest.raises(TensorError, match=r"can't reshape \(2, 3\) into \(4, -1\)"): Tensor.zeros(2, 3).reshape(4, -1)
  with pytest.raises(TensorError, match=r"only one -1"): Tensor.zeros(2, 3).reshape(-1, -1)


def test_index_errors_name_the_axis_and_shape_and_are_index_errors():
  # IndexError (numpy's and torch's kind, and numpy's words) as well as TensorError
  with pytest.raises(IndexError, match=r"index 3 is out of bounds for axis 0 of size 3 \(shape \(3, 4\)\)"): Tensor.zeros(3, 4)[3]
  with pytest.raises(TensorError, match=r"index -5 is out of bounds for axis 1 of size 4"): Tensor.zeros(3, 4)[:, -5]
  with pytest.raises(IndexError, match=r"too many indices \(3\) for a tensor of shape \(3, 4\)"): Tensor.zeros(3, 4)[0, 0, 0]
  with pytest.raises(IndexError, match="only have a single ellipsis"): Tensor.zeros(3, 4)[..., 0, ...]
  with pytest.raises(IndexError, match="must be integers"): Tensor.zeros(3, 4)[Tensor([0.5])]
  with pytest.raises(IndexError, match="must be integers"): Tensor.zeros(3, 4)[[1.5]]
  with pytest.raises(IndexError, match="boolean mask"): Tensor.zeros(3, 4)[[True, False, True]]
  with pytest.raises(IndexError, match="too many indices"): Tensor(2.0)[:]


def test_permute_and_dimension_errors_name_the_shape():
  with pytest.raises(TensorError, match=r"permute: \(0, 0\) is not a permutation of the axes of \(2, 3\)"): Tensor.zeros(2, 3).permute(0, 0)
  with pytest.raises(TensorError, match=r"dimension 2 out of range for a tensor of shape \(2, 3\)"): Tensor.zeros(2, 3).permute(0, 2)
  with pytest.raises(TensorError, match=r"dimension 3 out of range for a tensor of shape \(2, 3\)"): Tensor.zeros(2, 3).sum(3)
  with pytest.raises(TensorError, match=r"cat: shapes \(2, 3\) and \(2, 4\) differ outside dim 0"):
    Tensor.cat(Tensor.zeros(2, 3), Tensor.zeros(2, 4))
  with pytest.raises(TensorError, match=r"stack: shapes \(2, 3\) and \(3, 2\) differ"): Tensor.stack(Tensor.zeros(2, 3), Tensor.zeros(3, 2))


def test_conv2d_channel_mismatch_names_both_shapes():
  with pytest.raises(TensorError, match=r"conv2d: input \(1, 3, 5, 5\) .*got \(4, 2, 3, 3\)"):
    Tensor.zeros(1, 3, 5, 5).conv2d(Tensor.zeros(4, 2, 3, 3))
  with pytest.raises(TensorError, match=r"conv: input \(5, 5\) and weight \(4, 3, 3, 3\): expected .* \(N, C, \*spatial\) or \(C, \*spatial\)"):
    Tensor.zeros(5, 5).conv2d(Tensor.zeros(4, 3, 3, 3))


def test_item_on_a_non_scalar_names_the_shape():
  with pytest.raises(TensorError, match=r"item\(\) needs a tensor with one element, this one has shape \(2, 3\)"): Tensor.zeros(2, 3).item()
  with pytest.raises(TensorError, match=r"truth value of a tensor of shape \(2,\) is ambiguous"): bool(Tensor.zeros(2))


def test_backward_on_a_non_scalar_needs_a_gradient():
  x = Tensor(np.ones((2, 3), np.float32), requires_grad=True)
  with pytest.raises(TensorError, match=r"backward\(\) on a f32\(2, 3\) tensor needs a gradient"): (x * 2).backward()
