"""uopc.tensor.movement: reshape, permute, expand, shrink, pad, flip and what is built from them (cat, stack, split,
repeat, roll, diagonal, tril, unfold, ...).

Movement ops change how elements are addressed, never their values: RESHAPE, PERMUTE, EXPAND and SHRINK are index
maps in the IR, and pad and flip are composites of them (uopc.composite), so a chain of them fuses into the index
arithmetic of the kernel that reads it. cat of equal pieces is a STACK, of unequal ones a sum of padded pieces; a strided slice is a
shrink, a pad to a multiple of the step and a reshape that splits the step off; reflect/replicate/circular padding
concatenates pieces of the axis itself.
"""
from __future__ import annotations
import math
import numpy as np
from uopc.dtype import dtypes
from uopc.uop import UOp, Ops, prod
from uopc.composite import pad as _pad_uop, flip_axis
from uopc.tensor.errors import TensorError, TensorIndexError, TensorTypeError
from uopc.tensor.args import int_arg, shape_arg, check_size, new_shape, pairs_arg, promote
from uopc.tensor.core import TensorCore
from uopc.tensor.creation import shared_constant, triangle


def reshape_uop(t: TensorCore, shape: tuple[int, ...]) -> UOp:
  """t's uop in `shape`. A reshape of a reshape is one reshape of the first's source (or that source itself), so that a
  realized tensor viewed again (targets (B, T) flattened for a loss) stays a view of its buffer, with no copy kernel to
  realize it and no index check's read of that copy. Not for a tensor that requires a gradient: backward() finds such a
  tensor by its own node, which the folded graph would no longer hold."""
  return refold(t.uop, t.requires_grad, shape)


def refold(u: UOp, requires_grad: bool, shape: tuple[int, ...]) -> UOp:
  """reshape_uop for a tensor whose uop is u and that requires a gradient or not, for a composite that builds its UOps
  without the Tensors between (conv2d's _conv_uops)."""
  if u.op is Ops.RESHAPE and not requires_grad: u = u.src[0]
  return u if u.shape == shape else u.reshape(shape)


def stack_uop(uops: list[UOp], dim: int) -> UOp:
  """Same-shaped UOps joined along a new axis at `dim` (0 to their rank): a STACK (the new axis first) moved there.
  Tensor.stack's graph, for the composites that build theirs straight from UOps (a convolution's windows)."""
  check_size((len(uops),) + uops[0].shape, "stack")
  u = UOp(Ops.STACK, tuple(uops))
  return u.permute(tuple(range(1, dim + 1)) + (0,) + tuple(range(dim + 1, len(u.shape)))) if dim else u


class MovementMixin:
  """Views and rearrangements: every method here moves elements, none computes one."""
  __slots__ = ()

  def reshape(self, *shape) -> TensorCore:
    """The same elements in a new shape; one -1 takes what is left, and None keeps that axis's size (tinygrad's)."""
    if len(shape) == 1 and isinstance(shape[0], (tuple, list)): shape = tuple(shape[0])
    # the common case first (every internal reshape, most of a user's): python ints, none -1 or None, the same size
    if all(type(s) is int and s >= 0 for s in shape) and prod(shape) == self.numel():
      return self if shape == self.shape else self._new(reshape_uop(self, shape))
    shape = shape_arg(tuple(self.shape[k] if s is None and k < self.ndim else s for k, s in enumerate(shape)))
    if shape.count(-1) > 1: raise TensorError(f"reshape: only one -1, got {shape}")
    if -1 in shape:
      rest = prod(s for s in shape if s != -1)
      if rest == 0 or self.numel() % rest: raise TensorError(f"reshape: can't reshape {self.shape} into {shape}")
      shape = tuple(self.numel() // rest if s == -1 else s for s in shape)
    if prod(shape) != self.numel() or any(s < 0 for s in shape): raise TensorError(f"reshape: can't reshape {self.shape} into {shape}")
    return self if shape == self.shape else self._new(reshape_uop(self, shape))
  view = reshape
  def permute(self, *dims) -> TensorCore:
    dims = tuple(self._dim(d) for d in shape_arg(dims))
    if sorted(dims) != list(range(self.ndim)): raise TensorError(f"permute: {dims} is not a permutation of the axes of {self.shape}")
    return self if dims == tuple(range(self.ndim)) else self._new(self.uop.permute(dims))
  def transpose(self, dim0: int = -2, dim1: int = -1) -> TensorCore:
    order = list(range(self.ndim))
    a, b = self._dim(dim0), self._dim(dim1)
    order[a], order[b] = order[b], order[a]
    return self.permute(order)
  @property
  def T(self) -> TensorCore: return self.permute(tuple(reversed(range(self.ndim))))
  def expand(self, *shape) -> TensorCore:
    shape = shape_arg(shape)
    if len(shape) < self.ndim: raise TensorError(f"expand: {shape} has fewer dimensions than {self.shape}")
    src = (1,) * (len(shape) - self.ndim) + self.shape
    return self._broadcast_to(new_shape(tuple(s if n == -1 else n for s, n in zip(src, shape)), f"expand of {self.shape}"))
  def broadcast_to(self, *shape) -> TensorCore: return self._broadcast_to(new_shape(shape_arg(shape), f"expand of {self.shape}"))
  def squeeze(self, dim: int | tuple[int, ...] | None = None) -> TensorCore:
    """Drop axes of size 1: all of them, or those of dim (an int or a tuple) that have size 1."""
    if dim is None: return self.reshape(tuple(s for s in self.shape if s != 1))
    dims = {self._dim(d) for d in (dim if isinstance(dim, (tuple, list)) else (dim,))}
    if self.ndim == 0: return self
    return self.reshape(tuple(s for k, s in enumerate(self.shape) if not (k in dims and s == 1)))
  def unsqueeze(self, dim: int) -> TensorCore:
    d = self._dim(dim, extra=1)
    return self.reshape(self.shape[:d] + (1,) + self.shape[d:])
  def flatten(self, start_dim: int = 0, end_dim: int = -1) -> TensorCore:
    if self.ndim == 0: return self.reshape(1)
    s, e = self._dim(start_dim), self._dim(end_dim)
    return self.reshape(self.shape[:s] + (prod(self.shape[s:e + 1]),) + self.shape[e + 1:])
  def shrink(self, arg) -> TensorCore:
    """Keep [begin, end) on each axis; None keeps the whole axis."""
    arg = pairs_arg(arg, self.ndim, f"shrink of {self.shape}")
    arg = tuple((0, s) if a is None else a for a, s in zip(arg, self.shape))
    for (b, e), s in zip(arg, self.shape):
      if not 0 <= b <= e <= s: raise TensorError(f"shrink: range ({b}, {e}) doesn't fit an axis of {s} in shape {self.shape}")
    return self if all(a == (0, s) for a, s in zip(arg, self.shape)) else self._new(self.uop.shrink(arg))
  def _pad_pairs(self, padding) -> tuple[tuple[int, int], ...]:
    """One (before, after) pair per axis from numpy.pad's pairs (None for none, one per axis) or PyTorch's flat tuple
    (before, after for the last axis, then the one before it, ...; ints, an even number, up to two per axis)."""
    if not isinstance(padding, (tuple, list)):
      raise TensorError(f"pad: padding must be a tuple of (before, after) pairs or F.pad's flat tuple, got {padding!r}")
    padding = tuple(padding)
    if all(isinstance(p, (int, np.integer)) and not isinstance(p, bool) for p in padding) and padding:
      if len(padding) % 2 or len(padding) > 2 * self.ndim:
        raise TensorError(f"pad: a flat padding needs an even number of ints, at most 2 per axis (shape {self.shape}), got {padding}")
      flat = [(int(padding[k]), int(padding[k + 1])) for k in range(0, len(padding), 2)]
      return tuple([(0, 0)] * (self.ndim - len(flat)) + flat[::-1])
    if len(padding) != self.ndim:
      raise TensorError(f"pad: {len(padding)} (before, after) pairs for shape {self.shape}, expected {self.ndim}")
    try: return tuple((0, 0) if p is None else (int(p[0]), int(p[1])) for p in padding)
    except (TypeError, IndexError): raise TensorError(f"pad: expected (before, after) pairs or None per axis, got {padding}") from None

  def pad(self, padding, mode: str = "constant", value: float = 0.0) -> TensorCore:
    """Pad each axis: `padding` is numpy.pad's (before, after) per axis or F.pad's flat tuple from the last axis; negative
    amounts crop. mode: "constant" (with value), "reflect" (mirror without repeating the edge), "replicate" (repeat the
    edge), "circular" (wrap around). Negative amounts crop after reflect and replicate pad but before circular wraps, as
    in torch."""
    pairs = self._pad_pairs(padding)
    if isinstance(value, np.generic): value = value.item()
    if not isinstance(value, (int, float, bool)): raise TensorError(f"pad: the value must be a number, got {value!r:.60}")
    if mode not in ("constant", "reflect", "replicate", "circular"):
      raise TensorTypeError(f"pad: mode must be 'constant', 'reflect', 'replicate' or 'circular', got {mode!r}")
    if mode != "constant":
      if value != 0: raise TensorError(f"pad: value is for mode 'constant', not {mode!r}")
      crops = tuple((min(b, 0), min(a, 0)) for b, a in pairs)
      t = self.pad(crops) if mode == "circular" else self
      for ax, (b, a) in enumerate(pairs):
        if b > 0 or a > 0: t = t._pad_axis(ax, max(b, 0), max(a, 0), mode)
      return t if mode == "circular" else t.pad(crops)
    # negative amounts crop first (no shrink to build for the usual pad: its pairs parse dearer than the pad itself)
    t = self if all(b >= 0 and a >= 0 for b, a in pairs) else self.shrink(tuple((max(0, -b), s - max(0, -a)) for (b, a), s in zip(pairs, self.shape)))
    widths = tuple((max(0, b), max(0, a)) for b, a in pairs)
    if all(w == (0, 0) for w in widths): return t
    check_size(tuple(s + b + a for s, (b, a) in zip(t.shape, widths)), f"pad of {self.shape}")
    if t.numel() == 0 and any(w != (0, 0) for w in widths):
      # the PAD composite can't grow an empty axis: the fill is built from t's sum over its empty axes (zeros, with the
      # empty axes kept as 1s), padded on the other axes and expanded, so t stays in the graph for its (empty) gradient
      empty = [a for a, n in enumerate(t.shape) if n == 0]
      base = t.sum(empty, keepdim=True).cast(t.dtype).pad(tuple((0, 0) if a in empty else w for a, w in enumerate(widths)))
      base = base.expand(tuple(b + a if k in empty else n for k, (n, (b, a)) in enumerate(zip(base.shape, widths))))
      return base.ne(base).where(base, type(self).full((), value, t.dtype, device=self.device))
    out = t._new(_pad_uop(t.uop, widths))
    if value != 0:
      inside = t._new(_pad_uop(t.ones_like(dtype=dtypes.bool).uop, widths))
      out = inside.where(out, type(self).full((), value, t.dtype, device=self.device))   # the tensor's dtype, as torch's (2.5 pads an i32 with 2)
    return out

  def _pad_axis(self, ax: int, before: int, after: int, mode: str) -> TensorCore:
    """One axis padded by reflect, replicate or circular: pieces of the axis itself, concatenated."""
    n = self.shape[ax]
    piece = lambda b, e: self.shrink(tuple((b, e) if k == ax else None for k in range(self.ndim)))
    if mode == "reflect" and (before >= n or after >= n):
      raise TensorError(f"pad: reflect padding ({before}, {after}) must be smaller than the axis it mirrors ({n}, shape {self.shape})")
    if mode == "circular" and (before > n or after > n):
      raise TensorError(f"pad: circular padding ({before}, {after}) can wrap around axis {ax} of {n} at most once (shape {self.shape})")
    if mode == "replicate" and n == 0: raise TensorError(f"pad: can't replicate the edge of an empty axis (shape {self.shape})")
    if mode == "reflect": left, right = piece(1, before + 1).flip(ax), piece(n - 1 - after, n - 1).flip(ax)
    elif mode == "circular": left, right = piece(n - before, n), piece(0, after)
    else:
      grow = lambda t, k: t.expand(tuple(k if i == ax else s for i, s in enumerate(t.shape)))
      left, right = grow(piece(0, 1), before), grow(piece(n - 1, n), after)
    return type(self).cat(*(p for p in (left, self, right) if p.shape[ax]), dim=ax)

  def flip(self, axis) -> TensorCore:
    axes = [self._dim(a) for a in (axis if isinstance(axis, (tuple, list)) else [axis])]
    if len(set(axes)) != len(axes): raise TensorError(f"flip: dims {tuple(axis)} name an axis twice (shape {self.shape})")
    t = self
    for a in (sorted(axes) if self.ndim else []): t = t._new(flip_axis(t.uop, a))
    return t
  def cat(*tensors: TensorCore, dim: int = 0) -> TensorCore:
    """Concatenate along dim (all other axes equal). Tensor.cat(a, b, dim=1) and a.cat(b, dim=1) are the same."""
    if len(tensors) == 1 and isinstance(tensors[0], (list, tuple)): tensors = tuple(tensors[0])   # torch.cat([a, b])
    ts = [t for t in tensors if isinstance(t, TensorCore)]
    if len(ts) != len(tensors) or not ts: raise TensorError("cat takes one or more Tensors")
    first = ts[0]
    if any(t.ndim == 0 for t in ts): raise TensorIndexError("cat: zero-dimensional tensors can't be concatenated (stack them)")
    d = first._dim(dim)
    for t in ts[1:]:
      if t.ndim != first.ndim or any(a != b for i, (a, b) in enumerate(zip(t.shape, first.shape)) if i != d):
        raise TensorError(f"cat: shapes {' and '.join(str(x.shape) for x in ts)} differ outside dim {d}")
    dt = promote(*(t.dtype for t in ts))
    ts = [t.cast(dt) for t in ts]
    if len(ts) == 1: return ts[0]
    if all(t.shape == first.shape for t in ts):   # equal pieces: STACK them and merge the new axis into dim
      st = type(first).stack(*ts, dim=d)   # the piece index goes before dim (at dim + 1 the pieces would interleave)
      return st.reshape(first.shape[:d] + (len(ts) * first.shape[d],) + first.shape[d + 1:])
    total, off, out = sum(t.shape[d] for t in ts), 0, None
    for t in ts:
      p = t.pad(tuple((off, total - off - t.shape[d]) if i == d else (0, 0) for i in range(t.ndim)))
      out = p if out is None else out + p
      off += t.shape[d]
    return out
  def stack(*tensors: TensorCore, dim: int = 0) -> TensorCore:
    """Join same-shaped tensors along a new axis `dim`. Tensor.stack(a, b) and a.stack(b) are the same."""
    ts = list(tensors[0]) if len(tensors) == 1 and isinstance(tensors[0], (list, tuple)) else list(tensors)   # torch.stack([a, b])
    if not ts or not all(isinstance(t, TensorCore) for t in ts):
      raise TensorError("stack takes Tensors, or one list or tuple of them (the dimension goes in dim=)")
    if any(t.shape != ts[0].shape for t in ts): raise TensorError(f"stack: shapes {' and '.join(str(t.shape) for t in ts)} differ")
    dt = promote(*(t.dtype for t in ts))
    ts = [t.cast(dt) for t in ts]
    return ts[0]._new(stack_uop([t.uop for t in ts], ts[0]._dim(dim, extra=1)), *ts)
  def split(self, sizes, dim: int = 0) -> list[TensorCore]:
    d = self._dim(dim)
    n = self.shape[d]
    sizes = int_arg(sizes, "split: sizes") if not isinstance(sizes, (list, tuple)) else [int_arg(x, "split: a size") for x in sizes]
    if isinstance(sizes, int): sizes = [min(sizes, n - i) for i in range(0, n, sizes)] if sizes > 0 else None
    if sizes is not None and any(x < 0 for x in sizes): raise TensorError(f"split: sizes can't be negative, got {sizes}")
    if sizes is None or sum(sizes) != n: raise TensorError(f"split: sizes {sizes} don't add up to {n} (dim {d} of {self.shape})")
    out, off = [], 0
    for s in sizes:
      out.append(self.shrink(tuple((off, off + s) if i == d else None for i in range(self.ndim))))
      off += s
    return out
  def chunk(self, chunks: int, dim: int = 0) -> list[TensorCore]:
    if int_arg(chunks, "chunk: chunks") < 1: raise TensorError(f"chunk: chunks must be at least 1, got {chunks}")
    n = self.shape[self._dim(dim)]
    return self.split(max(1, math.ceil(n / chunks)), dim)
  def repeat(self, *repeats) -> TensorCore:
    reps = shape_arg(repeats)
    if len(reps) < self.ndim: raise TensorError(f"repeat: {len(reps)} repeats for a tensor of shape {self.shape} (one per axis at least)")
    base = (1,) * (len(reps) - self.ndim) + self.shape
    t = self.reshape(base)
    inter = tuple(x for s in base for x in (1, s))
    t = t.reshape(inter).expand(tuple(x for r, s in zip(reps, base) for x in (r, s)))
    return t.reshape(tuple(r * s for r, s in zip(reps, base)))

  def repeat_interleave(self, repeats: int, dim: int | None = None) -> TensorCore:
    """Each element `repeats` times in a row along dim (of the flattened tensor when dim is None)."""
    if isinstance(repeats, bool) or not isinstance(repeats, (int, np.integer)) or repeats < 0:
      raise TensorTypeError(f"repeat_interleave: repeats must be an int >= 0, got {repeats!r}")
    t = self.flatten() if dim is None else self
    d = t._dim(dim) if dim is not None else 0
    if t.ndim == 0: t = t.reshape(1)
    x = t.unsqueeze(d + 1)
    x = x.expand(x.shape[:d + 1] + (int(repeats),) + x.shape[d + 2:])
    return x.reshape(t.shape[:d] + (t.shape[d] * int(repeats),) + t.shape[d + 1:])
  def unflatten(self, dim: int, sizes) -> TensorCore:
    d = self._dim(dim)
    return self.reshape(self.shape[:d] + tuple(sizes) + self.shape[d + 1:])
  def roll(self, shifts, dims=None) -> TensorCore:
    """Shift elements along dims, wrapping around (over the flattened tensor when dims is None)."""
    shifts_t = tuple(shifts) if isinstance(shifts, (tuple, list)) else (shifts,)
    if dims is None:
      if len(shifts_t) != 1: raise TensorError(f"roll: {len(shifts_t)} shifts need as many dims")
      return self.flatten().roll(shifts_t[0], 0).reshape(self.shape)
    dims_t = tuple(dims) if isinstance(dims, (tuple, list)) else (dims,)
    if len(shifts_t) != len(dims_t): raise TensorError(f"roll: {len(shifts_t)} shifts for {len(dims_t)} dims")
    t = self
    for sh, dim in zip(shifts_t, dims_t):
      d = t._dim(dim)
      n = t.shape[d] if t.ndim else 1
      if not t.ndim or n == 0 or sh % n == 0: continue
      k = sh % n
      cut = lambda b, e: t.shrink(tuple((b, e) if i == d else None for i in range(t.ndim)))
      t = type(self).cat(cut(n - k, n), cut(0, n - k), dim=d)
    return t
  def _triangle(self, diagonal: int, upper: bool) -> TensorCore:
    """triu (upper) or tril: on the last two axes, the elements on and above (below) `diagonal` kept, the rest 0 (False)."""
    if self.ndim < 2: raise TensorError(f"{'triu' if upper else 'tril'} needs at least 2 dimensions, got shape {self.shape}")
    r, c = self.shape[-2:]
    keep = triangle(self, r, c, diagonal, upper)
    return keep.where(self, False if self.dtype is dtypes.bool else 0)
  def triu(self, diagonal: int = 0) -> TensorCore: return self._triangle(diagonal, True)
  def tril(self, diagonal: int = 0) -> TensorCore: return self._triangle(diagonal, False)
  def diagonal(self, offset: int = 0, dim1: int = 0, dim2: int = 1) -> TensorCore:
    """The diagonal of the (dim1, dim2) planes (offset above or below it) as a new last axis: the plane flattened and read
    with a stride of n + 1, movement ops only."""
    a, b = self._dim(dim1), self._dim(dim2)
    if a == b: raise TensorError(f"diagonal: dim1 and dim2 are both {a}")
    rest = [k for k in range(self.ndim) if k not in (a, b)]
    x = self.permute(rest + [a, b])
    lead = x.shape[:-2]
    r, c = x.shape[-2:]
    x = x.shrink(tuple(None for _ in lead) + (((0, r), (min(offset, c), c)) if offset >= 0 else ((min(-offset, r), r), (0, c))))
    n = min(x.shape[-2:])
    x = x.shrink(tuple(None for _ in lead) + ((0, n), (0, n))).reshape(lead + (n * n,))
    return x._strided(len(lead), 0, n * n, n + 1) if n else x
  def diag(self, diagonal: int = 0) -> TensorCore:
    """A 1-D tensor as the given diagonal of a square matrix; the diagonal of a 2-D one."""
    if self.ndim == 2: return self.diagonal(diagonal)
    if self.ndim != 1: raise TensorError(f"diag takes a 1-D or 2-D tensor, got shape {self.shape}")
    n, k = self.shape[0], abs(diagonal)
    square = shared_constant(self, ("eye", n), lambda: np.eye(n, dtype=bool)).where(self.reshape(1, n).expand(n, n), 0)
    return square.pad(((0, k), (k, 0)) if diagonal >= 0 else ((k, 0), (0, k)))
  def unfold(self, dim: int, size: int, step: int) -> TensorCore:
    """torch's Tensor.unfold: the windows of `size` along dim, `step` apart, as a new last axis."""
    d = self._dim(dim)
    n = self.shape[d] if self.ndim else 1
    if size < 0 or size > n: raise TensorError(f"unfold: size {size} doesn't fit dim {d} of {n} (shape {self.shape})")
    if step <= 0: raise TensorError(f"unfold: step must be positive, got {step}")
    if self.ndim == 0: return self.reshape(size)
    o = (n - size) // step + 1
    if size == 0:   # empty windows, still from self (its gradient is then zeros, not missing)
      return self.shrink(tuple((0, 0) if k == d else None for k in range(self.ndim))).reshape(self.shape[:d] + (o,) + self.shape[d + 1:] + (0,))
    others = [k for k in range(self.ndim) if k != d]
    win = self.permute(others + [d])._windows((size,), (step,), (1,))   # (*others, o, size)
    return win.permute(list(range(d)) + [self.ndim - 1] + list(range(d, self.ndim - 1)) + [self.ndim])
  def meshgrid(self, *others: TensorCore, indexing: str = "ij") -> tuple[TensorCore, ...]:
    """Coordinate grids of 1-D tensors (torch.meshgrid): "ij" indexes by the order given, "xy" swaps the first two."""
    if indexing not in ("ij", "xy"): raise TensorError(f"meshgrid: indexing must be 'ij' or 'xy', got {indexing!r}")
    ts = [t.reshape(-1) for t in (self, *others)]
    shape = tuple(t.shape[0] for t in ts)
    if indexing == "xy" and len(ts) > 1: shape = (shape[1], shape[0]) + shape[2:]
    outs = []
    for k, t in enumerate(ts):
      axis = {0: 1, 1: 0}.get(k, k) if indexing == "xy" and len(ts) > 1 else k
      outs.append(t.reshape(tuple(-1 if i == axis else 1 for i in range(len(ts)))).expand(shape))
    return tuple(outs)

  def _strided(self, axis: int, start: int, stop: int, step: int) -> TensorCore:
    """x[start:stop:step] on one axis (step > 0): shrink, pad to a multiple of step, split off the step, keep the first."""
    t = self.shrink(tuple((start, stop) if i == axis else None for i in range(self.ndim)))
    if step == 1: return t
    n = t.shape[axis]
    m = math.ceil(n / step)
    t = t.pad(tuple((0, m * step - n) if i == axis else None for i in range(t.ndim)))
    t = t.reshape(t.shape[:axis] + (m, step) + t.shape[axis + 1:])
    t = t.shrink(tuple((0, 1) if i == axis + 1 else None for i in range(t.ndim)))
    return t.reshape(t.shape[:axis + 1] + t.shape[axis + 2:])
