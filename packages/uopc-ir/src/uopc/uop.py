"""The UOp: the one node type of the whole compiler.

    UOp(op, src: tuple[UOp, ...], arg)

Every program is a DAG of UOps, from an arithmetic expression to the GPT training step. UOps are
*hash consed*: constructing a UOp that is structurally identical to a live one returns the very same
Python object. That gives O(1) structural equality (`is`), free common-subexpression elimination and
cheap memoization keyed on nodes (equality and hashing stay object's identity versions, written in C). That holds
across threads: a node is added to the cache under a lock, after a second look.

dtype, shape and addrspace are *recursive properties*: the inference rules (`_RULES`, one per op) compute them
from the op, the arg and the sources when the node is built. They are the type checker
of the IR: a malformed UOp never exists, it dies at construction with an error that says what was wrong.

Nothing here recurses on graph depth: toposort, substitute, wrap, call_params, repr and pickling all
walk with explicit stacks, because chains of a million nodes happen.
"""
from __future__ import annotations
import functools, math, operator, reprlib, threading, weakref
from _weakref import _remove_dead_weakref
from dataclasses import dataclass
from enum import Enum, auto
from typing import Any, Callable
from uopc.dtype import AddrSpace, DType, dtypes, I32_MIN, I32_MAX


class Ops(Enum):
  # ---- values: parameters and calls, constants, and the ALU ops on them --------------
  PARAM = auto()      # arg: ParamArg. An input to the enclosing CALL.
  CALL = auto()       # src[0] = body, src[1:] = arguments. arg: CallArg
  CONST = auto()      # arg: python value (bool/int/float). shape ()
  STACK = auto()      # new leading axis; all srcs share one shape
  INDEX = auto()      # src[0] indexed by src[1:]; pops axes off the left. arg: None, or for memory a vector dtype
                      # d.vec(n): the n consecutive elements from the one flat index on (a vector LOAD or STORE)
  CAST = auto()       # arg: DType
  RECIP = auto()      # 1/x
  ADD = auto(); MUL = auto(); CMPLT = auto()
  FLOORDIV = auto(); FLOORMOD = auto()
  WHERE = auto()      # (cond, a, b)
  CMPNE = auto(); MAX = auto()
  MULACC = auto()     # (a, b, c): a*b + c rounded once (a fused multiply-add). f32 only; lowering makes it (Opts.fma)
  EXP2 = auto(); LOG2 = auto(); SQRT = auto(); SIN = auto()
  # ---- memory and the order of effects -----------------------------------------------
  BUFFER = auto()     # arg: ParamArg. global persistent memory (never in a CALL body)
  ALLOC = auto()      # arg: ParamArg. call-scope storage `float a[10];`
  LOAD = auto()       # (ptr,)
  STORE = auto()      # (ptr, value)
  AFTER = auto()      # (mem, *deps): `mem`, but only once deps have happened
  SINK = auto()       # (*effects): groups side effects, the root of a program
  # ---- loops -------------------------------------------------------------------------
  RANGE = auto()      # src[0] = end; arg: RangeArg. value is the loop counter
  END = auto()        # (passthrough, *ranges): closes the ranges
  # ---- shapes: movement and reduction (lowering turns them into loops) ---------------
  RESHAPE = auto(); EXPAND = auto(); PERMUTE = auto(); SHRINK = auto()
  REDUCE = auto()     # arg: (Ops.ADD | Ops.MAX, n) -- reduces the last n axes
  # ---- kernels -----------------------------------------------------------------------
  STAGE = auto()      # materialize src[0] into a temp buffer you can index into
  # ---- GPUs --------------------------------------------------------------------------
  BARRIER = auto()    # (*deps): __syncthreads()
  WMMA = auto()       # (a, b, c): a warp's tensor-core multiply-add D = A @ B + C (m16n8k16), each operand a STACK of
                      # the lane's fragment; lowered from GEMMs with Opts(tc=True) (uopc.gpulower)
  # asynchronous copies into shared memory and matrix loads from it (sm_80 and later; uopc.gpulower's pipelined GEMM)
  ASYNC_COPY = auto() # (dst, src, valid): dst (a vector INDEX of SHARED memory) <- src (one of GLOBAL memory, as wide), in the
                      # background (cp.async); zeros where valid is False, and src is then not read. Visible to the
                      # thread once an ASYNC_WAIT has waited for the group of copies it belongs to
  ASYNC_COMMIT = auto()   # (*deps): closes the thread's group of the ASYNC_COPYs it issued since the last one
  ASYNC_WAIT = auto() # (*deps) arg: n. waits until at most n of the thread's committed groups are still in flight
  LDMATRIX = auto()   # (row,) arg: (matrices, trans). A warp's 8x8 f16 matrices from SHARED memory: lane l gives, as
                      # `row` (a vector INDEX of 8 halves), the address of row l % 8 of matrix l // 8; lane l gets of
                      # each matrix m the elements (l // 4, 2 * (l % 4) + e), e = 0, 1 (of its transpose with trans):
                      # 2 * matrices halves, matrix by matrix
  # ---- vectors (made by uopc.vectorize, the last lowering pass; an ALU op on vectors works lane by lane) -------------
  VECTORIZE = auto()  # (*scalars): the vector of their values, lane k = src[k]; dtype src dtype.vec(len(src))
  GEP = auto()        # (vector,) arg: lane. That lane's scalar value
  # ---- a read at computed positions (shaped; lowering turns it into a load at a loaded index) ---------------------------
  GATHER = auto()     # (x, idx) arg: b, the batch axes they share (x.shape[:b] == idx.shape[:b]). Entries of x picked along
                      # its axis b by the i32 values of idx: shape idx.shape + x.shape[b + 1:], element [*B, *s, *r] =
                      # x[*B, idx[*B, *s], *r] (b = 0: rows of x, x[idx]; b = rank - 1: take_along_axis). An index
                      # outside 0..x.shape[b]-1 is the caller's to refuse (lowering clamps it, so memory stays safe)

  def __repr__(self): return "Ops." + self.name
  __hash__ = object.__hash__   # members are singletons: identity hashing is correct and much faster


UNARY = {Ops.RECIP, Ops.CAST, Ops.EXP2, Ops.LOG2, Ops.SQRT, Ops.SIN}
BINARY = {Ops.ADD, Ops.MUL, Ops.CMPLT, Ops.CMPNE, Ops.FLOORDIV, Ops.FLOORMOD, Ops.MAX}
TERNARY = {Ops.WHERE, Ops.MULACC}
ALU = UNARY | BINARY | TERNARY
COMMUTATIVE = {Ops.ADD, Ops.MUL, Ops.MAX, Ops.CMPNE}
MOVEMENT = {Ops.RESHAPE, Ops.EXPAND, Ops.PERMUTE, Ops.SHRINK}


class AxisType(Enum):
  LOOP = auto()      # a plain serial for-loop
  REDUCE = auto()    # a for-loop that a reduction accumulates over
  UPCAST = auto()    # the lanes of one SIMD vector (Opts.vector, Opts.reduce_vector): a loop in the program's
                     # meaning, made vector values by uopc.vectorize (Opts.upcast unrolls without a RANGE)
  THREAD = auto()    # parallel across CPU threads
  GLOBAL = auto()    # GPU blockIdx
  LOCAL = auto()     # GPU threadIdx
  def __repr__(self): return "AxisType." + self.name
  __hash__ = object.__hash__


@dataclass(frozen=True)
class ParamArg:
  slot: int
  dtype: DType
  shape: tuple[int, ...] = ()
  addrspace: AddrSpace | None = None   # only used by ALLOC (LOCAL or SHARED)


@dataclass(frozen=True)
class CallArg:
  name: str = "f"


@dataclass(frozen=True, order=True)
class RangeArg:
  idx: int                         # loops nest in increasing idx order
  kind: AxisType = AxisType.LOOP


def prod(xs) -> int: return math.prod(xs)


_MAX_ARG_DEPTH = 16   # no op's arg nests tuples deeper than 2 (SHRINK); the bound keeps a hostile arg from recursing away

class _Ints:
  """The tag of a key for a tuple of ints and Ops alone (a shape, a permutation, a REDUCE's arg): the tuple itself is
  then its key."""


class _IntPairs:
  """The tag of a key for a tuple of pairs of ints alone (a SHRINK's bounds): the tuple itself is then its key."""


def _argkey(arg, depth: int = 0):
  # 1 == 1.0 == True and 0.0 == -0.0 in python; the cache must not merge them. repr also gives every nan one key.
  t = type(arg)
  if t is float: return (float, repr(arg))
  if t is tuple:
    # a shape or a permutation, the most common arg, or a REDUCE's (op, axes): no element can be confused with another
    # type's (bools are not ints here, an Ops member equals itself alone), so the tuple keys itself (a key of a pair per
    # element cost 2 us a RESHAPE, and 0.6 us a REDUCE)
    for a in arg:
      if (ta := type(a)) is not int and ta is not Ops: break
    else: return (_Ints, arg)
    # a SHRINK's bounds, as plain: a recursive key of each pair was 3 us of each SHRINK a convolution's windows build
    if _all_int_pairs(arg): return (_IntPairs, arg)
    if depth >= _MAX_ARG_DEPTH: raise UOpError(f"an arg of tuples nested more than {_MAX_ARG_DEPTH} deep")
    return (tuple, tuple(_argkey(a, depth + 1) for a in arg))
  return (t, arg)


_KEEP = object()   # replace(arg=...) default: keep the arg (None is a real arg)


class UOpError(Exception):
  """A malformed UOp: raised by the type checker when the node is built."""


class UOp:
  # the three defining fields, the three inferred ones, a weakref slot for the cache and a __dict__ for per-node memos
  __slots__ = ("op", "src", "arg", "dtype", "shape", "addrspace", "__dict__", "__weakref__")
  op: Ops
  src: tuple[UOp, ...]
  arg: Any
  dtype: DType
  shape: tuple[int, ...]
  addrspace: AddrSpace
  # the weak hash-consing cache: key -> weak reference to the live node. An entry goes away with its node (so the
  # cache shrinks after `del`), and the key, which holds the sources, never keeps a graph alive.
  _cache: dict[tuple, weakref.ref] = {}

  def __new__(cls, op: Ops, src: tuple[UOp, ...] = (), arg: Any = None):
    # the hot path of the whole compiler: one key, one dict probe, and on a miss the type checker
    if type(src) is not tuple:
      try: src = tuple(src)
      except TypeError: raise UOpError(f"{op!r}: src must be a tuple of UOps, got {type(src).__name__} {_show(src)}") from None
    key = (op, src) if arg is None else (op, src, _argkey(arg))
    try: ref = _cache_get(key)
    except TypeError: raise _unhashable(op, src, arg) from None   # a list for a shape, a UOp's source that is a dict, ...
    if ref is not None and (ret := ref()) is not None: return ret
    ret = object.__new__(cls)
    ret.op, ret.src, ret.arg = op, src, arg
    try: ret.dtype, ret.shape, ret.addrspace = _RULES[op](op, src, arg)   # the type checker; a failure caches nothing
    except (KeyError, AttributeError, TypeError) as e: raise _malformed(op, src, e) from None
    ref = _CacheRef(ret, _evict)
    ref.key = key
    # another thread may have built the same node since the probe above: setdefault (atomic under the GIL) inserts ours
    # or hands back theirs, so one node per structure holds under threads too (without it, 16 threads building one chain
    # made thousands of duplicates). Only an entry holding a dead node, not yet evicted, is replaced under the lock, so
    # that two threads can't both replace it; a lock on every miss cost 8% of building a graph.
    if (first := _cache_setdefault(key, ref)()) is not None: return first
    _cache_acquire()
    try:
      if (held := _cache_get(key)) is None or (first := held()) is None: _cache[key], first = ref, ret
    finally: _cache_release()
    return first

  # hash consing means identity *is* structural equality, so we keep object's default
  # __eq__/__hash__ (identity, implemented in C). Note __lt__ etc. build UOps instead.

  def __reduce__(self):
    # pickle (and deepcopy) rebuild through UOp(...), so the result is re-hash-consed into the live cache. The
    # graph travels as a flat list in topological order: a nested (UOp, (op, src, arg)) form makes pickle recurse.
    nodes = self.toposort()
    index = {u: i for i, u in enumerate(nodes)}
    return (_rebuild, ([(u.op, tuple(index[s] for s in u.src), u.arg) for u in nodes],))

  def __repr__(self): return _tree_repr(self)

  def replace(self, op: Ops | None = None, src: tuple[UOp, ...] | None = None, arg: Any = _KEEP) -> UOp:
    """This node with some fields changed (a new, hash-consed node: UOps are never mutated)."""
    return UOp(self.op if op is None else op, self.src if src is None else src, self.arg if arg is _KEEP else arg)

  # ---- graph helpers ----------------------------------------------------
  def toposort(self) -> list[UOp]:
    """Every node reachable from self, sources before users, sources in left-to-right order. Iterative. A new list each
    call; the order of the last few large graphs sorted is kept (_recent_sorts), since passes in a row sort one program
    again (a cold GPT step's planning: 58% of the nodes toposort visited were of a graph it had just sorted)."""
    if (hit := _recent_sorts.get(weakref.ref(self))) is not None: return [*hit, self]
    out: list[UOp] = []
    seen: set[UOp] = set()
    # two parallel stacks: the node, and whether its sources are done (then emit it) or it is still to expand. A node
    # seen again before it is emitted would be its own ancestor, which a DAG can't have, so `seen` means emitted or
    # about to be. (A 1-tuple marker per node was a third slower: every node paid for a tuple and a class check.)
    nodes: list[UOp] = [self]
    done: list[bool] = [False]
    push, pop, push_done, pop_done, emit, mark = nodes.append, nodes.pop, done.append, done.pop, out.append, seen.add
    while nodes:
      u = pop()
      if pop_done(): emit(u); continue
      if u in seen: continue
      mark(u)
      push(u); push_done(True)
      for s in reversed(u.src):
        if s not in seen: push(s); push_done(False)
    if len(out) >= SORTS_KEPT_FROM: _keep_sort(self, out)
    return out

  def substitute(self, mapping: dict[UOp, UOp]) -> UOp:
    """The graph with each key of `mapping` (by identity) replaced by its value; only the users of a replaced node are
    rebuilt, and rebuilding goes through UOp(), so subgraphs that become equal become one node."""
    return _rebuild_graph([self], lambda old, rebuilt: mapping.get(old, rebuilt), mapped=mapping)[0]

  @staticmethod
  def wrap(roots: list[UOp], targets: set[UOp], fn: Callable[[UOp], UOp]) -> list[UOp]:
    """Rebuild the graphs of `roots` bottom-up, replacing each target t by fn(t'), where t' is t over its *rebuilt*
    sources. (substitute() hands back the original t, whose sources may themselves have been replaced.)"""
    return _rebuild_graph(list(roots), lambda old, rebuilt: fn(rebuilt) if old in targets else rebuilt)

  def ranges(self) -> list[UOp]:
    """The RANGEs under this node, in loop order."""
    return sorted([u for u in self.toposort() if u.op is Ops.RANGE], key=lambda r: r.arg)

  # ---- constructors and sugar ----------------------------------------------
  @staticmethod
  def const(v, dtype: DType | None = None) -> UOp:
    """A CONST of python value v, converted to `dtype` when one is given. f16 has no python values: an f16 constant
    is the float CONST cast to f16."""
    v = _py_scalar(v)
    if dtype is None or dtype is dtypes.from_py(v): return UOp(Ops.CONST, (), v)
    if dtype.count > 1: return UOp(Ops.VECTORIZE, (UOp.const(v, dtype.scalar()),) * dtype.count)   # every lane v
    if dtype is dtypes.f16: return UOp(Ops.CONST, (), float(v)).cast(dtypes.f16)
    if dtype is dtypes.void: raise UOpError("a CONST can't have dtype void")
    convert = bool if dtype is dtypes.bool else int if dtype is dtypes.i32 else float
    return UOp(Ops.CONST, (), convert(v))

  def const_like(self, v) -> UOp:
    """v as a constant of this node's dtype *and shape*: a scalar CONST reshaped to all-ones and EXPANDed, so that
    `x * 2` type-checks for a shaped x (a bare scalar CONST has shape () and would not). A shaped one is remembered
    (CONST_LIKE_CACHE of them, by dtype, shape and value): a training step's graph asks for the same few a hundred
    times a step, and built again each step, each was three new nodes."""
    if not self.shape: return UOp.const(v, self.dtype)
    t = type(v)
    if t is float: return _shaped_const(self.dtype, self.shape, float, repr(v))   # -0.0 apart from 0.0, every nan one
    if t is int or t is bool: return _shaped_const(self.dtype, self.shape, t, v)   # 1, 1.0 and True apart
    return UOp.const(v, self.dtype).reshape((1,) * len(self.shape)).expand(self.shape)

  def _operand(self, x) -> UOp: return x if isinstance(x, UOp) else self.const_like(x)
  def alu(self, op: Ops, *src) -> UOp:
    """op applied to this node and `src` (python values become constants shaped and typed like this node)."""
    return UOp(op, (self,) + tuple(self._operand(s) for s in src))

  # x - y, -x, x > y and x == y have no ops of their own: they are built from ADD, MUL, CMPLT and CMPNE on the spot
  def __neg__(self): return self.alu(Ops.MUL, -1 if self.dtype is dtypes.i32 else -1.0)
  def __sub__(self, x): return self + -self._operand(x)
  def __rsub__(self, x): return self._operand(x) + -self
  def eq(self, x): return self.ne(x).ne(True)
  def recip(self): return self.alu(Ops.RECIP)
  def cast(self, d: DType): return self if d is self.dtype else UOp(Ops.CAST, (self,), d)
  def where(self, a, b):
    """WHERE(self, a, b). A python branch takes the dtype and shape of the other branch (or of its own value if both are)."""
    if not isinstance(a, UOp): a = b.const_like(a) if isinstance(b, UOp) else UOp.const(a)
    if not isinstance(b, UOp): b = a.const_like(b)
    return UOp(Ops.WHERE, (self, a, b))

  def index(self, *idx) -> UOp:
    return UOp(Ops.INDEX, (self,) + tuple(i if isinstance(i, UOp) else UOp.const(int(i)) for i in idx))
  def gather(self, idx: UOp, batch: int = 0) -> UOp:
    """Entries of self along axis `batch` picked by the i32 values of idx, which shares self's first `batch` axes: shape
    idx.shape + self.shape[batch + 1:] (a GATHER; batch 0: rows of self)."""
    return UOp(Ops.GATHER, (self, idx), batch)
  def load(self) -> UOp: return self.alu(Ops.LOAD)
  def store(self, v) -> UOp: return self.alu(Ops.STORE, v)
  def after(self, *deps) -> UOp:
    """This memory once `deps` have happened (itself when there are none)."""
    return UOp(Ops.AFTER, (self,) + deps) if deps else self
  def end(self, *rngs) -> UOp:
    """Close the loops `rngs` after this statement (itself when there are none)."""
    return UOp(Ops.END, (self,) + rngs) if rngs else self

  def reshape(self, shape): return UOp(Ops.RESHAPE, (self,), _ints(shape))
  def expand(self, shape): return UOp(Ops.EXPAND, (self,), _ints(shape))
  def permute(self, perm): return UOp(Ops.PERMUTE, (self,), _ints(perm))
  def shrink(self, arg): return UOp(Ops.SHRINK, (self,), _int_pairs(arg))
  def reduce(self, op: Ops, n: int = 1): return UOp(Ops.REDUCE, (self,), (op, int(n)))


CONST_LIKE_CACHE = 1024


@functools.lru_cache(maxsize=CONST_LIKE_CACHE)
def _shaped_const(dtype: DType, shape: tuple[int, ...], t: type, key) -> UOp:
  """const_like's shaped constants, held (the most recent CONST_LIKE_CACHE) by dtype, shape, the value's type and the
  value, a float's by its repr (as _argkey keys them)."""
  return UOp.const(float(key) if t is float else key, dtype).reshape((1,) * len(shape)).expand(shape)


class _CacheRef(weakref.ref):
  __slots__ = ("key",)

def _binary_sugar(op: Ops, swapped: bool = False):
  """The python operator for a binary op: `x op y`, or `y op x` for the reflected (__radd__, ...) and swapped forms."""
  if swapped: return lambda self, x: self._operand(x).alu(op, self)
  return lambda self, x: self.alu(op, x)

# x < y is CMPLT(x, y); x > y is CMPLT(y, x), the same op with its operands swapped
for _name, _op, _swapped in [("__add__", Ops.ADD, False), ("__radd__", Ops.ADD, True), ("__mul__", Ops.MUL, False),
                             ("__rmul__", Ops.MUL, True), ("__floordiv__", Ops.FLOORDIV, False), ("__rfloordiv__", Ops.FLOORDIV, True),
                             ("__mod__", Ops.FLOORMOD, False), ("__rmod__", Ops.FLOORMOD, True), ("__lt__", Ops.CMPLT, False),
                             ("__gt__", Ops.CMPLT, True), ("ne", Ops.CMPNE, False), ("maximum", Ops.MAX, False)]:
  setattr(UOp, _name, _binary_sugar(_op, _swapped))

_cache = UOp._cache
_cache_get, _cache_setdefault = _cache.get, _cache.setdefault

# UOp.toposort's results for the last SORTS_KEPT graphs of at least SORTS_KEPT_FROM nodes, by a weak reference to the
# root: an entry goes with its root (it holds the nodes under the root, which the root holds anyway), so a graph nobody
# holds, and the buffers it names, are never kept alive by it
SORTS_KEPT, SORTS_KEPT_FROM = 8, 32
_recent_sorts: dict[weakref.ref, tuple[UOp, ...]] = {}


def _drop_sort(ref: weakref.ref, _sorts=_recent_sorts) -> None: _sorts.pop(ref, None)


def _keep_sort(root: UOp, order: list[UOp]) -> None:
  # (a dict keeps insertion order: the oldest goes first; a race between threads at worst sorts a graph twice)
  _recent_sorts[weakref.ref(root, _drop_sort)] = tuple(order[:-1])   # not the root itself (the last), or it never dies
  while len(_recent_sorts) > SORTS_KEPT:
    try: del _recent_sorts[next(iter(_recent_sorts))]
    except (KeyError, RuntimeError, StopIteration): break
# held only to insert a new node (see __new__); the weakref callback needs none: it removes an entry only while it is dead
_cache_lock = threading.Lock()
_cache_acquire, _cache_release = _cache_lock.acquire, _cache_lock.release

def _evict(ref: _CacheRef, _remove=_remove_dead_weakref, _cache=_cache):
  # removes the entry only if it still holds a dead reference: a node rebuilt under the same key stays. Its helpers are
  # bound here: a node dying while the interpreter shuts down (held by a cache to the end) finds module globals None
  _remove(_cache, ref.key)


def _rebuild_graph(roots: list[UOp], visit: Callable[[UOp, UOp], UOp], mapped: dict | None = None) -> list[UOp]:
  """Walk the graphs of `roots` sources first; each node is first rebuilt over its sources' results (itself when none
  changed), then visit(original, rebuilt) gives its result. Nodes in `mapped` are not entered."""
  done: dict[UOp, UOp] = {}
  for old in (roots[0] if len(roots) == 1 else UOp(Ops.SINK, tuple(roots))).toposort():
    if mapped is not None and old in mapped: done[old] = mapped[old]; continue
    srcs = tuple([done[s] for s in old.src])
    done[old] = visit(old, old if srcs == old.src else UOp(old.op, srcs, old.arg))
  return [done[r] for r in roots]


def _rebuild(nodes: list[tuple[Ops, tuple[int, ...], Any]]) -> UOp:
  built: list[UOp] = []
  for op, src, arg in nodes: built.append(UOp(op, tuple(built[i] for i in src), arg))
  return built[-1]


def _ints(xs) -> tuple[int, ...]:
  # shapes and permutations hold python ints, so that (np.int64(3),) and (3,) are one node
  if type(xs) is tuple:   # most often one already (a tuple's loop is a fifth of building another)
    for x in xs:
      if type(x) is not int: break
    else: return xs
  try: return tuple(x if type(x) is int else operator.index(x) for x in xs)
  except TypeError: raise UOpError(f"expected a tuple of integers, got {_show(xs)}") from None


def _all_int_pairs(xs: tuple) -> bool:
  """Whether every element of the tuple xs is a pair of python ints (a SHRINK's bounds; bools are not ints here)."""
  for x in xs:
    if type(x) is not tuple or len(x) != 2 or type(x[0]) is not int or type(x[1]) is not int: return False
  return True


def _int_pairs(xs) -> tuple[tuple[int, ...], ...]:
  # a SHRINK's bounds: pairs of python ints, most often already (a loop, not a generator of _ints: 2 us a SHRINK)
  return xs if type(xs) is tuple and _all_int_pairs(xs) else tuple(_ints(x) for x in xs)


def _py_scalar(v):
  if type(v) in (bool, int, float): return v
  if hasattr(v, "item") and not isinstance(v, UOp): v = v.item()   # numpy scalars
  if isinstance(v, bool): return bool(v)
  if isinstance(v, int): return int(v)
  if isinstance(v, float): return float(v)
  raise UOpError(f"a CONST holds a python bool, int or float, got {_show(v)}")


def _tree_repr(root: UOp, budget: int = 4000) -> str:
  """UOp(Ops.MUL, src=(UOp(...), ...)): a tree (shared nodes repeat), cut off at `budget` characters so a
  DAG with exponentially many paths prints quickly. Iterative."""
  parts: list[str] = []
  size = 0
  stack: list[UOp | str] = [root]
  while stack and size < budget:
    u = stack.pop()
    if isinstance(u, str): parts.append(u); size += len(u); continue
    s = f"UOp({u.op}, arg={u.arg!r}" if u.arg is not None else f"UOp({u.op}"
    if u.src:
      s += ", src=("
      stack.append(",))" if len(u.src) == 1 else "))")
      for i in range(len(u.src) - 1, -1, -1):
        stack.append(u.src[i])
        if i: stack.append(", ")
    else: s += ")"
    parts.append(s)
    size += len(s)
  return "".join(parts) + (" ..." if stack else "")


def users_of(nodes: list[UOp]) -> dict[UOp, list[UOp]]:
  """The inverse edges of a graph: for each node of `nodes` that something uses, its users among `nodes`, in order (a
  user appears once per edge, so x*x lists MUL twice)."""
  users: dict[UOp, list[UOp]] = {}
  for u in nodes:
    for s in u.src: users.setdefault(s, []).append(u)
  return users


def sink(*srcs: UOp) -> UOp:
  """The root of a program: a SINK of its effects."""
  return UOp(Ops.SINK, srcs)

def range_(end: int | UOp, idx: int, kind: AxisType = AxisType.LOOP) -> UOp:
  """A loop counter over [0, end): RANGE number `idx` (loops nest in idx order)."""
  if not isinstance(end, UOp):
    try: end = UOp.const(operator.index(end))
    except TypeError: raise UOpError(f"a RANGE ends at an integer, got {_show(end)}") from None
  return UOp(Ops.RANGE, (end,), RangeArg(idx, kind))

def stack(*xs) -> UOp:
  """STACK of the arguments: a new leading axis. Python literals become CONSTs typed like the first UOp
  argument (or by their own python type when there is none)."""
  like = next((x for x in xs if isinstance(x, UOp)), None)
  return UOp(Ops.STACK, tuple(x if isinstance(x, UOp) else (like.const_like(x) if like is not None else UOp.const(x)) for x in xs))

def buf(slot: int, n: int, dtype: DType = dtypes.f32) -> UOp:
  """A flat global BUFFER of n elements in argument slot `slot`."""
  if isinstance(n, bool) or not isinstance(n, int) and not hasattr(n, "__index__"):
    raise UOpError(f"buf: a buffer's size is an int, got {n!r}")   # int(2.5) made a 2-element buffer
  return UOp(Ops.BUFFER, (), ParamArg(slot, dtype, (operator.index(n),)))


# ---------------------------------------------------------------------------
# shape / dtype / addrspace inference. This is the type checker of the IR:
# every malformed UOp dies here, at construction time, with a useful message.

_shower = reprlib.Repr()
_shower.maxlevel, _shower.maxstring, _shower.maxother = 3, 60, 80

def _show(x) -> str:
  """repr(x) cut short: a hostile arg (a tuple nested 50,000 deep, a list of a million items) still gets a one-line error."""
  return _shower.repr(x)

# The rules below test first and format a message only on failure: building an f-string for every node made
# construction twice as slow. Each rule takes (op, src, arg) and returns (dtype, shape, addrspace).
_A = AddrSpace.ALU
_void, _bool, _i32 = dtypes.void, dtypes.bool, dtypes.i32
# module aliases of ops: `Ops.X` costs ~70ns in python 3.11 (EnumType's __getattr__ hook slows every class attribute)
_CAST, _FLOORDIV, _FLOORMOD, _CMPLT, _CMPNE, _BUFFER = Ops.CAST, Ops.FLOORDIV, Ops.FLOORMOD, Ops.CMPLT, Ops.CMPNE, Ops.BUFFER

def _malformed(op, src, e: Exception) -> Exception:
  # the rules assume UOp sources and a known op; a python error inside them means one of those did not hold
  if not isinstance(op, Ops) or op not in _RULES: return UOpError(f"no inference rule for {op!r}")
  for s in src:
    if type(s) is not UOp: return UOpError(f"{op!r}: sources must be UOps, got {type(s).__name__} {s!r}")
  return e

def _unhashable(op, src, arg) -> Exception:
  """The error for a node whose key can't be hashed: a bad op or source, else what the type checker says of the arg (it
  names a list given for a shape), else that the arg must be hashable."""
  if not isinstance(op, Ops) or op not in _RULES or any(type(s) is not UOp for s in src): return _malformed(op, src, TypeError())
  try: _RULES[op](op, src, arg)
  except UOpError as e: return e
  except Exception: pass
  return UOpError(f"{op!r}: the arg must be hashable (ints, floats, tuples, dtypes, ...), got {type(arg).__name__} {_show(arg)}")

def _same_as(x: UOp) -> tuple[DType, tuple[int, ...], AddrSpace]: return (x.dtype, x.shape, x.addrspace)

def _nsrc(op: Ops, src, n: int):
  if len(src) != n: raise UOpError(f"{op!r} takes {n} source{'s' if n != 1 else ''}, got {len(src)}")

def _paramarg(op: Ops, arg):
  # (each message is formatted only on failure: _show of every arg made a BUFFER cost 50 us)
  if not isinstance(arg, ParamArg): raise UOpError(f"{op!r} needs a ParamArg, got {_show(arg)}")
  if not (type(arg.slot) is int and arg.slot >= 0): raise UOpError(f"{op!r}: slot must be a non-negative int, got {arg.slot!r}")
  if not (isinstance(arg.dtype, DType) and arg.dtype is not _void): raise UOpError(f"{op!r}: bad dtype {arg.dtype!r}")
  if not (type(arg.shape) is tuple and all(type(s) is int and s >= 0 for s in arg.shape)): raise UOpError(f"{op!r}: bad shape {arg.shape!r}")

def _infer_const(op, src, arg):
  if src: raise UOpError("CONST has no sources")
  t = type(arg)
  if t is float: return dtypes.f32, (), _A
  if t is int:
    if not I32_MIN <= arg <= I32_MAX:   # (a 5000-digit int can't even be printed: python limits int -> str)
      raise UOpError(f"CONST {arg if arg.bit_length() <= 128 else f'of {arg.bit_length()} bits'} does not fit in i32")
    return _i32, (), _A
  if t is bool: return _bool, (), _A
  raise UOpError(f"CONST holds a python bool, int or float, got {_show(arg)}")

def _infer_param(op, src, arg):
  if src: raise UOpError("PARAM has no sources")
  _paramarg(op, arg)
  return arg.dtype, arg.shape, _A

def _infer_buffer(op, src, arg):
  if src: raise UOpError(f"{op.name} has no sources")
  _paramarg(op, arg)
  if len(arg.shape) != 1: raise UOpError(f"{op.name} is flat")
  # every address in generated code is an i32: a bigger buffer could never be indexed whole
  if arg.shape[0] > I32_MAX: raise UOpError(f"{op.name} of {arg.shape[0]} elements: an i32 index reaches at most {I32_MAX}")
  if op is Ops.BUFFER:
    if arg.dtype.count != 1: raise UOpError(f"a BUFFER holds scalars, got {arg.dtype.name} (a vector is a view of memory: INDEX's arg)")
    return arg.dtype, arg.shape, AddrSpace.GLOBAL
  space = AddrSpace.LOCAL if arg.addrspace is None else arg.addrspace
  # an ALLOC in ALU "memory" was a value that no LOAD or STORE accepts, its INDEX skipped by the memory-safety proof
  if space is not AddrSpace.LOCAL and space is not AddrSpace.SHARED: raise UOpError(f"ALLOC lives in LOCAL or SHARED memory, got {space!r}")
  return arg.dtype, arg.shape, space

def _infer_call(op, src, arg):
  if not src: raise UOpError("CALL needs a body")
  params: dict[int, UOp] = {}
  for u in call_params(src[0]):
    if params.setdefault(u.arg.slot, u) is not u:
      raise UOpError(f"CALL body has two PARAMs with slot {u.arg.slot}: {params[u.arg.slot].arg} and {u.arg}")
  slots = sorted(params)
  if slots != list(range(len(src) - 1)): raise UOpError(f"CALL needs params 0..{len(src)-2}, body has {slots}")
  for i, a in enumerate(src[1:]):
    p = params[i]
    if a.shape != p.shape or a.dtype is not p.dtype: raise UOpError(f"CALL arg {i}: {a.dtype}{a.shape} != param {p.dtype}{p.shape}")
  return _same_as(src[0])

def _infer_stack(op, src, arg):
  if not src: raise UOpError("STACK of nothing")
  s0 = src[0]
  shape, dtype = s0.shape, s0.dtype
  for s in src:
    if s.shape != shape or s.dtype is not dtype: raise UOpError("STACK srcs must agree in shape and dtype")
  if dtype is _void: raise UOpError("STACK of void")
  return dtype, (len(src),) + shape, _A

def _infer_index(op, src, arg):
  if not src: raise UOpError("INDEX needs something to index")
  x, n = src[0], len(src) - 1
  if n > len(x.shape): raise UOpError(f"INDEX: {n} indices into shape {x.shape}")
  for i in src[1:]:
    if i.dtype is not _i32 or i.shape != (): raise UOpError("INDEX indices are i32 scalars")
  if arg is None: return x.dtype, x.shape[n:], x.addrspace
  # a vector of consecutive elements: n scalars of flat memory from one index on
  if not (isinstance(arg, DType) and arg.count > 1 and arg.scalar() is x.dtype):
    raise UOpError(f"INDEX: the arg is a vector of the memory's {x.dtype.name} elements, got {_show(arg)}")
  if x.addrspace is _A or len(x.shape) != 1 or n != 1:
    raise UOpError(f"INDEX as {arg.name}: a vector is read from flat memory at one index, got {x.addrspace!r} of shape {x.shape} and {n} indices")
  return arg, (), x.addrspace

def _infer_gather(op, src, arg):
  if len(src) != 2: raise UOpError(f"GATHER takes (x, idx), got {len(src)} sources")
  x, idx = src
  if type(arg) is not int or arg < 0: raise UOpError(f"GATHER's arg is the number of batch axes, an int >= 0, got {_show(arg)}")
  if len(x.shape) <= arg: raise UOpError(f"GATHER picks along x's axis {arg}: x of shape {x.shape} has none ({x.dtype.name})")
  if idx.dtype is not _i32: raise UOpError(f"GATHER indices are i32, got {idx.dtype.name}")
  if x.dtype.count > 1: raise UOpError(f"GATHER reads scalars, got {x.dtype.name}")
  if idx.shape[:arg] != x.shape[:arg]: raise UOpError(f"GATHER with {arg} batch axes: indices {idx.shape} and x {x.shape} differ on them")
  return x.dtype, idx.shape + x.shape[arg + 1:], _A

def _infer_vectorize(op, src, arg):
  if len(src) < 2: raise UOpError(f"VECTORIZE makes a vector of 2 or more lanes, got {len(src)}")
  d = src[0].dtype
  for s in src:
    if s.dtype is not d or s.shape != (): raise UOpError(f"VECTORIZE lanes are scalars of one dtype, got {s.dtype.name}{list(s.shape)} and {d.name}")
  if d.count != 1 or d is _void: raise UOpError(f"VECTORIZE lanes are scalar values, got {d.name}")
  return d.vec(len(src)), (), _A

def _infer_gep(op, src, arg):
  if len(src) != 1: _nsrc(op, src, 1)
  d = src[0].dtype
  if d.count == 1: raise UOpError(f"GEP takes a lane of a vector, got a {d.name}")
  if type(arg) is not int or not 0 <= arg < d.count: raise UOpError(f"GEP: lane {_show(arg)} of a {d.name} (lanes 0..{d.count - 1})")
  return d.scalar(), (), _A

def _infer_where(op, src, arg):
  if len(src) != 3: _nsrc(op, src, 3)
  c, a, b = src
  if c.dtype is not (_bool if a.dtype.count == 1 else _bool.vec(a.dtype.count)):
    raise UOpError("WHERE condition must be bool" if a.dtype.count == 1 else
                   f"WHERE of {a.dtype.name}: the condition must be {_bool.vec(a.dtype.count).name}, got {c.dtype.name}")
  if a.dtype is not b.dtype: raise UOpError(f"WHERE branches disagree: {a.dtype} vs {b.dtype}")
  if not c.shape == a.shape == b.shape: raise UOpError(f"WHERE shape mismatch {c.shape} {a.shape} {b.shape}")
  if a.dtype is _void: raise UOpError("WHERE of void")
  return a.dtype, a.shape, _A

def _infer_mulacc(op, src, arg):
  if len(src) != 3: _nsrc(op, src, 3)
  a, b, c = src
  if not a.shape == b.shape == c.shape: raise UOpError(f"MULACC shape mismatch {a.shape} {b.shape} {c.shape}")
  if not (a.dtype is b.dtype is c.dtype and a.dtype.scalar() is dtypes.f32): raise UOpError(f"MULACC is f32 only, got {a.dtype} {b.dtype} {c.dtype}")
  return a.dtype, a.shape, _A

def _infer_unary(op, src, arg):
  if len(src) != 1: raise UOpError(f"{op} is unary")
  x = src[0]
  if op is _CAST:
    if not isinstance(arg, DType) or arg is _void: raise UOpError(f"CAST needs a value dtype as its arg, got {_show(arg)}")
    if x.dtype is _void: raise UOpError("CAST of void")
    if arg.count != x.dtype.count: raise UOpError(f"CAST of {x.dtype.name} to {arg.name}: a cast keeps the lanes")
    return arg, x.shape, _A
  if not x.dtype.is_float: raise UOpError(f"{op} needs a float, got {x.dtype}")
  return x.dtype, x.shape, _A

def _infer_binary(op, src, arg):
  if len(src) != 2: _nsrc(op, src, 2)
  a, b = src
  if a.shape != b.shape: raise UOpError(f"{op}: shape mismatch {a.shape} vs {b.shape} (broadcast with EXPAND)")
  dtype = a.dtype
  if dtype is not b.dtype: raise UOpError(f"{op}: dtype mismatch {dtype} vs {b.dtype} (use CAST)")
  if dtype is _void: raise UOpError(f"{op} of void")
  if (op is _FLOORDIV or op is _FLOORMOD) and dtype.scalar() is not _i32: raise UOpError(f"{op} is integer only")
  if op is _CMPLT or op is _CMPNE: return (_bool if dtype.count == 1 else _bool.vec(dtype.count)), a.shape, _A
  return dtype, a.shape, _A

def _infer_load(op, src, arg):
  if len(src) != 1: _nsrc(op, src, 1)
  if src[0].addrspace is _A: raise UOpError("LOAD needs memory")
  return src[0].dtype, src[0].shape, _A

def _infer_store(op, src, arg):
  if len(src) != 2: _nsrc(op, src, 2)
  if src[0].addrspace is _A: raise UOpError("STORE needs memory")
  if src[0].dtype is not src[1].dtype: raise UOpError(f"STORE of {src[1].dtype} into {src[0].dtype}")
  return _void, (), _A

def _infer_after(op, src, arg):
  if not src: raise UOpError("AFTER needs the memory it orders")
  return _same_as(src[0])

def _infer_void(op, src, arg): return _void, (), _A

def _infer_end(op, src, arg):
  if not src: raise UOpError("END needs the statement it closes loops after")
  for r in src[1:]:
    if r.op is not Ops.RANGE: raise UOpError(f"END closes RANGEs, got {r.op!r}")
  return _void, (), _A

def _infer_range(op, src, arg):
  if len(src) != 1: _nsrc(op, src, 1)
  if src[0].dtype is not _i32: raise UOpError("RANGE end is i32")
  if src[0].shape != (): raise UOpError("RANGE end is a scalar")
  if not isinstance(arg, RangeArg): raise UOpError(f"RANGE needs a RangeArg, got {_show(arg)}")
  return _i32, (), _A

def _shape_arg(op, arg):
  # (a loop, not all() of a generator: every RESHAPE and EXPAND a Tensor op builds comes through here)
  if type(arg) is tuple:
    for s in arg:
      if type(s) is not int or s < 0: break
    else: return
  raise UOpError(f"{op.name} needs a tuple of non-negative ints, got {_show(arg)}")

def _infer_reshape(op, src, arg, _prod=math.prod):
  if len(src) != 1: _nsrc(op, src, 1)
  _shape_arg(op, arg)
  if _prod(arg) != _prod(src[0].shape): raise UOpError(f"RESHAPE {src[0].shape} -> {_show(arg)}")
  return src[0].dtype, arg, src[0].addrspace

def _infer_expand(op, src, arg):
  if len(src) != 1: _nsrc(op, src, 1)
  s = src[0].shape
  # the shape's check and the broadcast's in one loop (a Tensor op's every broadcast comes through here)
  if type(arg) is tuple and len(arg) == len(s):
    for a, b in zip(s, arg):
      if type(b) is not int or (a != b and (a != 1 or b < 0)): break
    else: return src[0].dtype, arg, src[0].addrspace
  _shape_arg(op, arg)
  raise UOpError(f"EXPAND {s} -> {_show(arg)}")

def _infer_permute(op, src, arg):
  if len(src) != 1: _nsrc(op, src, 1)
  s = src[0].shape
  # ints alone: a float can't index the shape, and (True, False) sorted as (0, 1)
  if type(arg) is not tuple or not all([type(a) is int for a in arg]) or sorted(arg) != list(range(len(s))):
    raise UOpError(f"PERMUTE {_show(arg)} of {s}")
  return src[0].dtype, tuple([s[a] for a in arg]), src[0].addrspace

def _infer_shrink(op, src, arg):
  if len(src) != 1: _nsrc(op, src, 1)
  s = src[0].shape
  # (a loop, not all() of a generator: a convolution's windows are nine SHRINKs a call)
  if type(arg) is tuple and len(arg) == len(s):
    out = []
    for p, n in zip(arg, s):
      if type(p) is not tuple or len(p) != 2 or type(p[0]) is not int or type(p[1]) is not int or not 0 <= p[0] <= p[1] <= n: break
      out.append(p[1] - p[0])
    else: return src[0].dtype, tuple(out), src[0].addrspace
  raise UOpError(f"SHRINK {_show(arg)} of {s}")

def _infer_reduce(op, src, arg):
  if len(src) != 1: _nsrc(op, src, 1)
  ok = type(arg) is tuple and len(arg) == 2 and arg[0] in (Ops.ADD, Ops.MAX) and type(arg[1]) is int
  if not ok or not 0 <= arg[1] <= len(src[0].shape): raise UOpError(f"REDUCE {_show(arg)} of {src[0].shape}")
  if src[0].dtype is _void: raise UOpError("REDUCE of void")
  return src[0].dtype, src[0].shape[:len(src[0].shape) - arg[1]], _A

def _infer_stage(op, src, arg):
  if len(src) != 1: _nsrc(op, src, 1)
  return src[0].dtype, src[0].shape, _A

def _async_index(what: str, x, space, lanes: int = 0) -> None:
  if x.op is not Ops.INDEX or x.arg is None or x.addrspace is not space or (lanes and x.dtype.count != lanes):
    raise UOpError(f"{what} is a vector INDEX of {space.name} memory{f' of {lanes} lanes' if lanes else ''}, got "
                   f"{x.op.name} ({x.addrspace.name} {x.dtype.name})")

def _infer_async_copy(op, src, arg):
  if len(src) != 3: _nsrc(op, src, 3)
  dst, source, valid = src
  _async_index("ASYNC_COPY's destination", dst, AddrSpace.SHARED)
  _async_index("ASYNC_COPY's source", source, AddrSpace.GLOBAL)
  if dst.dtype is not source.dtype: raise UOpError(f"ASYNC_COPY of {source.dtype.name} into {dst.dtype.name}")
  if dst.dtype.itemsize != 16: raise UOpError(f"ASYNC_COPY moves 16 bytes, got a {dst.dtype.name}")
  if valid.dtype is not _bool or valid.shape != (): raise UOpError(f"ASYNC_COPY's valid is a bool scalar, got {valid.dtype.name}")
  return _void, (), _A

def _infer_async_wait(op, src, arg):
  if type(arg) is not int or arg < 0: raise UOpError(f"ASYNC_WAIT's arg is the groups left in flight, an int >= 0, got {_show(arg)}")
  return _void, (), _A

def _infer_ldmatrix(op, src, arg):
  if len(src) != 1: _nsrc(op, src, 1)
  if not (type(arg) is tuple and len(arg) == 2 and arg[0] in (1, 2, 4) and type(arg[0]) is int and type(arg[1]) is bool):
    raise UOpError(f"LDMATRIX's arg is (matrices: 1, 2 or 4, trans: bool), got {_show(arg)}")
  _async_index("LDMATRIX's row", src[0], AddrSpace.SHARED, 8)
  if src[0].dtype.scalar() is not dtypes.f16: raise UOpError(f"LDMATRIX loads f16 matrices, got {src[0].dtype.name}")
  return dtypes.f16, (2 * arg[0],), _A

def _infer_wmma(op, src, arg):
  if len(src) < 3: raise UOpError("WMMA takes (a, b, c)")
  return src[2].dtype, src[2].shape, _A

_RULES: dict[Ops, Callable] = {
  Ops.CONST: _infer_const, Ops.PARAM: _infer_param, Ops.BUFFER: _infer_buffer, Ops.ALLOC: _infer_buffer,
  Ops.CALL: _infer_call, Ops.STACK: _infer_stack, Ops.INDEX: _infer_index, Ops.WHERE: _infer_where, Ops.MULACC: _infer_mulacc,
  Ops.GATHER: _infer_gather,
  **{op: _infer_unary for op in UNARY}, **{op: _infer_binary for op in BINARY},
  Ops.LOAD: _infer_load, Ops.STORE: _infer_store, Ops.AFTER: _infer_after, Ops.SINK: _infer_void, Ops.BARRIER: _infer_void,
  Ops.END: _infer_end, Ops.RANGE: _infer_range, Ops.RESHAPE: _infer_reshape, Ops.EXPAND: _infer_expand,
  Ops.PERMUTE: _infer_permute, Ops.SHRINK: _infer_shrink, Ops.REDUCE: _infer_reduce, Ops.STAGE: _infer_stage,
  Ops.WMMA: _infer_wmma, Ops.ASYNC_COPY: _infer_async_copy, Ops.ASYNC_COMMIT: _infer_void, Ops.ASYNC_WAIT: _infer_async_wait,
  Ops.LDMATRIX: _infer_ldmatrix, Ops.VECTORIZE: _infer_vectorize, Ops.GEP: _infer_gep,
}


def call_params(body: UOp) -> list[UOp]:
  """The PARAMs of this body's own scope. A CALL inside it is a scope of its own: its arguments (src[1:]) belong to this
  body, its body (src[0]) does not, even though a hash-consed PARAM slot=0 may be the very node this body uses."""
  found: list[UOp] = []
  visited: set[UOp] = set()
  todo = [body]
  while todo:
    u = todo.pop()
    if u in visited: continue
    visited.add(u)
    if u.op is Ops.PARAM: found.append(u)
    todo += u.src[1:] if u.op is Ops.CALL else u.src
  return found
