"""Tensor's functional pieces against NumPy: matmul and linear, conv2d and pooling against direct loops, softmax,
the losses against their formulas, layernorm, embedding, dropout and scaled dot-product attention.

The data and check() come from test_tensor_ops (NumPy is the oracle, shapes are reused so kernels compile once).
"""
import math
import numpy as np
import pytest
from uopc.dtype import dtypes
from uopc.uop import UOp, Ops, prod
from uopc.tensor import Tensor, TensorError
from test_tensor_ops import RNG, X234, X34, I34, check


# ---- linear algebra and nn ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("sa, sb", [((3, 4), (4, 5)), ((2, 3, 4), (4, 5)), ((2, 3, 4), (2, 4, 5)), ((2, 1, 3, 4), (5, 4, 2)),
                                    ((4,), (4, 5)), ((3, 4), (4,)), ((4,), (4,)), ((2, 3, 4), (4,)), ((4,), (2, 4, 5)), ((1, 1), (1, 1))])
def test_matmul_matches_numpy(sa, sb):
  a = RNG.standard_normal(sa).astype(np.float32)
  b = RNG.standard_normal(sb).astype(np.float32)
  check(Tensor(a) @ Tensor(b), a @ b, rtol=1e-5, atol=1e-5)
  check(Tensor(a).matmul(Tensor(b)), a @ b, rtol=1e-5, atol=1e-5)



def test_a_linear_layer_written_as_heads_matches_numpy():
  # out[b, h, t, d] = (x @ W)[b, t, h * D + d] as one kernel: the heads are more columns of W, tiled as a GEMM's (its
  # rows x vectors), not as a convolution's channels
  x = RNG.standard_normal((2, 32, 64)).astype(np.float32)
  w = RNG.standard_normal((64, 4 * 32)).astype(np.float32)
  got = (Tensor(x) @ Tensor(w)).reshape(2, 32, 4, 32).transpose(1, 2).contiguous()
  check(got, (x @ w).reshape(2, 32, 4, 32).transpose(0, 2, 1, 3), rtol=1e-4, atol=1e-4)

@pytest.mark.parametrize("batch", [(), (3,), (2, 3)])
@pytest.mark.parametrize("dtype", [np.float32, np.int32])
def test_matmul_s_straight_road_builds_the_graph_of_the_general_one(batch, dtype, monkeypatch):
  # two operands of one dtype and one batch go straight to UOps (_same_batch_matmul): the very nodes the general road
  # makes over the same buffers, so kernels, schedules and gradients can't tell them apart; sizes of 1 skip the same expands
  from uopc.tensor.matmul import MatmulMixin
  grad = dtype is np.float32
  pairs = [(Tensor(np.ones(batch + (n, k), dtype), requires_grad=grad), Tensor(np.ones(batch + (k, m), dtype)))
           for n in (1, 4) for k in (1, 5) for m in (1, 6)]
  straight = [a @ b for a, b in pairs]
  monkeypatch.setattr(MatmulMixin, "_same_batch_matmul", lambda self, w: None)
  general = [a @ b for a, b in pairs]
  for s, g in zip(straight, general): assert s.uop is g.uop and s.requires_grad == g.requires_grad == grad


def test_a_matmul_takes_a_row_factor_of_its_first_operand_out_of_the_sum():
  # (x * f) @ w with f one value a row (softmax's 1 / sum) is (x @ w) * f: the factor scales the n x m output instead of
  # the n x k operand, the values and gradients NumPy's; a constant factor stays where it is; and softmax(s) @ v stores
  # exp(s - max) alone, never the probabilities
  rng = np.random.default_rng(5)
  X, F, W = (rng.standard_normal((3, 8, 16)), rng.uniform(0.5, 2.0, (3, 8, 1)), rng.standard_normal((3, 16, 4)))
  X, F, W = (a.astype(np.float32) for a in (X, F, W))
  for divide in (False, True):
    x, f, w = (Tensor(a, requires_grad=True) for a in (X, F, W))
    out = (x / f if divide else x * f) @ w
    assert out.uop.op is Ops.MUL and any(s.op is Ops.REDUCE for s in out.uop.src)   # summed first, then scaled
    A = X / F if divide else X * F
    check(out, A @ W, rtol=1e-5, atol=1e-5)
    out.sum().backward()
    dA = np.ones((3, 8, 4), np.float32) @ W.transpose(0, 2, 1)
    check(x.grad, dA / F if divide else dA * F, rtol=1e-5, atol=1e-5)
    check(f.grad, (dA * X).sum(-1, keepdims=True) * (-1 / F ** 2 if divide else 1), rtol=1e-4, atol=1e-5)
    check(w.grad, A.transpose(0, 2, 1) @ np.ones((3, 8, 4), np.float32), rtol=1e-5, atol=1e-5)
  assert ((Tensor(X) * 2.0) @ Tensor(W)).uop.op is Ops.REDUCE
  # factors peeled in a loop: a chain of 3000 of them (deeper than Python's recursion limit) is one matmul, scaled
  y, g = Tensor(X), Tensor(np.full((3, 8, 1), 1.0001, np.float32))
  for _ in range(3000): y = y * g
  check(y @ Tensor(W), (X @ W) * np.float32(1.0001) ** 3000, rtol=1e-3, atol=1e-3)
  s, v = Tensor(rng.standard_normal((256, 256)).astype(np.float32)), Tensor(rng.standard_normal((256, 64)).astype(np.float32))
  y = s.softmax(-1) @ v
  e = np.exp(s.numpy() - s.numpy().max(-1, keepdims=True))
  check(y, (e / e.sum(-1, keepdims=True)) @ v.numpy(), rtol=1e-5, atol=1e-5)
  assert sum(1 for k in (s.softmax(-1) @ v).schedule() if k.out.shape == (256 * 256,)) == 1   # exp's, not the quotient too


@pytest.mark.parametrize("branches", [("t", 0.0), (0, "t"), ("t", "u"), ("t", 2), (-0.0, "t"), ("t", float("nan")), ("t", True),
                                      ("t", 2 ** 40), ("t", "wide"), ("wide", "t"), (1, 2.5)])
@pytest.mark.parametrize("dtype", [np.float32, np.int32])
def test_where_of_tensors_and_numbers_matches_numpy(branches, dtype):
  # a number takes the other branch's dtype (two numbers their own, promoted); one with no value there is refused as
  # full() refuses it
  t = Tensor(np.arange(12, dtype=dtype).reshape(3, 4) - 5, requires_grad=dtype is np.float32)
  named = {"t": t, "u": t * 2, "wide": Tensor(np.ones((2, 3, 4), dtype))}
  a, b = (named.get(x, x) if isinstance(x, str) else x for x in branches)
  cond = t > 0
  if dtype is np.int32 and 2 ** 40 in branches:
    with pytest.raises(TensorError, match="doesn't fit in i32"): cond.where(a, b)
    return
  got = cond.where(a, b)
  assert got.requires_grad == (cond.requires_grad or any(isinstance(x, Tensor) and x.requires_grad for x in (a, b)))
  value = lambda x: x.numpy() if isinstance(x, Tensor) else x
  np.testing.assert_array_equal(got.numpy(), np.where(value(cond), value(a), value(b)).astype(got.numpy().dtype))


def test_where_holds_a_number_as_a_broadcast_constant():
  # no tensor of its own for the number: its CONST, broadcast, straight into the WHERE (as const_like builds it)
  t = Tensor(np.ones((3, 4), np.float32))
  cond = t > 0
  assert cond.where(t, 0.0).uop is UOp(Ops.WHERE, (cond.uop, t.uop, t.uop.const_like(0.0)))
  assert cond.where(2, t).uop is UOp(Ops.WHERE, (cond.uop, t.uop.const_like(2), t.uop))


@pytest.mark.parametrize("shapes", [((3, 4), (4,)), ((3, 1), (1, 4)), ((2, 3, 4), (3, 1)), ((4,), (2, 3, 4)), ((3, 4), (2, 4))])
def test_a_broadcast_of_one_dtype_builds_the_graph_of_broadcast_to(shapes):
  # _operands' road for one dtype builds the reshape and expand UOps of _broadcast_to without its Tensors
  x, y = (Tensor(np.ones(s, np.float32), requires_grad=True) for s in shapes)
  try: shape = np.broadcast_shapes(*shapes)
  except ValueError:
    with pytest.raises(TensorError, match="broadcast"): x + y
    return
  assert (x + y).uop is UOp(Ops.ADD, (x._broadcast_to(shape).uop, y._broadcast_to(shape).uop))
  assert (2.0 - y).shape == shapes[1] and (x * y).requires_grad


@pytest.mark.parametrize("batch,m,k,n,transposed", [((), 1024, 128, 65, True), ((), 512, 64, 100, False), ((2,), 300, 70, 1001, True),
                                                     ((), 64, 520, 200, False), ((), 997, 256, 1024, False), ((3,), 37, 300, 500, True)])
def test_a_matmul_whose_columns_are_not_whole_panels_matches_numpy(batch, m, k, n, transposed):
  # n columns that aren't whole panels of 32 (a GPT's head over a vocabulary of 65), or m rows that only register tiles
  # of 1 or 2 rows divide (997, 37): on a CPU computed over B padded with zero columns and A with zero rows, C read back
  # (uopc.packing._padded). NumPy's numbers either way, its gradients too, and a jitted call's (the padded copy of a
  # weight that stays the same is made once)
  from uopc.jit import jit
  rng = np.random.default_rng(n)
  X = rng.standard_normal(batch + (m, k)).astype(np.float32)
  W = rng.standard_normal(batch + ((n, k) if transposed else (k, n))).astype(np.float32)
  x, w = Tensor(X, requires_grad=True), Tensor(W, requires_grad=True)
  mm = (lambda a: a @ w.transpose(-1, -2)) if transposed else (lambda a: a @ w)
  Wk = np.swapaxes(W, -1, -2) if transposed else W
  c = mm(x)
  np.testing.assert_allclose(c.numpy(), X @ Wk, rtol=1e-4, atol=1e-4)
  G = rng.standard_normal(c.shape).astype(np.float32)
  (c * Tensor(G)).sum().backward()
  np.testing.assert_allclose(x.grad.numpy(), G @ np.swapaxes(Wk, -1, -2), rtol=1e-4, atol=1e-4)
  dW = np.swapaxes(X, -1, -2) @ G
  np.testing.assert_allclose(w.grad.numpy(), np.swapaxes(dW, -1, -2) if transposed else dW, rtol=1e-4, atol=1e-4)
  f = jit(lambda a: mm(a) + 1.0)
  for s in range(3):
    Xs = rng.standard_normal(X.shape).astype(np.float32)
    np.testing.assert_allclose(f(Tensor(Xs)).numpy(), Xs @ Wk + 1.0, rtol=1e-4, atol=1e-4)


def test_a_deep_narrow_matmul_summed_in_chunks_matches_numpy():
  # (64, 32768) @ (32768, 32): on a CPU whose half L2 its B (4 MiB) outgrows, partial products over chunks of K, stored,
  # then summed (uopc.packing._split_depth); either way NumPy's numbers, and its gradients
  from uopc.backends import get_backend
  from uopc.runtime import backend_caps
  rng = np.random.default_rng(12)
  A, B = rng.standard_normal((64, 32768)).astype(np.float32), rng.standard_normal((32768, 32)).astype(np.float32)
  a, b = Tensor(A, requires_grad=True), Tensor(B, requires_grad=True)
  c = a @ b
  ks = c.schedule()
  caps = backend_caps(get_backend(a.device))
  assert any(k.root.shape[1:] == (64, 32) and k.root.shape[0] > 1 for k in ks) == (caps.gemm_panel > 0 and 8 * 32768 * 32 > caps.l2_bytes)
  np.testing.assert_allclose(c.numpy(), A.astype(np.float64) @ B, rtol=1e-4, atol=1e-3)
  G = rng.standard_normal((64, 32)).astype(np.float32)
  (c * Tensor(G)).sum().backward()
  np.testing.assert_allclose(a.grad.numpy(), G @ B.T, rtol=1e-4, atol=1e-4)
  np.testing.assert_allclose(b.grad.numpy(), A.T @ G, rtol=1e-4, atol=1e-4)


def test_matmul_on_ints_and_mixed_dtypes():
  a, b = I34, I34.T.copy()
  check(Tensor(a) @ Tensor(b), a @ b, dtype=dtypes.i32)
  check(Tensor(a) @ Tensor(X34.T.copy()), a @ X34.T, rtol=1e-5, atol=1e-5, dtype=dtypes.f32)
  check(Tensor(X34) @ X34.T, X34 @ X34.T, rtol=1e-5, atol=1e-5)


def test_dot_of_vectors_and_matrices_is_numpys():
  check(Tensor(X34[0]).dot(Tensor(X34[1])), np.dot(X34[0], X34[1]), rtol=1e-5, atol=1e-6)
  check(Tensor(X34).dot(Tensor(X34.T.copy())), np.dot(X34, X34.T), rtol=1e-5, atol=1e-5)
  check(Tensor(I34).dot(Tensor(I34[0])), np.dot(I34, I34[0]), dtype=dtypes.i32)


def test_linear_uses_weight_out_by_in():
  x = RNG.standard_normal((2, 3, 4)).astype(np.float32)
  w, b = RNG.standard_normal((5, 4)).astype(np.float32), RNG.standard_normal(5).astype(np.float32)
  check(Tensor(x).linear(Tensor(w)), x @ w.T, rtol=1e-5, atol=1e-5)
  check(Tensor(x).linear(Tensor(w), Tensor(b)), x @ w.T + b, rtol=1e-5, atol=1e-5)


def conv2d_ref(x, w, b=None, stride=(1, 1), padding=(0, 0), dilation=(1, 1), groups=1):
  """Cross-correlation by direct loops over the output pixels, as torch.nn.functional.conv2d defines it."""
  N, C, H, W = x.shape
  O, Cg, KH, KW = w.shape
  (sh, sw), (ph, pw), (dh, dw) = stride, padding, dilation
  xp = np.pad(x, ((0, 0), (0, 0), (ph, ph), (pw, pw)))
  Ho, Wo = (H + 2 * ph - dh * (KH - 1) - 1) // sh + 1, (W + 2 * pw - dw * (KW - 1) - 1) // sw + 1
  out = np.zeros((N, O, Ho, Wo), np.float64)
  per_group = O // groups
  for o in range(O):
    g = o // per_group
    for i in range(Ho):
      for j in range(Wo):
        patch = xp[:, g * Cg:(g + 1) * Cg, i * sh:i * sh + dh * (KH - 1) + 1:dh, j * sw:j * sw + dw * (KW - 1) + 1:dw]
        out[:, o, i, j] = (patch * w[o]).sum((1, 2, 3))
  return out + b.reshape(1, O, 1, 1) if b is not None else out


@pytest.mark.parametrize("wshape, kw", [
  ((6, 4, 3, 3), {}), ((6, 4, 3, 3), {"stride": 2, "padding": 1}), ((6, 4, 3, 3), {"dilation": 2}),
  ((6, 2, 3, 3), {"groups": 2}), ((4, 1, 3, 3), {"groups": 4, "padding": 1}), ((6, 4, 2, 3), {"stride": (2, 1), "padding": (1, 0)}),
  ((5, 4, 1, 1), {}), ((6, 2, 3, 2), {"groups": 2, "stride": 2, "dilation": (1, 2), "padding": 2}), ((3, 4, 7, 6), {}),
])
@pytest.mark.parametrize("bias", [False, True])
def test_conv2d_matches_a_direct_loop(wshape, kw, bias):
  x = RNG.standard_normal((2, 4, 7, 6)).astype(np.float32)
  w = RNG.standard_normal(wshape).astype(np.float32)
  b = RNG.standard_normal(wshape[0]).astype(np.float32) if bias else None
  pair = lambda v: (v, v) if isinstance(v, int) else v
  ref = conv2d_ref(x, w, b, pair(kw.get("stride", 1)), pair(kw.get("padding", 0)), pair(kw.get("dilation", 1)), kw.get("groups", 1))
  got = Tensor(x).conv2d(Tensor(w), Tensor(b) if bias else None, **kw)
  check(got, ref, rtol=1e-4, atol=1e-4)



def test_conv2d_gradients_at_a_vectorized_size_match_numpy():
  """The gradients of a 3x3 convolution at a size the C backend vectorizes (rows of 32 floats, 16 channels): the weight's
  a sum over (batch, rows, columns) read along the columns, in 16 lanes, each of the 9 window positions its own copy;
  the input's summed over output channels with lanes along the columns and the 9 positions a tile. Against NumPy's."""
  N, C, O, H, W = 2, 16, 16, 32, 32
  x, w = RNG.standard_normal((N, C, H, W)).astype(np.float32), (RNG.standard_normal((O, C, 3, 3)) / 12).astype(np.float32)
  g = RNG.standard_normal((N, O, H, W)).astype(np.float32)
  tx, tw = Tensor(x, requires_grad=True), Tensor(w, requires_grad=True)
  (tx.conv2d(tw, padding=1) * Tensor(g)).sum().backward()
  win = np.lib.stride_tricks.sliding_window_view(np.pad(x, ((0, 0), (0, 0), (1, 1), (1, 1))), (3, 3), axis=(2, 3))   # (N, C, H, W, 3, 3)
  dw = np.einsum("nohw,nchwij->ocij", g.astype(np.float64), win.astype(np.float64))
  gwin = np.lib.stride_tricks.sliding_window_view(np.pad(g, ((0, 0), (0, 0), (1, 1), (1, 1))), (3, 3), axis=(2, 3))
  dx = np.einsum("nohwij,ocij->nchw", gwin.astype(np.float64), w[:, :, ::-1, ::-1].astype(np.float64))
  check(tw.grad, dw, rtol=1e-4, atol=1e-3)
  check(tx.grad, dx, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("shape, kernel, dilation", [
  ((2, 4, 7, 6), (3, 3), (1, 1)), ((2, 4, 7, 6), (2, 3), (2, 1)), ((1, 1, 5, 5), (1, 1), (1, 1)),
  ((3, 5, 8), (3,), (2,)), ((2, 2, 3, 3, 4), (3, 1, 2), (1, 1, 2)), ((1, 2, 4, 4), (4, 4), (1, 1))])
def test_unit_stride_windows_straight_to_uops_build_the_graph_of_the_views(shape, kernel, dilation):
  # a convolution's windows at stride 1 are built as UOps directly: the same graph, node for node, as the shrinks and
  # stack of the general road, so kernels and gradients are theirs; the whole conv2d (padded) against its Tensor ops too
  nd = len(kernel)
  for grad, lazy in [(False, False), (True, False), (False, True), (True, True)]:
    x = Tensor(RNG.standard_normal(shape).astype(np.float32), requires_grad=grad)
    if lazy: x = x * 2.0
    fast, slow = x._unit_stride_windows(kernel, dilation), x._windows_by_views(kernel, (1,) * nd, dilation)
    assert fast.uop is slow.uop and fast.requires_grad == slow.requires_grad and fast.shape == slow.shape
    w = Tensor(RNG.standard_normal((2, shape[1]) + kernel).astype(np.float32))
    pads = tuple((1, 1) for _ in kernel)
    by_ops = x.pad(((0, 0), (0, 0)) + pads).contiguous()._windows_by_views(kernel, (1,) * nd, dilation)
    out_sp = by_ops.shape[2:-1]
    by_ops = by_ops.reshape((shape[0], 1, 1, shape[1]) + out_sp + (prod(kernel),)).permute((0, 1, 2) + tuple(range(4, 4 + nd)) + (3, 4 + nd))
    by_ops = (by_ops * w.reshape((1, 1, 2) + (1,) * nd + (shape[1], prod(kernel)))).sum((-2, -1)).reshape((shape[0], 2) + out_sp)
    assert x.conv2d(w, padding=1, dilation=dilation).uop is by_ops.uop
  with pytest.raises(TensorError, match="doesn't fit"): x._unit_stride_windows((shape[-1] + 1,) * nd, dilation)


@pytest.mark.parametrize("xs, ws, kw", [
  ((2, 3, 9, 7), (5, 3, 3, 3), dict(padding=1)), ((2, 3, 9, 7), (5, 3, 3, 3), dict()), ((2, 3, 9, 7), (5, 3, 1, 1), dict()),
  ((2, 3, 9, 7), (5, 3, 3, 2), dict(padding=(1, 2))), ((2, 3, 9, 7), (5, 3, 3, 3), dict(padding=2, dilation=2)),
  ((2, 3, 9, 7), (5, 3, 3, 3), dict(padding="same")), ((2, 3, 9, 7), (5, 3, 3, 3), dict(padding=(0, 1, 2, 0))),
  ((3, 9, 7), (5, 3, 3, 3), dict(padding=1)), ((2, 3, 9), (5, 3, 3), dict(padding=1)), ((1, 2, 4, 4, 4), (3, 2, 3, 3, 3), dict(padding=1))])
def test_a_convolution_straight_to_uops_builds_the_graph_of_its_tensor_ops(monkeypatch, xs, ws, kw):
  # conv2d's common case (one group, stride 1, no cropping, one dtype) builds its UOps directly (_conv_uops): the same
  # nodes as the Tensor ops of the general road, with and without a bias, gradients or a lazy input
  from uopc.tensor.conv import ConvMixin
  for grad, bias, lazy in [(False, False, False), (True, True, False), (False, True, True), (True, False, True)]:
    x = Tensor(RNG.standard_normal(xs).astype(np.float32), requires_grad=grad)
    if lazy: x = x * 2.0
    w = Tensor(RNG.standard_normal(ws).astype(np.float32), requires_grad=grad)
    b = Tensor(RNG.standard_normal(ws[0]).astype(np.float32)) if bias else None
    fast = x.conv2d(w, b, **kw)
    with monkeypatch.context() as m:
      m.setattr(ConvMixin, "_conv_uops", lambda *a: None)
      slow = x.conv2d(w, b, **kw)
    assert fast.uop is slow.uop and fast.requires_grad == slow.requires_grad
  x4, w4 = Tensor(RNG.standard_normal((2, 4, 6, 6)).astype(np.float32)), Tensor(RNG.standard_normal((4, 4, 3, 3)).astype(np.float32))
  one = ((1, 1), (1, 1))
  assert x4._conv_uops(w4, None, (1, 1), one, (1, 1), 1) is not None
  for other in [(w4, None, (2, 1), one, (1, 1), 1), (w4, None, (1, 1), ((-1, 1), (1, 1)), (1, 1), 1), (w4.half(), None, (1, 1), one, (1, 1), 1),
                (w4, Tensor(np.ones(4, np.int32)), (1, 1), one, (1, 1), 1), (w4[:, :2], None, (1, 1), one, (1, 1), 2)]:
    assert x4._conv_uops(*other) is None                    # stride 2, a crop, f16 or mixed dtypes, groups: the general road
  assert Tensor(np.ones((0, 4, 6, 6), np.float32))._conv_uops(w4, None, (1, 1), one, (1, 1), 1) is None

def pool_ref(x, kernel, stride, padding, reduce, pad_value):
  (kh, kw), (sh, sw), (ph, pw) = kernel, stride, padding
  xp = np.pad(x, ((0, 0), (0, 0), (ph, ph), (pw, pw)), constant_values=pad_value)
  Ho, Wo = (xp.shape[2] - kh) // sh + 1, (xp.shape[3] - kw) // sw + 1
  out = np.zeros(x.shape[:2] + (Ho, Wo), np.float64)
  for i in range(Ho):
    for j in range(Wo): out[:, :, i, j] = reduce(xp[:, :, i * sh:i * sh + kh, j * sw:j * sw + kw], axis=(2, 3))
  return out


@pytest.mark.parametrize("kernel, stride, padding", [(2, None, 0), (3, 2, 1), ((2, 3), (1, 2), 0), (3, 1, 0), (2, 3, (1, 0))])
def test_pooling_matches_a_direct_loop(kernel, stride, padding):
  x = RNG.standard_normal((2, 3, 7, 6)).astype(np.float32)
  pair = lambda v: (v, v) if isinstance(v, int) else v
  k, s, p = pair(kernel), pair(stride if stride is not None else kernel), pair(padding)
  check(Tensor(x).max_pool2d(kernel, stride, padding), pool_ref(x, k, s, p, np.max, -np.inf))
  # avg counts the zero padding in the window, as torch's default count_include_pad=True
  check(Tensor(x).avg_pool2d(kernel, stride, padding), pool_ref(x, k, s, p, np.mean, 0.0), rtol=1e-5, atol=1e-6)


def np_log_softmax(x, axis):
  s = x - x.max(axis, keepdims=True)
  return s - np.log(np.exp(s).sum(axis, keepdims=True))


@pytest.mark.parametrize("axis", [-1, 0, 1])
def test_softmax_and_log_softmax(axis):
  x = X234 * 5
  check(Tensor(x).softmax(axis), np.exp(np_log_softmax(x.astype(np.float64), axis)), rtol=1e-5, atol=1e-7)
  check(Tensor(x).log_softmax(axis), np_log_softmax(x.astype(np.float64), axis), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("shape, axis", [((4, 64), -1), ((2, 128, 128), -1), ((2, 128, 128), 1), ((256, 128), 0)])
def test_a_large_softmax_computes_its_exp_once(shape, axis):
  """From SOFTMAX_STAGE_MIN elements the exp is stored by a kernel of its own, which the sum and the quotient read;
  below it, each of their kernels computes it. The values are NumPy's either way, and so are the gradients' (the
  stored exp is a STAGE, which the gradient passes through)."""
  from uopc.tensor.normalization import SOFTMAX_STAGE_MIN
  x = np.random.default_rng(11).standard_normal(shape).astype(np.float32) * 3
  t = Tensor(x, requires_grad=True)
  y = t.softmax(axis)
  exps = [k for k in y.schedule() if any(u.op is Ops.EXP2 for u in k.root.toposort())]
  assert len(exps) == (1 if x.size >= SOFTMAX_STAGE_MIN else 2)
  p = np.exp(np_log_softmax(x.astype(np.float64), axis))
  check(y, p, rtol=1e-5, atol=1e-7)
  w = np.random.default_rng(12).standard_normal(shape).astype(np.float32)
  (y * Tensor(w)).sum().backward()
  check(t.grad, p * (w - (w * p).sum(axis, keepdims=True)), rtol=1e-4, atol=1e-6)


def test_softmax_is_stable_for_large_logits():
  x = np.array([[1000.0, 1001.0, 1002.0], [-1000.0, -1000.0, -1000.0]], np.float32)
  check(Tensor(x).softmax(), np.exp(np_log_softmax(x.astype(np.float64), -1)), rtol=1e-5, atol=1e-7)
  check(Tensor(x).log_softmax(), np_log_softmax(x.astype(np.float64), -1), rtol=1e-5, atol=1e-5)


def cross_entropy_ref(logits, target, reduction="mean", ignore_index=-100, label_smoothing=0.0):
  C = logits.shape[1]
  logp = np_log_softmax(logits.astype(np.float64), 1)
  keep = target != ignore_index
  q = np.eye(C)[np.where(keep, target, 0)] * (1 - label_smoothing) + label_smoothing / C
  nll = -(logp * q).sum(1) * keep
  if reduction == "none": return nll
  if reduction == "sum": return nll.sum()
  return nll.sum() / keep.sum()


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("ignore, smoothing", [(False, 0.0), (True, 0.0), (False, 0.1), (True, 0.2)])
def test_cross_entropy_matches_the_formula(reduction, ignore, smoothing):
  logits = RNG.standard_normal((6, 5)).astype(np.float32) * 3
  target = np.array([0, 4, 2, 2, 1, 3], np.int32)
  kw = {"reduction": reduction, "label_smoothing": smoothing}
  if ignore:
    target[[1, 4]] = -1
    kw["ignore_index"] = -1
  check(Tensor(logits).cross_entropy(Tensor(target), **kw), cross_entropy_ref(logits, target, **kw), rtol=1e-5, atol=1e-6)


def test_cross_entropy_ignores_minus_100_by_default_and_takes_spatial_logits():
  logits = RNG.standard_normal((2, 4, 3)).astype(np.float32)   # (N, C, d)
  target = np.array([[0, 3, -100], [1, 1, 2]], np.int32)
  flat_logits = logits.transpose(0, 2, 1).reshape(-1, 4)
  check(Tensor(logits).cross_entropy(Tensor(target)), cross_entropy_ref(flat_logits, target.reshape(-1)), rtol=1e-5)
  check(Tensor(logits).cross_entropy(Tensor(target), reduction="none"),
        cross_entropy_ref(flat_logits, target.reshape(-1), reduction="none").reshape(2, 3), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("weighted", [False, True])
def test_the_losses_load_each_rows_target_and_an_ignored_row_stays_out_even_beside_infinite_logits(weighted):
  # each row's target log-probability is loaded (a GATHER along the classes, the rows its batch axis), not picked by a
  # one-hot summed over every class (at 8192 classes, a scan of all the log-probabilities in one thread); an ignored
  # row reads class 0 and counts for nothing, with a -inf logit there too (0 * -inf would be NaN); class weights are
  # loaded the same way. Values and gradients against the formula
  rng = np.random.default_rng(11)
  logits = rng.standard_normal((40, 300)).astype(np.float32)
  target = rng.integers(0, 300, 40).astype(np.int32)
  target[[3, 17]] = -100
  logits[[3, 17], 0] = -np.inf
  w = rng.random(300).astype(np.float32) + 0.5 if weighted else None
  x = Tensor(logits, requires_grad=True)
  loss = x.cross_entropy(Tensor(target), weight=Tensor(w) if weighted else None)
  ks = loss.schedule()
  assert any(u.op is Ops.GATHER for k in ks for u in k.root.toposort())
  assert all(u.src[0].shape[-1] != 300 for k in ks if k.root.shape == () for u in k.root.toposort() if u.op is Ops.REDUCE)
  keep = target != -100
  logp = np_log_softmax(np.where(np.isinf(logits), -1e30, logits).astype(np.float64), 1)
  ww = w[np.where(keep, target, 0)] * keep if weighted else keep.astype(np.float64)
  want = -(logp[np.arange(40), np.where(keep, target, 0)] * ww).sum() / ww.sum()
  check(loss, want, rtol=1e-5)
  loss.backward()
  p = np.exp(logp)
  grad = (p - np.eye(300)[np.where(keep, target, 0)]) * ww[:, None] / ww.sum()
  np.testing.assert_allclose(x.grad.numpy(), grad, rtol=1e-4, atol=1e-6)


def test_tinygrads_loss_names_are_the_same_losses():
  p = (1 / (1 + np.exp(-X34))).astype(np.float32)
  t = (X34[::-1] > 0).astype(np.float32)
  bce = -(t * np.log(p.astype(np.float64)) + (1 - t) * np.log1p(-p.astype(np.float64)))
  check(Tensor(p).binary_crossentropy(Tensor(t)), bce.mean(), rtol=1e-5)
  check(Tensor(X34).binary_crossentropy_logits(Tensor(t), reduction="sum"), bce.sum(), rtol=1e-4)
  # sparse_categorical_crossentropy: the classes on the last axis of (..., C), and -1 ignored unless told otherwise
  logits = RNG.standard_normal((2, 3, 5)).astype(np.float32)
  target = np.array([[4, -1, 0], [2, 2, 1]], np.int32)
  flat = (logits.reshape(-1, 5), target.reshape(-1))
  check(Tensor(logits).sparse_categorical_crossentropy(Tensor(target)), cross_entropy_ref(*flat, ignore_index=-1), rtol=1e-5)
  check(Tensor(logits).sparse_categorical_crossentropy(Tensor(target), label_smoothing=0.1, reduction="none"),
        cross_entropy_ref(*flat, reduction="none", ignore_index=-1, label_smoothing=0.1).reshape(2, 3), rtol=1e-5, atol=1e-6)
  check(Tensor(logits).sparse_categorical_crossentropy(Tensor(np.abs(target)), ignore_index=0, reduction="sum"),
        cross_entropy_ref(flat[0], np.abs(flat[1]), reduction="sum", ignore_index=0), rtol=1e-5)


@pytest.mark.parametrize("axis", [-1, (1, 2)])
def test_layernorm_normalizes_without_affine(axis):
  x = X234 * 3 + 1
  mean = x.mean(axis, keepdims=True)
  expected = (x - mean) / np.sqrt(x.var(axis, keepdims=True) + 1e-5)
  check(Tensor(x).layernorm(axis), expected, rtol=1e-4, atol=1e-5)
  check(Tensor(x).layernorm(axis, eps=1.0), (x - mean) / np.sqrt(x.var(axis, keepdims=True) + 1.0), rtol=1e-4, atol=1e-5)


def test_embedding_picks_rows_of_the_weight():
  weight = RNG.standard_normal((5, 4)).astype(np.float32)
  idx = np.array([[0, 3], [2, 2], [4, 1]], np.int32)
  check(Tensor(idx).embedding(Tensor(weight)), weight[idx])
  check(Tensor([1, 0, 4]).embedding(Tensor(weight)), weight[[1, 0, 4]])


def test_embedding_checks_its_indices_once_and_refuses_negative_ones(monkeypatch):
  """embedding's indices are refused outside [0, V) (torch: no negative index), and that check is the only one: the
  gather under it counts no index from the end and checks nothing again (each check reads the indices on the host)."""
  import uopc.tensor.indexing as ix
  calls = []
  check_indices = ix.check_indices
  monkeypatch.setattr(ix, "check_indices", lambda *a, **k: (calls.append(a[1:3]), check_indices(*a, **k))[1])
  weight = RNG.standard_normal((5, 4)).astype(np.float32)
  idx = np.array([[4, 0], [2, 3]], np.int32)
  check(Tensor(idx).embedding(Tensor(weight)), weight[idx])
  assert calls == [(0, 5)]
  with pytest.raises(TensorError, match="embedding: index -1 is out of range for 5 embeddings"):
    Tensor(np.array([1, -1], np.int32)).embedding(Tensor(weight))
  check(Tensor(weight)[Tensor(np.array([-1, 2], np.int32))], weight[[-1, 2]])      # indexing still counts from the end


def test_the_constants_composites_build_are_made_once_and_shared(monkeypatch):
  """attention's causal mask, tril/triu's triangle and a gather's positions are made with NumPy once per shape and
  backend (SHARED_CONSTANTS of them kept, the least recently used dropped) and read by every call since; the results
  are NumPy's."""
  import uopc.tensor.creation as creation
  from uopc.tensor.storage import buffer_of
  q = RNG.standard_normal((1, 2, 7, 4)).astype(np.float32)
  a, b = (Tensor(q).scaled_dot_product_attention(Tensor(q), Tensor(q), is_causal=True) for _ in range(2))
  masks = [u for t in (a, b) for u in t.uop.toposort() if u.op is Ops.BUFFER and u.dtype is dtypes.bool]
  assert len(masks) == 2 and masks[0] is masks[1]
  check(a, attention_ref(q, q, q, True), rtol=1e-4, atol=1e-5)
  x = RNG.standard_normal((3, 5)).astype(np.float32)
  check(Tensor(x).tril(1), np.tril(x, 1))
  check(Tensor(x).triu(-1), np.triu(x, -1))
  check(Tensor(x > 0).tril(), np.tril(x > 0))
  tri = creation.shared_constant(Tensor(x), ("tril", 3, 5, 1), lambda: pytest.fail("made again"))
  assert buffer_of(tri.uop).numpy()[:15].reshape(3, 5).tolist() == np.tril(np.ones((3, 5), bool), 1).tolist() and not tri.requires_grad
  for n in range(creation.SHARED_CONSTANTS + 5): creation.shared_constant(Tensor(x), ("test", n), lambda: np.zeros(1, np.int32))
  assert len(creation._shared) == creation.SHARED_CONSTANTS
  monkeypatch.setattr(creation, "SHARED_CONSTANT_BYTES", 3000)   # and no more than SHARED_CONSTANT_BYTES: the oldest go
  for n in range(3): creation.shared_constant(Tensor(x), ("big", n), lambda: np.zeros(1001, np.bool_))
  assert creation._shared_bytes <= creation.SHARED_CONSTANT_BYTES and len(creation._shared) == 2
  assert creation._shared_bytes == sum(nbytes for _, nbytes in creation._shared.values())
  # a one-hot and a loss compare with one shared 0..n-1; Tensor.arange hands out a tensor of the caller's own
  g = Tensor(x)[Tensor(np.array([2, 0], np.int32))]
  oh = Tensor(np.array([1, 4], np.int32)).one_hot(5)
  shared = lambda t: {u for u in t.uop.toposort() if u.op is Ops.BUFFER and u.dtype is dtypes.i32}
  assert creation.positions(Tensor(x), 5).uop in shared(oh)
  assert g.uop.op is Ops.GATHER and creation.positions(Tensor(x), 3).uop not in shared(g)   # a gather loads its rows: no one-hot
  check(g, x[[2, 0]])
  check(oh, np.eye(5, dtype=np.int32)[[1, 4]])
  assert buffer_of(Tensor.arange(5).uop) is not buffer_of(Tensor.arange(5).uop)
  # a scan's triangle, a sort's, an argmax's countdown, bit weights, diag's identity: each one buffer across calls
  y = RNG.standard_normal((3, 6)).astype(np.float32)
  ty = Tensor(y)
  consts = lambda t: {u for u in t.uop.toposort() if u.op is Ops.BUFFER and u is not ty.uop.src[0]}
  for make in (lambda t: t.cumsum(-1), lambda t: t.sort(-1)[1], lambda t: t.argmax(-1), lambda t: t[0].diag()):
    first, again = make(ty), make(ty)
    assert consts(first) and consts(first) == consts(again)
  check(Tensor(y).cumsum(-1), np.cumsum(y, -1), rtol=1e-5, atol=1e-5)
  check(Tensor(y).argmax(-1), y.argmax(-1))
  check(Tensor(y).sort(-1)[1], np.argsort(y, -1, kind="stable"))
  check(Tensor(y)[0].diag(), np.diag(y[0]))
  i = RNG.integers(-99, 99, (4,)).astype(np.int32)
  check(Tensor(i) & Tensor(i[::-1].copy()), i & i[::-1])


def test_dropout():
  x = Tensor(np.ones((40, 50), np.float32))
  check(x.dropout(0.0), np.ones((40, 50)))
  check(x.dropout(0.5, training=False), np.ones((40, 50)))
  check(x.dropout(1.0), np.zeros((40, 50)))
  Tensor.manual_seed(3)
  d = x.dropout(0.5).numpy()
  assert set(np.unique(d).tolist()) <= {0.0, 2.0}
  assert 0.4 < (d == 0).mean() < 0.6
  d = Tensor(np.full((40, 50), 3.0, np.float32)).dropout(0.25).numpy()
  assert set(np.unique(d).tolist()) <= {0.0, 4.0} and 0.15 < (d == 0).mean() < 0.35


def attention_ref(q, k, v, is_causal=False, mask=None):
  s = q.astype(np.float64) @ np.swapaxes(k, -1, -2) / math.sqrt(q.shape[-1])
  if is_causal: s = np.where(np.tril(np.ones((q.shape[-2], k.shape[-2]), bool)), s, -np.inf)
  if mask is not None: s = np.where(mask, s, -np.inf)
  return np.exp(np_log_softmax(s, -1)) @ v


@pytest.mark.parametrize("L, S", [(5, 5), (4, 6)])
@pytest.mark.parametrize("is_causal", [False, True])
def test_scaled_dot_product_attention(L, S, is_causal):
  q = RNG.standard_normal((2, 3, L, 4)).astype(np.float32)
  k = RNG.standard_normal((2, 3, S, 4)).astype(np.float32)
  v = RNG.standard_normal((2, 3, S, 3)).astype(np.float32)
  got = Tensor(q).scaled_dot_product_attention(Tensor(k), Tensor(v), is_causal=is_causal)
  check(got, attention_ref(q, k, v, is_causal), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("L, S, block", [(128, 128, None), (130, 130, None), (9, 9, 2), (10, 7, 3), (6, 11, 2), (12, 12, 3)])
def test_causal_attention_in_blocks_of_queries_matches_numpy(L, S, block, monkeypatch):
  # a long causal attention runs in blocks of queries, each against the keys up to its last query (_causal_blocks):
  # forward and gradients as the one-block graph's. Small blocks (block) make small shapes split: uneven last blocks,
  # more queries than keys (the blocks past the keys see them all) and fewer
  import uopc.tensor.attention as attention
  if block is not None: monkeypatch.setattr(attention, "CAUSAL_BLOCK", block)
  rng = np.random.default_rng(L * S)
  q = rng.standard_normal((2, 3, L, 8)).astype(np.float32)
  k, v = (rng.standard_normal((2, 3, S, 8)).astype(np.float32) for _ in range(2))
  def run():
    tq, tk, tv = (Tensor(x, requires_grad=True) for x in (q, k, v))
    out = tq.scaled_dot_product_attention(tk, tv, is_causal=True)
    (out * out).sum().backward()
    return out, [t.grad.numpy() for t in (tq, tk, tv)]
  out, grads = run()
  assert out.uop.op is Ops.STAGE   # the blocks' join, in a buffer of its own
  check(out, attention_ref(q, k, v, True), rtol=1e-4, atol=1e-5)
  monkeypatch.setattr(attention, "CAUSAL_BLOCK", 1 << 30)
  whole, whole_grads = run()
  assert whole.uop.op is not Ops.STAGE   # one block: the plain graph
  for g, w in zip(grads, whole_grads): np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-5)


def test_causal_attention_in_blocks_packs_k_and_v_once_each():
  # the blocks read slices of k (forward: q @ k.T) and of v (backward: dy @ v.T) packed into panels of 32 keys; the
  # slices and the last block's whole operand read one pack each (a slice of v, taken transposed, has the longer view
  # v.T.T, the whole v's own once its two transposes are folded: uopc.packing._fold)
  from uopc.tensor.storage import buffer_uop
  rng = np.random.default_rng(5)
  q, k, v = (Tensor(rng.standard_normal((2, 2, 256, 64)).astype(np.float32), requires_grad=True) for _ in range(3))
  out = q.scaled_dot_product_attention(k, v, is_causal=True)
  (out * out).sum().backward()
  kernels = Tensor.schedule(out, q.grad, k.grad, v.grad)
  for t in (k, v): assert len([kk for kk in kernels if kk.inputs == (buffer_uop(t.uop),)]) == 1


def test_causal_attention_in_blocks_refuses_what_the_general_road_refuses(monkeypatch):
  # the blocks shrink the keys and values they read: values longer than the keys must still be an error, not shrunk away
  import uopc.tensor.attention as attention
  q, k, v = (Tensor(np.ones((1, n, 4), np.float32)) for n in (8, 8, 9))
  with pytest.raises(TensorError) as whole:
    q.scaled_dot_product_attention(k, v, is_causal=True)
  monkeypatch.setattr(attention, "CAUSAL_BLOCK", 2)
  with pytest.raises(TensorError) as blocks:
    q.scaled_dot_product_attention(k, v, is_causal=True)
  assert str(blocks.value) == str(whole.value) and "inner dimensions 8 and 9" in str(whole.value)


def test_scaled_dot_product_attention_with_a_boolean_mask():
  q, k, v = (RNG.standard_normal((2, 4, 3)).astype(np.float32) for _ in range(3))
  mask = np.array([[True, False, True, True], [True, True, False, False], [False, True, True, True], [True, True, True, False]])
  got = Tensor(q).scaled_dot_product_attention(Tensor(k), Tensor(v), attn_mask=Tensor(mask))
  check(got, attention_ref(q, k, v, mask=mask), rtol=1e-4, atol=1e-5)


def _softmax_by_ops(s: Tensor, axis: int = -1) -> Tensor:
  """softmax's Tensor expression (what its f32 road over the last axis builds directly)."""
  from uopc.tensor.normalization import SOFTMAX_STAGE_MIN
  e = (s - s.max(axis, keepdim=True)._stop_gradient()).exp()
  if e.numel() >= SOFTMAX_STAGE_MIN: e = e.contiguous()
  return e / e.sum(axis, keepdim=True)


def _log_softmax_by_ops(x: Tensor, axis: int = -1) -> Tensor:
  """log_softmax's Tensor expression (what its f32 road over the last axis builds directly)."""
  s = x - x.max(axis, keepdim=True)._stop_gradient()
  return s - s.exp().sum(axis, keepdim=True).log()


@pytest.mark.parametrize("shape", [(3, 4), (2, 3, 1), (5,), (1, 1), (2, 128, 128)])   # (the last: softmax stores its exp)
@pytest.mark.parametrize("name, by_ops", [("softmax", _softmax_by_ops), ("log_softmax", _log_softmax_by_ops)])
def test_softmaxes_straight_to_uops_build_the_graph_of_their_tensor_ops(shape, name, by_ops):
  rng = np.random.default_rng(7)
  for grad, lazy in [(False, False), (True, False), (False, True), (True, True)]:
    x = Tensor(rng.standard_normal(shape).astype(np.float32), requires_grad=grad)
    if lazy: x = x * 2.0
    for axis in (-1, len(shape) - 1):
      fast, slow = getattr(x, name)(axis), by_ops(x, axis)
      assert fast.uop is slow.uop and fast.requires_grad == slow.requires_grad
  if len(shape) > 1: assert getattr(x, name)(0).uop is by_ops(x, 0).uop   # another axis: the Tensor ops themselves


@pytest.mark.parametrize("shapes", [((2, 3, 5, 4), (2, 3, 6, 4), (2, 3, 6, 7)), ((5, 4), (5, 4), (5, 1)), ((1, 1, 4), (1, 1, 4), (1, 1, 4))])
def test_attention_straight_to_uops_builds_the_graph_of_its_tensor_ops(shapes):
  # attention's common case (f32, no mask but the causal one) builds its UOps directly past the two matmuls; it must be
  # the same graph, node for node, as the Tensor expressions, so kernels and gradients are theirs
  from uopc.tensor.creation import triangle
  rng = np.random.default_rng(3)
  for grads in [(a, b, c) for a in (False, True) for b in (False, True) for c in (False, True)]:
    for causal, scale in [(False, None), (True, None), (True, 0.3), (False, 2.0)]:
      q, k, v = (Tensor(rng.standard_normal(sh).astype(np.float32), requires_grad=g) for sh, g in zip(shapes, grads))
      fast = q._attention_uops(k, v, causal, scale)
      s = (q @ k.transpose(-1, -2)) * (scale if scale is not None else 1 / math.sqrt(q.shape[-1]))
      if causal:
        s = triangle(q, q.shape[-2], k.shape[-2]).where(s, float("-inf"))
      slow = _softmax_by_ops(s) @ v
      assert fast is not None and fast.uop is slow.uop and fast.requires_grad == slow.requires_grad
      assert q.scaled_dot_product_attention(k, v, is_causal=causal, scale=scale).uop is slow.uop
  # a block of queries (_causal_blocks): the mask shifted by `diagonal`, the first `keys` keys and values, the keys
  # shrunk as given, the values along the keys as the last axis (transposed)
  keys = k.shape[-2] - 1
  t = lambda x: x.transpose(-1, -2)
  kt, vk = t(k[..., :keys, :]), t(t(v)[..., :keys])
  s = (q @ kt) * (1 / math.sqrt(q.shape[-1]))
  slow = _softmax_by_ops(triangle(q, q.shape[-2], keys, 1).where(s, float("-inf"))) @ vk
  assert q._attention_uops(k, v, True, None, diagonal=1, keys=keys).uop is slow.uop
  assert q.half()._attention_uops(k.half(), v.half(), False, None) is None   # f16: in f32, rounded once
  longer = Tensor(np.ones(v.shape[:-2] + (v.shape[-2] + 1, v.shape[-1]), np.float32))
  assert q._attention_uops(k, longer, False, None) is None                   # keys and values disagree: the general road's error


@pytest.mark.parametrize("shape", [(4, 3), (5,), (1, 1), (2, 3, 2)])
def test_embedding_is_one_gather_of_the_rows_and_its_gradient_adds_each_row_up(shape):
  # weight[indices] is one GATHER node over the weight (a load per element: a one-hot of the indices against every row,
  # summed, was O(vocab) per element), for every kind of index tensor (a view, lazy) and weight (requiring a gradient
  # or not, f16); its gradient sums the picked rows' gradients into each row, as np.add.at does
  rng = np.random.default_rng(4)
  for w_grad, view, lazy, v, d, half in [(a, b, c, e, f, h) for a in (False, True) for b in (False, True) for c in (False, True)
                                         for e in (7, 1) for f in (5, 1) for h in (False, True)]:
    W = rng.standard_normal((v, d)).astype(np.float16 if half else np.float32)
    w = Tensor(W, requires_grad=w_grad and not half)
    idx = rng.integers(0, v, shape).astype(np.int32)
    i = Tensor(idx.ravel()).reshape(*shape) if view else Tensor(idx)
    if lazy: i = i * 1
    e = i.embedding(w)   # (its index check computes a lazy i first)
    assert e.uop.op is Ops.GATHER and e.uop.src[0] is w.uop and e.shape == shape + (d,) and e.requires_grad == w.requires_grad
    np.testing.assert_array_equal(e.numpy(), W[idx])
    if w.requires_grad:
      G = rng.standard_normal(e.shape).astype(np.float32)
      (e * Tensor(G)).sum().backward()
      want = np.zeros_like(W)
      np.add.at(want, idx, G)
      np.testing.assert_allclose(w.grad.numpy(), want, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("n, c", [(6, 5), (1, 3), (4, 1)])
def test_cross_entropy_straight_to_uops_builds_the_graph_of_its_tensor_ops(n, c):
  # cross_entropy's common case (f32 logits (N, C), class indices, the mean) builds its UOps directly; it must be the
  # graph of log_softmax and the nll's Tensor ops, node for node, so kernels and gradients are theirs
  rng = np.random.default_rng(5)
  for grad, view, lazy, ignore in [(a, b, d, e) for a in (False, True) for b in (False, True) for d in (False, True) for e in (-100, 0)]:
    x = Tensor(rng.standard_normal((n, c)).astype(np.float32), requires_grad=grad)
    if lazy: x = x * 2.0
    tg = rng.integers(0, c, (n,)).astype(np.int32)
    t = Tensor(tg.reshape(n, 1)).reshape(n) if view else Tensor(tg)
    fast, slow = x._cross_entropy_uops(t, ignore), _log_softmax_by_ops(x, 1)._nll(t, None, ignore, "mean")
    assert fast is not None and fast.uop is slow.uop and fast.requires_grad == slow.requires_grad
    assert x.cross_entropy(t, ignore_index=ignore).uop is slow.uop
  assert x._cross_entropy_uops(t.float(), -100) is None and x.half()._cross_entropy_uops(t, -100) is None   # the general road
  with pytest.raises(TensorError, match="out of range"): x.cross_entropy(Tensor(np.full(n, c, np.int32)))   # still checked


@pytest.mark.parametrize("shape", [(3, 4), (1, 1), (5,), ()])
def test_sigmoid_and_gelu_straight_to_uops_build_the_graph_of_their_tensor_ops(shape):
  # f32 sigmoid (and GELU, SiLU through it) build their UOps directly; they must be the graph of the Tensor expressions
  import uopc.tensor.activations as A
  def sigmoid(x):
    t = x.float() * -A._LOG2E
    far = t > A._EXP2_MAX
    return far.where(0.0, (1.0 + far.where(A._EXP2_MAX, t).exp2()).recip())
  rng = np.random.default_rng(6)
  for grad, lazy in [(False, False), (True, False), (False, True), (True, True)]:
    x = Tensor(rng.standard_normal(shape).astype(np.float32), requires_grad=grad)
    if lazy: x = x * 2.0
    gelu = x * sigmoid(2 * math.sqrt(2 / math.pi) * (x + 0.044715 * x * x * x))
    for fast, slow in [(x.sigmoid(), sigmoid(x)), (x.gelu(), gelu), (x.silu(), x * sigmoid(x))]:
      assert fast.uop is slow.uop and fast.requires_grad == slow.requires_grad
  i = Tensor(rng.integers(-3, 3, shape).astype(np.int32))   # integers: the same graphs over their f32 cast
  assert i.sigmoid().uop is sigmoid(i).uop and i.gelu().uop is (i * sigmoid(2 * math.sqrt(2 / math.pi) * (i + 0.044715 * i * i * i))).uop
