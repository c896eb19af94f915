"""Every member of Ops has its entry in every table of uopc-lower that must know it: rangeify's index rules, kernelize's
cost of recomputing an ALU op, and the reference interpreter's statements. A new op fails here, naming each table it
is missing from (testing/op_tables.py says how ops are classed)."""
from uopc.uop import Ops, ALU, MOVEMENT
from uopc.rangeify import INDEX_RULES, INDEX_MAPS
from uopc.kernelize import ALU_COST
from uopc.interpret import STATEMENTS
from op_tables import SHAPED, LINEAR, ASYNC_OPS, assert_covers


def test_rangeify_has_an_index_rule_for_every_op_of_a_shaped_graph():
  assert_covers("rangeify.INDEX_RULES", INDEX_RULES, SHAPED)
  assert_covers("rangeify.INDEX_MAPS (the movement ops' index maps)", INDEX_MAPS, MOVEMENT)


def test_kernelize_knows_what_recomputing_every_alu_op_costs():
  assert_covers("kernelize.ALU_COST", ALU_COST, ALU)


def test_the_reference_interpreter_runs_every_statement_of_a_linearized_program():
  # RANGE and END move the program counter (run_linear's loop); STACK and WMMA are a GPU warp's tensor-core fragments,
  # run only where a warp's lanes run together (the PYTHON backend), and so are the pipelined GEMM's copies in flight
  # and warp-wide matrix loads (ASYNC_OPS)
  assert_covers("interpret.STATEMENTS", STATEMENTS, LINEAR, leaves_out={Ops.RANGE, Ops.END, Ops.STACK, Ops.WMMA} | ASYNC_OPS)
