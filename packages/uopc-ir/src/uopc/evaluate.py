"""Evaluation by rewriting: run a memory-free, loop-free graph down to a literal.

    run(u)        -> a literal UOp: a CONST, or a STACK of literals (an f16 scalar is CAST(CONST, f16)), or a vector's
                     VECTORIZE of scalar literals
    to_python(u)  -> the literal's value as a python bool/int/float, or nested lists

The evaluator is two PatternMatchers. The first inlines every CALL by binding its PARAMs (only the body's own
scope, `call_params`: a nested CALL's body is left alone until that CALL is inlined in turn). The second folds
each op whose sources are already literals: ALU, WHERE and CAST elementwise (on vectors lane by lane), STACK and
VECTORIZE, GEP, INDEX, the movement ops and REDUCE. Because graph_rewrite rewrites sources first, every rule can assume literal sources; an op that
has no value without memory or loops (BUFFER, LOAD, RANGE, ...) is refused with an EvalError naming it.

The scalar semantics live here, in `exec_alu` and `cast_value`, and are the C backend's: i32 wraps modulo
2**32, FLOORDIV/FLOORMOD are floor division and modulo, f32 and f16 results are rounded to their type (so
`run` and the compiled C agree bit for bit on exact operations), a cast of a float to int truncates toward
zero, MAX propagates NaN like NumPy. The simplifier folds constants with the same functions.
"""
from __future__ import annotations
import copy, math, struct
from fractions import Fraction
from uopc.uop import UOp, Ops, ALU, MOVEMENT, UOpError, call_params, prod
from uopc.dtype import DType, dtypes, I32_MIN, I32_MAX
from uopc.rewrite import UPat, PatternMatcher, graph_rewrite


class EvalError(Exception):
  """A graph that can't be evaluated: memory, loops, an unbound PARAM, division by zero, an index out of range."""


# ---- scalar semantics ------------------------------------------------------------------------------------------

def wrap_i32(x: int) -> int: return ((x - I32_MIN) & 0xFFFFFFFF) + I32_MIN

def _round(fmt: str, x: float) -> float:
  # pack raises OverflowError exactly when the rounded value is infinite, for a float only (an int past the format raises
  # struct.error), hence float(x) first; float() of an int past 1e308 raises OverflowError too
  try: return struct.unpack(fmt, struct.pack(fmt, float(x)))[0]
  except OverflowError: return math.inf if x > 0 else -math.inf

def round_f32(x: float) -> float: return _round("f", x)
def round_f16(x: float) -> float: return _round("e", x)

def truncate(dtype: DType, x):
  """x as a value of dtype: bool, an i32 wrapped modulo 2**32, or a float rounded to f32/f16."""
  if dtype is dtypes.f32: return round_f32(x)
  if dtype is dtypes.i32: return wrap_i32(x)
  if dtype is dtypes.bool: return bool(x)
  if dtype is dtypes.f16: return round_f16(x)
  raise EvalError(f"no values of dtype {dtype}")

def _recip(x: float) -> float:
  if x == 0.0: return math.copysign(math.inf, x)
  return 1.0 / x

def _exp2(x: float) -> float:
  try: return 2.0 ** x
  except OverflowError: return math.inf

def _log2(x: float) -> float:
  if x != x or x < 0: return math.nan
  if x == 0: return -math.inf
  return math.log2(x)

def _sqrt(x: float) -> float:
  if x != x or x < 0: return math.nan
  return math.sqrt(x)   # sqrt(-0.0) is -0.0, as in C

def _sin(x: float) -> float:
  if x != x or math.isinf(x): return math.nan
  return math.sin(x)

def _max(a, b):
  # (a > b || a != a) ? a : b -- NaN in either operand gives NaN, as numpy.maximum; the C renderer emits the same
  return a if a > b or a != a else b

def _floordiv(a: int, b: int) -> int:
  if b == 0: raise EvalError(f"integer division by zero: {a} // 0")
  return a // b

def _floormod(a: int, b: int) -> int:
  if b == 0: raise EvalError(f"integer modulo by zero: {a} % 0")
  return a % b

def _round_exact_f32(x: Fraction) -> float:
  """The f32 nearest to the exact rational x (ties to even), or +-inf past the largest f32: one rounding, with no
  intermediate double (rounding twice can land on the other side of a tie)."""
  sign = -1.0 if x < 0 else 1.0
  num, den = abs(x.numerator), x.denominator
  e = num.bit_length() - den.bit_length()              # 2**e <= |x| < 2**(e+1), after the correction below
  if (num << max(0, -e)) < (den << max(0, e)): e -= 1
  q = max(e, -126) - 23                                # the spacing of f32s around |x|: 24 bits, or the subnormal spacing
  if q >= 0: den <<= q
  else: num <<= -q
  m, r = divmod(num, den)
  if 2 * r > den or (2 * r == den and m & 1): m += 1
  v = math.ldexp(m, q)
  return sign * (math.inf if v > 3.4028234663852886e38 else v)

def _fma_f32(a: float, b: float, c: float) -> float:
  """a*b + c rounded once to f32, as the hardware's fused multiply-add (and C's fmaf) computes it."""
  if not (math.isfinite(a) and math.isfinite(b) and math.isfinite(c)): return round_f32(a * b + c)   # inf and nan as IEEE says
  exact = Fraction(a) * Fraction(b) + Fraction(c)
  if exact == 0: return a * b + c   # the product is exact in a double, so the sign of an exact zero follows IEEE's rule
  return _round_exact_f32(exact)

# the scalar semantics, one table per arity: every ALU op but CAST (cast_value converts) is in one of them
_UNARY_FN = {Ops.RECIP: _recip, Ops.EXP2: _exp2, Ops.LOG2: _log2, Ops.SQRT: _sqrt, Ops.SIN: _sin}
_BINARY_FN = {Ops.ADD: lambda a, b: a + b, Ops.MUL: lambda a, b: a * b, Ops.MAX: _max, Ops.CMPLT: lambda a, b: a < b,
              Ops.CMPNE: lambda a, b: a != b, Ops.FLOORDIV: _floordiv, Ops.FLOORMOD: _floormod}
# C's _Bool arithmetic: the int result converts back to 0/1, so + is "or" and * is "and" (FLOORDIV and FLOORMOD take i32 only)
_BOOL_FN = {Ops.ADD: lambda a, b: a or b, Ops.MUL: lambda a, b: a and b, Ops.MAX: lambda a, b: a or b,
            Ops.CMPLT: lambda a, b: (not a) and b, Ops.CMPNE: lambda a, b: a != b}
_TERNARY_FN = {Ops.WHERE: lambda c, a, b: a if c else b, Ops.MULACC: _fma_f32}

def exec_alu(op: Ops, dtype: DType, *vals):
  """The value of ALU op `op` on python values `vals` (already values of the operands' dtype); `dtype` is the
  result's dtype. WHERE takes (cond, a, b), MULACC (a, b, c) for a*b + c."""
  if len(vals) == 3: return _TERNARY_FN[op](*vals)
  if len(vals) == 1: return truncate(dtype, _UNARY_FN[op](vals[0]))
  a, b = vals
  if type(a) is bool: return _BOOL_FN[op](a, b)
  r = _BINARY_FN[op](a, b)
  return r if dtype is dtypes.bool else truncate(dtype, r)

def cast_value(x, to: DType):
  """C's conversion of value x to dtype `to`. A float that is NaN or out of the i32 range becomes INT_MIN (what
  x86's cvttss2si gives; C leaves it undefined)."""
  if to is dtypes.bool: return x != 0
  if to is dtypes.i32:
    if isinstance(x, float):
      if x != x or math.isinf(x): return I32_MIN
      x = math.trunc(x)
      return x if I32_MIN <= x <= I32_MAX else I32_MIN
    return int(x)
  return truncate(to, float(x))


def identity(op: Ops, d: DType):
  """The identity element of reduction `op` in dtype d: what an accumulator starts from."""
  if op is Ops.ADD: return 0.0 if d.is_float else (False if d is dtypes.bool else 0)
  return -math.inf if d.is_float else dtypes.min(d)


# ---- literals ----------------------------------------------------------------------------------------------------

def literal(values: list, shape: tuple[int, ...], dtype: DType) -> UOp:
  """The literal UOp holding flat row-major `values` with `shape`: nested STACKs of CONSTs (CAST to f16 for
  f16). An empty shape (a 0 axis) has no STACK form; it is the literal zero of shape (1, ..., 1) expanded to it."""
  if 0 in shape: return literal([0], (1,) * len(shape), dtype).expand(shape)
  if dtype.count > 1:
    if shape: raise EvalError(f"run evaluates vectors of shape (), got a {dtype.name} of shape {shape}")
    return UOp(Ops.VECTORIZE, tuple(_scalar(v, dtype.scalar()) for v in values))
  level = [_scalar(v, dtype) for v in values]
  for n in reversed(shape):
    level = [UOp(Ops.STACK, tuple(level[i:i + n])) for i in range(0, len(level), n)]
  return level[0]

def _scalar(v, dtype: DType) -> UOp:
  if dtype is dtypes.f16: return UOp(Ops.CAST, (UOp.const(float(v)),), dtypes.f16)
  return UOp.const(v, dtype)

def _values(u: UOp, memo: dict) -> list:
  """Flat row-major values of a literal (its sources are literals: graph_rewrite rewrote them first)."""
  if (r := memo.get(u)) is not None: return r
  if u.op is Ops.CONST: r = [u.arg]
  elif u.op is Ops.CAST: r = [u.src[0].arg]
  elif u.op is Ops.STACK or u.op is Ops.VECTORIZE: r = [v for s in u.src for v in _values(s, memo)]
  else: r = []                                   # the empty literal: an EXPAND to a shape with a 0
  memo[u] = r
  return r

def _strides(shape: tuple[int, ...]) -> list[int]:
  out, acc = [], 1
  for s in reversed(shape): out.append(acc); acc *= s
  return out[::-1]

def _gather(vals: list, shape: tuple[int, ...], out_shape: tuple[int, ...], src_index) -> list:
  """Values of a view: element k of the output (row-major in out_shape) is vals[src_index(index tuple)]."""
  st = _strides(shape)
  out = []
  for flat in range(prod(out_shape)):
    idx, rem = [], flat
    for s in reversed(out_shape): idx.append(rem % s); rem //= s
    out.append(vals[sum(i * k for i, k in zip(src_index(idx[::-1]), st))])
  return out


# ---- the evaluation rules ------------------------------------------------------------------------------------------

def const_value(c: UOp):
  """The value a CONST stands for. An f32 CONST holds a python float (a double); its value is that float rounded to f32,
  as `0.1f` is in C. Every consumer of constants (run, the simplifier's folding) reads them through here."""
  return round_f32(c.arg) if c.dtype is dtypes.f32 else c.arg

def _fold_const(u: UOp, ctx: dict) -> UOp | None:
  v = const_value(u)
  return UOp.const(v) if v != u.arg and u.arg == u.arg else None

def _fold_alu(u: UOp, ctx: dict) -> UOp:
  lane = u.dtype.scalar()       # a vector's op is its lanes' ops
  if u.op is Ops.CAST:
    v = [cast_value(x, lane) for x in _values(u.src[0], ctx)]
    # CAST(CONST float, f16) of an f16 value is already a literal; CAST(CONST True, f16) is not (True == 1.0 in python)
    src = u.src[0]
    if u.dtype is dtypes.f16 and src.op is Ops.CONST and type(src.arg) is float and src.arg == v[0] and u.shape == (): return u
  else:
    cols = [_values(s, ctx) for s in u.src]
    v = [exec_alu(u.op, lane, *args) for args in zip(*cols)]
  return literal(v, u.shape, u.dtype)

def _fold_index(u: UOp, ctx: dict) -> UOp:
  x, pos = u.src[0], [_values(i, ctx)[0] for i in u.src[1:]]
  for k, (i, n) in enumerate(zip(pos, x.shape)):
    if not 0 <= i < n: raise EvalError(f"INDEX {i} out of range for axis {k} of size {n} (shape {x.shape})")
  vals, st = _values(x, ctx), _strides(x.shape)
  start, size = sum(i * k for i, k in zip(pos, st)), prod(u.shape)
  return literal(vals[start:start + size], u.shape, u.dtype)

def _fold_gather(u: UOp, ctx: dict) -> UOp:
  x, i = u.src
  b = u.arg
  vals, picks = _values(x, ctx), _values(i, ctx)
  n, row = x.shape[b], prod(x.shape[b + 1:])
  per_batch = prod(i.shape[b:])                     # indices of one batch entry, whose rows are x's entry's rows
  out = []
  for k, r in enumerate(picks):
    if not 0 <= r < n: raise EvalError(f"GATHER index {r} out of range for axis {b} of size {n} (shape {x.shape})")
    start = (k // per_batch * n + r) * row        # (an index exists only when per_batch > 0)
    out.extend(vals[start:start + row])
  return literal(out, u.shape, u.dtype)

def _fold_movement(u: UOp, ctx: dict) -> UOp:
  x = u.src[0]
  vals = _values(x, ctx)
  if u.op is Ops.RESHAPE: return literal(vals, u.shape, u.dtype)
  if u.op is Ops.EXPAND: fn = lambda idx: [0 if s == 1 else i for i, s in zip(idx, x.shape)]
  elif u.op is Ops.SHRINK: fn = lambda idx: [i + b for i, (b, _) in zip(idx, u.arg)]
  else:   # PERMUTE: output axis k is input axis arg[k], so input axis arg[k] is at idx[k]
    def fn(idx):
      at = dict(zip(u.arg, idx))
      return [at[a] for a in range(len(idx))]
  return literal(_gather(vals, x.shape, u.shape, fn), u.shape, u.dtype)

# A float sum of more than SUM_CHUNK terms is summed in chunks, as the lowered loops do (uopc.rangeify): along its
# innermost reduced axis (of more than one element), partial sums of SUM_CHUNK terms, each started from zero, are added
# to the total in order, then the terms that fill no chunk one by one; with that axis SUM_CHUNK long or shorter, one
# partial per run of it. One accumulator for millions of f32 terms stops growing (ones stop at 2**24).
SUM_CHUNK = 4096

def _sum_in_chunks(d: DType, vals: list, axis: int) -> float:
  """vals (the terms of one output, row-major, their innermost reduced axis of `axis` elements) summed in chunks."""
  total = 0.0
  for row in range(0, len(vals), axis):
    for start in range(row, row + axis, min(axis, SUM_CHUNK)):
      end = min(start + SUM_CHUNK, row + axis)
      if end - start < min(axis, SUM_CHUNK):        # the tail: no chunk of its own
        for v in vals[start:end]: total = exec_alu(Ops.ADD, d, total, v)
        continue
      partial = 0.0
      for v in vals[start:end]: partial = exec_alu(Ops.ADD, d, partial, v)
      total = exec_alu(Ops.ADD, d, total, partial)
  return total

def _fold_reduce(u: UOp, ctx: dict) -> UOp:
  rop, n = u.arg
  x = u.src[0]
  popped = x.shape[len(x.shape) - n:]
  vals, size = _values(x, ctx), prod(popped)
  axis = next((s for s in reversed(popped) if s > 1), 1)     # the innermost axis the loops walk (one of size 1 is no loop)
  out = []
  for start in range(0, prod(u.shape) * size, size) if size else range(prod(u.shape)):
    if rop is Ops.ADD and u.dtype.is_float and size > SUM_CHUNK: out.append(_sum_in_chunks(u.dtype, vals[start:start + size], axis)); continue
    acc = identity(rop, u.dtype)
    for v in vals[start:start + size]: acc = exec_alu(rop, u.dtype, acc, v)   # left to right, as the C loop
    out.append(acc)
  return literal(out, u.shape, u.dtype)

def _refuse(u: UOp) -> UOp:
  why = "it is an unbound PARAM (only a CALL binds PARAMs)" if u.op is Ops.PARAM else \
        "it is memory" if u.op in (Ops.BUFFER, Ops.ALLOC, Ops.LOAD, Ops.STORE, Ops.AFTER) else \
        "it is a loop" if u.op in (Ops.RANGE, Ops.END) else "it has no value"
  raise EvalError(f"run can't evaluate {u.op!r}: {why}; run evaluates memory-free, loop-free graphs")

def _is_empty_literal(u: UOp) -> bool:
  return u.op is Ops.EXPAND and 0 in u.shape and all(s == 1 for s in u.src[0].shape) and u.src[0].op is Ops.STACK

_inline_calls = PatternMatcher([(UPat(Ops.CALL, name="u"), lambda u: bind_call(u))])

_evaluate = PatternMatcher([
  (UPat(Ops.CONST, name="u"), _fold_const),
  (UPat(Ops.STAGE, name="u"), lambda u: u.src[0]),
  (UPat(Ops.EXPAND, name="u"), lambda u, ctx: None if _is_empty_literal(u) else _fold_movement(u, ctx)),
  (UPat(ALU, name="u"), _fold_alu),
  (UPat(Ops.INDEX, name="u"), _fold_index),
  (UPat(Ops.GATHER, name="u"), _fold_gather),
  (UPat(MOVEMENT - {Ops.EXPAND}, name="u"), _fold_movement),
  (UPat(Ops.REDUCE, name="u"), _fold_reduce),
  (UPat(Ops.GEP, name="u"), lambda u, ctx: literal([_values(u.src[0], ctx)[u.arg]], (), u.dtype)),
  (UPat({Ops.PARAM, Ops.BUFFER, Ops.ALLOC, Ops.LOAD, Ops.STORE, Ops.AFTER, Ops.SINK, Ops.RANGE, Ops.END, Ops.BARRIER, Ops.WMMA,
        Ops.ASYNC_COPY, Ops.ASYNC_COMMIT, Ops.ASYNC_WAIT, Ops.LDMATRIX},
        name="u"), _refuse),
])


def bind_call(call: UOp) -> UOp:
  """The body of CALL(body, *args) with each of *its own* PARAMs (call_params) replaced by the argument in
  that slot. PARAMs inside a nested CALL's body belong to that CALL and are left alone."""
  body, args = call.src[0], call.src[1:]
  mapping = {p: args[p.arg.slot] for p in call_params(body)}
  new: dict[UOp, UOp] = {}
  stack: list[tuple[UOp, bool]] = [(body, False)]
  while stack:
    u, ready = stack.pop()
    if u in new: continue
    inner = u.src[1:] if u.op is Ops.CALL else u.src     # a nested body is its own scope: don't enter src[0]
    if not ready:
      stack.append((u, True))
      stack.extend((s, False) for s in inner if s not in new)
      continue
    if u in mapping:
      new[u] = mapping[u]
      continue
    src = ((u.src[0],) + tuple(new[s] for s in inner)) if u.op is Ops.CALL else tuple(new[s] for s in inner)
    new[u] = u if src == u.src else UOp(u.op, src, u.arg)
  return new[body]


# run holds every value as python objects, one UOp per element: past this many elements in one node it would take minutes
# and gigabytes (an EXPAND to 10**9 elements was killed for memory), so such a program is refused up front
RUN_MAX_ELEMENTS = 1 << 20


def run(u: UOp) -> UOp:
  """Evaluate a graph without memory or loops to a literal (CONST, or STACKs of CONSTs)."""
  if not isinstance(u, UOp): raise EvalError(f"run takes a UOp, got {type(u).__name__}")
  for n in u.toposort():
    if len(n.shape) and prod(n.shape) > RUN_MAX_ELEMENTS:
      raise EvalError(f"run evaluates element by element in python: {n.op!r} of shape {n.shape} has {prod(n.shape)} elements, more than "
                      f"its limit of {RUN_MAX_ELEMENTS}; lower and compile the program instead (uopc.testing.run_shaped)")
  inlined = graph_rewrite(u, _inline_calls, bottom_up=True)
  return graph_rewrite(inlined, _evaluate, ctx={})


def to_python(u: UOp):
  """The value of a graph as python data: a bool/int/float for shape (), nested lists otherwise."""
  lit = run(u)
  vals, shape = _values(lit, {}), lit.shape
  if not shape: return vals[0] if lit.dtype.count == 1 else vals     # a vector: its lanes
  if 0 in shape:                                   # nested lists down to the first empty axis
    k = shape.index(0)
    out: list = []
    for n in reversed(shape[:k]): out = [copy.deepcopy(out) for _ in range(n)]
    return out
  for n in reversed(shape[1:]): vals = [vals[i:i + n] for i in range(0, len(vals), n)]
  return vals


__all__ = ["run", "to_python", "EvalError", "exec_alu", "cast_value", "truncate", "wrap_i32", "round_f32", "round_f16",
           "literal", "bind_call", "identity", "const_value", "UOpError"]
