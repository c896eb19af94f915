"""The symbolic fuzzer over every rule of `symbolic`, with the evaluator (uopc.evaluate.run) as the oracle.

Random expressions mix i32, bool and f32 values over RANGEs and PARAMs: sums, products, floor division and modulo by
constants of both signs, MAX, comparisons, WHERE, casts both ways (and to the same dtype), the float functions, MULACC,
double negations, x*1.0 and x+(-0.0), with -0.0, inf and NaN among the constants, and index arithmetic as rangeify
writes it (Gen.index). At sampled points (each RANGE and PARAM bound to a CONST) simplify(e) and e must evaluate to the
same bits (every NaN alike), and each FLOORDIV and FLOORMOD of e must lie in its bounds; a point where e itself has no
value (a division by zero) is skipped. Across the corpus every rule of the matcher must fire, and every exit of the
div/mod laws must be taken, each with numerators of both signs: a rule or a branch that no expression reaches is a gap
in the fuzzer, not something silently untested. A failure prints the seed and the expression as .uir, and
UOPC_FUZZ_SEED=N reruns just that seed. UOPC_FUZZ_ITERS=N runs N expressions (CI: 1600).
"""
import ast, collections, contextlib, inspect, math, os, random, struct, sys
import pytest
from uopc.dtype import dtypes
from uopc.uop import UOp, Ops, ParamArg, AxisType, range_
from uopc.uir import to_uir
from uopc.rewrite import PatternMatcher, graph_rewrite
from uopc.evaluate import run, EvalError
from uopc import symbolic as symbolic_module
from uopc.symbolic import bounds, simplify, symbolic

ITERS = int(os.environ.get("UOPC_FUZZ_ITERS", "1600"))
SEED = os.environ.get("UOPC_FUZZ_SEED")
I32_MAX, I32_MIN = 2**31 - 1, -2**31
I32_CONSTS = [0, 1, -1, 2, 3, -3, 4, 7, 8, 16, I32_MAX, I32_MIN, 65536, 2**30]
DIVISORS = [1, 2, 3, 4, 5, 6, 8, 12, 16, 65536, 2**30, I32_MAX]
F32_CONSTS = [0.0, -0.0, 1.0, -1.0, 0.5, 2.0, -2.5, 1e30, -1e-30, math.inf, -math.inf, math.nan, 3.0]


def _i32(v: int) -> int: return (v - I32_MIN) % 2**32 + I32_MIN


class Gen:
  """A random expression builder: i32(d), boolean(d) and f32(d) return expressions of depth at most d."""
  def __init__(self, rng: random.Random):
    self.rng = rng
    self.ranges = [range_(rng.randint(1, 5), k) for k in range(rng.randint(1, 3))]
    self.iparam, self.fparam = UOp(Ops.PARAM, (), ParamArg(0, dtypes.i32)), UOp(Ops.PARAM, (), ParamArg(1, dtypes.f32))

  def i32(self, d: int) -> UOp:
    r = self.rng
    if d <= 0 or r.random() < 0.15:
      k = r.random()
      return r.choice(self.ranges) if k < 0.55 else self.iparam if k < 0.7 else UOp.const(r.choice(I32_CONSTS))
    a, b = self.i32(d - 1), self.i32(d - 1)
    op = r.randrange(16)
    if op == 0: return a + b
    if op == 1: return a * UOp.const(r.choice(I32_CONSTS))
    if op == 2: return a * b
    if op == 3: return a // UOp.const(r.choice([1, 2, 3, 4, 5, 8, -1, -2, -3, 65536]))
    if op == 4: return a % UOp.const(r.choice([1, 2, 3, 4, 5, 8, -1, -3, 2**31 - 1]))
    if op == 5: return a.maximum(b)
    if op == 6: return self.boolean(d - 1).where(a, b)
    if op == 7: return self.boolean(d - 1).cast(dtypes.i32)
    if op == 8: return a - b
    if op == 9: return UOp(Ops.CAST, (a,), dtypes.i32)                      # a CAST to its own dtype
    if op == 10: return self.f32(d - 1).cast(dtypes.i32)
    if op == 11: return a + UOp.const(r.choice(I32_CONSTS))
    if op == 12: return (a // UOp.const(4)) // UOp.const(r.choice([2, 3, 8]))
    if op == 13: return (a % UOp.const(16)) % UOp.const(r.choice([2, 4, 8]))
    if op == 14: return a // b if r.random() < 0.5 else a % b             # a divisor of any sign, zero included
    return self.index()

  def index(self) -> UOp:
    """Index arithmetic as rangeify writes it, k*r + ... + C, divided or reduced by a positive constant once or twice,
    with the coefficients and constants chosen around the divisor: its multiples, a common factor, one less and one
    more, both signs, and sometimes the i32 limits. These are the shapes every exit of the div/mod laws needs, each with
    dividends that can be negative and dividends that can't (see div_mod_exits)."""
    r = self.rng
    c = r.choice(DIVISORS)
    g = r.choice([f for f in (2, 3, 4) if c % f == 0] or [1])                   # a factor the coefficients may share with c
    shape = r.random()
    if shape < 0.2:     # (g*A + s)//(g*m) with s a small sum near [0, g): it is A//m only while 0 <= s < g
      g, m = r.choice([2, 3, 4]), r.choice([2, 3])
      c = g * m
      # s is a range, or a vector's lane (an UPCAST range of g lanes: (g*A + lane)%(g*m) takes the lane out of the %)
      lane = r.random() < 0.4
      e = (range_(g, 7, AxisType.UPCAST) if lane else self.ranges[0]) + r.choice([0, 1, g - 1, g, 3 * g])
      for x in self.ranges[1:] + [self.ranges[0]] * (len(self.ranges) == 1 or lane):
        e = e + x * UOp.const(r.choice([g, -g, 3 * g, -3 * g, g + 1]))
      e = e // UOp.const(c) if not lane or r.random() < 0.5 else e % UOp.const(c)
    elif shape < 0.35:  # coefficients one off a multiple of c: x%c may lie in one period of c as a sum of small terms
      e = UOp.const(_i32(r.choice([0, 1, c - 1, c // 2])))
      for x in self.ranges: e = e + x * UOp.const(_i32(r.choice([c - 1, -(c - 1), c + 1, -(c + 1), 2 * c - 1, 1])))
      e = e % UOp.const(c)
    elif shape < 0.45:  # a divisor near 2**31 and a small negative constant: moving the constant's multiples of c out
      c = r.choice([I32_MAX, I32_MAX - 2, I32_MAX - 2, 2**30])   # of x + C (C%c is near c) can wrap where x did not
      e = UOp.const(r.choice([-1, -2, -3, -c]))
      for x in self.ranges: e = e + x * UOp.const(r.choice([1, 2, 3, -1]))
      e = e // UOp.const(c) if r.random() < 0.5 else e % UOp.const(c)
    else:
      plain = r.random() < 0.5            # a plain index: every coefficient and the constant non-negative
      def k(): return _i32(r.choice([1, 2, c, 2 * c, c - 1, c + 1, g, 3 * g, c // g] + ([] if plain else [-1, -c, -(c - 1), -g])))
      consts = [0, 1, c - 1, c, c + 1, 2 * c - 1, I32_MAX, I32_MAX - c, g - 1] + ([] if plain else [-1, -2, -c, -(c + 1), I32_MIN])
      e = UOp.const(_i32(r.choice(consts)))
      for x in self.ranges + [self.iparam] * (r.random() < 0.1 and not plain):
        if r.random() < 0.8: e = e + x * UOp.const(k())
      # a constant divisor; now and then a negative one, or one that is positive but not constant (the laws decline both)
      d = r.choice([UOp.const(c)] * 8 + [UOp.const(-c), self.ranges[-1] + c])
      e = e // d if r.random() < 0.5 else e % d
    if r.random() < 0.5:   # a second level: nested (the nested laws), or a fresh sum around the first
      d2 = r.choice([2, 3, 4, c, 2 * c if 2 * c <= I32_MAX else c] + [f for f in (2, 3, 4) if c % f == 0])
      if r.random() < 0.3: e = e + self.ranges[0] * UOp.const(_i32(r.choice([1, -1, c, d2]))) + UOp.const(r.choice([-1, 0, 1, d2 - 1]))
      if r.random() < 0.2: d2, divisor = c, self.ranges[-1] + c                 # positive, not constant, above x%c
      else: divisor = UOp.const(d2)
      again = e.op if r.random() < 0.7 else r.choice([Ops.FLOORDIV, Ops.FLOORMOD])   # mostly the same op: the nested laws
      e = e // divisor if again is Ops.FLOORDIV else e % divisor
    return e

  def boolean(self, d: int) -> UOp:
    r = self.rng
    if d <= 0: return r.choice([UOp.const(True), UOp.const(False), self.i32(0) < self.i32(0)])
    op = r.randrange(11)
    if op == 0: return self.i32(d) < self.i32(d)
    if op == 1: return self.i32(d).ne(self.i32(d))
    if op == 2: return self.i32(d).eq(self.i32(d))
    if op == 3: return self.boolean(d - 1) * self.boolean(d - 1)                # and
    if op == 4: return self.boolean(d - 1) + self.boolean(d - 1)                # or
    if op == 5: return self.i32(d).cast(dtypes.bool)
    if op == 6: return self.boolean(d - 1).ne(True).ne(True)                    # not(not(b))
    if op == 7: return self.boolean(d - 1).where(UOp.const(True), UOp.const(False))
    if op == 8: x = self.i32(d); return r.choice([x < x, x.ne(x)])            # decided for integers, not floats
    if op == 9: return self.f32(d) < self.f32(d)
    return r.choice([self.boolean(d - 1) * UOp.const(True), self.boolean(d - 1) + UOp.const(False), self.boolean(d - 1).maximum(self.boolean(d - 1))])

  def f32(self, d: int) -> UOp:
    r = self.rng
    if d <= 0 or r.random() < 0.15:
      k = r.random()
      return self.fparam if k < 0.4 else self.i32(0).cast(dtypes.f32) if k < 0.6 else UOp.const(r.choice(F32_CONSTS))
    a, b = self.f32(d - 1), self.f32(d - 1)
    op = r.randrange(13)
    if op == 0: return a + b
    if op == 1: return a * b
    if op == 2: return a * UOp.const(1.0) if r.random() < 0.5 else UOp.const(1.0) * a
    if op == 3: return a + UOp.const(-0.0) if r.random() < 0.5 else UOp.const(-0.0) + a
    if op == 4: return a.maximum(b)
    if op == 5: return UOp(r.choice([Ops.RECIP, Ops.SQRT, Ops.EXP2, Ops.LOG2, Ops.SIN]), (a,))
    if op == 6: return UOp(Ops.MULACC, (a, b, self.f32(d - 1)))
    if op == 7: return self.boolean(d - 1).where(a, b)
    if op == 8: return UOp(Ops.CAST, (a,), dtypes.f32)
    if op == 9: return self.i32(d - 1).cast(dtypes.f32)
    if op == 10: return a - b
    if op == 11: return UOp.const(r.choice(F32_CONSTS)) + UOp.const(r.choice(F32_CONSTS))   # folded in f32
    return a * UOp.const(r.choice(F32_CONSTS))

  def expression(self) -> UOp:
    if self.rng.random() < 0.4: return self.index()
    d = self.rng.randint(1, 4)
    return self.rng.choice([self.i32, self.boolean, self.f32])(d)


def bits(lit: UOp):
  """A literal's value, comparable bit for bit: floats by their f32 bits with every NaN alike."""
  v = lit.src[0].arg if lit.op is Ops.CAST else lit.arg
  if isinstance(v, float): return "nan" if v != v else struct.pack("<f", v)
  return v


def value_at(e: UOp, env: dict[UOp, UOp]):
  """e's value at the point `env` (bits(), or a list of them for a STACK), or None where it has none."""
  try:
    lit = run(e.substitute(env))
    return [bits(x) for x in lit.src] if e.op is Ops.STACK else bits(lit)
  except EvalError: return None      # no value here (a division by zero): the point says nothing


def check_seed(seed: int, hits: list[int] | None = None, exits: "ExitsTaken | None" = None) -> None:
  """Simplify seed's expression and compare it with the original at sampled points, and the bounds of its FLOORDIV and
  FLOORMOD nodes with their values there. `hits` counts the rules that fire, `exits` the exits of the div/mod laws taken
  (traced while simplifying and bounding only: tracing the evaluator too made the test six times slower)."""
  rng = random.Random(seed)
  g = Gen(rng)
  e = g.expression()
  divmods = [u for u in e.toposort() if u.op in (Ops.FLOORDIV, Ops.FLOORMOD)]
  with exits if exits is not None else contextlib.nullcontext():
    s = simplify(e)
    counted = graph_rewrite(e, COUNTING, ctx=hits) if hits is not None else s
    divmod_bounds = [bounds(n) for n in divmods]
  assert counted is s, f"seed {seed}: the counting matcher and simplify disagree"
  leaves = [u for u in e.toposort() if u.op in (Ops.RANGE, Ops.PARAM)]
  for _ in range(8):
    env = {}
    for u in leaves:
      if u.op is Ops.RANGE: env[u] = UOp.const(rng.randrange(u.src[0].arg))
      elif u.dtype is dtypes.i32: env[u] = UOp.const(rng.choice(I32_CONSTS + [rng.randint(-2**31, 2**31 - 1)]))
      else: env[u] = UOp.const(rng.choice(F32_CONSTS + [rng.uniform(-10, 10)]))
    at = f"{ {u.op.name + str(u.arg.idx if u.op is Ops.RANGE else u.arg.slot): v.arg for u, v in env.items()} }"
    # the div/mod laws decide with bounds, so the bounds of each FLOORDIV and FLOORMOD must hold its value here: their
    # values (and e's, when it is an i32 too) in one evaluation, or one by one where something divides by zero
    together = divmods + [e] * (e.dtype is dtypes.i32 and e not in divmods)
    values = value_at(UOp(Ops.STACK, tuple(together)), env) if together else None
    if values is None: values = [value_at(n, env) for n in divmods]
    want = values[divmods.index(e)] if e in divmods else values[-1] if len(values) > len(divmods) else value_at(e, env)
    for n, (lo, hi), v in zip(divmods, divmod_bounds, values):
      assert v is None or lo <= v <= hi, (f"seed {seed} (UOPC_FUZZ_SEED={seed} reruns it): bounds {lo}..{hi} of a {n.op.name} miss its "
                                          f"value {v} at {at}\n{to_uir(n)}")
    if want is None: continue
    got = value_at(s, {u: v for u, v in env.items()})
    assert got == want, (f"seed {seed} (UOPC_FUZZ_SEED={seed} reruns it): simplify changed the value at {at}: "
                         f"{want!r} -> {got!r}\n--- expression\n{to_uir(e)}--- simplified\n{to_uir(s)}")


def _counting(i: int, fn):
  def rule(ctx, **captures):
    r = fn(**captures)
    if r is not None: ctx[i] += 1
    return r
  return rule

COUNTING = PatternMatcher([(pat, _counting(i, fn)) for i, (pat, fn) in enumerate(symbolic.patterns)])


@pytest.mark.parametrize("block", range(4))
def test_fuzz_simplify_agrees_with_the_evaluator_on_every_kind_of_expression(block):
  seeds = [int(SEED)] if SEED is not None else range(1_000_000 + block * ITERS // 4, 1_000_000 + (block + 1) * ITERS // 4)
  for seed in seeds: check_seed(seed)


# ---- which exits of the div/mod laws the corpus takes -----------------------------------------------------------------
# Counting the rules that fire let a subtly wrong div/mod law through: the FLOORDIV rule fired on easy dividends, and the
# paths that were wrong (a sum split over a common factor, one period of a modulus, a wrapping rest, a negative
# numerator) were never taken. So the corpus must take every exit of _div and _mod, each return statement (a
# conditional one once per outcome), and every case of the FLOORDIV and FLOORMOD bounds; each exit that rewrites or
# bounds, with a numerator that can be negative and with one that can't. A law wrong for negative numerators, or at the
# edge of its condition, then meets points where it is wrong. The exits are read from symbolic's source, so a new
# branch is counted the day it is written.

def div_mod_exits() -> dict[tuple[str, int], ast.Return]:
  """(where, line) -> the return statement, for every exit of the div/mod laws: `where` is _div, _mod, or the bounds of
  FLOORDIV or FLOORMOD (the returns under `if op is _FLOORDIV:` / `if op is _FLOORMOD:` in _compute_bounds)."""
  source = inspect.getsource(symbolic_module)
  functions = {f.name: f for f in ast.parse(source).body if isinstance(f, ast.FunctionDef)}
  exits = {}
  for name in ("_div", "_mod"):
    exits.update({(name, r.lineno): r for r in ast.walk(functions[name]) if isinstance(r, ast.Return)})
  for case in ast.walk(functions["_compute_bounds"]):
    if isinstance(case, ast.If) and ast.unparse(case.test) in ("op is _FLOORDIV", "op is _FLOORMOD"):
      where = "bounds of " + ast.unparse(case.test).removeprefix("op is _")
      exits.update({(where, r.lineno): r for r in ast.walk(case) if isinstance(r, ast.Return)})
  return exits

# an exit whose own condition rules a sign out: `if alo >= 0 and ahi < blo: return (alo, ahi, True)`
NEVER_NEGATIVE = {"return (alo, ahi, True)"}


def required_exits(exits: dict) -> dict[tuple, str]:
  """(where, line, outcome, numerator can be negative) -> the source of the return, for each case the corpus must take.
  A return of None (the law declines) needs one visit; a rewrite (or a bound) needs both signs of the numerator."""
  need = {}
  for (where, line), r in exits.items():
    text = ast.unparse(r)
    declines = r.value is None or (isinstance(r.value, ast.Constant) and r.value.value is None)
    either = isinstance(r.value, ast.IfExp) and any(isinstance(b, ast.Constant) and b.value is None for b in (r.value.body, r.value.orelse))
    if declines or either: need[(where, line, "declined", None)] = text
    if not declines:
      outcome = "bounds" if where.startswith("bounds") else "rewrote"
      for negative in (False, True):
        if not (negative and text in NEVER_NEGATIVE): need[(where, line, outcome, negative)] = text
  return need


def _numerator(x: UOp) -> UOp:
  """The numerator a law is about: under nested divisions by constants, the innermost one ((y//a)//c is about y)."""
  while x.op in (Ops.FLOORDIV, Ops.FLOORMOD) and x.src[1].op is Ops.CONST: x = x.src[0]
  return x


class ExitsTaken:
  """A tracer of the exits of _div, _mod and _compute_bounds, counting (where, line, outcome, numerator can be negative)."""
  def __init__(self):
    self.taken: collections.Counter = collections.Counter()
    self.codes = {symbolic_module._div.__code__: "_div", symbolic_module._mod.__code__: "_mod",
                  symbolic_module._compute_bounds.__code__: "bounds"}

  def on_call(self, frame, event, arg): return self.on_event if frame.f_code in self.codes else None

  def on_event(self, frame, event, arg):
    if event != "return": return self.on_event
    where = self.codes[frame.f_code]
    if where == "bounds":
      u = frame.f_locals["u"]
      if u.op not in (Ops.FLOORDIV, Ops.FLOORMOD): return None
      where, x, outcome = f"bounds of {u.op.name}", u.src[0], "bounds"
    else: x, outcome = frame.f_locals["x"], ("declined" if arg is None else "rewrote")
    self.taken[(where, frame.f_lineno, outcome, None if outcome == "declined" else bounds(_numerator(x))[0] < 0)] += 1
    return None

  # the tracer is on only inside the three functions (each is swapped for a wrapper while this is entered): tracing all
  # of simplify doubled the test's time
  def __enter__(self):
    self.originals = {name: getattr(symbolic_module, name) for name in ("_div", "_mod", "_compute_bounds")}
    for name, fn in self.originals.items(): setattr(symbolic_module, name, self._traced(fn))
    return self

  def __exit__(self, *exc):
    for name, fn in self.originals.items(): setattr(symbolic_module, name, fn)

  def _traced(self, fn):
    def traced(*args):
      before = sys.gettrace()
      sys.settrace(self.on_call)
      try: return fn(*args)
      finally: sys.settrace(before)
    return traced


def test_every_rule_of_the_simplifier_fires_and_every_exit_of_the_div_mod_laws_is_taken():
  hits = [0] * len(symbolic.patterns)
  exits = ExitsTaken()
  for seed in range(2_000_000, 2_000_000 + max(ITERS // 2, 800)): check_seed(seed, hits, exits)
  never = [f"rule {i}: {symbolic.patterns[i][0]!r}" for i, n in enumerate(hits) if n == 0]
  assert not never, "rules the fuzzer never reached:\n" + "\n".join(never)
  need = required_exits(div_mod_exits())
  sign = {None: "", True: " with a numerator that can be negative", False: " with a non-negative numerator"}
  missed = [f"{where} line {line}, {outcome}{sign[negative]}: {text}"
            for (where, line, outcome, negative), text in need.items() if not exits.taken[(where, line, outcome, negative)]]
  assert not missed, "exits of the div/mod laws the fuzzer never took (a gap in Gen.index):\n" + "\n".join(missed)


def test_a_sum_read_as_normal_is_the_sum_the_builder_builds():
  """_norm_add skips rebuilding a sum it reads as already in normal form (_in_normal_form): over random sums as the
  fuzzer writes them, as rangeify writes them, and their simplified forms (most of them normal), every sum it reads as
  normal is the very node _build_sum(*_collect(u)) makes of it, and many are; a sum it doesn't rebuilds as before."""
  rng = random.Random(7)
  normal = rebuilt = 0
  for _ in range(3000):
    gen = Gen(rng)
    e = gen.index() if rng.random() < 0.4 else gen.i32(3)
    for u in {x for root in (e, simplify(e)) for x in root.toposort() if x.op is Ops.ADD and x.dtype is dtypes.i32 and not x.shape}:
      col = symbolic_module._collect(u)
      if symbolic_module._in_normal_form(u):
        normal += 1
        assert col is None or symbolic_module._build_sum(*col) is u, to_uir(u)
      elif col is not None and symbolic_module._build_sum(*col) is u: rebuilt += 1    # (a modulo's base: built to be sure)
  assert normal > 2000 and rebuilt < normal
