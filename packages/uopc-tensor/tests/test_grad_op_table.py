"""Every op of a shaped graph has its local derivatives in uopc.grad's GRAD_RULES (the op-table tests of the other
packages check their own tables; testing/op_tables.py says how ops are classed). A new op fails here by name."""
from uopc.uop import Ops
from uopc.grad import GRAD_RULES
from op_tables import SHAPED, assert_covers


def test_autodiff_has_a_rule_for_every_op_of_a_shaped_graph():
  # a CONST and a BUFFER have no sources to hand a gradient to (a BUFFER is where gradient() stops: a w of wrt)
  assert_covers("grad.GRAD_RULES", GRAD_RULES, SHAPED, leaves_out={Ops.CONST, Ops.BUFFER})
