"""Every member of Ops has its entry in every table of uopc-backends that must know it: the C and CUDA renderers'
expressions and statements, and the PYTHON backend's emulated ALU and statements. A new op fails here, naming each
table it is missing from (testing/op_tables.py says how ops are classed). Shaped ops never reach a backend: lowering
turned them into loops, so only the ops of a linearized program are asked for."""
from uopc.uop import Ops, ALU, UNARY, BINARY, TERNARY
from uopc.backends.c import CRenderer, _Body
from uopc.backends.cuda import CUDARenderer
from uopc.backends import python
from op_tables import LINEAR, assert_covers


def test_the_c_and_cuda_renderers_render_every_op_of_a_linearized_program():
  for renderer in (CRenderer, CUDARenderer):
    # a cast reads its operand's type, and floor division its operands' bounds (C's / where they are non-negative), so
    # _Body renders those three with methods (render_cast, divmod) rather than a format of the operand strings
    assert_covers(f"{renderer.__name__}.code_for_op", renderer.code_for_op, ALU, leaves_out={Ops.CAST, Ops.FLOORDIV, Ops.FLOORMOD})
  assert_covers("c._Body.statements", _Body.statements, LINEAR - ALU)


def test_the_python_backend_runs_every_op_of_a_linearized_program():
  # RANGE and END move the program counter (run_grid's loop)
  assert_covers("python.STATEMENTS", python.STATEMENTS, LINEAR, leaves_out={Ops.RANGE, Ops.END})
  assert_covers("python._UNARY", python._UNARY, UNARY, leaves_out={Ops.CAST})          # CAST: python._cast
  assert_covers("python._BINARY", python._BINARY, BINARY)
  assert_covers("python._TERNARY", python._TERNARY, TERNARY)
  assert_covers("python._BOOL", python._BOOL, BINARY, leaves_out={Ops.FLOORDIV, Ops.FLOORMOD})   # i32 only (the type checker)
