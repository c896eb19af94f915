"""The linearizer: a lowered SINK -> the ordered list of its nodes, with loops opened and closed in place.

The loop IR has no statement order. RANGE is a loop counter, END(x, *ranges) closes ranges after x, and
AFTER(mem, *deps) is memory once deps have happened. `linearize` decides where and in which order each
node runs; the renderer then prints the list top to bottom (RANGE opens a `for`, END closes it).

Placement. A node must run inside every loop whose counter it depends on, and nowhere deeper. Its loops are
its *range set*: the union of its sources' sets, plus itself for a RANGE, minus the closed ranges for an END
(what an END feeds runs after the loop). Loops nest in RANGE index order, and a loop sits inside another when
some node needs both, so each node's place is the innermost loop of its set. Loop-invariant loads and index
arithmetic therefore land outside the loops they don't use (hoisted), and an accumulator declared by
ALLOC lives at the deepest loop that contains all of its uses (a fresh one per iteration of the loops its
output index uses).

Order. Inside one loop body the items are nodes placed there and child loops (each a block from RANGE to END).
A dependency between two nodes in different items of the same body orders those items; a node that reads
what a loop computed depends on that loop's END, so a loop that feeds a sibling comes first (the max loop
before the loop that subtracts the max). Items are emitted in dependency order; among ready items, the plain nodes a
loop of the body needs come first (code sorts before the loop it is invariant to), then loops, then the nodes no loop
needs (a value used only after a loop is computed there, not held in registers across it); among those, a node that
feeds a chain of multiply-adds (a register tile's accumulators, each updated by the unrolled steps of a window) goes
by the chain's step it first feeds, so the accumulators' updates take turns step by step (see _chain_steps); ties go
to the node's position in the graph's toposort, so the same graph always gives the same order.
"""
from __future__ import annotations
import heapq
from uopc.uop import UOp, Ops, users_of
from uopc.rangeify import merge_ends


class LinearizeError(Exception):
  """A SINK whose loops can't be laid out (a RANGE never closed, loops that can't nest)."""


def _normalize_ends(sink: UOp) -> UOp:
  """One END per RANGE: END(x, r0, r1) becomes END(END(x, r1), r0) (inner loop closed first), then merge_ends makes
  the several ENDs of one range a single END over a SINK of what they close."""
  ends = [u for u in sink.toposort() if u.op is Ops.END and len(u.src) > 2]
  if ends:
    def split(e: UOp) -> UOp:
      x = e.src[0]
      for r in sorted(e.src[1:], key=lambda r: r.arg, reverse=True): x = UOp(Ops.END, (x, r))
      return x
    [sink] = UOp.wrap([sink], set(ends), split)
  return merge_ends(sink)


def range_sets(nodes: list[UOp], counts) -> dict[UOp, frozenset]:
  """For each node of `nodes` (in toposort order), the ranges it runs inside: those of its sources, its own if it is a
  range that `counts(u)` keeps, less the ranges an END closes. Frozensets, shared between nodes with the same loops."""
  rset: dict[UOp, frozenset] = {}
  empty: frozenset = frozenset()
  for u in nodes:
    s = empty
    for x in u.src:
      if rset[x]: s = s | rset[x] if s else rset[x]
    if u.op is Ops.RANGE and counts(u): s = s | {u}
    elif u.op is Ops.END: s = s - set(u.src[1:])
    rset[u] = s
  return rset


def linearize(sink: UOp) -> list[UOp]:
  """Every node of the lowered program in execution order. A RANGE opens its loop and the END of that range
  closes it; every other node runs inside the loops opened before it and not yet closed."""
  if not isinstance(sink, UOp) or sink.op is not Ops.SINK:
    raise LinearizeError(f"linearize takes a SINK, got {repr(sink.op) if isinstance(sink, UOp) else type(sink).__name__}")
  sink = _normalize_ends(sink)
  nodes = sink.toposort()
  order = {u: i for i, u in enumerate(nodes)}

  rset = range_sets(nodes, lambda u: u.op is Ops.RANGE)

  # loop nesting: r sits inside every lower-index range that some node needs together with r, transitively
  ranges = sorted((u for u in nodes if u.op is Ops.RANGE), key=lambda r: r.arg)
  enclosing: dict[UOp, set] = {r: set() for r in ranges}
  for s in set(rset.values()):
    for r in s: enclosing[r].update(q for q in s if q.arg < r.arg)
  parent: dict[UOp, UOp | None] = {}
  for r in reversed(ranges):
    p = max(enclosing[r], key=lambda q: q.arg) if enclosing[r] else None
    parent[r] = p
    if p is not None: enclosing[p].update(enclosing[r] - {p})
  path: dict[UOp | None, tuple] = {None: ()}
  for r in ranges: path[r] = path[parent[r]] + (("loop", r),)
  closer = {u.src[1]: u for u in nodes if u.op is Ops.END}
  for r in ranges:
    if r not in closer:
      raise LinearizeError(f"RANGE {r.arg.idx} (size {r.src[0].arg if r.src[0].op is Ops.CONST else '?'}) is never closed by an END")

  def innermost(s: frozenset) -> UOp | None: return max(s, key=lambda r: r.arg) if s else None

  # where each node sits: its position is the path of loops down to it, then the node (or, for RANGE/END, the loop)
  pos: dict[UOp, tuple] = {}
  users = users_of(nodes)
  step = _chain_steps(nodes, users)
  for u in nodes:
    if u.op is Ops.RANGE: pos[u] = path[parent[u]] + (("loop", u),)
    elif u.op is Ops.END: pos[u] = path[parent[u.src[1]]] + (("loop", u.src[1]),)
    elif u.op is not Ops.ALLOC: pos[u] = path[innermost(rset[u])] + (("node", u),)
  for u in nodes:
    if u.op is Ops.ALLOC:   # an accumulator is declared in the deepest loop that holds all of its uses
      common = None
      for v in users.get(u, ()): common = pos[v][:-1] if common is None else _common_prefix(common, pos[v][:-1])
      pos[u] = (common or ()) + (("node", u),)

  # dependencies between sibling items of one loop body
  items: dict[tuple, set] = {}
  for u in nodes:
    p = pos[u]
    items.setdefault(p[:-1], set()).add(p[-1])
  deps: dict[tuple, set] = {}
  for u in nodes:
    pu = pos[u]
    for x in u.src:
      px = pos[x]
      d = 0
      while d < len(px) and d < len(pu) and px[d] == pu[d]: d += 1
      if d < len(px) and d < len(pu): deps.setdefault(pu[d], set()).add(px[d])

  # emit: order each body's items, expanding loops in place (an explicit stack: loops can nest deeply)
  out: list[UOp] = []
  work: list = [("body", ())]
  while work:
    kind, what = work.pop()
    if kind == "emit": out.append(what); continue
    scope = what
    todo = items.get(scope, set())
    indeg = {it: len([d for d in deps.get(it, ()) if d in todo]) for it in todo}
    dependents: dict[tuple, list] = {}
    for it in todo:
      for d in deps.get(it, ()):
        if d in todo: dependents.setdefault(d, []).append(it)
    # the nodes a loop of this body needs (transitively) go before the loops; the rest wait until after them, next to
    # their use: 16 mask vectors loaded before a GEMM's k loop and used after it spilled its accumulators (attention)
    feeds = set()
    stack = [it for it in todo if it[0] == "loop"]
    while stack:
      for d in deps.get(stack.pop(), ()):
        if d in todo and d not in feeds: feeds.add(d); stack.append(d)
    def key(item: tuple) -> tuple:
      return (0 if item[0] == "node" and item in feeds else 1 if item[0] == "loop" else 2, step.get(item[1], 0), order[item[1]])
    heap = [(key(it), it) for it in todo if indeg[it] == 0]
    heapq.heapify(heap)
    seq = []
    while heap:
      _, it = heapq.heappop(heap)
      seq.append(it)
      for nxt in dependents.get(it, ()):
        indeg[nxt] -= 1
        if indeg[nxt] == 0: heapq.heappush(heap, (key(nxt), nxt))
    if len(seq) != len(todo): raise LinearizeError("the loops of this program depend on each other in a cycle")
    for it in reversed(seq):
      if it[0] == "node": work.append(("emit", it[1]))
      else:
        r = it[1]
        work.append(("emit", closer[r]))
        work.append(("body", scope + (it,)))
        work.append(("emit", r))
  return out


def _chain_steps(nodes: list[UOp], users: dict[UOp, list[UOp]]) -> dict[UOp, int]:
  """For the nodes that feed a chain of multiply-adds (an accumulator's unrolled updates, acc = a*b + acc), the first
  step of a chain they feed: a MULACC onto another is one step further than it, and anything else takes its users' least
  step. Among ready nodes, the lower step goes first, so a register tile's accumulators are updated step by step, each
  in turn (every accumulator's first multiply-add, then every second one), not one accumulator's whole chain after the
  other's: the latency of each fma then hides behind the others' (a 3x3 convolution's kernel, batch 8, 64 -> 64
  channels, 32 x 32, its tile 16 accumulators of 9 steps: 3.66-3.80 ms in chains one after another with 32, 2.83-3.32
  step by step with 16; see uopc.opt). The values are the same: each accumulator adds its terms in the same order. Nodes
  that feed no chain are absent (step 0: a store of a finished accumulator goes as soon as it can, as before)."""
  step: dict[UOp, int] = {}
  for u in nodes:
    if u.op is Ops.MULACC: step[u] = step[u.src[2]] + 1 if u.src[2].op is Ops.MULACC else 0
  if not any(step.values()): return {}   # no chain of two steps or more (a GEMM's tile): every node is at step 0
  for u in reversed(nodes):
    if u.op is not Ops.MULACC and (s := min((step[w] for w in users.get(u, ()) if w in step), default=None)) is not None: step[u] = s
  return step


def _common_prefix(a: tuple, b: tuple) -> tuple:
  n = 0
  while n < len(a) and n < len(b) and a[n] == b[n]: n += 1
  return a[:n]


__all__ = ["linearize", "LinearizeError"]
