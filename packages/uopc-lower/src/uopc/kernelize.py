"""Kernelize: a shaped graph with one or more outputs -> a schedule of kernels over temporary buffers.

rangeify can lower any shaped graph as one loop nest, but one loop nest is not always a good program. A
reduction evaluated inside a loop it doesn't depend on is recomputed on every iteration of that loop:
fused attention computes each row of QK^T once per output column (the book's 1787 ms against 7 ms). The
cure is to *materialize*: compute the value once into a temporary BUFFER, in a kernel of its own, and let its
consumers LOAD it. `STAGE(x)` is the IR's mark for "materialize x"; kernelize turns every STAGE, and every
node its rules decide to materialize, into a temporary BUFFER written by its own kernel.

The rules (tinygrad's, which never recompute a reduction per output element):
  * a REDUCE whose value is broadcast (an EXPAND that grows an axis, reached through elementwise and movement
    ops) is materialized: its consumer would otherwise revisit it from inside loops it doesn't use;
  * a node shared by several kernels is materialized when recomputing it costs more than loading it: when its
    kernel-local graph holds a REDUCE, or reads more than MAX_SHARED_READS buffers;
  * everything else (elementwise chains, movement ops, cheap shared subexpressions) fuses into its consumer.

The rebuild is bottom-up with UOp.wrap, so a materialized node whose sources were themselves materialized is
rebuilt over their buffers first (substitute would wrap the original, unrewritten node). Kernels come out in
creation order, which is a topological order: a kernel is made only after the kernels of its sources.

Each kernel also gets a canonical form: its BUFFERs renumbered 0..n-1 in toposort order and the output last.
Kernels with the same structure up to buffer numbering have the same canonical (hash-consed) UOps, so a
backend's kernel cache keyed on them compiles each structure once.
"""
from __future__ import annotations
from dataclasses import dataclass
from typing import Callable
from uopc.uop import UOp, Ops, ParamArg, ALU, MOVEMENT, buf, prod, users_of
from uopc.dtype import DType

MAX_SHARED_READS = 4

# ops that stay inside a kernel: a value made of these is recomputed wherever it is used
_LOCAL = ALU | MOVEMENT | {Ops.STACK, Ops.INDEX, Ops.CONST}


class KernelizeError(Exception):
  """Outputs kernelize can't schedule (not a shaped graph, an output that isn't a BUFFER of the right size)."""


@dataclass(frozen=True)
class Kernel:
  """One kernel: the shaped value `root`, computed over the BUFFERs in `inputs`, stored row-major into `out`.
  `canonical_root`/`canonical_out` are the same kernel with buffers renumbered (inputs 0..n-1, output n)."""
  root: UOp
  out: UOp
  inputs: tuple[UOp, ...]
  canonical_root: UOp
  canonical_out: UOp

  @property
  def buffers(self) -> tuple[UOp, ...]:
    """The kernel's buffers in canonical slot order: inputs, then the output."""
    return self.inputs + (self.out,)


def _expands(u: UOp) -> bool:
  return u.op is Ops.EXPAND and any(a != b for a, b in zip(u.src[0].shape, u.shape))


def _regions(roots: list[UOp], cut: set[UOp]) -> list[set[UOp]]:
  """For each kernel root, the nodes computed inside its kernel: reachable without crossing a cut or a BUFFER."""
  out = []
  for r in roots:
    seen, stack = set(), [r]
    while stack:
      u = stack.pop()
      if u in seen: continue
      seen.add(u)
      stack.extend(s for s in u.src if s not in cut and s.op is not Ops.BUFFER)
    out.append(seen)
  return out


def _stored_form(u: UOp, live: set[UOp]) -> UOp | None:
  """What to store when u must be materialized: never a view. Walk down from u through movement ops, STAGE marks and
  ops with a single non-constant source (a pad's STACK with zeros, a mask's WHERE, x*2) and keep the node with the
  fewest elements: an EXPAND of a (B, T, C) activation to (B, T, C, 4C) stores the activation, and its consumers read
  it through the view. Between nodes of equal size only movement ops are passed (store x, not flip(x); but exp(x), not
  x, or every consumer would recompute the exp). None when nothing needs storing: a BUFFER is read as it is, and a
  value made of constants alone is recomputed."""
  best, cur, moves_only = u, u, True
  while True:
    if cur.op in MOVEMENT or cur.op is Ops.STAGE: nxt = cur.src[0]
    elif cur.op in _LOCAL and cur.src:
      inputs = [s for s in cur.src if s in live]
      if len(inputs) != 1: break
      nxt, moves_only = inputs[0], False
    else: break
    cur = nxt
    if prod(cur.shape) < prod(best.shape) or (moves_only and prod(cur.shape) == prod(best.shape)): best, moves_only = cur, True
  return best if best in live and best.op is not Ops.BUFFER else None


def _staged(roots: list[UOp]) -> set[UOp]:
  """The nodes to materialize, by the rules of the module docstring, each in its stored form (never a view)."""
  nodes = UOp(Ops.SINK, tuple(roots)).toposort()
  live: set[UOp] = set()     # nodes that read memory or reduce; the rest are constants, recomputed wherever used
  for u in nodes:
    if u.op in (Ops.BUFFER, Ops.REDUCE) or any(s in live for s in u.src): live.add(u)
  def stored(us) -> set[UOp]: return {f for u in us if (f := _stored_form(u, live)) is not None}
  staged = stored(u.src[0] for u in nodes if u.op is Ops.STAGE)
  # a REDUCE broadcast by an EXPAND: carry each value's kernel-local REDUCEs up the graph until an EXPAND meets them
  carried: dict[UOp, frozenset] = {}
  empty: frozenset = frozenset()
  for u in nodes:
    if u.op is Ops.REDUCE: carried[u] = frozenset((u,))
    elif u.op in _LOCAL:
      c = empty
      for s in u.src:
        if carried[s]: c = c | carried[s]
      carried[u] = c
      if _expands(u): staged |= c
    else: carried[u] = empty
  # shared values: a node used by several kernels is materialized if recomputing it is costly
  users = users_of(nodes)
  root_set = set(roots)
  while True:
    owners: dict[UOp, set[int]] = {}
    for k, reg in enumerate(_regions(list(roots) + list(staged), staged)):
      for u in reg: owners.setdefault(u, set()).add(k)
    costly = []
    for u, ks in owners.items():
      if len(ks) < 2 or u in staged or u.op in (Ops.CONST, Ops.BUFFER, Ops.SINK): continue
      # sharing starts at the topmost shared node: one that is a kernel root, or has a user in fewer kernels
      if u not in root_set and all(owners.get(v, set()) >= ks for v in users.get(u, ()) if v in owners): continue
      local = _regions([u], staged)[0]
      if any(x.op is Ops.REDUCE for x in local) or len(_reads(local)) > MAX_SHARED_READS: costly.append(u)
    new = stored(costly) - staged
    if not new: break
    staged |= new
  # an output that would be materialized is simply computed into its own buffer, unless something else reads it
  return {u for u in staged if u not in root_set or users.get(u)}


def _reads(region: set[UOp]) -> set[UOp]:
  return {s for u in region for s in u.src if s.op is Ops.BUFFER} | {u for u in region if u.op is Ops.BUFFER}


def canonicalize(root: UOp, out: UOp) -> tuple[UOp, UOp, tuple[UOp, ...]]:
  """(root, out) with BUFFERs renumbered: inputs 0..n-1 in toposort order, the output n; and the inputs in that order."""
  inputs = tuple(u for u in root.toposort() if u.op is Ops.BUFFER)
  mapping = {b: UOp(Ops.BUFFER, (), ParamArg(i, b.dtype, b.shape)) for i, b in enumerate(inputs)}
  canon_out = UOp(Ops.BUFFER, (), ParamArg(len(inputs), out.dtype, out.shape))
  return root.substitute(mapping) if mapping else root, canon_out, inputs


def kernelize(outputs: list[tuple[UOp, UOp]], new_buffer: Callable[[int, DType], UOp] | None = None) -> list[Kernel]:
  """The kernels that compute each output (a shaped root and the BUFFER to store it in), in an order that runs
  every kernel after the kernels it reads from. `new_buffer(n, dtype)` makes a temporary BUFFER (by default a
  fresh slot above every slot in the graph)."""
  roots = []
  for root, out in outputs:
    if not isinstance(root, UOp) or not isinstance(out, UOp): raise KernelizeError("kernelize takes (shaped UOp, output BUFFER) pairs")
    if out.op is not Ops.BUFFER: raise KernelizeError(f"kernelize: an output must be a BUFFER, got {out.op!r}")
    if out.dtype is not root.dtype or out.shape[0] < prod(root.shape):
      raise KernelizeError(f"kernelize: output BUFFER {out.dtype}[{out.shape[0]}] can't hold a {root.dtype}{root.shape} value")
    roots.append(root)
  if new_buffer is None:
    top = max((u.arg.slot for u in UOp(Ops.SINK, tuple(r for r, _ in outputs) + tuple(o for _, o in outputs)).toposort()
               if u.op is Ops.BUFFER), default=-1)
    counter = iter(range(top + 1, 1 << 30))
    new_buffer = lambda n, d: buf(next(counter), n, d)
  staged = _staged(roots)
  kernels: list[Kernel] = []
  # a materialized value that is also an output is computed straight into the output's buffer (no copy kernel after)
  into = {root: out for root, out in reversed(outputs) if out.shape[0] == max(1, prod(root.shape))}

  def materialize(u: UOp) -> UOp:
    if u.op is Ops.STAGE: return u.src[0]           # a STAGE's value was materialized in its stored form below it
    if prod(u.shape) == 0: return u.const_like(0)   # nothing to store: every view of it is empty too
    out = into.pop(u, None) or new_buffer(max(1, prod(u.shape)), u.dtype)
    kernels.append(make_kernel(u, out))
    return out.reshape(u.shape) if u.shape != out.shape else out

  stages = {u for u in UOp(Ops.SINK, tuple(roots)).toposort() if u.op is Ops.STAGE}
  new_roots = UOp.wrap(roots, staged | stages, materialize)
  for root, (_, out) in zip(new_roots, outputs):
    if root is not (out.reshape(root.shape) if root.shape != out.shape else out): kernels.append(make_kernel(root, out))
  return kernels


def make_kernel(root: UOp, out: UOp, canonical: bool = True) -> Kernel:
  """The Kernel that stores shaped `root` row-major into BUFFER `out`, with its canonical form. With canonical=False the
  buffers keep their slots (inputs in slot order): a hand-written program compiles with the names its author gave."""
  if not isinstance(root, UOp) or not isinstance(out, UOp) or out.op is not Ops.BUFFER or out.dtype is not root.dtype \
     or out.shape[0] < prod(root.shape):
    raise KernelizeError(f"a kernel stores a shaped UOp into a BUFFER of its dtype and size, got {root!r:.80} into {out!r:.80}")
  if not canonical:
    inputs = tuple(sorted((u for u in root.toposort() if u.op is Ops.BUFFER), key=lambda b: b.arg.slot))
    if len({b.arg.slot for b in inputs + (out,)}) != len(inputs) + 1: raise KernelizeError("two BUFFERs of this kernel share a slot")
    return Kernel(root, out, inputs, root, out)
  canon_root, canon_out, inputs = canonicalize(root, out)
  return Kernel(root, out, inputs, canon_root, canon_out)


__all__ = ["kernelize", "make_kernel", "Kernel", "KernelizeError", "canonicalize", "MAX_SHARED_READS"]
