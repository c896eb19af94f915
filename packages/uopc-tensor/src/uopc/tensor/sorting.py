"""uopc.tensor.sorting: sort, argsort and topk, in fixed shapes.

The IR has no data-dependent loop or shape, so a row is sorted by counting: each element's rank is the number of
elements that go before it (smaller ones, and equal ones earlier in the row: stable), and output position r takes the
element of rank r (n^2 comparisons). Rows longer than SORT_BY_COUNTING_MAX go through a bitonic network instead
(O(n log^2 n)), which masked_select also uses to bring selected elements first. NaN sorts as the largest, as in torch.
"""
from __future__ import annotations
import numpy as np
from uopc.dtype import dtypes, I32_MIN, I32_MAX
from uopc.tensor.errors import TensorError
from uopc.tensor.core import TensorCore, ValuesIndices
from uopc.tensor.creation import positions, triangle

SORT_BY_COUNTING_MAX = 1024   # longer sorts go through a bitonic network (SortingMixin._sort_network)


class SortingMixin:
  """Sorting by counting ranks, or through a bitonic network for long rows."""
  __slots__ = ()

  def sort(self, dim: int = -1, descending: bool = False, stable: bool = True) -> ValuesIndices:
    """Sorted values and their original indices along dim (stable; NaN sorts as the largest, as in torch). Each element's
    rank is the number of elements that go before it (smaller ones, and equal ones earlier in the row), and the output
    position r takes the element of rank r: n^2 comparisons, no data-dependent shapes or loops."""
    return self._sorted(dim, descending, None)
  def argsort(self, dim: int = -1, descending: bool = False, stable: bool = True) -> TensorCore: return self.sort(dim, descending).indices
  def topk(self, k: int, dim: int = -1, largest: bool = True, sorted: bool = True) -> ValuesIndices:
    """The k largest (smallest with largest=False) values along dim, in order, and their indices (ties: the earlier first)."""
    d = self._dim(dim)
    n = self.shape[d] if self.ndim else 1
    if not 0 <= k <= n: raise TensorError(f"topk: k={k} is out of range for dim {d} of size {n} (shape {self.shape})")
    return self._sorted(d, largest, k)
  def _sorted(self, dim: int, descending: bool, k: int | None) -> ValuesIndices:
    d = self._dim(dim)
    if self.ndim == 0: return ValuesIndices(self, type(self).zeros(dtype=dtypes.i32, device=self.device))
    n = self.shape[d]
    k = n if k is None else k
    x = self.transpose(d, -1)
    key = x.int() if x.dtype is dtypes.bool else x
    if n > SORT_BY_COUNTING_MAX:
      values, indices = type(self)._sort_network(key, descending)
      values, indices = values.cast(x.dtype), indices
    else:
      first, same = type(self)._order(key.unsqueeze(-2), key.unsqueeze(-1), descending)   # [i, j]: element j before / tied with i
      earlier = triangle(self, n, n, -1)   # [i, j]: j < i
      rank = (first | (same & earlier)).sum(-1)                     # (..., n): where element i lands
      at = rank.unsqueeze(-2).eq(positions(self, n).unsqueeze(-1))   # [r, i]: element i lands at r
      values = at.where(x.unsqueeze(-2), False if x.dtype is dtypes.bool else 0).sum(-1).cast(x.dtype)
      indices = at.where(positions(self, n), 0).sum(-1)
    if k != n: values, indices = values[..., :k], indices[..., :k]
    return ValuesIndices(values.transpose(d, -1), indices.transpose(d, -1))

  @staticmethod
  def _order(a: TensorCore, b: TensorCore, descending: bool) -> tuple[TensorCore, TensorCore]:
    """(a sorts strictly before b, a ties b): NaN is the largest float and ties NaN, as in torch's sort."""
    first, same = (a > b) if descending else (a < b), a.eq(b)
    if a.dtype.is_float:
      na, nb = a.isnan(), b.isnan()
      first = first | ((na & nb.logical_not()) if descending else (nb & na.logical_not()))
      same = same | (na & nb)
    return first, same

  @classmethod
  def _sort_network(cls, key: TensorCore, descending: bool, payload: TensorCore | None = None) -> tuple[TensorCore, ...]:
    """key sorted along its last axis by a bitonic network, with the original indices carried along: O(n log^2 n) work
    in log2(n) (log2(n) + 1) / 2 stages (counting ranks is O(n^2), an hour at a million elements). Each stage compares
    the elements j apart within blocks of `size` and swaps the pairs that are out of order, blocks alternately up and
    down; an order of (key, index) pairs makes it stable. Padding to a power of two sorts last (NaN, or the lowest
    value descending, after every real one of its key by its larger index). Each stage is stored, or every element of
    the last one would recompute the whole network. A payload of key's shape rides along too (returned third)."""
    n, lead = key.shape[-1], key.shape[:-1]
    N = 1 << (n - 1).bit_length()
    fill = (float("-inf") if descending else float("nan")) if key.dtype.is_float else (I32_MIN if descending else I32_MAX)
    k = key.pad(tuple(None for _ in lead) + ((0, N - n),), value=fill)
    idx = cls.arange(N, device=key.device).reshape((1,) * len(lead) + (N,))._broadcast_to(lead + (N,))
    if payload is not None: payload = payload.pad(tuple(None for _ in lead) + ((0, N - n),))
    half = lambda t, h: t[..., h, :]
    size = 2
    while size <= N:
      j = size // 2
      while j:
        shape = lead + (N // (2 * j), 2, j)
        kk, ii = k.reshape(shape), idx.reshape(shape)
        k0, k1, i0, i1 = half(kk, 0), half(kk, 1), half(ii, 0), half(ii, 1)
        up = cls((np.arange(N // (2 * j)) * 2 * j // size) % 2 == 0, device=key.device).reshape(-1, 1)
        f10, s10 = cls._order(k1, k0, descending)
        f01, s01 = cls._order(k0, k1, descending)
        swap = up.where(f10 | (s10 & (i1 < i0)), f01 | (s01 & (i0 < i1)))
        k = cls.stack(swap.where(k1, k0), swap.where(k0, k1), dim=-2).reshape(lead + (N,)).contiguous()
        idx = cls.stack(swap.where(i1, i0), swap.where(i0, i1), dim=-2).reshape(lead + (N,)).contiguous()
        if payload is not None:
          p0, p1 = half(payload.reshape(shape), 0), half(payload.reshape(shape), 1)
          payload = cls.stack(swap.where(p1, p0), swap.where(p0, p1), dim=-2).reshape(lead + (N,)).contiguous()
        j //= 2
      size *= 2
    return (k[..., :n], idx[..., :n]) + ((payload[..., :n],) if payload is not None else ())
