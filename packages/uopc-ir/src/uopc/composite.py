"""Composite ops: PAD and FLIP built from the primitives, so rangeify and autodiff need no rules for them.

    concat2(a, b, axis)    STACK the two, move the new axis next to `axis`, merge the pair with a RESHAPE
    pad_axis / pad         concatenate zeros (doubling while the padding is wider than the axis), SHRINK back
    anti_eye(n)            M[i, j] = (i + j == n - 1) by the "diagonal trick" (a row stride one longer than the data)
    flip_axis(x, axis)     reverse an axis: O(n), with movement ops alone

Every index map here stays inside its source's shape, which is what lets the lowered code load
unconditionally: a STACK branch never reads outside the tensor it was built from.

flip_axis uses the same shearing idea as anti_eye, applied to the data itself. Broadcast x (length n) to
n rows and flatten: w[p] = x[p % n]. Read w with stride n-1 from position n-1: element i is
w[(n-1)(i+1)] = x[(n-1)(i+1) % n] = x[n-1-i], because (n-1)(i+1) = -(i+1) modulo n. A stride is a RESHAPE
to rows of n-1 plus a SHRINK to the first column, so the flip is six movement ops and one load per element
(the O(n^2) anti-identity product stays available as anti_eye, as a reference).
"""
from __future__ import annotations
from uopc.uop import UOp, Ops, UOpError
from uopc.dtype import DType


def _axis(x: UOp, axis: int, what: str) -> int:
  if not isinstance(x, UOp): raise UOpError(f"{what} takes a UOp, got {type(x).__name__}")
  n = len(x.shape)
  if not -n <= axis < n: raise UOpError(f"{what}: axis {axis} out of range for shape {x.shape}")
  return axis % n


def move_axis(x: UOp, src: int, dst: int) -> UOp:
  """x with axis `src` moved to position `dst` (the others keep their order)."""
  src, dst = _axis(x, src, "move_axis"), _axis(x, dst, "move_axis")
  perm = list(range(len(x.shape)))
  perm.insert(dst, perm.pop(src))
  return x if perm == sorted(perm) else x.permute(tuple(perm))


def zeros_like(x: UOp) -> UOp:
  """Zeros with x's dtype and shape (a broadcast CONST)."""
  return x.const_like(0)


def concat2(a: UOp, b: UOp, axis: int) -> UOp:
  """a and b (same shape) joined along `axis`: STACK them (a new leading axis of 2), move that axis to just before
  `axis`, and let a RESHAPE merge the pair with it: position p of the result is a[p] for p < n, b[p - n] after."""
  if a.shape != b.shape or a.dtype is not b.dtype:
    raise UOpError(f"concat2 needs equal shapes and dtypes, got {a.dtype}{a.shape} and {b.dtype}{b.shape}")
  axis = _axis(a, axis, "concat2")
  pair = move_axis(UOp(Ops.STACK, (a, b)), 0, axis)        # (..., 2, n, ...)
  return pair.reshape(a.shape[:axis] + (2 * a.shape[axis],) + a.shape[axis + 1:])


def _shrink_axis(x: UOp, axis: int, begin: int, end: int) -> UOp:
  return x.shrink(tuple((begin, end) if k == axis else (0, s) for k, s in enumerate(x.shape)))


def pad_axis(x: UOp, axis: int, before: int, after: int) -> UOp:
  """Zero-pad one axis. Each round concatenates a block of zeros as long as the axis and shrinks away what isn't
  needed, so padding wider than the axis takes several rounds, doubling the axis each time."""
  axis = _axis(x, axis, "pad_axis")
  if before < 0 or after < 0: raise UOpError(f"pad_axis: padding must be non-negative, got ({before}, {after})")
  if (before or after) and x.shape[axis] == 0: raise UOpError(f"pad_axis: can't pad an empty axis {axis} of {x.shape} by doubling")
  while after:
    n = x.shape[axis]
    step = min(after, n)
    x = _shrink_axis(concat2(x, zeros_like(x), axis), axis, 0, n + step)          # keep x and `step` zeros after it
    after -= step
  while before:
    n = x.shape[axis]
    step = min(before, n)
    x = _shrink_axis(concat2(zeros_like(x), x, axis), axis, n - step, 2 * n)      # keep `step` zeros and x
    before -= step
  return x


def pad(x: UOp, arg: tuple[tuple[int, int], ...]) -> UOp:
  """Zero-pad every axis: arg holds one (before, after) pair per axis, like numpy.pad."""
  if len(arg) != len(x.shape): raise UOpError(f"pad: {len(arg)} (before, after) pairs for shape {x.shape}")
  for axis, widths in enumerate(arg):
    if not (isinstance(widths, (tuple, list)) and len(widths) == 2 and all(type(w) is int for w in widths)):
      raise UOpError(f"pad: axis {axis} needs a (before, after) pair of ints, got {widths!r}")
    x = pad_axis(x, axis, *widths)
  return x


def anti_eye(n: int, dtype: DType) -> UOp:
  """M[i, j] = (i + j == n - 1), from a one-hot vector and the expand/reshape/shrink diagonal trick.

  u is one-hot at n-1 with length 2n-1. Expand it to n+1 rows, flatten, keep n*2n elements and read them as (n, 2n):
  element (i, j) is u[(2n*i + j) mod (2n-1)] = u[i + j], because 2n = 1 modulo 2n-1. The first n columns are M."""
  if n < 1: raise UOpError(f"anti_eye: n must be at least 1, got {n}")
  one = UOp.const(1, dtype).reshape((1,))
  if n == 1: return one.reshape((1, 1))
  row = 2 * n - 1
  u = pad_axis(one, 0, n - 1, n - 1)                                        # (2n-1,): 1 at n-1
  flat = u.reshape((1, row)).expand((n + 1, row)).reshape(((n + 1) * row,))
  sheared = flat.shrink(((0, 2 * n * n),)).reshape((n, 2 * n))
  return sheared.shrink(((0, n), (0, n)))


def flip_axis(x: UOp, axis: int) -> UOp:
  """Reverse one axis with movement ops only: y[i] = x[(n-1)(i+1) mod n] = x[n-1-i] (see the module docstring)."""
  axis = _axis(x, axis, "flip_axis")
  n = x.shape[axis]
  if n <= 1: return x
  xl = move_axis(x, axis, -1)                                                 # (..., n)
  lead = xl.shape[:-1]
  keep = tuple((0, s) for s in lead)
  w = xl.reshape(lead + (1, n)).expand(lead + (n, n)).reshape(lead + (n * n,))   # w[p] = x[p % n]
  w = w.shrink(keep + ((n - 1, n * n - 1),)).reshape(lead + (n, n - 1))          # row i starts at w[n-1 + i(n-1)]
  y = w.shrink(keep + ((0, n), (0, 1))).reshape(lead + (n,))
  return move_axis(y, -1, axis)


__all__ = ["move_axis", "zeros_like", "concat2", "pad_axis", "pad", "anti_eye", "flip_axis"]
