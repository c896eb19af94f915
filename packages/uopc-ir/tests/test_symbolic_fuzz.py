"""The symbolic fuzzer over every rule of `symbolic`, with the evaluator (uopc.evaluate.run) as the oracle.

Random expressions mix i32, bool and f32 values over RANGEs and PARAMs: sums, products, floor division and modulo by
constants of both signs, MAX, comparisons, WHERE, casts both ways (and to the same dtype), the float functions, MULACC,
double negations, x*1.0 and x+(-0.0), with -0.0, inf and NaN among the constants. At sampled points (each RANGE and
PARAM bound to a CONST) simplify(e) and e must evaluate to the same bits (every NaN alike); a point where e itself has
no value (a division by zero) is skipped. Across the corpus every rule of the matcher must fire, so a rule that no
expression reaches is a gap in the fuzzer, not a rule that is silently untested. A failure prints the seed and the
expression as .uir, and UOPC_FUZZ_SEED=N reruns just that seed. UOPC_FUZZ_ITERS=N runs N expressions (CI: 1600).
"""
import math, os, random, struct
import pytest
from uopc.dtype import dtypes
from uopc.uop import UOp, Ops, ParamArg, range_
from uopc.uir import to_uir
from uopc.rewrite import PatternMatcher, graph_rewrite
from uopc.evaluate import run, EvalError
from uopc.symbolic import simplify, symbolic

ITERS = int(os.environ.get("UOPC_FUZZ_ITERS", "1600"))
SEED = os.environ.get("UOPC_FUZZ_SEED")
I32_CONSTS = [0, 1, -1, 2, 3, -3, 4, 7, 8, 16, 2**31 - 1, -2**31, 65536, 2**30]
F32_CONSTS = [0.0, -0.0, 1.0, -1.0, 0.5, 2.0, -2.5, 1e30, -1e-30, math.inf, -math.inf, math.nan, 3.0]


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
    op = r.randrange(14)
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
    return (a % UOp.const(16)) % UOp.const(r.choice([2, 4, 8]))

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
    d = self.rng.randint(1, 4)
    return self.rng.choice([self.i32, self.boolean, self.f32])(d)


def bits(lit: UOp):
  """A literal's value, comparable bit for bit: floats by their f32 bits with every NaN alike."""
  v = lit.src[0].arg if lit.op is Ops.CAST else lit.arg
  if isinstance(v, float): return "nan" if v != v else struct.pack("<f", v)
  return v


def value_at(e: UOp, env: dict[UOp, UOp]):
  try: return bits(run(e.substitute(env)))
  except EvalError: return None      # no value here (a division by zero): the point says nothing


def check_seed(seed: int, hits: list[int] | None = None) -> None:
  rng = random.Random(seed)
  g = Gen(rng)
  e = g.expression()
  s = simplify(e)
  if hits is not None:
    counted = graph_rewrite(e, COUNTING, ctx=hits)
    assert counted is s, f"seed {seed}: the counting matcher and simplify disagree"
  leaves = [u for u in e.toposort() if u.op in (Ops.RANGE, Ops.PARAM)]
  for _ in range(8):
    env = {}
    for u in leaves:
      if u.op is Ops.RANGE: env[u] = UOp.const(rng.randrange(u.src[0].arg))
      elif u.dtype is dtypes.i32: env[u] = UOp.const(rng.choice(I32_CONSTS + [rng.randint(-2**31, 2**31 - 1)]))
      else: env[u] = UOp.const(rng.choice(F32_CONSTS + [rng.uniform(-10, 10)]))
    want = value_at(e, env)
    if want is None: continue
    got = value_at(s, {u: v for u, v in env.items()})
    assert got == want, (f"seed {seed} (UOPC_FUZZ_SEED={seed} reruns it): simplify changed the value at "
                         f"{ {u.op.name + str(u.arg.idx if u.op is Ops.RANGE else u.arg.slot): v.arg for u, v in env.items()} }: "
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


def test_every_rule_of_the_simplifier_fires_in_the_fuzz_corpus():
  hits = [0] * len(symbolic.patterns)
  for seed in range(2_000_000, 2_000_000 + max(ITERS // 2, 200)): check_seed(seed, hits)
  never = [f"rule {i}: {symbolic.patterns[i][0]!r}" for i, n in enumerate(hits) if n == 0]
  assert not never, "rules the fuzzer never reached:\n" + "\n".join(never)
