"""Symbolic algebra: simplify, bounds, vmin and vmax.

Oracles: worked examples (ravel/unravel round trips, a merge-then-split chain that must fold back), the
evaluator `uopc.evaluate.run` for constant folding, and an independent scalar evaluator below (floor division,
i32 wrap-around, C's _Bool arithmetic) that the fuzzers run at every point of the loop counters' product:
simplify(e) must equal e there, and the bounds of every node must contain every value the node takes.
"""
import gc, itertools, math, random
import pytest
from hypothesis import given, settings, strategies as st
from uopc import symbolic
from uopc.dtype import dtypes
from uopc.uop import UOp, Ops, ParamArg, AxisType, range_
from uopc.evaluate import run, to_python, EvalError
from uopc.symbolic import simplify, bounds, vmin, vmax, I32_MIN, I32_MAX


def param(slot, dtype=dtypes.i32): return UOp(Ops.PARAM, (), ParamArg(slot, dtype))
def c(v, dtype=None): return UOp.const(v, dtype)

# local versions of rangeify's ravel/unravel (uopc.rangeify lives in another package), built the same way: Horner's
# rule, and coordinate k = (flat // (product of the sizes after k)) % size_k, with 0 for a size-1 axis
def ravel(idx, shape):
  flat = c(0)
  for coord, size in zip(idx, shape): flat = flat * size + coord
  return flat

def unravel(flat, shape):
  strides = [math.prod(shape[k + 1:]) for k in range(len(shape))]
  return tuple(c(0) if size == 1 else (flat // stride) % size for size, stride in zip(shape, strides))

i, j, k = range_(4, 0), range_(6, 1), range_(4, 2)
f = param(0, dtypes.f32)


# ---- an independent evaluator: the oracle of the fuzzers ------------------------------------------------------------

def wrap(v: int) -> int: return (v + 2**31) % 2**32 - 2**31

def evaluate(root: UOp, env: dict):
  """root's value with env binding the RANGEs and PARAMs: i32 wraps modulo 2**32, // and % floor, bool + is or, * is and."""
  return evaluate_all(root, env)[root]

def evaluate_all(root: UOp, env: dict) -> dict:
  """The value of every node under root (see evaluate)."""
  val = {}
  for u in root.toposort():
    if u in env: val[u] = env[u]; continue
    s = [val[x] for x in u.src]
    if u.op is Ops.CONST: v = u.arg
    elif u.op is Ops.WHERE: v = s[1] if s[0] else s[2]
    elif u.op is Ops.CAST: v = s[0] != 0 if u.dtype is dtypes.bool else int(s[0])
    elif u.op is Ops.CMPLT: v = s[0] < s[1]
    elif u.op is Ops.CMPNE: v = s[0] != s[1]
    elif u.dtype is dtypes.bool: v = (s[0] and s[1]) if u.op is Ops.MUL else (s[0] or s[1])   # ADD and MAX are "or"
    elif u.op is Ops.ADD: v = wrap(s[0] + s[1])
    elif u.op is Ops.MUL: v = wrap(s[0] * s[1])
    elif u.op is Ops.MAX: v = max(s[0], s[1])
    elif u.op is Ops.FLOORDIV: v = wrap(s[0] // s[1])
    elif u.op is Ops.FLOORMOD: v = s[0] % s[1]
    else: raise AssertionError(f"the test evaluator has no rule for {u.op!r}")
    val[u] = v
  return val

def points(ranges):
  return [dict(zip(ranges, p)) for p in itertools.product(*(range(r.src[0].arg) for r in ranges))]

def assert_simplify_is_exact(e: UOp, ranges, params=(), param_values=(0,)):
  """simplify(e) equals e at every point of the ranges' product (and every PARAM value), and the bounds of every i32 and
  bool node of e and of simplify(e) hold every value that node takes."""
  s = simplify(e)
  nodes = [u for u in dict.fromkeys(e.toposort() + s.toposort()) if u.dtype in (dtypes.i32, dtypes.bool)]
  for env in points(ranges):
    for pv in param_values:
      env.update({p: pv for p in params})
      val = {**evaluate_all(e, env), **evaluate_all(s, env)}
      at = f"at {[env[r] for r in ranges]}, params={pv}"
      assert val[s] == val[e], f"simplify changed the value {at}: {val[e]} -> {val[s]}\n{e}\n{s}"
      for u in nodes:
        lo, hi = bounds(u)
        assert lo <= val[u] <= hi, f"bounds {(lo, hi)} miss the value {val[u]} {at}\n{u}"
  return s


def test_the_test_evaluator_agrees_with_uopc_evaluate():
  p = param(0)
  exprs = [(i * 6 + j - 7) // 4 % 3, (i - 3) * (j - 2) // -3 % -4, (i < j).where(i.maximum(j - 3), p * 7 + (2**31 - 1)),
           ((i * 2**30 + j) // 5).cast(dtypes.bool).cast(dtypes.i32), (i < 2) * (j.ne(3)) + (i.eq(j)).maximum(i < 1)]
  for e in exprs:
    for env in points([i, j]):
      env[p] = 2**31 - 3
      assert evaluate(e, env) == to_python(e.substitute({u: UOp.const(v, u.dtype) for u, v in env.items()}))


# ---- worked examples (ravel and unravel, merge then split) ------------------------------------------------------------

def test_ravel_simplifies_to_i_times_6_plus_j():
  assert simplify(ravel((i, j), (4, 6))) is i * 6 + j


def test_unravel_of_ravel_in_the_same_shape_is_exactly_the_index():
  out = [simplify(u) for u in unravel(ravel((i, j), (4, 6)), (4, 6))]
  assert out[0] is i and out[1] is j


def test_unravel_into_24_by_1_is_the_flat_index_and_zero():
  out = [simplify(u) for u in unravel(ravel((i, j), (4, 6)), (24, 1))]
  assert out[0] is i * 6 + j and out[1] is c(0)


def test_unravel_into_a_different_shape_keeps_real_div_and_mod_and_their_values():
  flat = ravel((i, j), (4, 6))
  out = [simplify(u) for u in unravel(flat, (2, 12))]
  assert out[0].op is Ops.FLOORDIV and out[1].op is Ops.FLOORMOD
  for env in points([i, j]):
    n = env[i] * 6 + env[j]
    assert [evaluate(u, env) for u in out] == [n // 12, n % 12]


def test_merge_then_split_chain_of_pitfall_4_simplifies_to_i():
  i4, j4, k4 = range_(4, 0), range_(4, 1), range_(4, 2)
  assert simplify((((i4 * 4 + j4) * 4 + k4) // 16) % 4) is i4


def test_ravel_unravel_round_trips_in_rank_3_and_rank_4_shapes():
  for shape in [(2, 3, 4), (3, 1, 5), (2, 2, 3, 2), (5, 7, 1, 3)]:
    idx = tuple(range_(s, n) if s != 1 else c(0) for n, s in enumerate(shape))     # a size-1 axis has index 0, as unravel gives it
    out = [simplify(u) for u in unravel(ravel(idx, shape), shape)]
    assert all(u is want for u, want in zip(out, idx)), f"{shape}: {out}"


# ---- integer identities and laws -----------------------------------------------------------------------------------

x, y = range_(10, 3), range_(100, 4)

def test_integer_identities():
  assert simplify(x + 0) is x and simplify(0 + x) is x
  assert simplify(x * 1) is x and simplify(1 * x) is x
  assert simplify(x * 0) is c(0) and simplify(param(0) * 0) is c(0)   # i32 x*0 is 0 whatever x is, wrap included
  assert simplify(x // 1) is x and simplify(param(0) // 1) is param(0)
  assert simplify(x % 1) is c(0) and simplify(param(0) % 1) is c(0)


def test_equal_sums_in_different_orders_become_the_same_node():
  p = param(0)
  forms = [i + 3 + j * 2 + k + p, p + (k + (j * 2 + (3 + i))), (2 * j + i) + (k + 3) + p, k + p + 3 + i + j + j]
  assert len({simplify(e) for e in forms}) == 1
  assert simplify(i * j * p) is simplify(p * (j * i))


def test_like_terms_collect():
  assert simplify(x * 2 + x * 3) is x * 5
  assert simplify(x + x) is x * 2
  assert simplify(x * 3 + y + x * -3) is y
  assert simplify(x * 2 + 1 + x + 2) is x * 3 + 3


def test_a_constant_distributes_over_a_sum_so_div_and_mod_see_every_term():
  assert simplify((i + j) * 3) is i * 3 + j * 3
  assert simplify((i + j) * 3 // 3) is i + j
  assert simplify(((i + j) * 3 + 1) // 3) is i + j
  assert simplify(((i + j) * 3 + 1) % 3) is c(1)
  assert simplify((i * 3 + j * 3) // 3) is i + j


def test_floordiv_and_floormod_of_a_multiple_plus_a_remainder():
  assert simplify((i * 6 + j) // 6) is i and simplify((i * 6 + j) % 6) is j     # 0 <= j < 6: b//c = 0, b%c = b
  big = range_(10, 1)                                                             # 0 <= big < 10: big//6 stays
  assert simplify((i * 6 + big) // 6) is i + big // 6
  assert simplify((i * 6 + big) % 6) is big % 6
  assert simplify((i * 12 + j * 6 + 7) // 6) is i * 2 + j + 1


def test_floordiv_is_zero_and_floormod_is_identity_below_the_divisor():
  assert simplify(x // 10) is c(0) and simplify(x % 10) is x
  assert simplify(x // 11) is c(0) and simplify(x % 11) is x
  assert simplify(x // 9) is not c(0) and simplify(x % 9) is x % 9   # x = 9 reaches the divisor: nothing to decide


def test_nested_floordiv_multiplies_the_divisors():
  assert simplify(y // 3 // 4) is y // 12
  assert simplify(param(0) // 3 // 5) is param(0) // 15


def test_quotient_times_divisor_plus_remainder_is_the_dividend():
  assert simplify(y // 7 * 7 + y % 7) is y
  assert simplify(y % 7 + 7 * (y // 7)) is y
  assert simplify((y // 7 * 7 + y % 7) * 2) is y * 2


def test_comparisons_decided_by_bounds():
  assert simplify(x < 10) is c(True) and simplify(x < 0) is c(False) and simplify(x < 9) is (x < 9)
  assert simplify(x.ne(10)) is c(True) and simplify((x + 3).ne(2)) is c(True) and simplify(x.ne(x)) is c(False)
  assert simplify(param(0) < I32_MIN) is c(False)                  # nothing is below INT_MIN
  assert simplify(x.eq(-1)) is c(False) and simplify(x.ne(y + 10)) is c(True) and simplify(y < x + 100) is c(True)


def test_where_with_a_decided_condition_is_one_branch():
  assert simplify((x < 10).where(y, x)) is y
  assert simplify((x < 0).where(y, x)) is x
  assert simplify((x < 5).where(y, y)) is y


def test_max_decided_by_bounds():
  assert simplify(x.maximum(9)) is c(9) and simplify(x.maximum(-1)) is x and simplify(x.maximum(20)) is c(20)
  assert simplify(x.maximum(5)).op is Ops.MAX and simplify(x.maximum(x)) is x


# ---- floats: only IEEE-exact rules --------------------------------------------------------------------------------

def run_at(e: UOp, value: float):
  return to_python(e.substitute({f: c(value)}))


def test_float_times_one_and_plus_negative_zero_are_the_operand():
  assert simplify(f * 1.0) is f and simplify(1.0 * f) is f
  assert simplify(f + -0.0) is f and simplify(-0.0 + f) is f


def test_float_plus_zero_is_not_simplified():
  e = f + 0.0
  assert simplify(e) is e
  assert math.copysign(1.0, run_at(e, -0.0)) == 1.0          # -0.0 + 0.0 is +0.0: x+0.0 is not x


def test_float_times_zero_is_not_simplified_to_zero():
  e = f * 0.0
  assert simplify(e) is e
  assert math.isnan(run_at(e, math.inf)) and math.copysign(1.0, run_at(e, -1.0)) == -1.0


def test_float_sums_are_not_reassociated():
  e = (f + 1.0) + 2.0
  assert simplify(e) is e and sum(u.op is Ops.ADD for u in simplify(e).toposort()) == 2
  assert run_at(e, 2.0**24) != run_at(f + 3.0, 2.0**24)      # f32 rounding: (x+1)+2 != x+3 at x = 2**24


def test_float_constant_folding_rounds_to_f32_like_run():
  exprs = [c(0.1) + c(0.2), c(1e30) * c(1e10), c(16777216.0) + c(1.0), c(-2.5).cast(dtypes.i32), c(1e39).cast(dtypes.i32),
           c(3.0).recip(), UOp(Ops.SQRT, (c(2.0),)), UOp(Ops.EXP2, (c(0.5),)), UOp(Ops.LOG2, (c(10.0),)), UOp(Ops.SIN, (c(1.0),)),
           c(math.nan).maximum(c(1.0)), c(3).cast(dtypes.f32) * c(0.1), (c(0.1) < c(0.2)).where(c(0.3), c(0.4))]
  for e in exprs:
    s = simplify(e)
    assert s.op is Ops.CONST and s is run(e), f"{e} folds to {s}, run gives {run(e)}"
  assert simplify(c(0.1) + c(0.2)).arg == 0.30000001192092896 != 0.1 + 0.2


def test_float_folding_reads_each_f32_constant_as_its_f32_value_like_run():
  # an f32 CONST holding a double that is no f32 means that double rounded to f32 (`1.0000000298f` in C): folding once
  # computed with the unrounded double, so odd + 2**-25 was 1.0000001 and odd != 1.0 was True where run says 1.0 and False
  odd = 1 + 2**-25 + 2**-40
  exprs = [c(odd) + c(2.0**-25), c(odd).ne(c(1.0)), c(odd) < c(1.0), c(0.1).maximum(c(odd)), c(2147483647.5).cast(dtypes.i32),
           c(odd).cast(dtypes.bool), c(odd) * c(3.0)]
  for e in exprs:
    s = simplify(e)
    assert s.op is Ops.CONST and s is run(e), f"{e} folds to {s}, run gives {run(e)}"


def test_integer_constant_folding_wraps_and_floors_like_run():
  exprs = [c(I32_MAX) + c(1), c(I32_MIN) * c(-1), c(65536) * c(65536), c(-7) // c(2), c(-7) % c(2), c(7) // c(-2), c(7) % c(-2),
           c(I32_MIN) // c(-1), c(True).cast(dtypes.i32), c(5).cast(dtypes.bool), c(3).maximum(c(-4)), c(-3) < c(2)]
  for e in exprs: assert simplify(e) is run(e)


def test_division_by_constant_zero_is_left_for_the_backend():
  e = c(7) // c(0)
  assert simplify(e) is e and simplify(x % 0) is x % 0
  with pytest.raises(EvalError): run(e)


# ---- bounds ----------------------------------------------------------------------------------------------------------

def test_bounds_of_leaves():
  assert bounds(c(5)) == (5, 5) and bounds(x) == (0, 9) and bounds(range_(1, 9)) == (0, 0)
  assert bounds(param(0)) == (I32_MIN, I32_MAX) and bounds(c(True)) == (True, True)
  assert bounds(f) == (-math.inf, math.inf) and bounds(c(1.5)) == (1.5, 1.5)
  assert vmin(x) == 0 and vmax(x) == 9


def test_bounds_of_add_and_mul_take_every_corner():
  assert bounds(x + y) == (0, 108) and bounds(x - 5) == (-5, 4)
  assert bounds((x - 5) * (y - 3)) == (-480, 384)          # the corners: -5*-3, -5*96, 4*-3, 4*96
  assert bounds(x * -3) == (-27, 0) and bounds((x - 5) * -2) == (-8, 10)


def test_bounds_of_floordiv_and_floormod_by_positive_constants():
  assert bounds(x // 3) == (0, 3) and bounds((x - 5) // 3) == (-2, 1)
  assert bounds(x % 3) == (0, 2) and bounds((x - 5) % 3) == (0, 2) and bounds(x % 20) == (0, 9)
  assert bounds((x + 12) % 10) == (0, 9) and bounds((x + 20) % 30) == (20, 29)
  assert bounds(param(0) % 4) == (0, 3) and bounds(param(0) // 4) == (I32_MIN // 4, I32_MAX // 4)


def test_bounds_of_max_where_and_comparisons():
  assert bounds(x.maximum(c(4))) == (4, 9) and bounds((x - 20).maximum(y - 50)) == (-20, 49)
  assert bounds((x < 5).where(x, y + 100)) == (0, 199)
  assert bounds((x < 10).where(x, y + 100)) == (0, 9)          # decided: only the taken branch
  assert bounds(x < 10) == (True, True) and bounds(x < 0) == (False, False) and bounds(x < 5) == (False, True)
  assert bounds(x.ne(10)) == (True, True) and bounds(c(3).ne(c(3))) == (False, False) and bounds(x.ne(3)) == (False, True)


def test_bounds_of_casts():
  assert bounds((x < 5).cast(dtypes.i32)) == (0, 1) and bounds((x < 10).cast(dtypes.i32)) == (1, 1)
  assert bounds(x.cast(dtypes.bool)) == (False, True) and bounds((x + 1).cast(dtypes.bool)) == (True, True)
  assert bounds(x.cast(dtypes.f32).cast(dtypes.i32)) == (I32_MIN, I32_MAX)


def test_bounds_of_i32_overflow_are_the_whole_range():
  assert bounds(x * 2**30) == (I32_MIN, I32_MAX)
  assert bounds(x + (I32_MAX - 5)) == (I32_MIN, I32_MAX)
  assert bounds(x + (I32_MAX - 9)) == (I32_MAX - 9, I32_MAX)   # reaches INT_MAX, never past it
  assert bounds(param(0) + 1) == (I32_MIN, I32_MAX) and bounds(param(0) * 2) == (I32_MIN, I32_MAX)


# ---- fuzzers: simplify is exact at every point, bounds hold every value ------------------------------------------------

BIG = [I32_MAX, I32_MAX - 1, I32_MIN, I32_MIN + 1, 2**30, -2**30, 2**30 + 1, 3 * 2**29, 65536, -65536, 123456789]
PARAM_VALUES = (0, 1, -1, 7, I32_MIN, I32_MAX)

def random_expr(rng: random.Random, leaves: list, ranges: list, depth: int, big: bool) -> UOp:
  """An i32 expression over `leaves`: + and * with constants of both signs, // and % by constants (positive, negative,
  and, with `big`, near 2**31) or by a positive loop-dependent divisor, MAX, WHERE and casts of comparisons."""
  def const():
    if big and rng.random() < 0.3: return c(rng.choice(BIG + [rng.randint(I32_MIN, I32_MAX), (1 << rng.randint(10, 30)) + rng.randint(-3, 3)]))
    return c(rng.randint(-8, 8))
  def divisor():
    r = rng.random()
    if r < 0.15: return rng.choice(ranges) + rng.randint(1, 3)                  # positive, not a constant
    return c(rng.choice([1, 2, 3, 4, 5, 6, 8, 12, 16, -1, -2, -3, -4] + ([65536, 2**30, I32_MAX] if big else [])))
  def num(d):
    if d == 0 or rng.random() < 0.2: return rng.choice(leaves) if rng.random() < 0.75 else const()
    op = rng.randrange(10)
    if op == 0: return num(d - 1) + num(d - 1)
    if op == 1: return num(d - 1) * const()
    if op == 2: return num(d - 1) * num(d - 1)
    if op == 3: return num(d - 1) // divisor()
    if op == 4: return num(d - 1) % divisor()
    if op == 5: return num(d - 1).maximum(num(d - 1))
    if op == 6: return cond(d - 1).where(num(d - 1), num(d - 1))
    if op == 7: return cond(d - 1).cast(dtypes.i32)
    if op == 8: return num(d - 1) - num(d - 1)
    return num(d - 1) + const()
  def cond(d):
    op = rng.randrange(6)
    if op == 0: return num(d) < num(d)
    if op == 1: return num(d).ne(num(d))
    if op == 2: return num(d).eq(num(d))
    if op == 3: return cond(d - 1) * cond(d - 1) if d > 0 else num(0) < num(0)      # and
    if op == 4: return cond(d - 1) + cond(d - 1) if d > 0 else num(0).ne(num(0))    # or
    return num(d).cast(dtypes.bool)
  return num(depth)

def random_case(seed: int, big: bool):
  rng = random.Random(seed)
  ranges = [range_(rng.randint(1, 5), n) for n in range(rng.randint(2, 3))]
  p = param(0)
  with_param = rng.random() < 0.3
  e = random_expr(rng, ranges + [p] * with_param, ranges, rng.randint(2, 6), big)
  return e, ranges, ([p] if with_param and p in e.toposort() else [])


@pytest.mark.parametrize("block", range(4))
def test_fuzz_simplify_is_exact_on_small_constants(block):
  for seed in range(block * 250, (block + 1) * 250):
    e, ranges, params = random_case(seed, big=False)
    assert_simplify_is_exact(e, ranges, params, PARAM_VALUES if params else (0,))


@pytest.mark.parametrize("block", range(4))
def test_fuzz_simplify_is_exact_under_i32_wrap_around(block):
  for seed in range(10_000 + block * 250, 10_000 + (block + 1) * 250):
    e, ranges, params = random_case(seed, big=True)
    assert_simplify_is_exact(e, ranges, params, PARAM_VALUES if params else (0,))


def linear_div_mod_case(seed: int):
  """sum(k*r) + C, then // or % by a constant, once or twice, with k, C and the divisor often near 2**31: the shapes where
  the div/mod laws would be wrong if a rebuilt dividend could wrap."""
  rng = random.Random(seed)
  def k(): return rng.choice(BIG) if rng.random() < 0.3 else rng.randint(-9, 9)
  ranges = [range_(rng.randint(1, 6), n) for n in range(rng.randint(1, 3))]
  e = c(k())
  for r in ranges:
    if rng.random() < 0.8: e = e + r * k()
  for _ in range(rng.randint(1, 2)):
    d = rng.choice([2, 3, 4, 5, 6, 7, 8, 16, I32_MAX, 2**30, 65536, I32_MAX - 2])
    e = e // d if rng.random() < 0.5 else e % d
    if rng.random() < 0.5: e = e + k() + ranges[0] * k()
  return e, ranges


def test_fuzz_linear_div_mod_near_the_i32_limits():
  for seed in range(1500):
    e, ranges = linear_div_mod_case(seed)
    assert_simplify_is_exact(e, ranges)


@settings(max_examples=300, deadline=None)
@given(ends=st.lists(st.integers(1, 6), min_size=1, max_size=3),
       coeffs=st.lists(st.one_of(st.integers(-12, 12), st.sampled_from(BIG)), min_size=3, max_size=3),
       const=st.one_of(st.integers(-40, 40), st.sampled_from(BIG)),
       ops=st.lists(st.tuples(st.sampled_from(["//", "%"]), st.one_of(st.integers(1, 20), st.sampled_from([65536, 2**30, I32_MAX]))),
                    min_size=1, max_size=3))
def test_property_div_and_mod_of_linear_forms_are_exact(ends, coeffs, const, ops):
  ranges = [range_(n, idx) for idx, n in enumerate(ends)]
  e = c(const)
  for r, kk in zip(ranges, coeffs): e = e + r * kk
  for op, d in ops: e = e // d if op == "//" else e % d
  assert_simplify_is_exact(e, ranges)


# ---- regressions found by the fuzzers --------------------------------------------------------------------------------

def test_mod_does_not_move_a_constant_into_a_dividend_that_then_wraps():
  # (j - 1) % (2**31 - 1) once became (j + 2147483646) % (2**31 - 1), which wraps at j = 2
  r = range_(3, 1)
  assert_simplify_is_exact((r - 1) % I32_MAX, [r])
  assert_simplify_is_exact((r * -65536 - 3 + r * 3) % (I32_MAX - 2), [r])
  assert_simplify_is_exact(((r * 8 - 1) % 65536 - 7) // I32_MAX, [r])


def test_mod_within_one_period_near_int_min_does_not_build_an_unrepresentable_constant():
  # x in [INT_MIN, INT_MIN + 2] is in one period of 2**31 - 1: x%c = x + 2*c, and 2*c does not fit in an i32 CONST
  r = range_(3, 1)
  assert_simplify_is_exact((r + I32_MIN) % I32_MAX, [r])
  assert_simplify_is_exact((r + I32_MIN) % (2**30 + 1), [r])


# ---- memoization ------------------------------------------------------------------------------------------------------

def test_simplify_is_idempotent():
  for e in [ravel((i, j), (4, 6)) // 5 % 3, (x * 2 + y) % 7 + x, (f + 1.0) * 1.0]:
    s = simplify(e)
    assert simplify(s) is s and simplify(e) is s


def test_simplify_of_an_already_simplified_graph_does_no_rewriting(monkeypatch):
  a, b = range_(11, 700), range_(13, 701)
  e = ((a * 13 + b) // 13 * 5 + (a * 13 + b) % 13) % 97
  s = simplify(e)
  def no_rewrite(*args, **kw): raise AssertionError("simplify rewrote a graph it had already simplified")
  monkeypatch.setattr(symbolic, "graph_rewrite", no_rewrite)
  assert simplify(e) is s and simplify(s) is s
  for u in e.toposort(): simplify(u)          # simplify(e) left its result on every node it visited


def test_simplify_memo_does_not_keep_nodes_alive():
  gc.collect()
  before = len(UOp._cache)
  a, b, p = range_(17, 801), range_(19, 802), param(5)
  e = ((((a * 19 + b) * 3 + 1017) // 3) % 1009 + p * 1011) // 1013
  assert simplify(e) is not e and len(UOp._cache) > before
  del a, b, p, e
  gc.collect()
  assert len(UOp._cache) == before


# ---- deep graphs -----------------------------------------------------------------------------------------------------
# The work simplify does is counted, not timed: the nodes it builds and the rewrites it tries per node of the chain stay
# a small constant (5 and 3 today), where a rule that rebuilt the chain behind a node (reassociating a sum one term at a
# time) would build hundreds of thousands per node. A wall-clock limit is the machine's verdict, not the code's.

def simplify_counting_work(e: UOp, monkeypatch) -> tuple[UOp, int, int]:
  """simplify(e), and how many UOps it built (cache hits included) and how many nodes it tried the rules on."""
  built, tried = [0], [0]
  new, rewrite = UOp.__dict__["__new__"], symbolic.symbolic._rewrite
  def counting_new(cls, *args, **kw):
    built[0] += 1
    return new(cls, *args, **kw)
  def counting_rewrite(u, ctx):
    tried[0] += 1
    return rewrite(u, ctx)
  with monkeypatch.context() as m:
    m.setattr(UOp, "__new__", counting_new)
    m.setattr(symbolic.symbolic, "_rewrite", counting_rewrite)
    s = simplify(e)
  return s, built[0], tried[0]


def test_simplify_folds_a_50000_node_chain_of_plus_one(monkeypatch):
  p = param(0)
  e = p
  for _ in range(50_000): e = e + 1
  s, built, tried = simplify_counting_work(e, monkeypatch)
  assert s is p + 50_000
  assert built <= 8 * 50_000 and tried <= 4 * 50_000, (built, tried)


def test_simplify_a_50000_node_chain_over_distinct_terms(monkeypatch):
  p = param(0)
  e = p
  for n in range(50_000): e = e + p // (n + 2)
  s, built, tried = simplify_counting_work(e, monkeypatch)
  assert built <= 4 * 50_000 and tried <= 4 * 50_000, (built, tried)
  v = 123_456_789
  assert evaluate(s, {p: v}) == wrap(v + sum(v // (n + 2) for n in range(50_000)))


def test_a_vector_lane_over_an_aligned_base_comes_out_of_div_and_mod():
  """Lane l of a 16-lane vector at 16*b: the conditions of a concatenation's selects, (16*b + l + 128)//256 and
  ((16*b + l) % 128)//32, are the same for every lane, and (16*b + l) % 32 is a base plus the lane (a vector load).
  A plain range keeps its one % (unravel into (2, 12) above)."""
  b, lane = range_(24, 0), range_(16, 1, AxisType.UPCAST)
  x = b * 16 + lane
  assert simplify((x + 128) // 256) is simplify((b + 8) // 16)
  assert simplify((x % 128) // 32) is simplify((b % 8) // 2)
  assert simplify((x + 128) % 256) is simplify(((b + 8) % 16) * 16 + lane)
  assert simplify(x % 32) is simplify((b % 2) * 16 + lane)
  for e in [(x + 128) // 256, (x + 128) % 256, (x % 128) // 32, x % 32, (x + 3) % 32]:
    for env in points([b, lane]): assert evaluate(simplify(e), env) == evaluate(e, env)


def test_a_product_by_a_constant_is_one_term_of_div_and_mod():
  """(i*2) % 2 is 0 and (i*4)//2 is i*2, as for a sum of such terms: the address of a lane's pair of outputs (2*t) is
  proven even, so the pair is stored as one 8-byte vector. Where the product may wrap, nothing changes."""
  i = range_(32, 0)
  assert simplify((i * 2) % 2) is UOp.const(0) and simplify((i * 4) // 2) is simplify(i * 2)
  assert simplify((i * 6) % 4).op is Ops.FLOORMOD                     # 6 is no multiple of 4: the % stays
  big = UOp(Ops.PARAM, (), ParamArg(0, dtypes.i32, ()))
  assert simplify((big * 2) % 2).op is Ops.FLOORMOD                   # any i32: big * 2 can wrap
  for e in [(i * 2) % 2, (i * 4) // 2, (i * 6) % 4, (i * 6) // 4, (i * -4) // 2]:
    for env in points([i]): assert evaluate(simplify(e), env) == evaluate(e, env)
