"""Every member of Ops has its entry in every table of uopc-ir that must know it: the type rules, the evaluator's
scalar semantics (one table per arity) and its fold-or-refuse rules, and the simplifier's constant folding. A new op
fails here, naming each table it is missing from (testing/op_tables.py says how ops are classed)."""
from uopc.uop import Ops, ALU, UNARY, BINARY, TERNARY, _RULES
from uopc import evaluate
from uopc.symbolic import symbolic
from op_tables import SHAPED, LINEAR, CALLS, assert_covers, missing


def test_every_op_is_in_a_class_the_op_tables_read():
  assert not (unclassed := missing(SHAPED | LINEAR | CALLS, set(Ops))), f"place {unclassed} in testing/op_tables.py"
  assert ALU == UNARY | BINARY | TERNARY and not (UNARY & BINARY or BINARY & TERNARY or UNARY & TERNARY)


def test_the_type_checker_has_a_rule_for_every_op():
  assert_covers("uop._RULES (the type checker)", _RULES, set(Ops))


def test_the_evaluator_has_scalar_semantics_for_every_alu_op():
  # CAST is a conversion, not arithmetic: evaluate.cast_value does it
  assert_covers("evaluate._UNARY_FN", evaluate._UNARY_FN, UNARY, leaves_out={Ops.CAST})
  assert_covers("evaluate._BINARY_FN", evaluate._BINARY_FN, BINARY)
  assert_covers("evaluate._TERNARY_FN", evaluate._TERNARY_FN, TERNARY)
  # on bools the binary ops are C's _Bool arithmetic; the type checker gives FLOORDIV and FLOORMOD only i32 operands
  assert_covers("evaluate._BOOL_FN", evaluate._BOOL_FN, BINARY, leaves_out={Ops.FLOORDIV, Ops.FLOORMOD})


def test_the_evaluator_folds_or_refuses_every_op():
  # a CALL is inlined by the first pass (evaluate._inline_calls) before these rules run; a STACK of literals is a literal,
  # and so is a VECTORIZE of scalar literals (a vector's literal)
  assert_covers("evaluate._inline_calls", evaluate._inline_calls.pdict, {Ops.CALL})
  assert_covers("evaluate._evaluate", evaluate._evaluate.pdict, set(Ops), leaves_out={Ops.CALL, Ops.STACK, Ops.VECTORIZE})


def test_the_simplifier_folds_every_alu_op_on_constants():
  # the other rules are laws of particular ops (x*1, sums in normal form, div/mod): no op needs one to be correct
  assert_covers("symbolic (constant folding)", symbolic.pdict, ALU)
