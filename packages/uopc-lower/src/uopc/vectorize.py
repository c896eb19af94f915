"""Vectorize: SIMD lanes become vector values, and neighbouring memory moves become one wide move.

    vectorize(sink, lanes=True, memory_bytes=0) -> sink        the last lowering pass: lower(), then this, then linearize

Vectors are IR, not a renderer's decision: this pass proves what can be a vector and writes it down with vector dtypes
(`dtypes.f32.vec(8)`), VECTORIZE (a vector of scalars), GEP (a lane of a vector) and vector LOADs and STOREs (an INDEX
whose arg is the vector's dtype: n consecutive elements from one flat index on). Renderers only print what it made, and
every interpreter runs it. The program computes what it computed before, bit for bit.

lanes: an UPCAST range (Opts.vector on an output axis, Opts.reduce_vector on a reduction's) is the lanes of one SIMD
vector. In the program's meaning it is a loop like any other (uopc.interpret runs it as one, and so does a backend
without SIMD: lanes=False); here every value that depends on it becomes one vector of its w lanes, and the loop goes:

    the lane counter                 VECTORIZE(0, 1, ..., w-1)
    an ALU op of lane values         the same op on vectors; an operand that is the same in every lane is broadcast
                                     (VECTORIZE(x, x, ..., x))
    a LOAD at a lane's address       one vector LOAD at lane 0's address when lane c's is lane 0's + c (contiguous: the
                                     lane enters the address only through sums and products by lane-free factors, and
                                     address(1) - address(0) simplifies to 1); otherwise a VECTORIZE of w scalar LOADs,
                                     lane c's address the address with the counter replaced by c
    a STORE at a lane's address      one vector STORE when contiguous; otherwise w scalar STOREs, of the lanes (GEP)
    an accumulator of every lane     an ALLOC of vectors: one whose every user lies inside the lanes' loop (where the
                                     linearizer would declare it, so it was fresh for every lane)
    acc = op(acc, lane value)        into a scalar accumulator: the loop's body once per lane, lane 0 first (a GEP per
                                     lane, each update reading what the one before stored: the same ops in the same
                                     order, so the same bits)

memory_bytes (a GPU's 16-byte loads: float4): unrolled copies (Opts.upcast) that LOAD neighbouring elements of one
memory, at root + o, root + o + 1, ..., root + o + n - 1 with n * itemsize = memory_bytes and root + o proven a multiple
of n (so the wide access is aligned to its size), become one vector LOAD and a GEP per copy; such STOREs become one
vector STORE of the VECTORIZE of their values, unless a value depends on one of those stores. What is left is folded
again into vectors half as wide, down to 4 bytes of 2 or more elements (float2, half2). Only global and shared
memory (a thread's registers, LOCAL, stay scalar), and no bools (a byte in memory, an int in C code).
"""
from __future__ import annotations
import functools, operator
from uopc.uop import UOp, Ops, AxisType, ALU, BINARY, users_of
from uopc.dtype import AddrSpace, DType, dtypes
from uopc.symbolic import simplify, bounds
from uopc.lowering import LowerError
from uopc.linearize import range_sets


def vectorize(sink: UOp, lanes: bool = True, memory_bytes: int = 0) -> UOp:
  """The lowered program `sink` with its UPCAST ranges as vector values (lanes) and its neighbouring global and shared
  memory moves of `memory_bytes` folded into vector ones (0: none). See the module docstring."""
  if not isinstance(sink, UOp) or sink.op is not Ops.SINK: raise LowerError(f"vectorize takes a lowered SINK, got {sink!r:.80}")
  if lanes and any(u.op is Ops.RANGE and u.arg.kind is AxisType.UPCAST for u in sink.toposort()): sink = _Lanes(sink).rewrite(sink)
  if memory_bytes: sink = fold_memory(sink, memory_bytes)
  return sink


# ---- lanes ----------------------------------------------------------------------------------------------------------

def _affine(index: UOp, lane: UOp) -> bool:
  """Is index an affine function of lane: the lane reaches it only through ADDs and MULs by lane-free values?"""
  depends: dict[UOp, bool] = {}
  for u in index.toposort():
    depends[u] = u is lane or any(depends[s] for s in u.src)
    if depends[u] and u is not lane:
      if u.op is Ops.ADD: continue
      if u.op is Ops.MUL and sum(depends[s] for s in u.src) == 1: continue
      return False
  return True


def index_step(index: UOp, var: UOp) -> int | None:
  """How far `index` moves when `var` (a lane, a loop counter) steps by one, where that is a constant: index affine in
  var with a step that simplifies to a number (the C renderer's prefetch distance reads it). None otherwise: a floor
  division or modulo of var, a product of var and another range."""
  if not _affine(index, var): return None
  step = simplify(_lane_step(index, var))
  return step.arg if step.op is Ops.CONST else None


def _lane_step(index: UOp, lane: UOp) -> UOp:
  """The coefficient of lane in an index _affine in it (its derivative: 1 for the lane, the sum over an ADD's operands,
  the lane-free factor times the other's over a MUL): lane c's index is lane 0's plus c times this. Simplifying it
  costs a fraction of simplifying the index at lanes 0 and 1 and their difference, which a contiguity proof did before."""
  d: dict[UOp, UOp | None] = {}
  for u in index.toposort():
    if u is lane: d[u] = UOp.const(1)
    elif not any(d[s] is not None for s in u.src): d[u] = None
    elif u.op is Ops.ADD: d[u] = _sum([d[s] for s in u.src if d[s] is not None])
    else:   # a MUL with one operand holding the lane (_affine made sure)
      a, b = u.src
      d[u] = d[a] * b if d[a] is not None else a * d[b]
  return d[index] if d[index] is not None else UOp.const(0)


def _lane_mods(index: UOp, lane: UOp) -> UOp:
  """index with each (Y + r) % C that the lane reaches written g*((Y//g) % (C//g)) + r, which is (Y % C) + r, where r is
  the sum of the terms that hold the lane, 0 <= r < g, and g divides both C and every term of Y (a constant, or a
  product by one): r can't carry Y past a multiple of g, so not past one of C either. Lanes inside a head of 64
  columns, (32*i + lane) % 64, are then 32*(i % 2) + lane: affine in the lane, one vector load instead of a gather (a
  transformer's attention output read by its projection). (simplify keeps the modulo: (6*i + j) % 12 stays one, as an
  index is meant to read.)"""
  mapping: dict[UOp, UOp] = {}
  for u in index.toposort():
    if u.op is not Ops.FLOORMOD or u.src[1].op is not Ops.CONST or u.src[0].op is not Ops.ADD or (c := u.src[1].arg) <= 1: continue
    terms, stack = [], [u.src[0]]
    while stack:
      t = stack.pop()
      if t.op is Ops.ADD: stack.extend(t.src)
      else: terms.append(t)
    held = [t for t in terms if lane in t.toposort()]
    rest = [t for t in terms if t not in held]
    if not held or not rest: continue
    r, y = _sum(held), _sum(rest)
    lo, hi = bounds(r)
    if lo < 0: continue
    g = next((g for g in range(c, hi, -1) if c % g == 0 and all(_step(t) % g == 0 for t in rest)), None)
    # g*((Y//g) % (C//g)): the same value as Y % C, with bounds that know it is a multiple of g (the memory-safety proof
    # reads the vector's last lane as lane 0's bound + 15)
    if g is not None: mapping[u] = (simplify(y // g) % (c // g)) * g + r
  return index.substitute(mapping) if mapping else index


def _step(t: UOp) -> int:
  """A whole number that divides every value of the term t: a constant's value, a product's constant factor, else 1."""
  if t.op is Ops.CONST: return t.arg
  if t.op is Ops.MUL and (k := [s.arg for s in t.src if s.op is Ops.CONST]): return k[0]
  return 1


def _sum(terms: list[UOp]) -> UOp: return functools.reduce(operator.add, terms)


class _Lanes:
  """One rewrite of a program's UPCAST ranges into vectors: which node depends on which lane, and the new graph."""
  def __init__(self, sink: UOp):
    nodes = sink.toposort()
    self.width: dict[UOp, int] = {}
    for u in nodes:
      if u.op is Ops.RANGE and u.arg.kind is AxisType.UPCAST:
        if u.src[0].op is not Ops.CONST: raise LowerError(f"UPCAST range {u.arg.idx}: vector lanes need a constant count")
        self.width[u] = u.src[0].arg
    # the lanes each node runs inside: the linearizer's range sets, kept to the lanes
    inside = range_sets(nodes, lambda r: r in self.width)
    # an accumulator whose every use is inside a lane's loop is declared there: one per lane, an ALLOC of vectors
    self.per_lane: dict[UOp, UOp] = {}
    for m, users in users_of(nodes).items():
      if m.op is Ops.ALLOC and (common := frozenset.intersection(*(inside[v] for v in users))):
        if len(common) > 1: raise LowerError(f"an accumulator (ALLOC {m.arg.slot}) lives inside the lanes of two vector axes")
        self.per_lane[m] = next(iter(common))
    self.lane_of: dict[UOp, UOp | None] = {}     # the lane whose counter a value depends on (None: the same in every lane)
    self.new: dict[UOp, UOp] = {}

  # -- which values are vectors
  def _lane(self, u: UOp) -> UOp | None:
    """The lane u's value depends on: its own counter, an accumulator's lane, or its sources'; memory orders through an
    AFTER without making the memory's value depend on what it waits for."""
    op = u.op
    if u in self.width: return u
    if op is Ops.ALLOC: return self.per_lane.get(u)
    if op is Ops.AFTER: return self.lane_of[u.src[0]]
    if op in (Ops.STORE, Ops.END, Ops.SINK, Ops.BARRIER, Ops.RANGE): return None
    found = {lane for s in u.src if (lane := self.lane_of[s]) is not None}
    if len(found) > 1: raise LowerError(f"a {op.name} depends on the lanes of two vector axes (ranges {sorted(r.arg.idx for r in found)})")
    return found.pop() if found else None

  def rewrite(self, root: UOp) -> UOp:
    """root's new node: every node under it rewritten first (sources before users, each once). The walk stops at nodes
    rewritten already: a load's or a store's rewrite asks for its address's, in a graph mostly done (a toposort of
    root each time was a third of vectorizing a cold GPT step's kernels)."""
    new, lane_of = self.new, self.lane_of
    if (done := new.get(root)) is not None: return done
    # post-order, sources left to right (as toposort's); a node pushed by two users is rewritten at its first pop
    nodes, ready = [root], [False]
    while nodes:
      u, expanded = nodes.pop(), ready.pop()
      if u in new: continue
      if expanded:
        lane_of[u] = self._lane(u)
        new[u] = self._rewrite(u)
        continue
      nodes.append(u); ready.append(True)
      for s in reversed(u.src):
        if s not in new: nodes.append(s); ready.append(False)
    return new[root]

  def _rewrite(self, u: UOp) -> UOp:
    new, op, lane = self.new, u.op, self.lane_of[u]
    if u in self.width: return UOp(Ops.VECTORIZE, tuple(UOp.const(c) for c in range(self.width[u])))
    if op is Ops.ALLOC and u in self.per_lane:
      a = u.arg
      return UOp(Ops.ALLOC, (), type(a)(a.slot, a.dtype.vec(self.width[lane]), a.shape, a.addrspace))
    if op is Ops.AFTER: return new[u.src[0]].after(*(new[d] for d in u.src[1:] if d not in self.width))
    if op is Ops.END: return new[u.src[0]].end(*(r for r in u.src[1:] if r not in self.width))
    if op is Ops.LOAD: return self._load(u)
    if op is Ops.STORE: return self._store(u)
    if op is Ops.INDEX and self._address_lane(u) is not None: return u    # a lane's address: its LOAD or STORE rewrites it
    if lane is not None and op in ALU:
      w = self.width[lane]
      return UOp(op, tuple(self.vector(s, w) for s in u.src), u.arg.vec(w) if op is Ops.CAST else u.arg)
    if lane is not None and op not in (Ops.INDEX, Ops.VECTORIZE, Ops.GEP):
      raise LowerError(f"a {op.name} of lane values has no vector form (vector lanes are for CPU kernels)")
    src = tuple(new[s] for s in u.src)
    return u if src == u.src else UOp(op, src, u.arg)

  def vector(self, s: UOp, w: int) -> UOp:
    """s as a vector of w lanes: its vector, or its one value broadcast to every lane."""
    return self.new[s] if self.lane_of[s] is not None else UOp(Ops.VECTORIZE, (self.new[s],) * w)

  def _address_lane(self, index: UOp) -> UOp | None:
    """The lane a memory INDEX's address depends on (not its memory's: an accumulator per lane is one vector)."""
    if index.op is not Ops.INDEX or index.src[0].addrspace is AddrSpace.ALU or len(index.src) != 2: return None
    return self.lane_of[index.src[1]]

  def _at(self, address: UOp, lane: UOp, c: int) -> UOp:
    """Lane c's address (a new, lane-free node)."""
    at = simplify(address.substitute({lane: UOp.const(c)}))
    new = self.rewrite(at)
    if self.lane_of[at] is not None:
      raise LowerError("an address depends on a lane through an accumulator of every lane: no lane's address can be written down")
    return new

  def _contiguous(self, address: UOp, lane: UOp) -> UOp | None:
    """Lane 0's address when lane c's is lane 0's + c, else None: _lane_sum's answer where it has one, else the proof."""
    base = self._lane_sum(address, lane)
    return self.rewrite(base) if base is not None else self._contiguous_proof(address, lane)

  def _lane_sum(self, address: UOp, lane: UOp) -> UOp | None:
    """The common address, a sum of the lane and terms no lane reaches (x + lane + 16: a vector of a row at an offset):
    lane 0's is the sum of those terms, simplified; None for any other. The proof comes to the same for ten times the
    work (most of vectorizing a GPT step's kernels)."""
    terms, stack = [], [address]
    while stack:
      t = stack.pop()
      if t.op is Ops.ADD and self.lane_of[t] is not None: stack += t.src
      else: terms.append(t)
    if terms.count(lane) != 1 or any(t is not lane and self.lane_of[t] is not None for t in terms): return None
    rest = [t for t in reversed(terms) if t is not lane]
    return simplify(_sum(rest)) if rest else UOp.const(0, lane.dtype)

  def _contiguous_proof(self, address: UOp, lane: UOp) -> UOp | None:
    """The proof, with uopc.symbolic: an affine function of the lane whose step simplifies to 1."""
    if not _affine(address, lane) and not _affine(address := _lane_mods(address, lane), lane): return None
    step = simplify(_lane_step(address, lane))
    return self._at(address, lane, 0) if step.op is Ops.CONST and step.arg == 1 else None

  def _memory_at(self, index: UOp, lane: UOp) -> tuple[UOp, UOp | None]:
    mem = index.src[0]
    if self.lane_of[mem] is not None:
      raise LowerError(f"an accumulator of every lane (ALLOC {mem.arg.slot}) is indexed at a lane's address: each lane owns its copy")
    return self.new[mem], self._contiguous(index.src[1], lane)

  def _load(self, u: UOp) -> UOp:
    index = u.src[0]
    if (lane := self._address_lane(index)) is None: return UOp(Ops.LOAD, (self.new[index],))
    w, d = self.width[lane], index.dtype
    mem, base = self._memory_at(index, lane)
    if base is not None: return UOp(Ops.INDEX, (mem, base), d.vec(w)).load()
    return UOp(Ops.VECTORIZE, tuple(mem.index(self._at(index.src[1], lane, c)).load() for c in range(w)))   # a gather

  def _store(self, u: UOp) -> UOp:
    new, (target, value) = self.new, u.src
    if (lane := self._address_lane(target)) is not None:
      w = self.width[lane]
      mem, base = self._memory_at(target, lane)
      if base is not None: return UOp(Ops.INDEX, (mem, base), target.dtype.vec(w)).store(self.vector(value, w))
      lanes = [UOp(Ops.GEP, (new[value],), c) if self.lane_of[value] is not None else new[value] for c in range(w)]
      return UOp(Ops.SINK, tuple(mem.index(self._at(target.src[1], lane, c)).store(v) for c, v in enumerate(lanes)))   # a scatter
    if (lane := self.lane_of[value]) is not None and self.lane_of[target] is None: return self._horizontal(u, lane)
    if self.lane_of[target] is not None: return new[target].store(self.vector(value, self.width[self.lane_of[target]]))
    return UOp(Ops.STORE, (new[target], new[value]))

  def _horizontal(self, u: UOp, lane: UOp) -> UOp:
    """acc = op(acc, v) with v a vector and acc one scalar: the loop over the lanes ran this update for lane 0, then 1,
    ..., so it runs once per lane in that order, each reading the accumulator after the lane before stored it, the op's
    operands in the node's order (max(-0.0, 0.0) is not max(0.0, -0.0))."""
    target, value = u.src
    own = [k for k, s in enumerate(value.src) if s.op is Ops.LOAD and s.src[0] is target]
    if value.op not in BINARY or len(own) != 1 or self.lane_of[value.src[1 - own[0]]] is None:
      raise LowerError("a vector is stored to one scalar address: every lane would write the same element (a vector updates a scalar "
                       "accumulator only as acc = op(acc, vector))")
    k, lanes = own[0], self.new[value.src[1 - own[0]]]
    mem, at = self.new[target.src[0]], self.new[target.src[1]]
    update = None
    for c in range(self.width[lane]):
      here = mem.after(update) if update is not None else mem
      acc, x = here.index(at).load(), UOp(Ops.GEP, (lanes,), c)
      update = here.index(at).store(UOp(value.op, (acc, x) if k == 0 else (x, acc)))
    return update


# ---- wide memory moves ------------------------------------------------------------------------------------------------

def _split(address: UOp) -> tuple[UOp, int]:
  """(root, offset) with address = root + offset: a simplified sum keeps its constant last."""
  if address.op is Ops.CONST: return UOp.const(0), address.arg
  if address.op is Ops.ADD and address.src[1].op is Ops.CONST: return address.src[0], address.src[1].arg
  return address, 0


def _aligned_runs(members: dict[int, UOp], root: UOp, n: int) -> list[list[UOp]]:
  """The runs of n members at offsets o, ..., o + n - 1 with root + o a multiple of n (proven: root % n simplifies to a
  constant)."""
  residue = simplify(root % n) if root.op is not Ops.CONST else UOp.const(root.arg % n)
  if residue.op is not Ops.CONST: return []
  runs = []
  for o in sorted(members):
    if (residue.arg + o) % n == 0 and all(o + j in members for j in range(n)): runs.append([members[o + j] for j in range(n)])
  return runs


def fold_memory(sink: UOp, nbytes: int) -> UOp:
  """Neighbouring scalar LOADs and STOREs of global and shared memory as vector ones of `nbytes` (see the docstring):
  the loads first, then the stores of what the folded loads compute; then what is left, as half as wide vectors, down to
  4 bytes (a tensor-core GEMM's lane holds pairs of neighbouring outputs: float2, or half2 for f16)."""
  while nbytes >= 4:
    sink = _fold(_fold(sink, nbytes, Ops.LOAD), nbytes, Ops.STORE)
    nbytes //= 2
  return sink


def _fold(sink: UOp, nbytes: int, op: Ops) -> UOp:
  nodes = sink.toposort()
  groups: dict[tuple, dict[int, UOp]] = {}
  for u in nodes:
    if u.op is not op: continue
    index = u.src[0]
    if index.op is not Ops.INDEX or index.arg is not None or len(index.src) != 2: continue
    d: DType = index.dtype
    # (a bool is a byte of memory but an int in C code: its vectors are never moved whole)
    if index.src[0].addrspace not in (AddrSpace.GLOBAL, AddrSpace.SHARED) or d.count != 1 or d is dtypes.bool or nbytes % d.itemsize \
       or nbytes // d.itemsize < 2: continue
    root, offset = _split(index.src[1])
    groups.setdefault((index.src[0], d, root), {})[offset] = u
  mapping: dict[UOp, UOp] = {}
  users = users_of(nodes) if op is Ops.STORE else {}
  for (mem, d, root), members in groups.items():
    runs = _aligned_runs(members, root, n := nbytes // d.itemsize)
    if op is Ops.LOAD:
      for run in runs:
        wide = UOp(Ops.INDEX, (mem, run[0].src[0].src[1]), d.vec(n)).load()
        mapping.update({u: UOp(Ops.GEP, (wide,), j) for j, u in enumerate(run)})
      continue
    # what reads memory after these stores can't be one of the values stored: the wide store waits for all of them
    later = _downstream(list(members.values()), users) if runs else set()
    for run in runs:
      if any(u.src[1] in later for u in run): continue
      wide = UOp(Ops.INDEX, (mem, run[0].src[0].src[1]), d.vec(n)).store(UOp(Ops.VECTORIZE, tuple(u.src[1] for u in run)))
      mapping.update(dict.fromkeys(run, wide))
  if not mapping: return sink
  sink = sink.substitute(mapping)
  # the n stores a wide one replaced were n sources of one SINK (or BARRIER): it lists the wide store once
  twice = {u for u in sink.toposort() if u.op in (Ops.SINK, Ops.BARRIER) and len(set(u.src)) != len(u.src)}
  return UOp.wrap([sink], twice, lambda u: UOp(u.op, tuple(dict.fromkeys(u.src))))[0] if twice else sink


def _downstream(starts: list[UOp], users: dict[UOp, list[UOp]]) -> set[UOp]:
  """Every node that depends on one of `starts`."""
  seen: set[UOp] = set()
  todo = list(starts)
  while todo:
    for v in users.get(todo.pop(), ()):
      if v not in seen: seen.add(v); todo.append(v)
  return seen


__all__ = ["vectorize", "fold_memory", "index_step"]
