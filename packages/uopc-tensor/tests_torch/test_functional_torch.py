"""PyTorch as the oracle for the functional pieces: convolutions of any rank and their transposes, pooling options,
interpolate, einsum, f16 sums and math in f32, the losses and attention, each forward and backward.

The helpers come from test_grad_torch (check: outputs and every float input's gradient) and test_ops_torch (exact,
forward, raises_like_torch, the special values).
"""
import numpy as np
import pytest
import torch
import torch.nn.functional as F
from uopc.tensor import Tensor
from test_grad_torch import check, assert_close, randn, positive
from test_ops_torch import INF, ints, floats, forward, raises_like_torch


# ---- convolution, pooling, resampling, einsum ---------------------------------------------------------------------------

CONVS_ND = [  # (input, weight, kwargs): conv1d, conv3d, the padding forms, unbatched input
  ((2, 3, 11), (6, 1, 5), {"groups": 3}),
  ((2, 2, 9), (4, 2, 3), {"stride": 2, "padding": (2, 1)}),          # a flat (before, after) pair for one spatial axis
  ((1, 2, 5, 5, 5), (2, 2, 3, 3, 3), {"padding": 1}),
  ((1, 2, 4, 5, 3), (3, 2, 2, 3, 1), {"padding": "same"}),
  ((2, 3, 7, 6), (4, 3, 2, 3), {"padding": "same", "dilation": 2}),
  ((2, 3, 7, 6), (4, 3, 3, 3), {"padding": "valid", "stride": (2, 1)}),
  ((1, 2, 6, 6), (2, 2, 2, 2), {"padding": (2, 1, 0, 1)}),             # F.pad's flat tuple: last axis first
  ((1, 1, 8, 8), (1, 1, 3, 3), {"padding": -1}),
  ((3, 7, 6), (4, 3, 3, 3), {"padding": 1}),                            # unbatched (C, H, W)
]


def _torch_conv(x, w, b, kw):
  kw = dict(kw)
  pad = kw.pop("padding", 0)
  if isinstance(pad, tuple) and len(pad) == 2 * (w.ndim - 2) or (isinstance(pad, int) and pad < 0):
    x, pad = F.pad(x, pad if isinstance(pad, tuple) else (pad,) * 2 * (w.ndim - 2)), 0
  return {3: F.conv1d, 4: F.conv2d, 5: F.conv3d}[w.ndim](x, w, b, padding=pad, **kw)


@pytest.mark.parametrize("case", CONVS_ND, ids=str)
def test_convolution_of_any_rank_and_padding_form(case):
  xs, ws, kw = case
  check(lambda x, w, b: x.conv2d(w, b, **kw), lambda x, w, b: _torch_conv(x, w, b, kw), randn(*xs, seed=46), randn(*ws, seed=47),
        randn(ws[0], seed=48))


CONV_T = [  # (input, weight, kwargs) for conv_transpose
  ((2, 4, 5, 5), (4, 2, 3, 3), {}),
  ((2, 4, 5, 5), (4, 2, 3, 3), {"groups": 2}),
  ((1, 2, 4, 5), (2, 3, 3, 2), {"stride": (2, 3), "padding": (1, 0), "output_padding": (1, 2)}),
  ((1, 2, 5, 4), (2, 2, 3, 3), {"dilation": (2, 1), "padding": 2}),
  ((2, 3, 7), (3, 2, 4), {"stride": 3, "padding": 1}),                     # 1-D
  ((3, 4, 4), (3, 2, 2, 2), {"stride": 2}),                                # unbatched
  ((1, 2, 3, 4, 3), (2, 2, 2, 3, 2), {"stride": (2, 1, 2), "padding": (0, 1, 0)}),   # 3-D
]


@pytest.mark.parametrize("case", CONV_T, ids=str)
def test_conv_transpose(case):
  xs, ws, kw = case
  name = f"conv_transpose{len(ws) - 2}d"   # 1d, 2d and 3d are one method (the weight sets the rank): each name is checked
  check(lambda x, w, b: getattr(x, name)(w, b, **kw), lambda x, w, b: getattr(F, name)(x, w, b, **kw), randn(*xs, seed=49), randn(*ws, seed=50),
        randn(ws[1] * kw.get("groups", 1), seed=51))


POOLS_EXT = [  # (kernel, stride, padding, dilation, ceil_mode)
  ((3, 3), 3, 1, 1, True),
  ((3, 2), 3, 1, 1, True),
  (4, 3, 1, 1, True),
  ((2, 2), (2, 3), 0, (3, 2), False),
  (3, 1, 1, 2, False),
  (2, 2, 0, 1, True),
  ((2, 2), (3, 4), 0, 1, False),    # strides beyond the window: gaps between windows
]


@pytest.mark.parametrize("case", POOLS_EXT, ids=str)
def test_max_pool_with_ceil_mode_and_dilation_and_its_indices(case):
  k, s, p, d, ceil = case
  x = np.random.default_rng(52).permutation(2 * 3 * 7 * 7).reshape(2, 3, 7, 7).astype(np.float32) / 40   # distinct: no ties
  check(lambda t: t.max_pool2d(k, s, p, d, ceil), lambda t: F.max_pool2d(t, k, s, p, d, ceil), x)
  forward(lambda t: t.max_pool2d(k, s, p, d, ceil, return_indices=True).indices,
          lambda t: F.max_pool2d(t, k, s, p, d, ceil, return_indices=True)[1], x)


@pytest.mark.parametrize("case", [c for c in POOLS_EXT if c[3] == 1], ids=str)
@pytest.mark.parametrize("count_include_pad", [True, False])
def test_avg_pool_with_ceil_mode_counting_or_not_the_padding(case, count_include_pad):
  k, s, p, _, ceil = case
  check(lambda t: t.avg_pool2d(k, s, p, ceil, count_include_pad), lambda t: F.avg_pool2d(t, k, s, p, ceil, count_include_pad),
        randn(2, 3, 7, 7, seed=53))


def test_pooling_of_other_ranks_integers_flat_padding_and_unpool():
  x = randn(2, 3, 5, 6, 7, seed=54)
  check(lambda t: t.avg_pool3d((3, 2, 3), 2, 1, count_include_pad=False), lambda t: F.avg_pool3d(t, (3, 2, 3), 2, 1, count_include_pad=False), x)
  check(lambda t: t.max_pool3d(2, ceil_mode=True), lambda t: F.max_pool3d(t, 2, ceil_mode=True), x)
  check(lambda t: t.max_pool1d(3, 2, 1), lambda t: F.max_pool1d(t, 3, 2, 1), randn(2, 3, 9, seed=55))
  check(lambda t: t.max_pool2d((3, 3), padding=(0, 1, 0, 1)), lambda t: F.max_pool2d(F.pad(t, (0, 1, 0, 1), value=-INF), (3, 3)),
        randn(1, 2, 8, 8, seed=56))
  forward(lambda t: t.max_pool2d(2, padding=1), lambda t: F.max_pool2d(t.float(), 2, padding=1).int(), ints(*range(-40, 40)).reshape(2, 2, 4, 5))
  assert Tensor(ints(*range(16)).reshape(1, 1, 4, 4)).max_pool2d(2).dtype.name == "i32"   # integers stay integers
  for shape, size in [((2, 3, 6, 6), None), ((2, 3, 6, 7), (6, 7))]:
    v, i = F.max_pool2d(torch.tensor(randn(*shape, seed=57)), (2, 2), return_indices=True)
    vu, iu = Tensor(v.numpy()), Tensor(i.numpy().astype(np.int32))
    assert_close(vu.max_unpool2d(iu, (2, 2), output_size=size).numpy(), F.max_unpool2d(v, i, (2, 2), output_size=size).numpy(), "max_unpool2d")
  raises_like_torch(lambda t: t.max_pool2d(2, padding=(1, 1, 1)), lambda t: F.max_pool2d(t, 2, padding=(1, 1, 1)), randn(1, 1, 4, 4))


INTERP = [  # (input shape, output size, mode, align_corners)
  ((2, 3, 13), (9,), "nearest", None), ((2, 3, 9), (13,), "nearest-exact", None), ((1, 2, 13, 9), (11, 10), "nearest", None),
  ((1, 2, 5, 2, 8), (3, 6, 4), "nearest", None), ((2, 3, 10), (7,), "linear", False), ((2, 3, 7), (12,), "linear", True),
  ((1, 2, 6, 9), (9, 4), "bilinear", False), ((1, 2, 6, 9), (9, 4), "bilinear", True), ((1, 2, 5, 2, 4), (3, 5, 4), "trilinear", False),
  ((1, 1, 3, 4), (1, 1), "bilinear", True),
]


@pytest.mark.parametrize("case", INTERP, ids=str)
def test_interpolate(case):
  shape, size, mode, ac = case
  check(lambda t: t.interpolate(size, mode=mode, align_corners=ac), lambda t: F.interpolate(t, size, mode=mode, align_corners=ac),
        randn(*shape, seed=58))


def test_interpolate_by_scale_factor_and_of_integers():
  x = randn(1, 2, 6, 5, seed=59)
  check(lambda t: t.interpolate(scale_factor=1.5, mode="bilinear"), lambda t: F.interpolate(t, scale_factor=1.5, mode="bilinear"), x)
  check(lambda t: t.interpolate(scale_factor=0.7), lambda t: F.interpolate(t, scale_factor=0.7), x)
  forward(lambda t: t.interpolate((5, 3)), lambda t: F.interpolate(t.float(), (5, 3)).int(), ints(*range(30)).reshape(1, 1, 6, 5))


EINSUMS = [
  ("->", [()]), ("ij->ji", [(3, 4)]), ("ji", [(3, 4)]), ("ijk->", [(2, 3, 4)]), ("ij,jk", [(3, 4), (4, 5)]), ("ik,k->i", [(3, 4), (4,)]),
  ("i,i", [(5,), (5,)]), ("i,j->ij", [(3,), (4,)]), ("ijk,ikl->jil", [(2, 3, 4), (2, 4, 5)]), ("ik,jkl,il->ij", [(2, 3), (4, 3, 5), (2, 5)]),
  ("ii->i", [(4, 4)]), ("ii", [(4, 4)]), ("...ii->...i", [(3, 4, 4)]), ("...id,...jd->...ij", [(2, 3, 4), (2, 5, 4)]),
  ("i...j,ji...->...", [(2, 3, 4, 5), (5, 2, 4)]), ("pqrs,tuqvr->pstuv", [(2, 3, 4, 2), (2, 2, 3, 3, 4)]), ("bij,bjk->bik", [(1, 2, 3), (4, 3, 2)]),
]


@pytest.mark.parametrize("formula,shapes", EINSUMS, ids=[e[0] for e in EINSUMS])
def test_einsum(formula, shapes):
  check(lambda *ts: Tensor.einsum(formula, *ts), lambda *ts: torch.einsum(formula, *ts),
        *(randn(*s, seed=60 + k) for k, s in enumerate(shapes)))


def test_einsum_refuses_what_torch_refuses():
  a, b = randn(2, 3, seed=70), randn(4, 5, seed=71)
  raises_like_torch(lambda x, y: Tensor.einsum("ij,jk->ik", x, y), lambda x, y: torch.einsum("ij,jk->ik", x, y), a, b)
  raises_like_torch(lambda x: Tensor.einsum("ij,jk->ik", x), lambda x: torch.einsum("ij,jk->ik", x), a)
  raises_like_torch(lambda x, y: Tensor.einsum("...i...,j", x, y), lambda x, y: torch.einsum("...i...,j", x, y), a, b)


def test_f16_matmul_sums_in_f32():
  a, b = randn(64, 64, seed=72), randn(64, 64, seed=73)
  out = (Tensor(a).half() @ Tensor(b).half()).numpy()
  ref = (torch.tensor(a).half().float() @ torch.tensor(b).half().float()).half().numpy()   # what an f32-accumulating BLAS gives
  assert out.dtype == np.float16
  assert np.mean(out != ref) < 0.01, f"{np.sum(out != ref)} of 4096 elements differ from the f32-summed product"


_H = (np.random.default_rng(76).standard_normal((2, 3000)) * 2).astype(np.float16)   # past 2048: an f16 accumulator drifts
_H_T = np.array([7, 2999], np.int32)
F16_OPS = {   # name: (uopc, torch, NumPy input): every reduction and float function of an f16 tensor
  "sum": (lambda x: x.sum(1), lambda x: x.sum(1)), "mean": (lambda x: x.mean(1), lambda x: x.mean(1)),
  "var": (lambda x: x.var(1), lambda x: x.var(1)), "std": (lambda x: x.std(1), lambda x: x.std(1)),
  "prod": (lambda x: (x * 0.01 + 1).prod(1), lambda x: (x * 0.01 + 1).prod(1)),
  "softmax": (lambda x: x.softmax(1), lambda x: x.softmax(1)), "log_softmax": (lambda x: x.log_softmax(1), lambda x: x.log_softmax(1)),
  "logsumexp": (lambda x: x.logsumexp(1), lambda x: x.logsumexp(1)), "cumsum": (lambda x: x.cumsum(1), lambda x: x.cumsum(1)),
  "cumprod": (lambda x: (x * 0.001 + 1).cumprod(1), lambda x: (x * 0.001 + 1).cumprod(1)),
  "logcumsumexp": (lambda x: x.logcumsumexp(1), lambda x: x.logcumsumexp(1)),
  "norm": (lambda x: x.norm(dim=1), lambda x: torch.linalg.vector_norm(x, dim=1)),
  "norm 1": (lambda x: x.norm(1, dim=1), lambda x: torch.linalg.vector_norm(x, 1, dim=1)),
  "norm 0": (lambda x: x.norm(0, dim=1), lambda x: torch.linalg.vector_norm(x, 0, dim=1)),
  "norm inf": (lambda x: x.norm(float("inf"), dim=1), lambda x: torch.linalg.vector_norm(x, float("inf"), dim=1)),
  "cross_entropy": (lambda x: x.cross_entropy(Tensor(_H_T)), lambda x: F.cross_entropy(x, torch.tensor(_H_T.astype(np.int64)))),
  "nll_loss": (lambda x: x.nll_loss(Tensor(_H_T)), lambda x: F.nll_loss(x, torch.tensor(_H_T.astype(np.int64)))),
  "mse_loss": (lambda x: x.mse_loss(x * 0.5), lambda x: F.mse_loss(x, x * 0.5)),
  "layernorm": (lambda x: x.layernorm(), lambda x: F.layer_norm(x, (3000,))),
  "avg_pool1d": (lambda x: x.reshape(1, 2, -1).avg_pool1d(10), lambda x: F.avg_pool1d(x.reshape(1, 2, -1), 10)),
  "interpolate": (lambda x: x.reshape(1, 2, -1).interpolate(size=4000, mode="linear"),
                  lambda x: F.interpolate(x.reshape(1, 2, -1), size=4000, mode="linear")),
  "einsum": (lambda x: Tensor.einsum("ij,kj->ik", x, x), lambda x: torch.einsum("ij,kj->ik", x, x)),
  "conv1d": (lambda x: x.reshape(1, 2, -1).conv1d(x[:, :5].reshape(1, 2, 5)), lambda x: F.conv1d(x.reshape(1, 2, -1), x[:, :5].reshape(1, 2, 5))),
  "attention": (lambda x: x.reshape(2, 100, 30).scaled_dot_product_attention(x.reshape(2, 100, 30), x.reshape(2, 100, 30)),
                lambda x: F.scaled_dot_product_attention(x.reshape(2, 100, 30), x.reshape(2, 100, 30), x.reshape(2, 100, 30))),
  **{n: (lambda x, n=n: getattr(x, n)(), lambda x, n=n: getattr(torch, n)(x)) for n in (
    "exp", "log", "sin", "cos", "tan", "tanh", "sigmoid", "erf", "sinh", "cosh", "asinh", "atan", "expm1", "log1p", "rsqrt")},
  "gelu": (lambda x: x.gelu(), lambda x: F.gelu(x, approximate="tanh")), "gelu none": (lambda x: x.gelu("none"), F.gelu),
  **{n: (lambda x, n=n: getattr(x, n)(), lambda x, n=n: getattr(F, n)(x)) for n in (
    "silu", "mish", "softplus", "elu", "selu", "celu", "logsigmoid", "hardswish", "hardsigmoid", "softsign")},
  "asin": (lambda x: (x * 0.1).asin(), lambda x: (x * 0.1).asin()), "acos": (lambda x: (x * 0.1).acos(), lambda x: (x * 0.1).acos()),
  "atanh": (lambda x: (x * 0.1).atanh(), lambda x: (x * 0.1).atanh()), "acosh": (lambda x: (x.abs() + 1).acosh(), lambda x: (x.abs() + 1).acosh()),
  "pow": (lambda x: x.abs() ** 2.5, lambda x: x.abs() ** 2.5), "rpow": (lambda x: 2.0 ** x, lambda x: 2.0 ** x),
  "logaddexp": (lambda x: x.logaddexp(x * 0.5), lambda x: torch.logaddexp(x, x * 0.5)),
}
# torch's CPU product of f16 rounds to f16 as it goes (1.001^3000 in f16 was 17.56, the f32 product 18.69): uopc
# multiplies in f32 (test_numerics), so only the dtype is compared there
F16_DTYPE_ONLY = {"prod", "cumprod"}
# gelu's tail 0.5 x (1 + erf(x / sqrt 2)) is uopc's erf's absolute error (Abramowitz and Stegun 7.1.26: 1.5e-7) times |x| / 2
# (|x| < 9 here), more than an f16 subnormal's ulp (6e-8)
F16_ATOL = {"gelu none": 7e-7}


@pytest.mark.parametrize("name", F16_OPS)
def test_f16_reductions_and_math_give_torchs_dtype_and_value(name):
  """torch keeps f16 for all of these (uopc gave f32 for mean, var, norms, the losses, layernorm, sigmoid, tanh, gelu,
  erf, silu, ...), computing in f32; the values agree within 2 f16 ulps (each rounds an f32 result once)."""
  f_u, f_t = F16_OPS[name]
  u, t = f_u(Tensor(_H)), f_t(torch.tensor(_H))
  assert t.dtype == torch.float16 and u.dtype.name == "f16", f"{name}: uopc {u.dtype.name}, torch {t.dtype}"
  if name in F16_DTYPE_ONLY: return
  a, b = u.numpy().astype(np.float64), t.numpy().astype(np.float64)
  assert a.shape == b.shape
  np.testing.assert_allclose(a, b, rtol=2**-9, atol=F16_ATOL.get(name, 2**-22), equal_nan=True, err_msg=name)


# ---- losses ------------------------------------------------------------------------------------------------------------

LOGITS, CLASSES = randn(6, 5, seed=74) * 2, ints(1, 4, 3, 0, 3, 2)
WEIGHT = positive(5, seed=75)


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_nll_loss_with_weights_ignore_index_and_spatial_targets(reduction):
  lp = torch.log_softmax(torch.tensor(LOGITS), 1).numpy()
  check(lambda x, t: x.nll_loss(t, reduction=reduction), lambda x, t: F.nll_loss(x, t, reduction=reduction), lp, CLASSES)
  w_u, w_t = Tensor(WEIGHT), torch.tensor(WEIGHT)   # class weights are constants (torch refuses a gradient for them)
  check(lambda x, t: x.nll_loss(t, w_u, ignore_index=3, reduction=reduction),
        lambda x, t: F.nll_loss(x, t, w_t, ignore_index=3, reduction=reduction), lp, CLASSES)
  lp3 = torch.log_softmax(torch.tensor(randn(2, 5, 3, 2, seed=76)), 1).numpy()
  check(lambda x, t: x.nll_loss(t, w_u, reduction=reduction), lambda x, t: F.nll_loss(x, t, w_t, reduction=reduction), lp3,
        np.random.default_rng(77).integers(0, 5, (2, 3, 2)).astype(np.int32))


@pytest.mark.parametrize("label_smoothing", [0.0, 0.3])
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_cross_entropy_with_weights_probabilities_and_1d_logits(reduction, label_smoothing):
  kw = dict(reduction=reduction, label_smoothing=label_smoothing)
  w_u, w_t = Tensor(WEIGHT), torch.tensor(WEIGHT)
  check(lambda x, t: x.cross_entropy(t, w_u, ignore_index=3, **kw), lambda x, t: F.cross_entropy(x, t, w_t, ignore_index=3, **kw),
        LOGITS, CLASSES)
  probs = torch.softmax(torch.tensor(randn(6, 5, seed=78)), 1).numpy()
  check(lambda x, p: x.cross_entropy(p, **kw), lambda x, p: F.cross_entropy(x, p, **kw), LOGITS, probs)   # the targets get gradients too
  check(lambda x, p: x.cross_entropy(p, w_u, **kw), lambda x, p: F.cross_entropy(x, p, w_t, **kw), randn(2, 5, 3, seed=79),
        torch.softmax(torch.tensor(randn(2, 5, 3, seed=80)), 1).numpy())
  check(lambda x, t: x.cross_entropy(t, **kw), lambda x, t: F.cross_entropy(x, t, **kw), LOGITS[0].copy(), np.array(2, dtype=np.int32))
  check(lambda x, p: x.cross_entropy(p, **kw), lambda x, p: F.cross_entropy(x, p, **kw), LOGITS[0].copy(), probs[0].copy())


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_binary_cross_entropy_and_with_logits(reduction):
  p, t = torch.sigmoid(torch.tensor(randn(4, 5, seed=81))).numpy(), np.random.default_rng(82).random((4, 5)).astype(np.float32)
  w, pw = positive(5, seed=83), positive(5, seed=84)
  check(lambda x, y: x.binary_cross_entropy(y, reduction=reduction), lambda x, y: F.binary_cross_entropy(x, y, reduction=reduction), p, t)
  check(lambda x, y: x.binary_cross_entropy(y, Tensor(w), reduction=reduction),
        lambda x, y: F.binary_cross_entropy(x, y, torch.tensor(w), reduction=reduction), p, t)
  z = randn(4, 5, seed=85) * 30   # far out: no overflow
  check(lambda x, y: x.binary_cross_entropy_with_logits(y, Tensor(w), reduction, Tensor(pw)),
        lambda x, y: F.binary_cross_entropy_with_logits(x, y, torch.tensor(w), reduction=reduction, pos_weight=torch.tensor(pw)), z, t)
  check(lambda x, y: x.binary_cross_entropy(y), lambda x, y: F.binary_cross_entropy(x, y), floats(0.0, 1.0, 0.5, 1e-30), floats(1.0, 0.0, 0.5, 1.0))


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_regression_losses_and_kl_div(reduction):
  x, y = randn(3, 4, seed=86), randn(3, 4, seed=87)
  check(lambda a, b: a.mse_loss(b, reduction), lambda a, b: F.mse_loss(a, b, reduction=reduction), x, y)
  check(lambda a, b: a.l1_loss(b, reduction), lambda a, b: F.l1_loss(a, b, reduction=reduction), x, y)
  for beta in (1.0, 0.3, 0.0):
    check(lambda a, b: a.smooth_l1_loss(b, reduction, beta), lambda a, b: F.smooth_l1_loss(a, b, reduction=reduction, beta=beta), x, y)
  check(lambda a, b: a.huber_loss(b, reduction, 0.5), lambda a, b: F.huber_loss(a, b, reduction=reduction, delta=0.5), x, y)
  lp = torch.log_softmax(torch.tensor(x), 1).numpy()
  q = torch.softmax(torch.tensor(y), 1).numpy()
  check(lambda a, b: a.kl_div(b, reduction), lambda a, b: F.kl_div(a, b, reduction=reduction), lp, q)
  if reduction == "mean": check(lambda a, b: a.kl_div(b, "batchmean"), lambda a, b: F.kl_div(a, b, reduction="batchmean"), lp, q)
  q[0, 0] = 0.0   # 0 * log 0 is 0 (torch's gradient for that target is NaN, so the values only)
  forward(lambda a, b: a.kl_div(b, reduction), lambda a, b: F.kl_div(a, b, reduction=reduction), lp, q)
  check(lambda a, b: a.kl_div(b, reduction, log_target=True), lambda a, b: F.kl_div(a, b, reduction=reduction, log_target=True), lp, lp[::-1].copy())


def test_loss_arguments_torch_refuses():
  raises_like_torch(lambda x, t: x.cross_entropy(t), lambda x, t: F.cross_entropy(x, t), randn(4, 3), randn(4, 1))
  for f_u, f_t in [(lambda x, y: x.mse_loss(y, "typo"), lambda x, y: F.mse_loss(x, y, reduction="typo")),
                   (lambda x, y: x.cross_entropy(y, reduction="typo"), lambda x, y: F.cross_entropy(x, y, reduction="typo"))]:
    with pytest.raises(ValueError): f_t(torch.tensor(randn(4, 3)), torch.tensor(randn(4, 3)))
    with pytest.raises(ValueError): f_u(Tensor(randn(4, 3)), Tensor(randn(4, 3)))


# ---- attention ---------------------------------------------------------------------------------------------------------

def test_attention_with_grouped_query_heads_and_the_mask_and_causal_refusal():
  q, k, v = randn(2, 4, 3, 8, seed=88), randn(2, 2, 5, 8, seed=89), randn(2, 2, 5, 4, seed=90)
  check(lambda a, b, c: a.scaled_dot_product_attention(b, c, enable_gqa=True),
        lambda a, b, c: F.scaled_dot_product_attention(a, b, c, enable_gqa=True), q, k, v)
  m = np.ones((3, 5), dtype=bool)
  raises_like_torch(lambda a, b, c, d: a.scaled_dot_product_attention(b, c, attn_mask=d, is_causal=True),
                    lambda a, b, c, d: F.scaled_dot_product_attention(a, b, c, attn_mask=d, is_causal=True), q, q, q, m)
