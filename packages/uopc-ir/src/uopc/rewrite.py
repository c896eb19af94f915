"""The rewrite engine: passes as tables of rules.

    UPat            a pattern over UOps: op(s), sources (in order, any order, or any), arg, dtype, a capture name
    PatternMatcher  [(UPat, fn), ...]: fn(**captures) or fn(ctx, **captures) returns a replacement or None
    graph_rewrite   rewrites a whole graph to a fixed point, sources before users, with an explicit stack

Most of the compiler is rules of the form "an ADD whose second source is CONST 0 becomes its first source".
Because every node has the same shape (op, src, arg), one matcher serves every rule, and a pass is data:
a PatternMatcher whose rules read like the laws they implement. The matcher indexes its rules by op once,
so rewriting a node only tries the rules that can match it.

graph_rewrite memoizes per node and rebuilds users of a rewritten node through UOp(...), so the result is
hash consed. It checks that every replacement keeps the node's dtype and shape: a rule that turns a bool
into an i32 is a bug, and the error names the rule's file and line.
"""
from __future__ import annotations
import inspect, itertools
from typing import Any, Callable, Iterable
from uopc.uop import UOp, Ops, _argkey
from uopc.dtype import DType

_ANY = object()   # "match any arg": None is a real arg value, so it can't be the wildcard of `arg`


class RewriteError(Exception):
  """A rule produced a bad replacement, or the rules rewrite a node back into itself forever."""


class UPat:
  """A pattern. op: an Ops, a set of Ops or None (any). src: a tuple (in order), a list (any permutation, for
  COMMUTATIVE ops), a single UPat (every source matches it) or None (any). arg: a value to compare exactly
  (1, 1.0 and True are different) or omitted. dtype: a DType or a set of them. name: capture the node; a name
  used twice must bind the same node."""
  __slots__ = ("ops", "src", "arg", "argkey", "name", "dtypes", "kind", "unique")

  def __init__(self, op: Ops | Iterable[Ops] | None = None, src: tuple | list | UPat | None = None, arg: Any = _ANY,
               name: str | None = None, dtype: DType | Iterable[DType] | None = None):
    try: self.ops = None if op is None else (frozenset((op,)) if isinstance(op, Ops) else frozenset(op))
    except TypeError: raise RewriteError(f"UPat op must be an Ops, a set of Ops or None, got {op!r}") from None
    if self.ops is not None and not all(isinstance(o, Ops) for o in self.ops):
      raise RewriteError(f"UPat op must be an Ops, a set of Ops or None, got {op!r}")
    try: self.dtypes = None if dtype is None else (frozenset((dtype,)) if isinstance(dtype, DType) else frozenset(dtype))
    except TypeError: raise RewriteError(f"UPat dtype must be a DType, a set of them or None, got {dtype!r}") from None
    self.arg, self.argkey = arg, (None if arg is _ANY else _argkey(arg))
    self.name = name
    if src is None: self.kind, self.src = "any", ()
    elif isinstance(src, UPat): self.kind, self.src = "all", (src,)
    elif isinstance(src, list): self.kind, self.src = "perm", tuple(src)
    elif isinstance(src, tuple): self.kind, self.src = "seq", src
    else: raise RewriteError(f"UPat src must be a tuple, a list, a UPat or None, got {src!r}")
    for s in self.src:
      if not isinstance(s, UPat): raise RewriteError(f"UPat sources must be UPats, got {s!r}")
    # without a permutation anywhere below, a pattern matches a node in at most one way: the fast path (match1)
    self.unique = self.kind != "perm" and all(s.unique for s in self.src)

  @staticmethod
  def var(name: str | None = None, dtype: DType | Iterable[DType] | None = None) -> UPat: return UPat(name=name, dtype=dtype)
  @staticmethod
  def cvar(name: str | None = None, dtype: DType | Iterable[DType] | None = None) -> UPat:
    return UPat(Ops.CONST, name=name, dtype=dtype)
  @staticmethod
  def const(value, name: str | None = None) -> UPat: return UPat(Ops.CONST, arg=value, name=name)

  # sugar, so that rules read like the laws they implement: UPat.var("x") * 1 matches x*1 and 1*x
  def _up(self, x) -> UPat: return x if isinstance(x, UPat) else UPat.const(x)
  def __add__(self, x): return UPat(Ops.ADD, [self, self._up(x)])
  __radd__ = __add__
  def __mul__(self, x): return UPat(Ops.MUL, [self, self._up(x)])
  __rmul__ = __mul__
  def __floordiv__(self, x): return UPat(Ops.FLOORDIV, (self, self._up(x)))
  def __mod__(self, x): return UPat(Ops.FLOORMOD, (self, self._up(x)))
  def __lt__(self, x): return UPat(Ops.CMPLT, (self, self._up(x)))
  def ne(self, x): return UPat(Ops.CMPNE, [self, self._up(x)])
  def maximum(self, x): return UPat(Ops.MAX, [self, self._up(x)])

  def names(self) -> set[str]:
    out, stack = set(), [self]
    while stack:
      p = stack.pop()
      if p.name is not None: out.add(p.name)
      stack.extend(p.src)
    return out

  def match1(self, u: UOp, store: dict[str, UOp]) -> bool:
    """The one way a `unique` pattern matches u, written into `store` (which is garbage when this returns False)."""
    if self.ops is not None and u.op not in self.ops: return False
    if self.dtypes is not None and u.dtype not in self.dtypes: return False
    if self.argkey is not None and _argkey(u.arg) != self.argkey: return False
    if self.name is not None and store.setdefault(self.name, u) is not u: return False
    kind = self.kind
    if kind == "any": return True
    src = u.src
    if kind == "all":
      p = self.src[0]
      for s in src:
        if not p.match1(s, store): return False
      return True
    if len(src) != len(self.src): return False
    for p, s in zip(self.src, src):
      if not p.match1(s, store): return False
    return True

  def match(self, u: UOp, store: dict[str, UOp]) -> list[dict[str, UOp]]:
    """Every way u matches this pattern, each as the captures extended from `store`. Recursion here is on the
    depth of the pattern, which is written by hand and small, never on the depth of the graph."""
    if self.ops is not None and u.op not in self.ops: return []
    if self.dtypes is not None and u.dtype not in self.dtypes: return []
    if self.argkey is not None and _argkey(u.arg) != self.argkey: return []
    if self.name is not None:
      prev = store.get(self.name)
      if prev is None: store = {**store, self.name: u}
      elif prev is not u: return []
    kind = self.kind
    if kind == "any": return [store]
    src = u.src
    if kind == "all":
      stores = [store]
      for s in src: stores = [r for st in stores for r in self.src[0].match(s, st)]
      return stores
    if len(src) != len(self.src): return []
    if kind == "seq": return _match_seq(self.src, src, store)
    out: list[dict[str, UOp]] = []
    for perm in itertools.permutations(self.src):
      out.extend(_match_seq(perm, src, store))
    return out

  def __repr__(self):
    ops = None if self.ops is None else "{" + ", ".join(sorted(o.name for o in self.ops)) + "}"
    parts = [f"op={ops}"] if ops else []
    if self.name: parts.append(f"name={self.name!r}")
    if self.argkey is not None: parts.append(f"arg={self.arg!r}")
    if self.kind != "any": parts.append(f"src={self.src!r}")
    return f"UPat({', '.join(parts)})"


def _match_seq(pats: tuple[UPat, ...], src: tuple[UOp, ...], store: dict) -> list[dict]:
  stores = [store]
  for p, s in zip(pats, src):
    stores = [r for st in stores for r in p.match(s, st)]
    if not stores: break
  return stores


_ALL_OPS = tuple(Ops)

class PatternMatcher:
  """Rules [(UPat, fn), ...], tried in order; the first fn that returns a UOp wins. fn takes the captures as
  keyword arguments, and `ctx` too when it has a parameter of that name. The rules are indexed by op once."""
  def __init__(self, patterns: list[tuple[UPat, Callable]]):
    try: self.patterns = [(pat, fn) for pat, fn in patterns]
    except (TypeError, ValueError): raise RewriteError(f"PatternMatcher takes a list of (UPat, function) pairs, got {patterns!r}") from None
    self.pdict: dict[Ops, list[tuple[UPat, Callable, bool]]] = {}
    for pat, fn in self.patterns:
      if not isinstance(pat, UPat): raise RewriteError(f"PatternMatcher: {pat!r} is not a UPat")
      if not callable(fn): raise RewriteError(f"PatternMatcher: the rule for {pat!r} is {fn!r}, not a function")
      params = inspect.signature(fn).parameters
      has_ctx = "ctx" in params
      if not any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        if missing := pat.names() - set(params):
          raise RewriteError(f"PatternMatcher: rule {_where(fn)} does not take the capture(s) {sorted(missing)} of {pat!r}")
      for op in (pat.ops if pat.ops is not None else _ALL_OPS): self.pdict.setdefault(op, []).append((pat, fn, has_ctx))

  def __add__(self, more: PatternMatcher) -> PatternMatcher: return PatternMatcher(self.patterns + more.patterns)

  def rewrite(self, u: UOp, ctx: Any = None) -> UOp | None:
    """The replacement of u by the first rule that gives one, or None."""
    r = self._rewrite(u, ctx)
    return None if r is None else r[0]

  def _rewrite(self, u: UOp, ctx: Any) -> tuple[UOp, Callable] | None:
    for pat, fn, has_ctx in self.pdict.get(u.op, ()):
      if pat.unique:
        store: dict[str, UOp] = {}
        if not pat.match1(u, store): continue
        ret = fn(ctx=ctx, **store) if has_ctx else fn(**store)
        if ret is not None and ret is not u: return ret, fn
        continue
      for store in pat.match(u, {}):
        ret = fn(ctx=ctx, **store) if has_ctx else fn(**store)
        if ret is not None and ret is not u: return ret, fn
    return None


def _where(fn: Callable) -> str:
  code = getattr(fn, "__code__", None)
  return f"{getattr(fn, '__qualname__', fn)} ({code.co_filename}:{code.co_firstlineno})" if code else repr(fn)


class _Memo:
  """A memo that stores each node's result on the node itself (its __dict__), so it is global and dies with the
  node; a dict keyed by UOps would keep every node it ever saw alive. A node that is its own result stores a
  marker, not itself, so no node refers to itself and plain reference counting frees it."""
  __slots__ = ("attr",)
  _SELF = object()
  def __init__(self, attr: str): self.attr = attr
  def get(self, u: UOp, default=None):
    r = getattr(u, self.attr, default)
    return u if r is _Memo._SELF else r
  def __setitem__(self, u: UOp, v: UOp): setattr(u, self.attr, _Memo._SELF if v is u else v)


def graph_rewrite(root: UOp, pm: PatternMatcher, ctx: Any = None, bottom_up: bool = False, check: bool = True,
                  memo: Any = None) -> UOp:
  """Rewrite every node of the graph under `root` with `pm` to a fixed point and return the new root.

  Sources are rewritten before their users; a user whose sources changed is rebuilt (and so re-hash-consed),
  then its own rules are applied until none matches; a replacement is itself rewritten the same way. With
  bottom_up=True the rules are also tried on each node *before* its sources, so a rule can see (and replace)
  a subgraph before anything below it changes. `memo` (node -> result, a dict by default) may be shared
  between calls. With `check`, a rule whose replacement has another dtype or shape raises RewriteError."""
  if not isinstance(root, UOp): raise RewriteError(f"graph_rewrite rewrites a UOp, got {type(root).__name__}")
  if not isinstance(pm, PatternMatcher): raise RewriteError(f"graph_rewrite needs a PatternMatcher, got {type(pm).__name__}")
  done = {} if memo is None else memo
  get, put = done.get, done.__setitem__
  rewrite = pm._rewrite
  active: set[UOp] = set()          # nodes whose result is being computed: meeting one again means the rules loop
  stack: list[tuple] = [(root, 0, None)]
  pop, push = stack.pop, stack.append
  while stack:
    n, stage, extra = pop()
    if stage == 0:
      if get(n) is not None: continue
      if n in active: raise RewriteError(f"graph_rewrite: the rules loop, {n.op!r} is rewritten back into itself: {_short(n)}")
      active.add(n)
      if bottom_up and (r := _fixpoint(rewrite, n, ctx, check)) is not n:
        push((n, 2, r)); push((r, 0, None))
        continue
      push((n, 1, None))
      for s in reversed(n.src):
        if get(s) is None: push((s, 0, None))
    elif stage == 1:
      src = n.src
      new_src = tuple([get(s) for s in src])
      new = n if new_src == src else UOp(n.op, new_src, n.arg)
      if (r := rewrite(new, ctx)) is None:
        put(n, new)
        if new is not n: put(new, new)
        active.discard(n)
        continue
      if check: _check_replacement(new, r[0], r[1])
      push((n, 2, r[0])); push((r[0], 0, None))
    else:
      put(n, get(extra))
      active.discard(n)
  return get(root)


def _fixpoint(rewrite, n: UOp, ctx, check: bool) -> UOp:
  seen = {n}
  while (r := rewrite(n, ctx)) is not None:
    if check: _check_replacement(n, r[0], r[1])
    n = r[0]
    if n in seen: raise RewriteError(f"graph_rewrite: the rules loop on {_short(n)}")
    seen.add(n)
  return n


def _check_replacement(old: UOp, new: UOp, fn: Callable):
  if type(new) is not UOp: raise RewriteError(f"graph_rewrite: rule {_where(fn)} returned {new!r}, not a UOp or None")
  if new.dtype is not old.dtype or new.shape != old.shape:
    raise RewriteError(f"graph_rewrite: rule {_where(fn)} changed {old.op!r} {old.dtype}{old.shape} into {new.op!r} {new.dtype}{new.shape}; "
                       "a replacement must keep the dtype and shape")


def _short(u: UOp) -> str:
  r = repr(u)
  return r if len(r) < 200 else r[:200] + " ..."
