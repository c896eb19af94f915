"""Tensor reductions, movement and indexing against NumPy: sums, extremes, var and argmax over any axes; reshape,
permute, pad, cat, stack, split and repeat; Python indexing with ints, slices, None, Ellipsis and integer arrays.

The data and check() come from test_tensor_ops (NumPy is the oracle, shapes are reused so kernels compile once).
"""
import math
import numpy as np
import pytest
from uopc.dtype import dtypes
from uopc.uop import Ops
from uopc.tensor import Tensor
from test_tensor_ops import X234, X34, I34, A24, check


# ---- reductions -----------------------------------------------------------------------------------------------------

AXES = [None, 0, 1, -1, (0, 2), (-1, 0), (0, 1, 2)]
REDUCE = {"sum": np.sum, "mean": np.mean, "max": np.max, "min": np.min}


@pytest.mark.parametrize("axis", AXES)
@pytest.mark.parametrize("keepdim", [False, True])
@pytest.mark.parametrize("name", REDUCE)
def test_reductions_match_numpy(name, axis, keepdim):
  got = getattr(Tensor(X234), name)(axis, keepdim=keepdim)
  check(got, REDUCE[name](X234, axis=axis, keepdims=keepdim), rtol=1e-5, atol=1e-6, dtype=dtypes.f32)


@pytest.mark.parametrize("axis", [None, 0, -1, (0, 1)])
def test_integer_reductions(axis):
  check(Tensor(I34).sum(axis), I34.sum(axis), dtype=dtypes.i32)
  check(Tensor(I34).max(axis), I34.max(axis), dtype=dtypes.i32)
  check(Tensor(I34).min(axis), I34.min(axis), dtype=dtypes.i32)
  check(Tensor(I34).mean(axis), I34.mean(axis), rtol=1e-6, dtype=dtypes.f32)


def test_sum_of_bools_counts_as_i32():
  m = X234 > 0
  check(Tensor(m).sum(), m.sum(), dtype=dtypes.i32)
  check(Tensor(m).sum(1), m.sum(1), dtype=dtypes.i32)
  check(Tensor(m).sum(dtype=dtypes.f32), np.float32(m.sum()), dtype=dtypes.f32)


@pytest.mark.parametrize("axis", [None, 1, -1, (0, 2)])
@pytest.mark.parametrize("correction", [1, 0])
@pytest.mark.parametrize("keepdim", [False, True])
def test_var_and_std_match_numpy_with_ddof(axis, correction, keepdim):
  check(Tensor(X234).var(axis, keepdim=keepdim, correction=correction), np.var(X234, axis=axis, ddof=correction, keepdims=keepdim),
        rtol=1e-5, atol=1e-6)
  check(Tensor(X234).std(axis, keepdim=keepdim, correction=correction), np.std(X234, axis=axis, ddof=correction, keepdims=keepdim),
        rtol=1e-5, atol=1e-6)


def test_var_defaults_to_the_unbiased_estimate():
  check(Tensor(X34).var(), np.var(X34, ddof=1), rtol=1e-5)
  check(Tensor(X34).std(1), np.std(X34, axis=1, ddof=1), rtol=1e-5)


def test_var_mean_and_std_mean_pair_the_two_reductions():
  var, mean = Tensor(X234).var_mean(1, keepdim=True, correction=0)
  check(var, np.var(X234, axis=1, keepdims=True), rtol=1e-5, atol=1e-6)
  check(mean, np.mean(X234, axis=1, keepdims=True), rtol=1e-5, atol=1e-6)
  std, mean = Tensor(X234).std_mean((0, 2))
  check(std, np.std(X234, axis=(0, 2), ddof=1), rtol=1e-5, atol=1e-6)
  check(mean, np.mean(X234, axis=(0, 2)), rtol=1e-5, atol=1e-6)


# axis=None with keepdim is left out: NumPy keeps every axis there, torch's answer has changed between versions
@pytest.mark.parametrize("axis, keepdim", [(None, False)] + [(a, k) for a in (0, 1, -1, 2) for k in (False, True)])
def test_argmax_and_argmin_match_numpy(axis, keepdim):
  amax, amin = Tensor(X234).argmax(axis, keepdim=keepdim), Tensor(X234).argmin(axis, keepdim=keepdim)
  check(amax, np.argmax(X234, axis=axis, keepdims=keepdim), dtype=dtypes.i32)
  check(amin, np.argmin(X234, axis=axis, keepdims=keepdim), dtype=dtypes.i32)


def test_argmax_and_argmin_pick_the_first_of_ties():
  x = np.array([[1, 3, 3, 0], [2, 2, 1, 1], [5, 5, 5, 5]], np.float32)
  check(Tensor(x).argmax(1), [1, 0, 0])
  check(Tensor(x).argmin(1), [3, 2, 0])
  check(Tensor(x).argmax(0), [2, 2, 2, 2])
  check(Tensor(x).argmax(), 8)
  check(Tensor(x.astype(np.int32)).argmin(), 3)


# ---- movement -------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("shape", [(6, 4), (-1,), (4, -1), (2, -1, 3), (24,), (1, 2, 1, 12), (3, 8)])
def test_reshape_and_view(shape):
  check(Tensor(A24).reshape(shape), A24.reshape(shape))
  check(Tensor(A24).reshape(*shape), A24.reshape(shape))
  check(Tensor(A24).view(*shape), A24.reshape(shape))


def test_reshape_of_a_reshape_is_one_view():
  # a realized tensor viewed twice (a loss flattening (B, T) targets) is still a view of its buffer: nothing to compute,
  # no copy kernel; back to its own shape it is the buffer itself. Values and gradients are the plain reshape's
  t = Tensor(A24).realize()
  twice = t.reshape(4, 6).reshape(24)
  buffer = t.uop.src[0]                       # (2, 3, 4) is a view of its 24-element BUFFER
  assert t.uop.op is Ops.RESHAPE and buffer.op is Ops.BUFFER and twice.uop is buffer
  assert twice.schedule() == []
  assert t.reshape(6, 4).reshape(A24.shape).uop is t.uop and t.reshape(6, 4).uop.src[0] is buffer
  check(twice, A24.reshape(24))
  # a tensor that requires a gradient keeps its node in the graph (backward() finds it by that node), realized or not
  for x in (Tensor(X234, requires_grad=True), Tensor(X234, requires_grad=True).realize()):
    (x.reshape(6, 4).reshape(24) * Tensor(np.arange(24, dtype=np.float32))).sum().backward()
    np.testing.assert_array_equal(x.grad.numpy(), np.arange(24, dtype=np.float32).reshape(X234.shape))


@pytest.mark.parametrize("order", [(0, 1, 2), (2, 0, 1), (1, 0, 2), (2, 1, 0), (-1, 0, 1)])
def test_permute(order):
  check(Tensor(A24).permute(order), A24.transpose(order))
  check(Tensor(A24).permute(*order), A24.transpose(order))


def test_transpose_and_T():
  check(Tensor(A24).transpose(0, 2), np.swapaxes(A24, 0, 2))
  check(Tensor(A24).transpose(), np.swapaxes(A24, -2, -1))
  check(Tensor(A24).transpose(-1, 0), np.swapaxes(A24, -1, 0))
  check(Tensor(X34).T, X34.T)
  check(Tensor(A24).T, A24.T)


def test_expand_and_broadcast_to():
  x = np.arange(3, dtype=np.float32).reshape(3, 1)
  check(Tensor(x).expand(3, 4), np.broadcast_to(x, (3, 4)))
  check(Tensor(x).expand(2, 3, 4), np.broadcast_to(x, (2, 3, 4)))
  check(Tensor(x).expand(-1, 5), np.broadcast_to(x, (3, 5)))
  check(Tensor(x).broadcast_to((2, 3, 4)), np.broadcast_to(x, (2, 3, 4)))
  check(Tensor(3.0).expand(2, 2), np.full((2, 2), 3.0))


def test_squeeze_unsqueeze_flatten():
  x = np.arange(6, dtype=np.float32).reshape(1, 3, 1, 2)
  check(Tensor(x).squeeze(), x.squeeze())
  check(Tensor(x).squeeze(0), x.squeeze(0))
  check(Tensor(x).squeeze(-2), x.squeeze(-2))
  check(Tensor(x).squeeze(1), x)   # not of size 1: unchanged, as in torch
  check(Tensor(X34).unsqueeze(0), X34[None])
  check(Tensor(X34).unsqueeze(1), X34[:, None])
  check(Tensor(X34).unsqueeze(-1), X34[..., None])
  check(Tensor(X34).unsqueeze(2), X34[:, :, None])
  check(Tensor(A24).flatten(), A24.reshape(-1))
  check(Tensor(A24).flatten(1), A24.reshape(2, 12))
  check(Tensor(A24).flatten(0, 1), A24.reshape(6, 4))
  check(Tensor(3.0).flatten(), [3.0])


def test_shrink():
  check(Tensor(A24).shrink(((0, 1), (1, 3), (0, 4))), A24[0:1, 1:3, 0:4])
  check(Tensor(A24).shrink((None, (2, 3), (1, 2))), A24[:, 2:3, 1:2])
  check(Tensor(A24).shrink((None, (1, 1), None)), A24[:, 1:1, :])


@pytest.mark.parametrize("pads, value", [
  (((1, 2), (0, 1)), 0.0), (((0, 0), (3, 0)), 0.0), (((1, 1), (1, 1)), -2.5), ((None, (2, 2)), 1.0),
  (((-1, 0), (1, -2)), 0.0), (((-1, 1), (-1, -1)), 4.0), (((0, -3), None), 0.0),
])
def test_pad_like_numpy_pad_with_negative_pads_cropping(pads, value):
  full = tuple((0, 0) if p is None else p for p in pads)
  crop = tuple(slice(max(0, -b), X34.shape[i] - max(0, -a)) for i, (b, a) in enumerate(full))
  grow = tuple((max(0, b), max(0, a)) for b, a in full)
  expected = np.pad(X34[crop], grow, constant_values=value)
  check(Tensor(X34).pad(pads, value=value), expected)


def test_pad_on_ints_and_bools():
  check(Tensor(I34).pad(((1, 0), (0, 2)), value=7), np.pad(I34, ((1, 0), (0, 2)), constant_values=7), dtype=dtypes.i32)
  m = X34 > 0
  check(Tensor(m).pad(((1, 1), (0, 0))), np.pad(m, ((1, 1), (0, 0))), dtype=dtypes.bool)


@pytest.mark.parametrize("axis", [0, 1, -1, (0, 2), (0, 1, 2)])
def test_flip(axis):
  check(Tensor(A24).flip(axis), np.flip(A24, axis))


def test_cat_with_equal_and_unequal_sizes():
  a, b, c = A24, A24 * 2, np.ones((2, 1, 4), np.float32)
  check(Tensor.cat(Tensor(a), Tensor(b), dim=1), np.concatenate([a, b], 1))
  check(Tensor(a).cat(Tensor(b), dim=1), np.concatenate([a, b], 1))
  check(Tensor(a).cat(Tensor(c), dim=1), np.concatenate([a, c], 1))
  check(Tensor.cat(Tensor(c), Tensor(a), Tensor(c), dim=-2), np.concatenate([c, a, c], -2))
  check(Tensor.cat(Tensor(a), Tensor(b)), np.concatenate([a, b], 0))
  check(Tensor.cat(Tensor(a), Tensor(b), dim=2), np.concatenate([a, b], 2))
  check(Tensor.cat(Tensor(I34), Tensor(I34[:1])), np.concatenate([I34, I34[:1]]), dtype=dtypes.i32)
  check(Tensor.cat(Tensor(I34), Tensor(X34), dim=1), np.concatenate([I34, X34], 1), dtype=dtypes.f32)


@pytest.mark.parametrize("dim", [0, 1, 2, -1, 3])
def test_stack(dim):
  a, b, c = A24, A24 + 100, -A24
  check(Tensor.stack(Tensor(a), Tensor(b), Tensor(c), dim=dim), np.stack([a, b, c], axis=dim))
  check(Tensor(a).stack(Tensor(b), dim=dim), np.stack([a, b], axis=dim))


def test_split_and_chunk():
  parts = Tensor(A24).split(2, dim=2)
  for p, e in zip(parts, np.split(A24, 2, axis=2)): check(p, e)
  parts = Tensor(A24).split([1, 2], dim=1)
  assert [p.shape for p in parts] == [(2, 1, 4), (2, 2, 4)]
  for p, e in zip(parts, np.split(A24, [1], axis=1)): check(p, e)
  parts = Tensor(np.arange(7, dtype=np.float32)).split(3)
  assert [p.tolist() for p in parts] == [[0, 1, 2], [3, 4, 5], [6]]
  parts = Tensor(np.arange(7, dtype=np.float32)).chunk(3)   # torch.chunk: pieces of ceil(7/3)
  assert [p.tolist() for p in parts] == [[0, 1, 2], [3, 4, 5], [6]]
  parts = Tensor(A24).chunk(2, dim=-1)
  for p, e in zip(parts, np.split(A24, 2, axis=-1)): check(p, e)


@pytest.mark.parametrize("reps", [(2, 1, 1), (1, 2, 3), (2, 2, 2, 1), (3, 1, 1, 1)])
def test_repeat_tiles_like_numpy_tile(reps):
  check(Tensor(A24).repeat(reps), np.tile(A24, reps))
  check(Tensor(A24).repeat(*reps), np.tile(A24, reps))


# ---- indexing -------------------------------------------------------------------------------------------------------

B = np.arange(4 * 5 * 6, dtype=np.float32).reshape(4, 5, 6)
IDX = [
  (1,), (-1,), (1, 2), (-1, -2, -3), (slice(1, 3),), (slice(None, None, 2),), (slice(None, None, -1),), (slice(3, 0, -2),),
  (slice(None), slice(4, None, -3)), (slice(5, 1),), (slice(-2, None),), (None,), (None, 1, None), (Ellipsis, 2), (Ellipsis,),
  (1, Ellipsis, None), (slice(None), None, slice(1, 3)), (slice(10, 20),), (slice(-100, 100, 3),), (slice(1, -1), slice(None), 0),
  (0, slice(None, None, -1), slice(1, None, 4)),
  ([0, 2],), ([-1, 0, 0],), (slice(None), [4, 0, 1]), (Ellipsis, [5, -6]), ([0, 2], [1, 3]), ([[0], [3]], [1, 2, 4]),
  ([0, 2], slice(None), [1, 3]), (slice(None), [1, 3], [0, 5]), ([1, 2], None, [0, 1]), (slice(1, 3), [[0, 1], [2, 3]]),
  ([0, 1], slice(None, None, -2), [[2], [3]]), (None, [1], slice(None), [2, 3]), (slice(None), slice(None), [[0, 1], [5, 4]]),
]


def _idx_id(idx) -> str: return ",".join(":" if i == slice(None) else repr(i) for i in idx).replace(" ", "")


@pytest.mark.parametrize("idx", IDX, ids=_idx_id)
def test_indexing_matches_numpy(idx):
  check(Tensor(B)[idx if len(idx) > 1 else idx[0]], B[idx])


def test_indexing_with_integer_tensors_and_numpy_arrays():
  check(Tensor(B)[Tensor([0, 3])], B[[0, 3]])
  check(Tensor(B)[Tensor([[1, -1]]), 2], B[[[1, -1]], 2])
  check(Tensor(B)[:, Tensor([0, 4]), Tensor([[1], [5]])], B[:, [0, 4], [[1], [5]]])
  check(Tensor(B)[np.array([2, 1])], B[np.array([2, 1])])
  check(Tensor(I34)[Tensor([2, 0])], I34[[2, 0]], dtype=dtypes.i32)
  m = B > 50
  check(Tensor(m)[Tensor([3, 0]), 1], m[[3, 0], 1], dtype=dtypes.bool)


def test_an_int_beside_index_tensors_selects_first_like_torch():
  # NumPy counts an int as an advanced index, so B[0, :, [1, 2]] moves the gathered axis first (shape (2, 5)); torch
  # and uopc select with the int first and index what is left, so the axes stay in order
  check(Tensor(B)[0, :, [1, 2]], B[0][:, [1, 2]])
  check(Tensor(B)[[1, 2], :, 3], B[:, :, 3][[1, 2], :])
  check(Tensor(B)[:, [1, 2], 0], B[:, [1, 2], 0])   # adjacent: NumPy agrees


def _random_index(rng: np.random.Generator, shape: tuple[int, ...]) -> tuple:
  idx, axis, used_ellipsis = [], 0, False
  while axis < len(shape) and rng.random() < 0.8:
    n, r = shape[axis], rng.random()
    if r < 0.1: idx.append(None); continue
    if r < 0.17 and not used_ellipsis:
      idx.append(Ellipsis); used_ellipsis = True
      axis = len(shape) - int(rng.integers(0, len(shape) - axis + 1))   # the Ellipsis stands for some of the axes left
      continue
    if r < 0.35: idx.append(int(rng.integers(-n, n)))
    elif r < 0.6:
      pick = lambda: None if rng.random() < 0.3 else int(rng.integers(-n - 2, n + 3))
      step = None if rng.random() < 0.3 else int(rng.choice([1, 2, 3, -1, -2, -3]))
      idx.append(slice(pick(), pick(), step))
    else:
      ishape = [(), (2,), (3,), (2, 1), (1, 3)][rng.integers(0, 5)]
      idx.append(rng.integers(-n, n, ishape).tolist() if ishape else [int(rng.integers(-n, n))])
    axis += 1
  return tuple(idx)


def _numpy_oracle(x: np.ndarray, idx: tuple) -> np.ndarray:
  """x[idx] in NumPy; when ints and index arrays are mixed, ints select first (torch's rule, see the test above)."""
  if not (any(isinstance(i, int) for i in idx) and any(isinstance(i, list) for i in idx)): return x[idx]
  n_real = sum(1 for i in idx if i is not None and i is not Ellipsis)
  full = []
  for i in idx: full.extend([slice(None)] * (x.ndim - n_real) if i is Ellipsis else [i])
  full += [slice(None)] * (x.ndim - n_real) if Ellipsis not in idx else []
  first = tuple(i if isinstance(i, int) else slice(None) for i in full if i is not None)
  return x[first][tuple(i for i in full if not isinstance(i, int))]


@pytest.mark.parametrize("seed", range(48))
def test_random_index_tuples_match_numpy(seed):
  rng = np.random.default_rng(seed)
  shape = [(4, 5, 6), (3, 4), (2, 3, 2, 3)][seed % 3]
  x = np.arange(math.prod(shape), dtype=np.float32).reshape(shape)
  while True:
    idx = _random_index(rng, shape)
    try: expected = _numpy_oracle(x, idx)
    except IndexError: continue   # index arrays that don't broadcast together: draw again
    break
  check(Tensor(x)[idx], expected)


def test_a_gather_of_rows_is_one_kernel_of_loads_and_its_gradient_adds_the_rows_up():
  # x[idx] loads the rows picked (a GATHER): one kernel, no reduction over the indexed axis (a one-hot mask summed over it
  # was O(rows) work per element: 4096 rows of a 2048 x 1024 tensor took 450 ms). Its gradient sums each picked row's
  # gradient into its row, repeats included, as np.add.at does; every dtype gathers
  rng = np.random.default_rng(7)
  X = rng.standard_normal((300, 24)).astype(np.float32)
  idx = rng.integers(-300, 300, (40, 3)).astype(np.int32)
  x = Tensor(X, requires_grad=True)
  y = x[Tensor(idx)]
  ks = y.schedule()
  assert len(ks) == 1 and not any(u.op is Ops.REDUCE for u in ks[0].root.toposort())
  check(y, X[idx])
  G = rng.standard_normal(y.shape).astype(np.float32)
  (y * Tensor(G)).sum().backward()
  want = np.zeros_like(X)
  np.add.at(want, idx, G)
  np.testing.assert_allclose(x.grad.numpy(), want, rtol=1e-5, atol=1e-5)
  check(Tensor(X.astype(np.float16))[Tensor(idx)], X.astype(np.float16)[idx], dtype=dtypes.f16)
  check(Tensor(X > 0)[Tensor(idx), 5], (X > 0)[idx, 5], dtype=dtypes.bool)
  check(Tensor(idx)[Tensor(np.array([39, 0], np.int32))], idx[[39, 0]], dtype=dtypes.i32)
  # torch.gather: each element from its own position along dim


@pytest.mark.parametrize("dim", [0, 1, 2, -1])
def test_gather_along_a_dim_loads_each_element_and_its_gradient_sums_along_that_dim_alone(dim):
  # torch.gather is a GATHER whose batch axes are all the others: its forward one load per element, its gradient a
  # one-hot along dim alone (every other axis a batch axis of it), so the backward sums over the index's own length
  rng = np.random.default_rng(8)
  X = rng.standard_normal((5, 6, 7)).astype(np.float32)
  ishape = tuple(3 if k == dim % 3 else s - 1 for k, s in enumerate(X.shape))
  idx = rng.integers(0, X.shape[dim], ishape).astype(np.int32)
  ref = np.take_along_axis(X[tuple(slice(0, s) if k != dim % 3 else slice(None) for k, s in enumerate(ishape))], idx, dim)
  x = Tensor(X, requires_grad=True)
  y = x.gather(dim, Tensor(idx))
  check(y, ref)
  G = rng.standard_normal(ishape).astype(np.float32)
  (y * Tensor(G)).sum().backward()
  want = np.zeros_like(X)
  grid = np.indices(ishape)
  grid[dim % 3] = idx
  np.add.at(want, tuple(grid), G)
  sums = [u for k in x.grad.schedule() for u in k.root.toposort() if u.op is Ops.REDUCE]
  assert sums and all(math.prod(u.src[0].shape[-u.arg[1]:]) == 3 for u in sums)      # over the index's length along dim
  np.testing.assert_allclose(x.grad.numpy(), want, rtol=1e-5, atol=1e-5)
