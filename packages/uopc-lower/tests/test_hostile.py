"""The hostile-input catalogue of uopc-lower: lower, kernelize, linearize, the optimizer's entry points and the
interpreter given the malformed inputs a user can produce. Each gives a correct answer or a one-line error of the
project's own exception types (LowerError, KernelizeError, LinearizeError, InterpretError); no AttributeError,
TypeError, ValueError or UOpError from deep inside a pass escapes."""
import pytest
from uopc.dtype import dtypes
from uopc.uop import UOp, Ops, ParamArg, CallArg, buf, range_, sink
from uopc.rangeify import lower, Ctx, Opts, LowerError
from uopc.kernelize import kernelize, make_kernel, KernelizeError
from uopc.linearize import linearize, LinearizeError
from uopc.opt import choose_opts, Caps
from uopc.interpret import run_linear, InterpretError

one = UOp.const(1.0).reshape((1,))

BAD = {
  # lower
  "an axis past i32": (lambda: lower(one.expand((2**31,)).reshape((2**31, 1)).reduce(Ops.ADD, 2), buf(0, 1)), LowerError,
                       "longer than an i32 loop counter"),
  "a flattened view past i32": (lambda: lower(one.reshape((1, 1)).expand((2**16, 2**16)).reshape((2**32,)).shrink(((0, 4),)), buf(0, 4)),
                                LowerError, "longer than an i32 loop counter"),
  "a RESHAPE of a view past i32": (lambda: lower(one.reshape((1, 1)).expand((2**16, 2**16)).reshape((2**8, 2**24)).shrink(((0, 1), (0, 4))),
                                                 buf(0, 4)), LowerError, "its flat positions pass i32"),
  "an unbound PARAM": (lambda: lower(UOp(Ops.PARAM, (), ParamArg(0, dtypes.f32, (3,))), buf(0, 3)), LowerError, "no index rule for Ops.PARAM"),
  "a CALL": (lambda: lower(UOp(Ops.CALL, (UOp(Ops.PARAM, (), ParamArg(0, dtypes.f32)) * 2.0, UOp.const(1.0)), CallArg()), buf(0, 1)),
             LowerError, "no index rule for Ops.CALL"),
  "an already lowered value": (lambda: lower(range_(4, 0).cast(dtypes.f32), buf(0, 1)), LowerError, "no index rule for Ops.RANGE"),
  "a SINK as the value": (lambda: lower(sink(), buf(0, 1)), LowerError, "the value is dtypes.void"),
  "an int for the Ctx": (lambda: lower(one, buf(0, 1), 3), LowerError, "ctx must be a Ctx"),
  "a too small output": (lambda: lower(one.expand((8,)), buf(0, 5)), LowerError, "needs 8"),
  "an output that is not a BUFFER": (lambda: lower(one, one), LowerError, "must be a BUFFER"),
  "a non-UOp value": (lambda: lower([1.0], buf(0, 1)), LowerError, "lower takes a shaped UOp"),
  "an upcast of 0": (lambda: lower(one, buf(0, 1), Ctx(opts=Opts(upcast={0: 0}))), LowerError, "must be at least 1"),
  "Opts of the wrong types": (lambda: Opts(unroll=1.5), LowerError, "Opts.unroll is an int"),
  "an Opts vector of one number": (lambda: Opts(vector=(0,)), LowerError, "Opts.vector is (axis, lanes)"),
  "an unroll with no reduction": (lambda: lower(one.expand((4,)), buf(0, 4), Ctx(opts=Opts(unroll=2))), LowerError, "no reduction to unroll"),
  # kernelize
  "kernelize of an int": (lambda: kernelize(3), KernelizeError, "list of (shaped UOp, output BUFFER) pairs"),
  "kernelize of a 1-tuple": (lambda: kernelize([(one,)]), KernelizeError, "list of (shaped UOp, output BUFFER) pairs"),
  "kernelize into a smaller buffer": (lambda: kernelize([(one.expand((4,)), buf(0, 2))]), KernelizeError, "can't hold"),
  "kernelize into a constant": (lambda: kernelize([(one, one)]), KernelizeError, "must be a BUFFER"),
  "a kernel whose buffers share a slot": (lambda: make_kernel(buf(0, 4) * 2.0, buf(0, 4), canonical=False), KernelizeError, "share a slot"),
  # linearize, the optimizer, the interpreter
  "linearize of an int": (lambda: linearize(3), LinearizeError, "linearize takes a SINK"),
  "linearize of a value": (lambda: linearize(one), LinearizeError, "linearize takes a SINK"),
  "choose_opts of a UOp": (lambda: choose_opts(one, Caps()), LowerError, "choose_opts takes a Kernel and Caps"),
  "Caps with no threads": (lambda: Caps(threads=0), LowerError, "Caps.threads must be a positive int"),
  "Caps with negative registers": (lambda: Caps(vector_registers=-16), LowerError, "Caps.vector_registers must be a positive int"),
  "run_linear of an int": (lambda: run_linear(3, {}), InterpretError, "run_linear takes the list"),
  "run_linear with no memory": (lambda: run_linear(linearize(lower(buf(0, 4) * 2.0, buf(1, 4))), {1: [0.0] * 4}), InterpretError,
                                "no memory for BUFFER slot 0"),
  "run_linear with memory too small": (lambda: run_linear(linearize(lower(buf(0, 4) * 2.0, buf(1, 4))), {0: [1.0], 1: [0.0] * 4}),
                                       InterpretError, "load of element 1 of memory with 1 elements"),
}


@pytest.mark.parametrize("case", list(BAD))
def test_a_hostile_input_is_a_one_line_error_of_ours(case):
  fn, kind, match = BAD[case]
  with pytest.raises(kind) as e: fn()
  msg = str(e.value)
  assert match in msg and "\n" not in msg and len(msg) < 600, msg


def test_a_view_past_i32_that_is_never_flattened_still_lowers():
  # the (n, m, k) product of a GEMM is a view of n*m*k elements; its index stays per axis, so any size of it is fine
  a = buf(0, 2048 * 2048).reshape((2048, 1, 2048)).expand((2048, 2048, 2048))
  b = buf(1, 2048 * 2048).reshape((1, 2048, 2048)).expand((2048, 2048, 2048))
  assert lower((a * b).reduce(Ops.ADD, 1), buf(2, 2048 * 2048)).op is Ops.SINK


def test_empty_and_size_one_shapes_lower_and_run():
  for shape in [(0,), (3, 0), (0, 4), (1,), (1, 1, 1)]:
    n = 1
    for s in shape: n *= s
    x = buf(0, max(n, 1)).reshape((max(n, 1),)).shrink(((0, n),)).reshape(shape)
    lin = linearize(lower(x * 2.0, buf(1, max(n, 1))))
    mem = {0: [float(i) for i in range(max(n, 1))], 1: [-1.0] * max(n, 1)}
    run_linear(lin, mem)
    assert mem[1] == ([2.0 * i for i in range(n)] if n else [-1.0])   # nothing stored for an empty value
  r = one.reshape((1, 1)).expand((3, 0)).reduce(Ops.ADD, 1)             # a sum over nothing is 0, of a max -inf
  mem = {0: [7.0] * 3}
  run_linear(linearize(lower(r, buf(0, 3))), mem)
  assert mem[0] == [0.0] * 3


def test_the_heuristics_take_a_reduction_over_nothing():
  # found by the Tensor fuzzer: an empty matmul fused into an add made choose_opts divide by the reduced size, 0
  empty = buf(0, 4).reshape((4, 1)).shrink(((0, 4), (0, 0)))                      # (4, 0)
  root = empty.reduce(Ops.ADD, 1) + buf(1, 4)
  kernel = make_kernel(root, buf(2, 4))
  opts = choose_opts(kernel, Caps(threads=2, vector_width=8, fma=True))
  mem = {0: [5.0] * 4, 1: [1.0, 2.0, 3.0, 4.0], 2: [0.0] * 4}
  run_linear(linearize(lower(kernel.canonical_root, kernel.canonical_out, Ctx(opts=opts))), mem)
  assert mem[2] == [1.0, 2.0, 3.0, 4.0]
