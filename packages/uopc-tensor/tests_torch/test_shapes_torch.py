"""PyTorch as the oracle for the movement and indexing ops users reach for: pad modes, roll, tril, diagonal, unfold and
meshgrid, index forms, gather, scatter and scatter_reduce, masked_fill, masked_select, nonzero and one_hot, each
forward and backward, on shapes with 0- and 1-sized axes and 0-d tensors.

The helpers come from test_grad_torch (check: outputs and every float input's gradient) and test_ops_torch (exact,
forward, raises_like_torch, the special values).
"""
import numpy as np
import pytest
import torch
import torch.nn.functional as F
from uopc.tensor import Tensor
from test_grad_torch import check, randn
from test_ops_torch import INF, NAN, ints, floats, forward, raises_like_torch


# ---- movement ----------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("mode", ["constant", "reflect", "replicate", "circular"])
@pytest.mark.parametrize("pads", [(0, 2), (1, 2, 3, 0), (-1, 2, 2, -1), (2, -1, 0, 1, 1, 0), (4, 1, 0, 0)], ids=str)
def test_pad_modes_with_torch_flat_pads(mode, pads):
  x = randn(*(2, 3) + (5,) * (len(pads) // 2), seed=19)   # torch pads the last 1-3 axes of a 3-D to 5-D input in these modes
  kw = {"value": 1.5} if mode == "constant" else {}
  check(lambda t: t.pad(pads, mode=mode, **kw), lambda t: F.pad(t, pads, mode=mode, **kw), x)


def test_pad_errors_and_numpy_pairs_beside_flat_tuples():
  x = randn(3, 4, seed=20)
  check(lambda t: t.pad(((1, 2), None), value=-INF), lambda t: F.pad(t, (0, 0, 1, 2), value=-INF), x)
  check(lambda t: t.pad((1, 2, 0, 0), value=NAN), lambda t: F.pad(t, (1, 2), value=NAN), x)
  raises_like_torch(lambda t: t.pad((2, 0, 2)), lambda t: F.pad(t, (2, 0, 2)), x)
  raises_like_torch(lambda t: t.pad((1, 4, 0, 0), mode="reflect"), lambda t: F.pad(t[None], (1, 4), mode="reflect"), x)
  with pytest.raises(NotImplementedError): Tensor(x).pad((1, 1), mode="typo")


def test_pad_then_slice_reads_the_fill_value():
  # the pad's value must survive a slice that drops the data (a dropped kernel input once shifted the launch arguments)
  for value in (0.0, 3.456):
    out = Tensor.ones(3, 3, 3).pad(((3, 2), (0, 1), (1, 1)), value=value)[0:2]
    assert np.array_equal(out.numpy(), np.full((2, 4, 5), value, np.float32))
    check(lambda t: t.pad(((3, 2), (0, 1), (1, 1)), value=value)[2:4], lambda t: F.pad(t, (1, 1, 0, 1, 3, 2), value=value)[2:4],
          randn(3, 3, 3, seed=21))


def test_roll_tril_triu_diagonal_diag_unfold_unflatten_repeat_interleave():
  x = randn(3, 4, 5, seed=22)
  check(lambda t: t.roll(2, 1), lambda t: t.roll(2, 1), x)
  check(lambda t: t.roll((1, -3), (0, 2)), lambda t: t.roll((1, -3), (0, 2)), x)
  check(lambda t: t.roll(-7), lambda t: t.roll(-7), x)
  for k in (0, 2, -1, 6, -6):
    check(lambda t: t.tril(k), lambda t: t.tril(k), x)
    check(lambda t: t.triu(k), lambda t: t.triu(k), x)
  forward(lambda t: t.tril(), lambda t: t.tril(), np.ones((3, 3), dtype=bool))
  check(lambda t: t.triu(), lambda t: t.triu(), np.zeros((2, 0, 3), dtype=np.float32))
  for off, d1, d2 in [(0, 0, 1), (1, 1, 2), (-2, 0, 2), (3, 2, 1)]:
    check(lambda t: t.diagonal(off, d1, d2), lambda t: t.diagonal(off, d1, d2), x)
  for k in (0, 1, -2): check(lambda t: t.diag(k), lambda t: t.diag(k), randn(4, seed=23))
  check(lambda t: t.diag(1), lambda t: t.diag(1), randn(3, 4, seed=24))
  for dim, size, step in [(2, 2, 1), (1, 3, 2), (0, 1, 5), (2, 5, 1), (1, 0, 8)]:
    check(lambda t: t.unfold(dim, size, step), lambda t: t.unfold(dim, size, step), x)
  check(lambda t: t.unflatten(-1, (5, 1)), lambda t: t.unflatten(-1, (5, 1)), x)
  for reps, dim in [(2, 1), (3, None), (1, 0), (0, 2)]:
    check(lambda t: t.repeat_interleave(reps, dim), lambda t: t.repeat_interleave(reps, dim), x)
  raises_like_torch(lambda t: t.unfold(0, 9, 3), lambda t: t.unfold(0, 9, 3), randn(8, seed=25))


def test_meshgrid_ij_and_xy():
  a, b, c = randn(3, seed=26), randn(4, seed=27), randn(2, seed=28)
  for indexing in ("ij", "xy"):
    check(lambda x, y, z: list(x.meshgrid(y, z, indexing=indexing)), lambda x, y, z: list(torch.meshgrid(x, y, z, indexing=indexing)), a, b, c)
  raises_like_torch(lambda x: x.meshgrid(indexing="bad"), lambda x: torch.meshgrid(x, indexing="bad"), a)


def test_shapes_and_index_forms_torch_takes():
  x = randn(2, 5, 6, 5, 3, seed=29)
  check(lambda t: t[(0,), 1:3, (2, 1, 0)], lambda t: t[(0,), 1:3, (2, 1, 0)], x)          # tuples as index lists
  check(lambda t: t[((0,),)], lambda t: t[((0,),)], x)
  check(lambda t: t[[[1], [0]], :, [4, 2]], lambda t: t[[[1], [0]], :, [4, 2]], x)
  s = np.array(2.5, dtype=np.float32)
  check(lambda t: t.squeeze(0), lambda t: t.squeeze(0), s)                                   # squeeze of a 0-d tensor
  check(lambda t: t.squeeze(-1).unsqueeze(0), lambda t: t.squeeze(-1).unsqueeze(0), s)
  check(lambda t: t[None], lambda t: t[None], s)
  check(lambda t: t.flip(()), lambda t: t.flip(()), s)
  a, b, c = randn(3, 4, seed=30), randn(3, 4, seed=31), randn(3, 4, seed=32)
  check(lambda p, q, r: Tensor.stack((p, q, r), dim=1), lambda p, q, r: torch.stack((p, q, r), dim=1), a, b, c)
  check(lambda p, q, r: Tensor.cat([p, q, r], dim=-1), lambda p, q, r: torch.cat([p, q, r], dim=-1), a, b, c)
  check(lambda p: p.reshape((None, 2, 2)), lambda p: p.reshape(3, 2, 2), a)


# ---- gathers, scatters, masks ------------------------------------------------------------------------------------------

IDX = np.random.default_rng(33).integers(0, 3, (3, 4, 5)).astype(np.int32)


@pytest.mark.parametrize("dim", [0, 1, 2, -1])
def test_gather_along_any_dim(dim):
  check(lambda t, i: t.gather(dim, i), lambda t, i: t.gather(dim, i), randn(4, 5, 6, seed=34), IDX)


@pytest.mark.parametrize("dim", [0, 1, -1])
def test_scatter_of_a_tensor_and_of_a_number(dim):
  x, src = randn(4, 5, 6, seed=35), randn(4, 5, 6, seed=36)
  forward(lambda t, i, s: t.scatter(dim, i, s), lambda t, i, s: t.scatter(dim, i, s), x, IDX, src)
  forward(lambda t, i: t.scatter(dim, i, INF), lambda t, i: t.scatter(dim, i, INF), x, IDX)
  forward(lambda t, i: t.scatter(dim, i, 2.0, reduce="add"), lambda t, i: t.scatter(dim, i, 2.0, reduce="add"), x, IDX)
  forward(lambda t, i: t.scatter(dim, i, NAN, reduce="multiply"), lambda t, i: t.scatter(dim, i, NAN, reduce="multiply"), x, IDX)


def test_scatter_with_repeated_indices_keeps_the_last_write():
  # torch's CPU writes in order, so the last of the repeated positions wins. With repeats the gradients differ by design:
  # uopc's goes to the source that was written, torch's to every source of the position (grad.gather(dim, index)), so
  # the repeated case is compared forward only
  check(lambda t, i, s: t.scatter(0, i, s), lambda t, i, s: t.scatter(0, i, s), floats(1, 2, 3, 4), ints(0, 2), floats(5, 6))
  forward(lambda t, i, s: t.scatter(0, i, s), lambda t, i, s: t.scatter(0, i, s), floats(1, 2, 3, 4), ints(0, 0, 3), floats(1, 0, 7))


@pytest.mark.parametrize("reduce", ["sum", "prod", "mean", "amax", "amin"])
def test_scatter_reduce_with_and_without_self(reduce):
  x, src = randn(3, 4, 5, seed=37), randn(3, 4, 5, seed=38)
  for dim in (-1, 1):
    for include_self in (True, False):
      forward(lambda t, i, s: t.scatter_reduce(dim, i, s, reduce, include_self=include_self),
              lambda t, i, s: t.scatter_reduce(dim, i, s, reduce, include_self=include_self), x, IDX, src)
  forward(lambda t, i, s: t.scatter_reduce(1, i, s, reduce), lambda t, i, s: t.scatter_reduce(1, i, s, reduce),
          np.zeros((4, 5, 6), np.int32), IDX, np.random.default_rng(39).integers(-9, 9, (3, 4, 5)).astype(np.int32))
  check(lambda t, i, s: t.scatter_reduce(1, i, s, reduce), lambda t, i, s: t.scatter_reduce(1, i, s, reduce),
        randn(3, 4, seed=40), ints(0, 1, 0, 3, 1, 0, 3, 2).reshape(2, 4), randn(2, 4, seed=41))


def test_scatter_refuses_what_torch_refuses():
  raises_like_torch(lambda t, i, s: t.scatter(1, i, s), lambda t, i, s: t.scatter(1, i, s), randn(2, 3, 10, seed=42), IDX, randn(10, 10, 10, seed=43))
  raises_like_torch(lambda t, i, s: t.half().scatter(1, i, s), lambda t, i, s: t.half().scatter(1, i, s), randn(3, 4, 5, seed=44), IDX,
                    randn(3, 4, 5))
  with pytest.raises(TypeError): Tensor(randn(3, 4, 5)).scatter_reduce(0, Tensor(IDX), Tensor(randn(3, 4, 5)), "INVALID")


def test_masked_fill_masked_select_nonzero_one_hot():
  x = randn(4, 5, seed=45)
  m = x > 0.3
  check(lambda t, k: t.masked_fill(k, -INF), lambda t, k: t.masked_fill(k, -INF), x, m)
  forward(lambda t: t.masked_fill(t < 0, 7), lambda t: t.masked_fill(t < 0, 7), ints(3, -1, 0, -5))
  check(lambda t, k: t.masked_select(k), lambda t, k: t.masked_select(k), x, m)
  check(lambda t, k: t.masked_select(k), lambda t, k: t.masked_select(k), x, m[0])              # the mask broadcasts
  check(lambda t, k: t.masked_select(k), lambda t, k: t.masked_select(k), x, np.array(True))
  sel = Tensor(floats(0, 1, 2, 3, 4, 5, 6, 7, 8)).masked_select(Tensor([True, False, True, False, True, False, False, False, True]), size=6,
                                                                fill_value=-1)
  assert sel.tolist() == [0, 2, 4, 8, -1, -1]
  forward(lambda t: t.nonzero(), lambda t: t.nonzero(), m)
  forward(lambda t: t.nonzero(), lambda t: t.nonzero(), ints(0, 3, 0, -2))
  forward(lambda t: t.one_hot(6), lambda t: F.one_hot(t, 6), ints(1, 2, 4, 0))
  forward(lambda t: t.one_hot(), lambda t: F.one_hot(t), ints(1, 2, 4, 0).reshape(2, 2))
