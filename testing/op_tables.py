"""What the op-table tests of every package share: the classes of ops that each table keyed by op must cover, and the
check that names what a table is missing.

A new op is added to uop.Ops and to one class here (an ALU op joins one of uop's UNARY, BINARY, TERNARY sets, and so
ALU, by itself); every op-table test then names each table that has no entry for it: the type rules, the evaluator,
the simplifier, the index rules, the cost table, the renderers, the interpreters, the gradients. Each test states the
ops a table leaves out on purpose, with the reason, as an explicit exclusion set.
"""
from uopc.uop import Ops, ALU, MOVEMENT

# a read at loaded positions (uopc-ir 0.5 and later: by name, as the vector ops below)
GATHER_OPS = {Ops.__members__[name] for name in ("GATHER",) if name in Ops.__members__}
# what a shaped graph holds: the values Tensor builds, kernelize cuts, rangeify lowers and autodiff differentiates
SHAPED = ALU | MOVEMENT | {Ops.CONST, Ops.BUFFER, Ops.STACK, Ops.INDEX, Ops.REDUCE, Ops.STAGE} | GATHER_OPS
# what a linearized program holds: no shapes left, memory and loops instead, and vectors (what renderers and interpreters read)
# (by name: uopc-ir before 0.3 has no vectors, and `nox -s compat` runs uopc-tensor's tests, which import this, on it)
VECTOR_OPS = {Ops.__members__[name] for name in ("VECTORIZE", "GEP") if name in Ops.__members__}
# a GPU's asynchronous copies and matrix loads (uopc-ir 0.3.3 and later: by name too)
ASYNC_OPS = {Ops.__members__[name] for name in ("ASYNC_COPY", "ASYNC_COMMIT", "ASYNC_WAIT", "LDMATRIX") if name in Ops.__members__}
LINEAR = ALU | {Ops.CONST, Ops.BUFFER, Ops.ALLOC, Ops.INDEX, Ops.LOAD, Ops.STORE, Ops.AFTER, Ops.SINK, Ops.RANGE, Ops.END, Ops.BARRIER,
                Ops.STACK, Ops.WMMA} | VECTOR_OPS | ASYNC_OPS
# what only the evaluator meets: a function's parameters and its calls (inlined before anything else looks)
CALLS = {Ops.PARAM, Ops.CALL}


def missing(table, required) -> list[str]:
  """The names of the ops in `required` that `table` (anything supporting `in`) has no entry for, sorted."""
  return sorted(op.name for op in required if op not in table)


def assert_covers(name: str, table, required, leaves_out=frozenset()) -> None:
  """Assert that `table` has an entry for every op in `required` but those it `leaves_out` on purpose (which must really
  be left out: an exclusion that has become an entry is stale)."""
  assert not (stale := sorted(op.name for op in leaves_out if op in table)), f"{name} has entries for {stale}, which it is said to leave out"
  assert not (gaps := missing(table, set(required) - set(leaves_out))), f"{name} has no entry for {', '.join(gaps)}"
