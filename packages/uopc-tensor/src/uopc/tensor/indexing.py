"""uopc.tensor.indexing: Python indexing, gather and scatter, masks, one_hot and embedding.

Ints, slices, None and Ellipsis are movement ops (shrink, reshape, a strided view, a flip for a negative step).
An index with integer tensors (advanced indexing, NumPy's rule), embedding and gather load the rows their indices pick
(a GATHER: one load per element). Lowering clamps an index into its axis, so memory stays safe but a wrong index would
silently read another row: the index values are checked as PyTorch checks them (capture.check_indices, repeated on
every uopc.jit replay). scatter is a one-hot mask of the indices against the positions, summed (as a GATHER's gradient
is); masked_select needs its result's length, which is read back unless `size` fixes it.
"""
from __future__ import annotations
import numpy as np
from uopc.dtype import dtypes
from uopc.uop import prod
from uopc.tensor.errors import TensorError, TensorIndexError, TensorTypeError
from uopc.tensor.args import broadcast_shape, index_array
from uopc.tensor.capture import check_indices
from uopc.tensor.core import TensorCore
from uopc.tensor.creation import positions
import uopc.tensor.sorting as sorting


class IndexingMixin:
  """t[idx], gather, scatter and scatter_reduce, masked_fill and masked_select, nonzero, one_hot, embedding."""
  __slots__ = ()

  def __getitem__(self, idx) -> TensorCore:
    """Python indexing: ints, slices (with steps, negative too), None, Ellipsis, and integer Tensors (or lists) to gather."""
    if not isinstance(idx, tuple): idx = (idx,)
    # a list or tuple inside the index is a list of indices, as in numpy and torch (x[(0, 1), :] gathers rows 0 and 1)
    idx = tuple(type(self)(index_array(i), device=self.device) if isinstance(i, (list, tuple, np.ndarray)) else i for i in idx)
    if sum(1 for i in idx if i is Ellipsis) > 1: raise TensorIndexError("an index can only have a single ellipsis ('...')")
    n_real = sum(1 for i in idx if i is not None and i is not Ellipsis)
    if n_real > self.ndim: raise TensorIndexError(f"too many indices ({n_real}) for a tensor of shape {self.shape}")
    if any(i is Ellipsis for i in idx):   # `in` would compare Tensors with ==
      k = next(j for j, i in enumerate(idx) if i is Ellipsis)
      idx = idx[:k] + (slice(None),) * (self.ndim - n_real) + idx[k + 1:]
    else: idx = idx + (slice(None),) * (self.ndim - n_real)
    t, axis, tensor_axes = self, 0, []
    for i in idx:
      if i is None: t = t.unsqueeze(axis); axis += 1; continue
      if isinstance(i, TensorCore):
        if i.dtype is dtypes.bool:
          raise TensorIndexError("boolean mask indexing isn't supported (its result shape depends on the data; see masked_select)")
        if i.dtype is not dtypes.i32: raise TensorIndexError(f"index tensors must be integers, got {i.dtype.name}")
        tensor_axes.append((axis, i)); axis += 1; continue
      if isinstance(i, (bool, np.bool_)): raise TensorIndexError("a bool index isn't supported")
      if isinstance(i, (int, np.integer)):
        n = t.shape[axis]
        j = int(i) + n if i < 0 else int(i)
        if not 0 <= j < n: raise TensorIndexError(f"index {i} is out of bounds for axis {axis} of size {n} (shape {self.shape})")
        t = t.shrink(tuple((j, j + 1) if a == axis else None for a in range(t.ndim)))
        t = t.reshape(t.shape[:axis] + t.shape[axis + 1:])
        continue
      if isinstance(i, slice):
        n = t.shape[axis]
        if i.step == 0: raise TensorError("a slice step can't be zero")
        try: start, stop, step = i.indices(n)
        except TypeError: raise TensorError(f"slice indices must be integers or None, got {i!r}") from None
        if step > 0: t = t._strided(axis, start, max(start, stop), step)
        else:   # a negative step: the mirrored positive slice of the flipped axis (or nothing)
          count, first = len(range(start, stop, step)), n - 1 - start
          t = t.flip(axis)._strided(axis, first, first + (count - 1) * -step + 1, -step) if count else t._strided(axis, 0, 0, 1)
        axis += 1
        continue
      raise TensorIndexError(f"can't index a Tensor with {type(i).__name__} {i!r}")
    return t._gather(tensor_axes) if tensor_axes else t

  def _gather(self, tensor_axes: list[tuple[int, TensorCore]], checked: bool = False) -> TensorCore:
    """Advanced indexing (NumPy's rule): the index tensors broadcast together and select along their axes; the result's
    index dimensions go where the indexed axes were when those are adjacent, else first. The indexed axes are moved
    first and merged into one, whose flat index picks rows (a GATHER: one load per element, where a one-hot mask and a
    sum over the axis were O(n) per element). `checked`: the caller has refused every index outside [0, n) already
    (embedding), so none counts from the end."""
    axes = [a for a, _ in tensor_axes]
    ishape = broadcast_shape(*(i.shape for _, i in tensor_axes))
    flat = None
    for a, i in tensor_axes:   # one flat index over the indexed axes (negative indices count from the end)
      n = self.shape[a]
      if not checked:
        check_indices(i, -n, n, f"index {{}} is out of range for axis {a} of size {n} (shape {self.shape})")
        i = (i < 0).where(i + n, i)
      i = i._broadcast_to(ishape)
      flat = i if flat is None else flat * n + i
    rest = [k for k in range(self.ndim) if k not in axes]
    pre = tuple(self.shape[k] for k in rest)
    x = self.permute(axes + rest).reshape((prod(self.shape[a] for a in axes),) + pre)   # (m, *rest)
    out = x._new(x.uop.gather(flat.uop), x)                               # (*ishape, *rest)
    if axes == list(range(axes[0], axes[0] + len(axes))) and axes[0] > 0:   # adjacent: the index dimensions where the axes were
      k, lead = len(ishape), axes[0]
      out = out.permute([k + j for j in range(lead)] + list(range(k)) + [k + j for j in range(lead, len(pre))])
    return out

  def gather(self, dim: int, index: TensorCore) -> TensorCore:
    """torch.gather: out[i][j] = self[index[i][j]][j] for dim 0, and so on; index has self's rank."""
    d, index = self._dim(dim), self._tensor_arg(index, "gather: index")
    if index.ndim != self.ndim: raise TensorError(f"gather: index of shape {index.shape} for a tensor of shape {self.shape}")
    if self.ndim == 0: return self.reshape(1).gather(0, index.reshape(1)).reshape(())   # torch takes a 0-d tensor as one element
    n = self.shape[d]
    if index.dtype is not dtypes.i32: raise TensorError(f"gather: index must be i32, got {index.dtype.name}")
    if any(a > b for i, (a, b) in enumerate(zip(index.shape, self.shape)) if i != d):
      raise TensorError(f"gather: index of shape {index.shape} is larger than the tensor {self.shape} outside dim {d}")
    check_indices(index, 0, n, f"gather: index {{}} is out of range for dim {d} of size {n} (shape {self.shape})")
    # dim moved last: every other axis is a batch axis the indices share with the (shrunk) tensor, and each element is
    # picked along dim by its own index (a GATHER with rank - 1 batch axes; its gradient a one-hot along dim alone)
    x = self.shrink(tuple(None if i == d else (0, s) for i, s in enumerate(index.shape)))
    order = [k for k in range(self.ndim) if k != d] + [d]
    x, idx = x.permute(order), index.permute(order)
    out = x._new(x.uop.gather(idx.uop, self.ndim - 1), x)
    return out.permute([order.index(k) for k in range(self.ndim)])

  # ---- scatter and masks
  def _scatter_parts(self, dim: int, index: TensorCore, src) -> tuple[int, TensorCore, TensorCore]:
    """For scatter and scatter_reduce: dim, and the one-hot `hit[..., t, i]` (index[..., i] == t, dim moved last, t over
    self's dim) with src's matching values broadcast to it, both over the region of self that index covers."""
    d = self._dim(dim)
    if not isinstance(index, TensorCore) or index.dtype is not dtypes.i32: raise TensorIndexError("scatter: index must be an i32 Tensor")
    if index.ndim != self.ndim: raise TensorError(f"scatter: index of shape {index.shape} for a tensor of shape {self.shape}")
    check_indices(index, 0, self.shape[d], f"scatter: index {{}} is out of range for dim {d} of size {self.shape[d]} (shape {self.shape})")
    if isinstance(src, TensorCore):
      if src.dtype is not self.dtype: raise TensorError(f"scatter: src is {src.dtype.name}, the tensor {self.dtype.name}")
      if src.ndim != self.ndim or any(i > s for i, s in zip(index.shape, src.shape)):
        raise TensorError(f"scatter: index of shape {index.shape} is larger than src {src.shape}")
      src = src.shrink(tuple((0, i) for i in index.shape))
    else: src = type(self).full(index.shape, src, self.dtype, device=self.device)
    if any(i > s for k, (i, s) in enumerate(zip(index.shape, self.shape)) if k != d):
      raise TensorError(f"scatter: index of shape {index.shape} is larger than the tensor {self.shape} outside dim {d}")
    n = self.shape[d]
    idx, vals = index.transpose(d, -1), src.transpose(d, -1)                       # (..., I)
    hit = idx.unsqueeze(-2).eq(positions(self, n).unsqueeze(-1))  # (..., n, I)
    return d, hit, vals.unsqueeze(-2)._broadcast_to(hit.shape)
  def _scatter_as_1d(self, fn, dim, index, src) -> TensorCore:
    """A scatter into a 0-d tensor (torch takes it as one element): fn on (1,)-shaped self, index and src, back to 0-d."""
    self._dim(dim)
    index = self._tensor_arg(index, "scatter: index")
    if index.ndim != 0: raise TensorError(f"scatter: index of shape {index.shape} for a tensor of shape ()")
    return fn(self.reshape(1), index.reshape(1), src.reshape(1) if isinstance(src, TensorCore) and src.ndim == 0 else src).reshape(())
  def _scatter_back(self, d: int, region: TensorCore, touched: TensorCore) -> TensorCore:
    """The updated region (dim last, other axes as index's) placed back into self where touched."""
    pads = tuple((0, s - r) for s, r in zip(self.transpose(d, -1).shape, region.shape))
    full, mask = region.pad(pads).transpose(d, -1), touched.pad(pads).transpose(d, -1)
    return mask.where(full, self)
  def scatter(self, dim: int, index: TensorCore, src, reduce: str | None = None) -> TensorCore:
    """torch.scatter: a copy of self with self[index[i][j]][j] = src[i][j] (dim 0, and so on). src is a tensor or a number;
    where index repeats a position the last write wins, as on torch's CPU. reduce "add" or "multiply" combine instead."""
    if reduce not in (None, "add", "multiply"):
      raise TensorTypeError(f"scatter: reduce must be None, 'add' or 'multiply', got {reduce!r}")
    if reduce is not None: return self.scatter_reduce(dim, index, src, {"add": "sum", "multiply": "prod"}[reduce])
    if self.ndim == 0: return self._scatter_as_1d(lambda t, i, v: t.scatter(0, i, v), dim, index, src)
    d, hit, vals = self._scatter_parts(dim, index, src)
    I = hit.shape[-1]
    counts = positions(self, I) + 1
    last = hit.where(counts, 0).max(-1, keepdim=True)   # 1 + the last i that writes t
    pick = hit & last.eq(counts)
    region = pick.where(vals, False if self.dtype is dtypes.bool else 0).sum(-1).cast(self.dtype)
    return self._scatter_back(d, region, hit.any(-1))
  def scatter_reduce(self, dim: int, index: TensorCore, src: TensorCore, reduce: str, include_self: bool = True) -> TensorCore:
    """torch.scatter_reduce: every src element folded into self at its index by sum, prod, mean, amax or amin (with self's
    own value unless include_self is False); positions nothing is scattered to keep self's value."""
    if reduce not in ("sum", "prod", "mean", "amax", "amin"):
      raise TensorTypeError(f"scatter_reduce: reduce must be 'sum', 'prod', 'mean', 'amax' or 'amin', got {reduce!r}")
    if self.ndim == 0: return self._scatter_as_1d(lambda t, i, v: t.scatter_reduce(0, i, v, reduce, include_self), dim, index, src)
    d, hit, vals = self._scatter_parts(dim, index, src)
    base = self.transpose(d, -1).shrink(tuple((0, s) for s in hit.shape[:-1]))   # self over the region
    touched = hit.any(-1)
    if reduce in ("amax", "amin"):
      v = vals if reduce == "amax" else vals._order_reversed()
      b = base if reduce == "amax" else base._order_reversed()
      r = hit.where(v, dtypes.min(v.dtype)).max(-1)
      r = r.maximum(b) if include_self else r
      if r.requires_grad and r.dtype.is_float:
        # torch shares the gradient evenly among the tied maxima (MAX splits pairwise: 1/2, 1/4, 1/4): the value is r
        # exactly, plus terms that are 0 forward and carry 1/count of the gradient to each tie
        rd = r._stop_gradient()
        tie = hit & v._stop_gradient().eq(rd.unsqueeze(-1))
        share = tie.where(v - v._stop_gradient(), 0.0).sum(-1)
        # torch counts self among the ties where it equals the result even when it isn't included (it then gets no share)
        self_tie = b._stop_gradient().eq(rd)
        count = tie.int().sum(-1) + self_tie.int()
        if include_self: share = share + self_tie.where(b - b._stop_gradient(), 0.0)
        r = rd + share / count.maximum(1)
      region = r if reduce == "amax" else r._order_reversed()
    elif reduce == "prod":
      r = hit.where(vals, 1).prod(-1)
      region = r * base if include_self else r
    else:
      r = hit.where(vals, 0).sum(-1)
      region = r + base if include_self else r
      if reduce == "mean":
        count = hit.sum(-1) + (1 if include_self else 0)
        region = region / count.maximum(1) if self.dtype.is_float else region // count.maximum(1)
    return self._scatter_back(d, region.cast(self.dtype), touched)
  def masked_fill(self, mask: TensorCore, value) -> TensorCore:
    """value where mask is true, self elsewhere (self's dtype)."""
    v = value.cast(self.dtype) if isinstance(value, TensorCore) else type(self).full((), value, self.dtype, device=self.device)
    return mask.where(v, self)
  def masked_select(self, mask: TensorCore, size: int | None = None, fill_value=0) -> TensorCore:
    """The elements where mask (broadcast with self) is true, flattened. The result's length depends on the data: pass
    `size` to keep it static (shorter: cut; longer: filled with fill_value); without it the count is read back (a sync).
    Each output position sums its one selected element out of all of them (O(n * size)), or for long inputs a stable
    sort network puts the selected elements first (O(n log^2 n))."""
    shape = broadcast_shape(self.shape, mask.shape)
    x, m = self._broadcast_to(shape).reshape(-1), mask.bool()._broadcast_to(shape).reshape(-1)
    if size is None: size = int(m.sum().item())
    n = x.shape[0]
    if n == 0: return type(self).full((size,), fill_value, self.dtype, device=self.device)
    fill = type(self).full((), fill_value, self.dtype, device=self.device)
    if n * size > sorting.SORT_BY_COUNTING_MAX ** 2:   # long: a stable sort by "not selected" brings the selected ones first, in order
      _, _, picked = type(self)._sort_network(m.logical_not().int(), False, x)
      picked = picked.pad(((0, max(0, size - n)),))[:size]
      return (positions(self, size) < m.int().sum()).where(picked, fill)
    pos = m.int().cumsum(0) - 1                                   # where each selected element goes
    at = m & pos.eq(positions(self, size).unsqueeze(-1))   # (size, n)
    out = at.where(x, False if self.dtype is dtypes.bool else 0).sum(-1).cast(self.dtype)
    return at.any(-1).where(out, fill)
  def nonzero(self, size: int | None = None, fill_value=0) -> TensorCore:
    """The indices of the nonzero elements, one row each (n, ndim), in row-major order; `size` as in masked_select."""
    m = self.ne(0) if self.dtype is not dtypes.bool else self
    if size is None: size = int(m.sum().item())
    coords = [type(self).arange(s, device=self.device).reshape(tuple(s if k == a else 1 for k in range(self.ndim)))._broadcast_to(self.shape)
              for a, s in enumerate(self.shape)]
    if not coords: return type(self).zeros(size, 0, dtype=dtypes.i32, device=self.device)
    return type(self).stack(*(c.masked_select(m, size, fill_value) for c in coords), dim=1)
  def one_hot(self, num_classes: int = -1) -> TensorCore:
    """i32 one-hot vectors along a new last axis; num_classes -1 takes the largest index + 1 (a read back, as in torch)."""
    if self.dtype is not dtypes.i32: raise TensorError(f"one_hot: indices must be i32, got {self.dtype.name}")
    if num_classes == -1: num_classes = int(self.max().item()) + 1 if self.numel() else 0
    if num_classes < 0: raise TensorError(f"one_hot: num_classes must be -1 or >= 0, got {num_classes}")
    check_indices(self, 0, num_classes, f"one_hot: class {{}} is out of range for {num_classes} classes")
    return self.unsqueeze(-1).eq(positions(self, num_classes)).int()

  def embedding(self, weight: TensorCore) -> TensorCore:
    """Rows of weight (V, D) picked by this integer tensor: shape self.shape + (D,)."""
    if self.dtype is not dtypes.i32: raise TensorError(f"embedding: indices must be i32, got {self.dtype.name}")
    weight = self._tensor_arg(weight, "embedding: weight")
    if weight.ndim != 2: raise TensorError(f"embedding: weight must be (num_embeddings, dim), got {weight.shape}")
    if weight.device != self.device: raise TensorError(f"embedding: indices on {self.device} and a weight on {weight.device}: move one first")
    check_indices(self, 0, weight.shape[0], f"embedding: index {{}} is out of range for {weight.shape[0]} embeddings")
    return weight._new(weight.uop.gather(self.uop), weight)   # weight[self]: a row per index
