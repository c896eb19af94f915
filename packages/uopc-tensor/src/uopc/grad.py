"""Reverse-mode autodiff on shaped UOp graphs.

    gradient(root, wrt, seed=None) -> [d root / d w for w in wrt]

Walk the graph from the root back to the leaves (reversed toposort, no recursion), giving every node its
gradient and handing each source its share by the op's rule. The rules are one table, `GRAD_RULES`, from an
op to its local derivatives, in the same vocabulary as the forward graph: the gradient of a movement op is a
movement op (SHRINK's is a PAD, PERMUTE's the inverse permutation), EXPAND's is a REDUCE over the expanded
axes, REDUCE ADD's is an EXPAND. So a backward graph is just another shaped graph, and it fuses into kernels
exactly like a forward one. Convolution needs no rule of its own: its gradient comes from differentiating the
movement ops that build its windows.

Conventions: comparisons and integer ops have no gradient; MAX sends the gradient to the larger input and
splits it evenly on ties (so max(x, -x), i.e. |x|, has gradient 0 at 0); REDUCE MAX sends it to every position
equal to the maximum, split evenly. A CAST to the value's own dtype is the frontend's stop-gradient marker
(Tensor._stop_gradient; detach() goes further and names the value alone): nothing flows through it.
"""
from __future__ import annotations
import math, threading
from typing import Callable
from uopc.uop import UOp, Ops, UOpError, UNARY
from uopc.composite import pad

LN2 = math.log(2)


# A gradient's views are views of a gradient: each rule's RESHAPE or PERMUTE of g, where g is itself one the rule of the
# node above built, is built over g's source instead, and one that changes nothing is not built. A matmul's backward
# otherwise reshapes each REDUCE's result to the keepdim shape and straight back (the REDUCE rule after _unexpand, the
# RESHAPE rule after the REDUCE's), and transposes a transposed operand's gradient twice: 15% of a GPT step's backward
# nodes, each built, keyed and walked again by kernelize at every plain step. Only gradient() folds nodes of its own
# making: the caller's seed (which a second gradient may be taken by: Tensor.gradient(..., gradient=v)) is never skipped.
_seed = threading.local()


def _reshape(g: UOp, shape: tuple[int, ...]) -> UOp:
  """g viewed in `shape` (a RESHAPE of g's source when g is a RESHAPE; g itself when it has the shape)."""
  if g.op is Ops.RESHAPE and g is not getattr(_seed, "node", None): g = g.src[0]
  return g if g.shape == shape else g.reshape(shape)


def _permute(g: UOp, perm: tuple[int, ...]) -> UOp:
  """g permuted by `perm` (one PERMUTE of g's source when g is a PERMUTE; g itself for the identity)."""
  if g.op is Ops.PERMUTE and g is not getattr(_seed, "node", None): g, perm = g.src[0], tuple(g.arg[p] for p in perm)
  return g if perm == tuple(range(len(perm))) else g.permute(perm)


def _unexpand(g: UOp, shape: tuple[int, ...]) -> UOp:
  """Sum g over the axes where `shape` has 1 and g does not (EXPAND's adjoint): move them last, REDUCE, reshape."""
  axes = [k for k, (a, b) in enumerate(zip(shape, g.shape)) if a != b]
  if not axes: return g
  keep = [k for k in range(len(shape)) if k not in axes]
  # (no PERMUTE where the summed axes are last already: a softmax's row sums, a bias's batch axes)
  moved = g if axes[0] == len(keep) else _permute(g, tuple(keep + axes))
  return moved.reduce(Ops.ADD, len(axes)).reshape(shape)


def _unreduce(u: UOp, g: UOp) -> UOp:
  """REDUCE ADD's adjoint: g (the sums) in the keepdim shape, expanded back over the summed axes."""
  x = u.src[0]
  full = _reshape(g, g.shape + (1,) * u.arg[1])
  return full if full.shape == x.shape else full.expand(x.shape)


def _reduce_max_grad(u: UOp, g: UOp) -> tuple:
  x = u.src[0]
  n = u.arg[1]
  full = lambda t: t.reshape(t.shape + (1,) * n).expand(x.shape)
  hit = x.eq(full(u)).where(x.const_like(1.0), x.const_like(0.0))
  count = hit.reduce(Ops.ADD, n)
  return (full(g * count.recip()) * hit,)


def _index_grad(u: UOp, g: UOp) -> tuple:
  """INDEX pops leading axes; its adjoint puts g back at the indexed position among zeros (a PAD when the index is a
  constant, a one-hot mask otherwise). The indices themselves get none."""
  x, idx = u.src[0], u.src[1:]
  k = len(idx)
  out = g.reshape((1,) * k + g.shape)
  if all(i.op is Ops.CONST for i in idx):
    full = pad(out, tuple((i.arg, n - 1 - i.arg) for i, n in zip(idx, x.shape[:k])) + ((0, 0),) * len(g.shape))
  else:
    from uopc.evaluate import literal
    mask = None
    for a, (i, n) in enumerate(zip(idx, x.shape[:k])):
      ar = literal(list(range(n)), (n,), i.dtype).reshape((1,) * a + (n,) + (1,) * (len(x.shape) - a - 1)).expand(x.shape)
      m = ar.eq(i.reshape((1,) * len(x.shape)).expand(x.shape))
      mask = m if mask is None else mask * m
    full = mask.where(out.expand(x.shape), x.const_like(0.0))
  return (full,) + (None,) * k


def _gather_grad(u: UOp, g: UOp, positions: Callable[[int], UOp] | None) -> tuple:
  """GATHER's adjoint: entry j of x (in each batch entry) gets the sum of the entries of g whose index is j (a
  scatter-add), built as a one-hot of the indices against the positions (0..n-1: `positions(n)`, a stored arange, or a
  literal one), summed over the indices' own axes. The indices themselves get none."""
  x, i = u.src
  b = u.arg
  n, batch, rest, own = x.shape[b], x.shape[:b], x.shape[b + 1:], i.shape[b:]
  if positions is not None: pos = positions(n)
  else:
    from uopc.evaluate import literal
    pos = literal(list(range(n)), (n,), i.dtype)
  k, ones = len(own), (1,) * len(rest)
  full = batch + (n,) + rest + own                  # (*batch, entry, *rest, *index axes): the index axes last, summed
  hit = pos.reshape((1,) * b + (n,) + ones + (1,) * k).expand(full).eq(i.reshape(batch + (1,) + ones + own).expand(full))
  gp = g.permute(tuple(range(b)) + tuple(range(b + k, b + k + len(rest))) + tuple(range(b, b + k)))   # (*batch, *rest, *own)
  rows = gp.reshape(batch + (1,) + gp.shape[b:]).expand(full)
  picked = hit.where(rows, rows.const_like(0.0))
  # one index per batch entry (a loss's target in each row) sums nothing: a reshape, which fuses where a REDUCE is a kernel
  return (picked.reduce(Ops.ADD, k) if math.prod(own) != 1 else picked.reshape(x.shape), None)


def _unshrink(u: UOp, g: UOp) -> UOp:
  """SHRINK's adjoint: g back in place among zeros. An empty slice took nothing, so its gradient is all zeros (and the
  PAD composite can't grow an empty axis)."""
  x = u.src[0]
  if 0 in g.shape: return x.const_like(0.0)
  return pad(g, tuple((b, n - e) for (b, e), n in zip(u.arg, x.shape)))


def _cos(x: UOp) -> UOp:
  """cos x = 1 - 2 sin(x/2)^2: halving is exact, where x + pi/2 rounds away the low bits of a large x (5% off at 1e6)."""
  s = UOp(Ops.SIN, (x * 0.5,))
  return x.const_like(1.0) - s * s * 2.0


def _stop(u: UOp, g: UOp) -> tuple:
  x = u.src[0]
  if x.dtype is u.dtype: return (None,)       # a same-dtype CAST: detach
  return (g.cast(x.dtype),) if x.dtype.is_float else (None,)


# one rule per op: (node, gradient of the node) -> the gradient of each source (None: no gradient)
GRAD_RULES: dict[Ops, Callable[[UOp, UOp], tuple]] = {
  Ops.ADD: lambda u, g: (g, g),
  Ops.MUL: lambda u, g: (UOp(Ops.MUL, (g, u.src[1])), UOp(Ops.MUL, (g, u.src[0]))),   # (gradient() has its own inline)
  Ops.MULACC: lambda u, g: (g * u.src[1], g * u.src[0], g),
  Ops.RECIP: lambda u, g: (-(g * u * u),),
  Ops.EXP2: lambda u, g: (g * u * LN2,),
  Ops.LOG2: lambda u, g: (g * u.src[0].recip() * (1 / LN2),),
  Ops.SQRT: lambda u, g: (g * u.recip() * 0.5,),
  Ops.SIN: lambda u, g: (g * _cos(u.src[0]),),
  Ops.MAX: lambda u, g: (_max_share(u.src[0], u.src[1], g), _max_share(u.src[1], u.src[0], g)),
  Ops.WHERE: lambda u, g: (None, u.src[0].where(g, g.const_like(0.0)), u.src[0].where(g.const_like(0.0), g)),
  Ops.CAST: _stop,
  Ops.CMPLT: lambda u, g: (None, None), Ops.CMPNE: lambda u, g: (None, None),
  Ops.FLOORDIV: lambda u, g: (None, None), Ops.FLOORMOD: lambda u, g: (None, None),
  Ops.RESHAPE: lambda u, g: (_reshape(g, u.src[0].shape),),
  Ops.EXPAND: lambda u, g: (_unexpand(g, u.src[0].shape),),
  Ops.PERMUTE: lambda u, g: (_permute(g, tuple(sorted(range(len(u.arg)), key=lambda k: u.arg[k]))),),
  Ops.SHRINK: lambda u, g: (_unshrink(u, g),),
  Ops.STACK: lambda u, g: tuple(g.index(k) for k in range(len(u.src))),
  Ops.REDUCE: lambda u, g: (_unreduce(u, g),) if u.arg[0] is Ops.ADD else _reduce_max_grad(u, g),
  Ops.INDEX: _index_grad,
  Ops.GATHER: lambda u, g: _gather_grad(u, g, None),   # (gradient() passes its caller's stored positions instead)
  # a stored value's gradient is stored too: a chain of stages (a sorting network) would otherwise be one backward kernel
  # whose every element recomputes every path back through the chain, 2^stages of them. Not that of a function of one
  # value (softmax's exp(x - max)): its rule reads the gradient once, so nothing is computed twice, and its kernel
  # computes it (attention's score gradient at N = 512: one pass over 512 x 512 where there were two, 51 -> 33 us)
  Ops.STAGE: lambda u, g: (g if u.src[0].op in UNARY else UOp(Ops.STAGE, (g,)),),
}


def _max_share(a: UOp, b: UOp, g: UOp) -> UOp:
  """a's share of MAX(a, b)'s gradient: all of it where a > b, half where they tie, none elsewhere."""
  zero = g.const_like(0.0)
  return (b < a).where(g, a.eq(b).where(g * 0.5, zero))


def gradient(root: UOp, wrt: list[UOp], seed: UOp | None = None, order: list[UOp] | None = None,
             positions: Callable[[int], UOp] | None = None) -> list[UOp]:
  """d root / d w for each w in wrt, as UOps of w's shape (zeros where root does not depend on w). root must be a
  float scalar unless `seed`, the gradient of root itself, is given. `order`: root.toposort(), when the caller has it.
  `positions(n)`: an i32 (n,) UOp holding 0..n-1 (a stored arange), for a GATHER's adjoint; without it a literal one."""
  if seed is None:
    if root.shape != () or not root.dtype.is_float:
      raise UOpError(f"gradient of a {root.dtype}{root.shape} value needs a seed (only a float scalar gets 1.0 by default)")
    seed = root.const_like(1.0)
  if seed.shape != root.shape or seed.dtype is not root.dtype:
    raise UOpError(f"gradient: seed {seed.dtype}{seed.shape} doesn't match the root {root.dtype}{root.shape}")
  nodes = root.toposort() if order is None else order
  targets = set(wrt)
  # only nodes with a path down to some w need a gradient
  needed: set[UOp] = set()
  for u in nodes:
    if u in targets or not needed.isdisjoint(u.src): needed.add(u)
  grads: dict[UOp, UOp] = {root: seed}
  ADD, MUL = Ops.ADD, Ops.MUL
  def add(s: UOp, sg: UOp) -> None:
    if s in needed and s.dtype.is_float: grads[s] = UOp(ADD, (grads[s], sg)) if s in grads else sg
  outer, _seed.node = getattr(_seed, "node", None), seed
  try:
    for u in reversed(nodes):
      g = grads.get(u)
      if g is None or not u.src: continue
      if u.op is MUL:   # the most common op, its rule inline: only the needed side's product is built
        a, b = u.src
        if a in needed: add(a, UOp(MUL, (g, b)))
        if b in needed: add(b, UOp(MUL, (g, a)))
        continue
      rule = GRAD_RULES.get(u.op)
      if rule is None:
        if any(s in needed for s in u.src): raise UOpError(f"gradient: no rule for {u.op!r}")
        continue
      for s, sg in zip(u.src, _gather_grad(u, g, positions) if u.op is Ops.GATHER else rule(u, g)):
        if sg is not None: add(s, sg)
  finally: _seed.node = outer
  return [grads[w] if w in grads else w.const_like(0.0) for w in wrt]


__all__ = ["gradient", "GRAD_RULES"]
