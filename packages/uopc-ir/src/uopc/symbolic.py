"""Symbolic algebra: `simplify` and `bounds` for the index arithmetic that rangeify produces.

    simplify(u)   -> an equal graph in normal form (graph_rewrite with the `symbolic` PatternMatcher)
    bounds(u)     -> (lo, hi): every value u can take, for i32 and bool expressions; vmin/vmax for one side

Index arithmetic is integer arithmetic over loop counters: ravel gives i*N + j, unravel gives (f//N)%M,
and their compositions must collapse (unravel(ravel(idx)) is idx) or the compiler makes wrong structural
decisions (a reduction nested in a loop its index only *seems* to use). Two tools do the work:

* bounds: an interval per node (RANGE is [0, end-1], MUL takes the four corners, ...), computed once
  and stored on the node. "x//c is 0 because 0 <= x < c" and "i < 4 is true" are bounds facts.
* a normal form for sums: an i32 sum is flattened into terms coefficient*base, like terms are collected,
  and the terms are put in a canonical order (outer loops first, constants last), so equal sums are the
  same node and the div/mod laws can see every term: (a*c + b)//c = a + b//c, (a*c + b)%c = b%c.

Every rule is exact. Integer rules hold under floor division and modulo; the ring rules (reordering,
collecting, distributing) hold modulo 2**32 too, so they are exact under i32 wrap-around, and the div/mod
rules, which are not, fire only when bounds prove the dividend's arithmetic can't wrap. Float rules are only
the IEEE-exact ones (x*1.0, x+(-0.0), folding in f32); never x*0 -> 0 or reassociation on floats.

simplify is memoized globally: each node keeps its result in its own __dict__, so the memo dies with the node.
"""
from __future__ import annotations
import math, zlib
from uopc.uop import UOp, Ops, RangeArg, ParamArg, CallArg, UOpError, ALU, AxisType
from uopc.dtype import DType, dtypes, I32_MIN, I32_MAX
from uopc.rewrite import UPat, PatternMatcher, graph_rewrite, _Memo
from uopc.evaluate import exec_alu, cast_value, const_value, wrap_i32 as _wrap, EvalError

# module aliases: `Ops.X` is slow in python 3.11 (EnumType's __getattr__ hook), and these run per node
_ADD, _MUL, _CONST, _RANGE, _FLOORDIV, _FLOORMOD = Ops.ADD, Ops.MUL, Ops.CONST, Ops.RANGE, Ops.FLOORDIV, Ops.FLOORMOD
_CMPLT, _CMPNE, _MAX, _WHERE, _CAST = Ops.CMPLT, Ops.CMPNE, Ops.MAX, Ops.WHERE, Ops.CAST
_GEP, _VECTORIZE = Ops.GEP, Ops.VECTORIZE
_i32, _bool, _f32 = dtypes.i32, dtypes.bool, dtypes.f32


# ---- per-node facts, computed once and kept on the node -----------------------------------------------------------

def _fill(u: UOp, attr: str, compute) -> None:
  """Compute the cached attribute `attr` for u and every node below it that lacks it, sources first. Iterative."""
  if hasattr(u, attr): return
  stack: list[tuple[UOp, bool]] = [(u, False)]
  while stack:
    n, ready = stack.pop()
    if hasattr(n, attr): continue
    if ready: setattr(n, attr, compute(n)); continue
    stack.append((n, True))
    stack.extend((s, False) for s in n.src if not hasattr(s, attr))


def _full(d: DType) -> tuple:
  if d is _i32: return (I32_MIN, I32_MAX, True)
  if d is _bool: return (0, 1, True)
  return (-math.inf, math.inf, True)

def _fit(lo: int, hi: int, exact: bool) -> tuple:
  # an interval that leaves i32 means the value may have wrapped: then anything is possible, and it is not exact
  if lo < I32_MIN or hi > I32_MAX: return (I32_MIN, I32_MAX, False)
  return (lo, hi, exact)

def _compute_bounds(u: UOp) -> tuple:
  """(lo, hi, exact): lo <= u <= hi for every value of the loop counters and inputs; exact when the ADD/MUL
  arithmetic that produced u can't have wrapped around (the div/mod laws need that)."""
  op, d = u.op, u.dtype
  if op is _GEP: return u.src[0]._bounds        # a lane of a vector lies within the vector's bounds
  if d.count > 1:
    # a vector's bounds hold for every lane: its lanes' union for VECTORIZE; lane by lane, the scalar rules below
    if op is _VECTORIZE:
      lanes = [s._bounds for s in u.src]
      return (min(b[0] for b in lanes), max(b[1] for b in lanes), all(b[2] for b in lanes))
    d = d.scalar()
  if d is not _i32 and d is not _bool:
    if op is _CONST: return (u.arg, u.arg, True)
    return _full(d)
  if op is _CONST: return (int(u.arg), int(u.arg), True)
  if op is _RANGE:
    return (0, max(u.src[0]._bounds[1] - 1, 0), True)
  src = u.src
  if op is _WHERE:
    c, a, b = src[0]._bounds, src[1]._bounds, src[2]._bounds
    if c[0] == c[1] == 1: return a
    if c[0] == c[1] == 0: return b
    return (min(a[0], b[0]), max(a[1], b[1]), True)
  if op is _CAST:
    s = src[0]._bounds
    if src[0].dtype.is_float: return _full(d)
    if d is _bool: return (0, 0, True) if s[0] == s[1] == 0 else ((1, 1, True) if s[0] > 0 or s[1] < 0 else (0, 1, True))
    return (s[0], s[1], True)
  if len(src) != 2 or src[0].dtype is not src[1].dtype or src[0].dtype.is_float:
    return (0, 1, True) if d is _bool else _full(d)
  (alo, ahi, ax), (blo, bhi, bx) = src[0]._bounds, src[1]._bounds
  if op is _CMPLT:
    return (1, 1, True) if ahi < blo else ((0, 0, True) if alo >= bhi else (0, 1, True))
  if op is _CMPNE:
    if ahi < blo or bhi < alo: return (1, 1, True)
    return (0, 0, True) if alo == ahi == blo == bhi else (0, 1, True)
  if d is _bool:   # _Bool arithmetic: + and max are "or", * is "and"
    if op is _MUL: return (alo & blo, ahi & bhi, True)
    return (alo | blo, ahi | bhi, True)
  if op is _ADD: return _fit(alo + blo, ahi + bhi, ax and bx)
  if op is _MUL:
    c = (alo * blo, alo * bhi, ahi * blo, ahi * bhi)
    return _fit(min(c), max(c), ax and bx)
  if op is _MAX: return (max(alo, blo), max(ahi, bhi), True)
  if op is _FLOORDIV:
    if blo > 0 or bhi < 0:   # the divisor keeps one sign: floor division is monotone in each argument, so corners bound it
      c = (alo // blo, alo // bhi, ahi // blo, ahi // bhi)
      return _fit(min(c), max(c), True)
    return _full(d)
  if op is _FLOORMOD:
    if blo > 0:
      if blo == bhi and alo // blo == ahi // blo: return (alo % blo, ahi % blo, True)
      if alo >= 0 and ahi < blo: return (alo, ahi, True)
      return (0, bhi - 1, True)
    if bhi < 0: return (blo + 1, 0, True)
    return _full(d)
  return _full(d)


def _bounds_of(u: UOp) -> tuple:
  try: return u._bounds
  except AttributeError:
    _fill(u, "_bounds", _compute_bounds)
    return u._bounds

def bounds(u: UOp) -> tuple:
  """(lo, hi) with lo <= u <= hi for every value u can take: ints for i32, bools for bool, floats otherwise."""
  if not isinstance(u, UOp): raise UOpError(f"bounds takes a UOp, got {type(u).__name__}")
  lo, hi, _ = _bounds_of(u)
  return (bool(lo), bool(hi)) if u.dtype.scalar() is _bool else (lo, hi)

def vmin(u: UOp): return bounds(u)[0]
def vmax(u: UOp): return bounds(u)[1]


def _stable_arg(a):
  # python's hash of a str changes from process to process; everything else here hashes the same every run
  if isinstance(a, str): return zlib.crc32(a.encode())
  if isinstance(a, tuple): return tuple(_stable_arg(x) for x in a)
  if isinstance(a, DType): return zlib.crc32(a.name.encode())
  if isinstance(a, (Ops,)): return a.value
  if isinstance(a, RangeArg): return (a.idx, a.kind.value)
  if isinstance(a, ParamArg): return (a.slot, _stable_arg(a.dtype), a.shape, a.addrspace.value if a.addrspace else 0)
  if isinstance(a, CallArg): return _stable_arg(a.name)
  if isinstance(a, float): return a if a == a else -0x7FC00000   # hash(nan) is by identity since python 3.10
  if a is None: return -0x4E6F6E65            # before python 3.12 hash(None) is None's address: different in every process
  return a if isinstance(a, (int, bool)) else zlib.crc32(repr(a).encode())

def _compute_key(u: UOp) -> tuple:
  """Sort key of a term: (the outermost RANGE it uses, its op, a structural hash). Outer loops first keeps the
  loop-invariant prefix of an index (ridx0*4 + ...) together, so it can be hoisted; the hash is the same in every
  process, so the order (and the generated C) is too."""
  first = u.arg.idx if u.op is _RANGE else min((s._order[0] for s in u.src), default=1 << 30)
  return (first, u.op.value, hash((u.op.value, _stable_arg(u.arg), *(s._order[2] for s in u.src))))

def _key(u: UOp) -> tuple:
  try: return u._order
  except AttributeError:
    _fill(u, "_order", _compute_key)
    return u._order


# ---- sums and products in normal form -------------------------------------------------------------------------

_MAX_TERMS = 16   # index sums are short; a cap keeps a 200,000-term chain linear instead of quadratic

def _leaves(u: UOp, op: Ops) -> list[UOp] | None:
  """The operands of the tree of i32 `op` nodes (ADD for a sum, MUL for a product) under u, or None past _MAX_TERMS."""
  out, stack = [], [u]
  while stack:
    n = stack.pop()
    if n.op is op and n.dtype is _i32: stack.append(n.src[1]); stack.append(n.src[0])
    else: out.append(n)
    # each pending entry is at least one more leaf: counting only `out` walked a left-deep chain's whole spine first
    if len(out) + len(stack) > _MAX_TERMS: return None
  return out

def _split(t: UOp) -> tuple[UOp | None, int]:
  """A term as (base, coefficient): x*3 -> (x, 3), x -> (x, 1), 5 -> (None, 5). Products keep their constant last."""
  if t.op is _CONST: return None, t.arg
  if t.op is _MUL and t.src[1].op is _CONST: return t.src[0], t.src[1].arg
  return t, 1

def _collect(u: UOp) -> tuple[dict[UOp, int], int] | None:
  """u as ({base: coefficient}, constant), like terms collected (coefficients kept modulo 2**32), or None."""
  if (ts := _leaves(u, _ADD)) is None: return None
  coeffs: dict[UOp, int] = {}
  const = 0
  for t in ts:
    base, k = _split(t)
    if base is None: const += k
    else: coeffs[base] = coeffs.get(base, 0) + k
  # (x//c)*c*k + (x%c)*k = x*k: the quotient and the remainder recombine
  for base in [b for b in coeffs if b.op is _FLOORMOD and b.src[1].op is _CONST]:
    x, c = base.src[0], base.src[1].arg
    q = UOp(_FLOORDIV, base.src)
    k = coeffs.get(base, 0)
    if k and c > 0 and coeffs.get(q) == k * c:
      del coeffs[base], coeffs[q]
      coeffs[x] = coeffs.get(x, 0) + k
  return {b: _wrap(k) for b, k in coeffs.items() if _wrap(k) != 0}, _wrap(const)

def _build_sum(coeffs: dict[UOp, int], const: int) -> UOp:
  """The canonical sum: terms ordered by _key, left-associated, the constant last."""
  terms = [b if k == 1 else UOp(_MUL, (b, UOp.const(k))) for b, k in sorted(coeffs.items(), key=lambda bk: _key(bk[0]))]
  if const or not terms: terms.append(UOp.const(const))
  acc = terms[0]
  for t in terms[1:]: acc = UOp(_ADD, (acc, t))
  return acc

def _in_normal_form(u: UOp) -> bool:
  """Is the i32 sum u already what _build_sum(*_collect(u)) builds (or past _MAX_TERMS, which _norm_add leaves)? Read
  off its terms, without building it again: left-associated, each term a base or a base times a constant other than 0
  and 1, the bases distinct and in _key order, a constant only last and not 0. Conservative where the rules recombine (a
  base that is a modulo): False there, and _norm_add builds. Most sums a lowering makes are in this form already (in a
  cold GPT step's planning, 5,116 of 8,394 rebuilt to themselves, at 11 us each)."""
  terms: list[UOp] = []
  n = u
  while n.op is _ADD and n.dtype is _i32:
    if (r := n.src[1]).op is _ADD and r.dtype is _i32: return False
    terms.append(r)
    if len(terms) > _MAX_TERMS: return True
    n = n.src[0]
  terms.append(n)
  if len(terms) > _MAX_TERMS: return True
  seen: set[UOp] = set()
  last = None
  for i, t in enumerate(reversed(terms)):
    base, k = _split(t)
    if base is None:
      if i != len(terms) - 1 or k == 0: return False
      continue
    if t is not base and (k in (0, 1) or _wrap(k) != k): return False
    if base.op is _FLOORMOD or base in seen: return False
    seen.add(base)
    if last is not None and _key(base) < last: return False
    last = _key(base)
  return True

def _norm_add(u: UOp) -> UOp | None:
  if u.shape or u.dtype is not _i32 or _in_normal_form(u) or (col := _collect(u)) is None: return None
  return _build_sum(*col)

def _norm_mul(u: UOp) -> UOp | None:
  if u.shape or u.dtype is not _i32 or (fs := _leaves(u, _MUL)) is None: return None
  const, rest = 1, []
  for f in fs:
    if f.op is _CONST: const = _wrap(const * f.arg)
    else: rest.append(f)
  if const == 0: return UOp.const(0)                        # x*0 is 0 for every i32 x (floats: never)
  adds = [f for f in rest if f.op is _ADD]
  if const != 1 and len(rest) == 1 and adds:                # (a+b)*c = a*c + b*c, so div/mod rules see every term
    col = _collect(rest[0])
    if col is not None: return _build_sum({b: _wrap(k * const) for b, k in col[0].items()}, _wrap(col[1] * const))
  rest.sort(key=_key)
  acc = rest[0] if rest else UOp.const(const)
  for f in rest[1:]: acc = UOp(_MUL, (acc, f))
  return acc if const == 1 or not rest else UOp(_MUL, (acc, UOp.const(const)))


# ---- div and mod by a positive constant --------------------------------------------------------------------------

def _div(x: UOp, c: int) -> UOp | None:
  if c == 1: return x
  if c <= 0: return None
  lo, hi, exact = _bounds_of(x)
  if lo // c == hi // c: return UOp.const(lo // c)           # x//c is one value over x's whole range
  if x.op is _FLOORDIV and x.src[1].op is _CONST and x.src[1].arg > 0 and x.src[1].arg * c <= I32_MAX:
    return UOp(_FLOORDIV, (x.src[0], UOp.const(x.src[1].arg * c)))   # (y//a)//c = y//(a*c)
  # a sum, or one term (a product by a constant: (x*4)//2 is x*2)
  if x.op is not _ADD and not (x.op is _MUL and x.src[1].op is _CONST) or not exact or (col := _collect(x)) is None: return None
  coeffs, const = col
  # (a*c + b)//c = a + b//c: move the terms whose coefficient c divides (and c's multiples of the constant) out
  out = {b: k // c for b, k in coeffs.items() if k % c == 0}
  if out or not 0 <= const < c:
    rest = {b: k for b, k in coeffs.items() if k % c != 0}
    rest_sum = _build_sum(rest, const % c)
    if not _bounds_of(rest_sum)[2]: return None                      # the new dividend must not wrap either (b + const%c can)
    return _build_sum(out, const // c) + (UOp(_FLOORDIV, (rest_sum, UOp.const(c))) if rest or const % c else 0)
  # (g*A + r)//(g*C) = A//C when 0 <= r < g: g divides c and the big coefficients, the rest is a small remainder
  if (split := _split_by_factor(coeffs, const, c)) is not None: return UOp(_FLOORDIV, (split[1], UOp.const(c // split[0])))
  return None

def _split_by_factor(coeffs: dict[UOp, int], const: int, c: int) -> tuple[int, UOp, UOp] | None:
  """(g, A, r) with the sum = g*A + r, g > 1 a divisor of c, A exact and 0 <= r < g, for the largest such g; None when
  there is none. The constant's multiples of g go to A: a vector's lane over an aligned base, (16*i + lane + 128), is
  16*(i + 8) + lane, and (16*i + lane + 128)//256 is (i + 8)//16, the same for every lane."""
  for g in sorted({math.gcd(c, k) for k in coeffs.values()} - {1}, reverse=True):
    big = {b: k // g for b, k in coeffs.items() if k % g == 0}
    small = _build_sum({b: k for b, k in coeffs.items() if k % g != 0}, const % g)
    slo, shi, _ = _bounds_of(small)
    if big and 0 <= slo and shi < g and _bounds_of(big_sum := _build_sum(big, const // g))[2]: return g, big_sum, small
  return None

def _mod(x: UOp, c: int) -> UOp | None:
  if c == 1: return UOp.const(0)
  if c <= 0: return None
  lo, hi, exact = _bounds_of(x)
  # x%c = x - q*c over x's whole range; the result is in [0, c), so adding q*c modulo 2**32 is exact (-q*c may not fit)
  if lo // c == hi // c: return x if lo // c == 0 else x + _wrap(-(lo // c) * c)
  if x.op is _FLOORMOD and x.src[1].op is _CONST and x.src[1].arg > 0 and x.src[1].arg % c == 0:
    return UOp(_FLOORMOD, (x.src[0], UOp.const(c)))         # (y%(k*c))%c = y%c
  if x.op is not _ADD and not (x.op is _MUL and x.src[1].op is _CONST) or not exact or (col := _collect(x)) is None: return None
  coeffs, const = col
  # (a*c + b)%c = b%c: drop the terms that are multiples of c, and the constant's multiples of c
  keep = {b: k for b, k in coeffs.items() if k % c != 0}
  if len(keep) < len(coeffs) or not 0 <= const < c:
    keep_sum = _build_sum(keep, const % c)
    return UOp(_FLOORMOD, (keep_sum, UOp.const(c))) if _bounds_of(keep_sum)[2] else None   # b + const%c can wrap where x did not
  # coefficients matter only modulo c: with each one as small as possible, x may fall in a single period, where
  # x%c is x - q*c ((4*i + 4)%5 is 4 - i for 0 <= i < 5). Otherwise keep x: non-negative sums render as plain C %.
  small = _build_sum({b: (k % c) - c if 2 * (k % c) > c else k % c for b, k in coeffs.items()}, const)
  slo, shi, sexact = _bounds_of(small)
  if sexact and slo // c == shi // c: return small if slo // c == 0 else small + _wrap(-(slo // c) * c)
  # (g*A + r)%(g*C) = (A%C)*g + r when 0 <= r < g and r holds a vector's lane (an UPCAST range): the lane comes out of
  # the modulo, so its lanes' addresses are one base plus the lane (a vector load). Other indices keep their one %.
  lanes = [b for b in coeffs if b.op is Ops.RANGE and b.arg.kind is AxisType.UPCAST]
  if lanes and (split := _split_by_factor(coeffs, const, c)) is not None and any(coeffs[b] % split[0] for b in lanes):
    g, big_sum, r = split
    return UOp(_FLOORMOD, (big_sum, UOp.const(c // g))) * g + r
  return None


# ---- the rules -------------------------------------------------------------------------------------------------

def _fold(u: UOp) -> UOp | None:
  """Constant folding with the evaluator's semantics; a division by a constant 0 stays for the backend to refuse."""
  if u.shape or not all(s.op is _CONST for s in u.src): return None
  args = [const_value(s) for s in u.src]
  try:
    if u.op is _CAST: return UOp.const(cast_value(args[0], u.dtype), u.dtype) if u.dtype is not dtypes.f16 else None
    return UOp.const(exec_alu(u.op, u.dtype, *args), u.dtype)
  except EvalError: return None

def _decided(u: UOp) -> UOp | None:
  """A comparison (or any bool) whose bounds leave one value."""
  if u.shape: return None
  lo, hi, _ = _bounds_of(u)
  return UOp.const(bool(lo)) if lo == hi else None

def _order2(u: UOp) -> UOp | None:
  """Two commutative operands in canonical order: constants last, then by _key. Exact for floats too (a+b == b+a)."""
  a, b = u.src
  if a.op is _CONST and b.op is not _CONST: return UOp(u.op, (b, a))
  if a.op is not _CONST and b.op is not _CONST and _key(b) < _key(a): return UOp(u.op, (b, a))
  return None

def _int_max(u: UOp) -> UOp | None:
  a, b = u.src
  if a is b: return a
  (alo, ahi, _), (blo, bhi, _) = _bounds_of(a), _bounds_of(b)
  if alo >= bhi: return a
  if blo >= ahi: return b
  return _order2(u)

def _where(c: UOp, a: UOp, b: UOp) -> UOp | None:
  if a is b: return a
  lo, hi, _ = _bounds_of(c)
  if lo == hi: return a if lo else b
  if a.op is _CONST and b.op is _CONST and a.arg is True and b.arg is False: return c
  return None

x, y, cst = UPat.var("x"), UPat.var("y"), UPat.cvar("c")
_ints, _floats = (dtypes.i32,), (dtypes.f32, dtypes.f16)

symbolic = PatternMatcher([
  # every ALU op on constants folds (f32 results rounded to f32, i32 wrapped): the evaluator's semantics
  (UPat(ALU, name="u"), _fold),
  # a CAST to the dtype it already has is the value itself (Tensor.detach's stop-gradient marker, after lowering)
  (UPat(Ops.CAST, src=(x,), name="u"), lambda u, x: x if x.dtype is u.dtype else None),
  # ---- integers: sums and products in normal form (x+0, x*1, x*0, like terms, distribution, order)
  (UPat(Ops.ADD, name="u", dtype=_ints), _norm_add),
  (UPat(Ops.MUL, name="u", dtype=_ints), _norm_mul),
  # x//c and x%c for c > 0: decided by bounds, nested, or split over the terms of a sum
  (UPat(Ops.FLOORDIV, src=(x, cst), dtype=_ints), lambda x, c: None if x.shape else _div(x, c.arg)),
  (UPat(Ops.FLOORMOD, src=(x, cst), dtype=_ints), lambda x, c: None if x.shape else _mod(x, c.arg)),
  (UPat(Ops.MAX, name="u", dtype=_ints), lambda u: None if u.shape else _int_max(u)),
  # comparisons decided by bounds; x < x and x != x are false for integers (not floats: NaN)
  (UPat((Ops.CMPLT, Ops.CMPNE), src=(x, x), dtype=dtypes.bool), lambda x: UOp.const(False) if x.dtype in (_i32, _bool) and not x.shape else None),
  (UPat((Ops.CMPLT, Ops.CMPNE), name="u"), _decided),
  (UPat(Ops.CMPNE, name="u"), _order2),                                          # a != b is b != a, NaN included
  # not(not(b)) is b
  (UPat(Ops.CMPNE, src=(UPat(Ops.CMPNE, src=(x, UPat.const(True))), UPat.const(True))), lambda x: x),
  (UPat(Ops.WHERE, src=(UPat.var("c"), x, y)), lambda c, x, y: None if c.shape else _where(c, x, y)),
  # ---- floats: only what IEEE makes exact
  (UPat(Ops.MUL, src=[x, UPat.const(1.0)], dtype=_floats), lambda x: x),          # x*1.0 is x, NaN and -0.0 included
  (UPat(Ops.ADD, src=[x, UPat.const(-0.0)], dtype=_floats), lambda x: x),         # x+(-0.0) is x; x+0.0 is not (-0.0+0.0 = 0.0)
  (UPat((Ops.ADD, Ops.MUL), name="u", dtype=_floats), _order2),                   # a+b == b+a; no reassociation
  # bool and/or with constants
  (UPat(Ops.MUL, src=[x, UPat.const(True)], dtype=dtypes.bool), lambda x: x),
  (UPat(Ops.ADD, src=[x, UPat.const(False)], dtype=dtypes.bool), lambda x: x),
])


def simplify(u: UOp) -> UOp:
  """u in normal form: equal to u at every point, with constant folding, the integer laws and the exact float
  rules applied everywhere. Memoized on the nodes, so simplifying a simplified graph costs one lookup per node."""
  if not isinstance(u, UOp): raise UOpError(f"simplify takes a UOp, got {type(u).__name__}")
  if (r := _simplified.get(u)) is not None: return r
  return graph_rewrite(u, symbolic, memo=_simplified)

_simplified = _Memo("_simp")

__all__ = ["simplify", "bounds", "vmin", "vmax", "symbolic"]
