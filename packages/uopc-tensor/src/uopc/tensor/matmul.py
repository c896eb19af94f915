"""uopc.tensor.matmul: matrix products (matmul, dot, linear, @) and einsum.

A matrix product is a broadcast multiply and a sum over the shared axis: (n, 1, k) * (1, m, k) summed over k, a
reduction like any other to the kernelizer (on CUDA, uopc.gpulower tiles it, on tensor cores for f16). f16 products
are summed in f32 and rounded once, as every BLAS does. einsum aligns its operands on one order of letters, multiplies them and sums the letters the
output doesn't keep.
"""
from __future__ import annotations
from uopc.dtype import dtypes
from uopc.uop import UOp, Ops, MOVEMENT, prod
from uopc.tensor.errors import TensorError, TensorIndexError
from uopc.tensor.args import broadcast_shape, promote
from uopc.tensor.core import TensorCore, broadcast_uop
from uopc.tensor.movement import reshape_uop


def _row_factor(u: UOp) -> tuple[UOp, UOp] | None:
  """u = x * f, a float, with f the same along u's last axis: a broadcast along that axis alone, or the reciprocal of
  one (softmax's e * 1 / sum(e)), of a computed value (not a constant: x * 2.0 stays as it is). (x, f before the
  broadcast, of shape u.shape[:-1] + (1,)); None for anything else."""
  if u.op is not Ops.MUL or not u.dtype.is_float or len(u.shape) < 2 or u.shape[-1] == 1: return None
  row = u.shape[:-1] + (1,)
  for x, f in (u.src, u.src[::-1]):
    g = f.src[0] if f.op is Ops.RECIP else f
    if g.op is not Ops.EXPAND or (y := g.src[0]).shape != row: continue
    base = y
    while base.op in MOVEMENT: base = base.src[0]
    if base.op is not Ops.CONST: return x, (UOp(Ops.RECIP, (y,)) if f.op is Ops.RECIP else y)
  return None


class MatmulMixin:
  """self @ w with NumPy's rules, linear layers' x @ W.T + b, and Einstein summation."""
  __slots__ = ()

  def __matmul__(self, x): return self.matmul(x)
  def __rmatmul__(self, x): return type(self)(x, device=self.device).matmul(self)

  def dot(self, w: TensorCore) -> TensorCore: return self.matmul(w)

  def matmul(self, w: TensorCore) -> TensorCore:
    """self @ w with NumPy's rules: batched over leading axes (broadcast), a 1-D operand a vector."""
    w = w if isinstance(w, TensorCore) else type(self)(w, device=self.device)
    if (fast := self._same_batch_matmul(w)) is not None: return fast
    if self.ndim == 0 or w.ndim == 0: raise TensorError(f"matmul: {self.shape} @ {w.shape}: both operands need at least one dimension")
    x, y = (self.unsqueeze(0) if self.ndim == 1 else self), (w.unsqueeze(-1) if w.ndim == 1 else w)
    if x.shape[-1] != y.shape[-2]:
      raise TensorError(f"matmul: {self.shape} @ {w.shape}: inner dimensions {x.shape[-1]} and {y.shape[-2]} differ")
    try: batch = broadcast_shape(x.shape[:-2], y.shape[:-2])
    except TensorError:
      raise TensorError(f"matmul: {self.shape} @ {w.shape}: batch dimensions {x.shape[:-2]} and {y.shape[:-2]} don't broadcast") from None
    d = promote(x.dtype, y.dtype)
    acc = dtypes.f32 if d is dtypes.f16 else d   # f16 products are summed in f32, as every BLAS does (f16 sums drift)
    n, k, m = x.shape[-2], x.shape[-1], y.shape[-1]
    a = x.cast(d).cast(acc).reshape(x.shape[:-2] + (n, 1, k))._broadcast_to(batch + (n, m, k))
    b = y.cast(d).cast(acc).transpose(-1, -2).reshape(y.shape[:-2] + (1, m, k))._broadcast_to(batch + (n, m, k))
    out = (a * b).sum(-1).cast(d)
    if self.ndim == 1: out = out.squeeze(-2)
    if w.ndim == 1: out = out.squeeze(-1)
    return out

  def _same_batch_matmul(self, w: TensorCore) -> TensorCore | None:
    """The common case, straight to UOps: two operands of 2 or more axes, one dtype (not f16, which is summed in f32),
    the same batch axes, the inner sizes equal. The graph is the one matmul builds below (a test holds them to it), for
    a quarter of the Python (a GEMM of 256: 96 -> 72 us a call, all of it overhead beside the 0.1 ms kernel). None
    otherwise."""
    xu, yu = self.uop, w.uop
    xs, ys = xu.shape, yu.shape
    nb = len(xs) - 2
    if nb < 0 or len(ys) != nb + 2 or xu.dtype is not yu.dtype or xu.dtype is dtypes.f16 or xs[:nb] != ys[:nb] or xs[-1] != ys[-2]:
      return None
    # (x * f) @ w, f one number a row (softmax's 1 / sum): (x @ w) * f, the factor out of the sum, applied to the
    # output's rows (n x m products where it was n x k, attention's value count against its keys), and the product
    # x * f never made: attention's probabilities are not stored, its backward reads exp(s - max) and the sums. Every
    # such factor is peeled here, in a loop (x * f * f * ... is a chain as long as the user made it)
    factors = []
    while (factored := _row_factor(xu)) is not None:
      xu, f = factored
      factors.append(f)
    if factors:
      out = self._new(xu)._same_batch_matmul(w)    # (its operand has no row factor left: one call deep)
      u = out.uop
      for f in reversed(factors): u = UOp(Ops.MUL, (u, f if ys[-1] == 1 else f.expand(u.shape)))
      return out._new(u, w)
    n, k, m = xs[-2], xs[-1], ys[-1]
    full = xs[:nb] + (n, m, k)
    a = reshape_uop(self, xs[:nb] + (n, 1, k))   # (as Tensor.reshape folds a realized tensor's view)
    if m != 1: a = a.expand(full)
    b = yu.permute(tuple(range(nb)) + (nb + 1, nb)).reshape(xs[:nb] + (1, m, k))
    if n != 1: b = b.expand(full)
    return self._new((a * b).reduce(Ops.ADD, 1), w)

  def linear(self, weight: TensorCore, bias: TensorCore | None = None) -> TensorCore:
    """self @ weight.T + bias, with weight (out_features, in_features) as in torch."""
    weight = self._tensor_arg(weight, "linear: weight")
    if (fast := self._linear_uops(weight, bias)) is not None: return fast
    if self.ndim > 2 and weight.ndim == 2 and self.shape[-1] == weight.shape[-1] and 0 not in self.shape:
      # the leading axes as one: (B, T, C) @ W.T is one GEMM of B*T rows, and its weight's gradient one reduction over
      # them (a reduction over B and T, two axes, was no GEMM to pack an operand for: 95 -> 210 GFLOP/s packed)
      out = self.reshape(-1, self.shape[-1]).matmul(weight.T).reshape(*self.shape[:-1], weight.shape[0])
    else: out = self.matmul(weight.T)
    return out + bias if bias is not None else out

  def _linear_uops(self, weight: TensorCore, bias) -> TensorCore | None:
    """linear's common case, a layer on (..., in_features) with a weight and a bias of its dtype (not f16) on its
    device, straight to UOps: the graph the Tensor ops above build, node for node (a test holds them to it), for a
    third of their Python (a GPT's nine layers were 0.4 ms of each plain step's 2.4 ms forward). None otherwise."""
    xu, wu = self.uop, weight.uop
    if _row_factor(xu) is not None: return None   # matmul's road takes the row factor out of the sum (see _same_batch_matmul)
    xs, ws = xu.shape, wu.shape
    if len(xs) < 2 or len(ws) != 2 or xs[-1] != ws[1] or 0 in xs or 0 in ws or xu.dtype is not wu.dtype or xu.dtype is dtypes.f16 \
       or weight.device != self.device: return None
    if bias is not None and (not isinstance(bias, TensorCore) or bias.uop.dtype is not xu.dtype or bias.uop.shape != ws[:1]
                             or bias.device != self.device): return None
    k, m = ws[1], ws[0]
    n = prod(xs[:-1])
    # self.reshape(-1, k) (of more than 2 axes), then matmul's (n, 1, k) view of it: reshape_uop folds a reshape of a
    # reshape unless the tensor requires a gradient (the flattened tensor requires one exactly when self does)
    flat = xu
    if len(xs) > 2:
      u = xu.src[0] if xu.op is Ops.RESHAPE and not self.requires_grad else xu
      flat = u if u.shape == (n, k) else u.reshape((n, k))
    u = flat.src[0] if flat.op is Ops.RESHAPE and not self.requires_grad else flat
    a = u if u.shape == (n, 1, k) else u.reshape((n, 1, k))
    if m != 1: a = a.expand((n, m, k))
    b = wu.permute((1, 0)).permute((1, 0)).reshape((1, m, k))   # weight.T, and matmul's transpose of its right operand
    if n != 1: b = b.expand((n, m, k))
    out = UOp(Ops.MUL, (a, b)).reduce(Ops.ADD, 1)
    if len(xs) > 2: out = out.reshape(xs[:-1] + (m,))
    if bias is None: return self._new(out, weight)
    return self._new(UOp(Ops.ADD, (out, broadcast_uop(bias.uop, out.shape))), weight, bias)

  @staticmethod
  def einsum(formula: str, *operands) -> TensorCore:
    """Einstein summation, as torch.einsum: "ij,jk->ik", an implicit output (the letters used once, sorted; the ellipsis
    first), "..." for broadcast leading axes, and a repeated letter in one operand for its diagonal. The operands are
    aligned on one order of letters, multiplied, and summed over the letters the output doesn't keep."""
    if len(operands) == 1 and isinstance(operands[0], (list, tuple)): operands = tuple(operands[0])
    if not operands or not all(isinstance(t, TensorCore) for t in operands): raise TensorError("einsum takes a formula and Tensors")
    lhs, arrow, rhs = formula.replace(" ", "").partition("->")
    specs = lhs.split(",")
    if len(specs) != len(operands): raise TensorError(f"einsum: {formula!r} names {len(specs)} operands, got {len(operands)}")
    ell = [t.ndim - len(sp.replace("...", "")) if "..." in sp else 0 for sp, t in zip(specs, operands)]
    n_ell = max(ell)
    ell_letters = [chr(0x3B1 + k) for k in range(n_ell)]   # greek letters stand for the ellipsis axes, right-aligned
    labels = []
    for sp, t, k in zip(specs, operands, ell):
      if sp.count("...") > 1: raise TensorIndexError(f"einsum: {sp!r} has more than one ellipsis")
      if any(not (c.isascii() and c.isalpha()) for c in sp.replace("...", "")): raise TensorError(f"einsum: {sp!r}: subscripts are letters a-z, A-Z")
      if k < 0 or ("..." not in sp and len(sp) != t.ndim):
        raise TensorError(f"einsum: {sp!r} names {len(sp.replace('...', ''))} axes of an operand of shape {t.shape}")
      head, _, tail = sp.partition("...")
      labels.append(list(head) + ell_letters[n_ell - k:] + list(tail))
    counts = {c: sum(lab.count(c) for lab in labels) for lab in labels for c in lab}
    if arrow: out = [c for c in rhs.replace("...", "".join(ell_letters))]
    else: out = ell_letters + sorted(c for c, n in counts.items() if n == 1 and c not in ell_letters)
    if len(set(out)) != len(out) or any(c not in counts for c in out): raise TensorError(f"einsum: bad output subscripts in {formula!r}")
    ts = []
    for lab, t in zip(labels, operands):
      while len(set(lab)) != len(lab):   # a repeated letter: its diagonal, as a new last axis
        c = next(c for c in lab if lab.count(c) > 1)
        a, b = lab.index(c), lab.index(c, lab.index(c) + 1)
        if t.shape[a] != t.shape[b]: raise TensorError(f"einsum: the diagonal of {c!r} needs equal sizes, got {t.shape[a]} and {t.shape[b]}")
        t, lab = t.diagonal(0, a, b), [x for k, x in enumerate(lab) if k not in (a, b)] + [c]
      ts.append((lab, t))
    order = out + sorted({c for lab, _ in ts for c in lab} - set(out))
    sizes: dict[str, int] = {}
    for lab, t in ts:   # a size of 1 broadcasts, as in torch
      for c, n in zip(lab, t.shape):
        if n != 1 and sizes.setdefault(c, n) != n: raise TensorError(f"einsum: subscript {c!r} has sizes {sizes[c]} and {n} in {formula!r}")
    full = tuple(sizes.get(c, 1) for c in order)
    # f16 operands are multiplied and summed in f32 and rounded once, as matmul's
    f16 = promote(*(t.dtype for _, t in ts)) is dtypes.f16
    if f16: ts = [(lab, t.float()) for lab, t in ts]
    prod_t = None
    for lab, t in ts:
      t = t.permute([lab.index(c) for c in order if c in lab]).reshape(tuple(t.shape[lab.index(c)] if c in lab else 1 for c in order))
      t = t._broadcast_to(full)
      prod_t = t if prod_t is None else prod_t * t
    out_t = prod_t.sum(tuple(range(len(out), len(order)))) if len(order) > len(out) else prod_t
    return out_t.half() if f16 else out_t
