"""uopc.tensor.reduce: reductions over axes (sum, max, mean, var, prod, norm, argmax, any, logsumexp) and scans (cumsum).

The IR reduces the last axes with ADD or MAX: a reduction over any axes PERMUTEs them to the end first (a free index
map) and REDUCEs. min is max under an order-reversing map, argmax the first position that holds the max; a product
halves its axis pairwise (PROD_FUSED inputs fused per kernel). A running (cumulative) op can't carry a value from one
iteration to the next in the IR, so a block of SCAN_BLOCK elements is spread into a triangular square and reduced
along its rows, then the blocks' totals are scanned the same way (O(32 n) work in a few kernels).
"""
from __future__ import annotations
from uopc.dtype import dtypes
from uopc.uop import Ops, prod
from uopc.tensor.errors import TensorError
from uopc.tensor.args import number_arg
from uopc.tensor.core import TensorCore, ValuesIndices, f16_in_f32
from uopc.tensor.creation import positions, triangle

PROD_FUSED = 16    # prod's pairwise halvings fuse this many inputs per kernel before storing the partial products
SCAN_BLOCK = 32   # cumulative ops scan blocks of this many elements as (b, b) squares, then the blocks' totals (_scan)


class ReduceMixin:
  """Reductions over axes and cumulative scans along one axis."""
  __slots__ = ()

  def _reduce(self, op: Ops, axis=None, keepdim: bool = False) -> TensorCore:
    """REDUCE pops the last axes, so the reduced axes are PERMUTEd to the end first (a free index map)."""
    axes = self._axes(axis)
    if not axes: return self   # nothing to reduce (a 0-d tensor, or axis=())
    order = [a for a in range(self.ndim) if a not in axes] + axes
    t = self.permute(order) if order != list(range(self.ndim)) else self
    u = t.uop.reduce(op, len(axes))
    if not keepdim: return self._new(u)
    return self._new(u.reshape(tuple(1 if a in axes else n for a, n in enumerate(self.shape))))   # (what reshape builds)

  def sum(self, axis=None, keepdim: bool = False, dtype=None) -> TensorCore:
    t = self.cast(dtype) if dtype is not None else (self.cast(dtypes.i32) if self.dtype is dtypes.bool else self)
    if t.dtype is dtypes.f16: return t.float()._reduce(Ops.ADD, axis, keepdim).half()   # summed in f32, rounded once (f16_in_f32)
    return t._reduce(Ops.ADD, axis, keepdim)
  # over an empty axis max and min give their identities (-inf and inf, INT_MIN and INT_MAX), as every reduction does
  # here and in tinygrad (NumPy and PyTorch raise instead)
  def max(self, axis=None, keepdim: bool = False) -> TensorCore: return self._reduce(Ops.MAX, axis, keepdim)
  def min(self, axis=None, keepdim: bool = False) -> TensorCore: return self._order_reversed()._reduce(Ops.MAX, axis, keepdim)._order_reversed()
  def _checked_nonempty(self, what: str, axis) -> TensorCore:
    """self, once it has elements over `axis`: an argmax or argmin over nothing has no value (the index INT_MIN would be
    made up), refused as NumPy and PyTorch refuse it."""
    if self.numel() == 0 and prod(self.shape[a] for a in self._axes(axis)) == 0:
      raise TensorError(f"{what} over an axis of size 0 (shape {self.shape}) has no value")
    return self
  @f16_in_f32
  def mean(self, axis=None, keepdim: bool = False) -> TensorCore:
    n = prod(self.shape[a] for a in self._axes(axis))
    return self.float().sum(axis, keepdim) * (1.0 / n if n else float("nan"))
  @f16_in_f32
  def var(self, axis=None, keepdim: bool = False, correction: int = 1) -> TensorCore:
    """The sum of squared deviations over n - correction; with no degrees of freedom left that is a division by 0 (inf,
    or NaN for a zero sum), as in torch."""
    correction = number_arg(correction, "var: correction")
    n = prod(self.shape[a] for a in self._axes(axis))
    d = self.float() - self.float().mean(axis, keepdim=True)
    return (d * d).sum(axis, keepdim) * (1.0 / (n - correction) if n - correction > 0 else float("inf"))
  @f16_in_f32
  def std(self, axis=None, keepdim: bool = False, correction: int = 1) -> TensorCore: return self.var(axis, keepdim, correction).sqrt()
  def var_mean(self, axis=None, keepdim: bool = False, correction: int = 1) -> tuple[TensorCore, TensorCore]:
    return self.var(axis, keepdim, correction), self.mean(axis, keepdim)
  def std_mean(self, axis=None, keepdim: bool = False, correction: int = 1) -> tuple[TensorCore, TensorCore]:
    return self.std(axis, keepdim, correction), self.mean(axis, keepdim)
  def prod(self, axis=None, keepdim: bool = False, dtype=None) -> TensorCore:
    """The product over axis. The IR reduces only by ADD and MAX, so the reduced axes become one axis, padded with ones to
    a power of two and halved pairwise log2(n) times: exact on integers, and its gradient is the product of the others
    (right at zeros too)."""
    t = self.cast(dtype) if dtype is not None else (self.int() if self.dtype is dtypes.bool else self)
    if t.dtype is dtypes.f16: return t.float().prod(axis, keepdim).half()   # multiplied in f32, rounded once (f16_in_f32)
    axes = t._axes(axis)
    if not axes: return t
    rest = [a for a in range(t.ndim) if a not in axes]
    n = prod(t.shape[a] for a in axes)
    x = t.permute(rest + axes).reshape(tuple(t.shape[a] for a in rest) + (n,))
    if n == 0: return t.sum(axes, keepdim) + 1   # the empty product, with t still in the graph
    m = 1 << max(0, n - 1).bit_length()
    if m != n: x = x.pad(tuple(None for _ in rest) + ((0, m - n),), value=1)
    fan_in = 1        # the inputs of one fused product tree: stored every 16, or 3000 products became one C expression (10 s of gcc)
    while x.shape[-1] > 1:
      if fan_in == PROD_FUSED: x, fan_in = x.contiguous(), 1
      x = x.reshape(x.shape[:-1] + (x.shape[-1] // 2, 2))
      x = x.shrink(tuple(None for _ in x.shape[:-1]) + ((0, 1),)) * x.shrink(tuple(None for _ in x.shape[:-1]) + ((1, 2),))
      x = x.reshape(x.shape[:-1])
      fan_in *= 2
    out = x.reshape(x.shape[:-1])
    return out.reshape(tuple(1 if a in axes else d for a, d in enumerate(t.shape))) if keepdim else out
  @f16_in_f32
  def norm(self, p: float = 2.0, dim=None, keepdim: bool = False) -> TensorCore:
    """The vector p-norm over dim (all axes by default), as torch.linalg.vector_norm: p = inf is the largest |x|, p = 0
    counts the nonzero elements."""
    a = self.float().abs()
    if p == float("inf"): return a.max(dim, keepdim)
    if p == float("-inf"): return a.min(dim, keepdim)
    if p == 0: return a.ne(0).float().sum(dim, keepdim)
    if p == 1: return a.sum(dim, keepdim)
    s = (a * a if p == 2 else a ** p).sum(dim, keepdim)
    # the root of a zero sum reads a safe 1: its slope there is inf, and inf * 0 was a NaN gradient (torch's is 0)
    zero = s.eq(0)
    root = zero.where(1.0, s)
    return zero.where(0.0, root.sqrt() if p == 2 else root ** (1 / p))

  def argmax(self, axis=None, keepdim: bool = False) -> TensorCore:
    """The index of the (first) maximum, as i32; over the flattened tensor when axis is None."""
    if axis is None: return self.reshape(-1).argmax(0)
    ax = self._checked_nonempty("argmax", axis)._dim(axis)
    if self.ndim == 0: return type(self).zeros(dtype=dtypes.i32, device=self.device)
    n = self.shape[ax]
    hit = self.eq(self.max(ax, keepdim=True))
    if self.dtype.is_float: hit = hit | self.ne(self)   # a NaN is the maximum, as in NumPy and torch: the first NaN wins
    rev = (n - positions(self, n)).reshape(tuple(n if i == ax else 1 for i in range(self.ndim)))
    return (n - hit.where(rev, 0).max(ax, keepdim)).cast(dtypes.i32)
  def argmin(self, axis=None, keepdim: bool = False) -> TensorCore:
    return self._checked_nonempty("argmin", axis)._order_reversed().argmax(axis, keepdim)
  # a bool MAX starts from False: through i32 an empty any() started from INT_MIN, which is True
  def any(self, axis=None, keepdim: bool = False) -> TensorCore: return self.bool()._reduce(Ops.MAX, axis, keepdim)
  def all(self, axis=None, keepdim: bool = False) -> TensorCore: return self.bool().logical_not().any(axis, keepdim).logical_not()

  @f16_in_f32
  def logsumexp(self, axis=None, keepdim: bool = False) -> TensorCore:
    """log(sum(exp(self))) over axis, shifted by the (detached) max so nothing overflows; over nothing it is log 0 = -inf."""
    if prod(self.shape[a] for a in self._axes(axis)) == 0: m = self.sum(axis, keepdim=True)._stop_gradient()   # no max to take: no shift
    else: m = self.max(axis, keepdim=True)._stop_gradient()
    m = m.isinf().where(0.0, m)
    out = (self - m).exp().sum(axis, keepdim=True).log() + m
    return out if keepdim else out.reshape(tuple(n for k, n in enumerate(self.shape) if k not in self._axes(axis)))

  # ---- scans: cumulative sums, products, maxima along one axis
  def _scan(self, axis: int, reduce: str) -> TensorCore:
    """out[..., i] = reduce(self[..., :i + 1]) along axis ("sum", "prod" or "max"). A running loop would carry a value from
    one iteration to the next, which the IR has no way to say; instead a block of b elements is spread into a (b, b)
    square whose entries above the diagonal are the reduction's identity, and the square is reduced along its rows. A
    longer axis is cut into blocks of 32: each block is scanned so, the blocks' totals are scanned the same way, and each
    block is combined with the total of the blocks before it. O(32 n) work in a few kernels."""
    t = self.int() if self.dtype is dtypes.bool else self
    d = t._dim(axis)
    if t.ndim == 0 or t.shape[d] == 0: return t
    return t.transpose(d, -1)._scan_last(reduce).transpose(d, -1)
  def _scan_last(self, reduce: str) -> TensorCore:
    n, B = self.shape[-1], SCAN_BLOCK
    identity = {"sum": 0, "prod": 1, "max": dtypes.min(self.dtype), "logaddexp": float("-inf")}[reduce]
    if n <= B:
      keep = triangle(self, n, n)   # keep[i, j] = j <= i
      square = keep.where(self.unsqueeze(-2), identity)
      return {"sum": square.sum, "prod": square.prod, "max": square.max, "logaddexp": square.logsumexp}[reduce](-1)
    m = -(-n // B)
    lead = self.shape[:-1]
    blocks = self.pad(tuple(None for _ in lead) + ((0, m * B - n),), value=identity).reshape(lead + (m, B))._scan_last(reduce)
    before = blocks[..., -1]._scan_last(reduce).pad(tuple(None for _ in lead) + ((1, -1),), value=identity)   # the blocks before
    combine = {"sum": lambda a, b: a + b, "prod": lambda a, b: a * b, "max": lambda a, b: a.maximum(b), "logaddexp": type(self).logaddexp}[reduce]
    return combine(blocks, before.unsqueeze(-1)).reshape(lead + (m * B,)).shrink(tuple(None for _ in lead) + ((0, n),))
  @f16_in_f32
  def cumsum(self, axis: int = 0, *, dim: int | None = None) -> TensorCore: return self._scan(axis if dim is None else dim, "sum")
  @f16_in_f32
  def cumprod(self, axis: int = 0, *, dim: int | None = None) -> TensorCore: return self._scan(axis if dim is None else dim, "prod")
  def cummax(self, axis: int = 0, *, dim: int | None = None) -> ValuesIndices:
    """The running maximum and, as torch gives it, the index of its last occurrence so far: the last position j <= i that
    holds its own running maximum (a record or a tie with it), itself a running max of those positions."""
    d = self._dim(axis if dim is None else dim)
    values = self._scan(d, "max")
    if self.ndim == 0: return ValuesIndices(values, type(self).zeros(dtype=dtypes.i32, device=self.device))
    pos = positions(self, self.shape[d]).reshape(tuple(-1 if k == d else 1 for k in range(self.ndim)))
    holds = self.eq(values) | self.isnan() if self.dtype.is_float else self.eq(values)   # a NaN is its own running max
    return ValuesIndices(values, holds.where(pos, -1)._scan(d, "max"))
  def cummin(self, axis: int = 0, *, dim: int | None = None) -> ValuesIndices:
    values, indices = self._order_reversed().cummax(axis, dim=dim)
    return ValuesIndices(values._order_reversed(), indices)
  @f16_in_f32
  def logcumsumexp(self, axis: int = 0, *, dim: int | None = None) -> TensorCore:
    """log(cumsum(exp(self))): the blocked scan with logaddexp as its combine (associative, identity -inf), each step
    shifted by its larger operand so nothing overflows; O(32 n) like the other scans (an (n, n) square was quadratic)."""
    return self.float()._scan(axis if dim is None else dim, "logaddexp")
