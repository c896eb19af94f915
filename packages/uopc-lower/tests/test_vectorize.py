"""uopc.vectorize: lanes become vector values and neighbouring memory moves wide ones, and the program computes what it
computed before, bit for bit. The oracle is the reference interpreter, which runs both: the lowered program (lanes as a
loop) and the vectorized one (vectors as tuples of lanes)."""
import math
import struct
import numpy as np
import pytest
from uopc.dtype import dtypes
from uopc.uop import UOp, Ops, AxisType, buf, range_, sink
from uopc.lowering import LowerError
from uopc.rangeify import lower, Opts, Ctx
from uopc.linearize import linearize
from uopc.interpret import run_linear
from uopc.vectorize import vectorize, _Lanes

rng = np.random.default_rng(0)


def bits(values: list) -> list:
  """Floats by their bits (NaN, -0.0 and 0.0 told apart), everything else as it is."""
  return [struct.pack("<f", v) if isinstance(v, float) else v for v in values]


def run(program: UOp, inputs: list[np.ndarray], n: int) -> list:
  mem = {i: a.ravel().tolist() for i, a in enumerate(inputs)}
  mem[len(inputs)] = [None] * n
  run_linear(linearize(program), mem)
  return mem[len(inputs)]


def programs():
  """(name, shaped root, inputs, Opts): elementwise, reductions along lanes (horizontal sums and maxes with NaN, -0.0 and
  infinities), lanes across rows (gathers and scatters), masks, integers, a long sum in chunks."""
  x = rng.standard_normal((8, 32)).astype(np.float32)
  x[1, 3], x[2, 7], x[3, 0], x[4, 4], x[5, 9] = np.nan, -0.0, np.inf, -np.inf, 0.0
  y = rng.standard_normal((8, 32)).astype(np.float32)
  X, Y = buf(0, 256).reshape((8, 32)), buf(1, 256).reshape((8, 32))
  i = rng.integers(-50, 50, (8, 32)).astype(np.int32)
  Ii = buf(0, 256, dtypes.i32).reshape((8, 32))
  long = rng.standard_normal(3 * 4096 + 64).astype(np.float32)
  yield "axpy", X * 2.0 + Y, [x, y], Opts(vector=(1, 16))
  yield "row sum", X.reduce(Ops.ADD, 1), [x], Opts(reduce_vector=8, unroll=2)
  yield "row max", X.reduce(Ops.MAX, 1), [x], Opts(reduce_vector=16)
  yield "column max, lanes across rows", X.permute((1, 0)).reduce(Ops.MAX, 1), [x], Opts(vector=(0, 8))
  yield "transpose: gathers", X.permute((1, 0)) + 1.0, [x], Opts(vector=(1, 8))
  yield "rows as lanes: scatters", X * Y, [x, y], Opts(vector=(0, 4), upcast={1: 2})
  yield "masks", ((X < Y) * Y.ne(0.5)).where(X, Y.maximum(X)), [x, y], Opts(vector=(1, 8))
  yield "integers", ((Ii // 3) * 3 + Ii % -5 + Ii // 7).cast(dtypes.f32), [i], Opts(vector=(1, 16))
  yield "bool sum", (X < 0.0).reduce(Ops.ADD, 1), [x], Opts(reduce_vector=4)
  yield "a long sum in chunks", buf(0, long.size).reduce(Ops.ADD, 1), [long], Opts(reduce_vector=16, unroll=4)
  # two heads of 16 columns read through a permutation: column c is d = c % 16 of head c // 16, so 4 lanes at column
  # 8*j + lane read (8*j + lane) % 16 (the lanes never cross a multiple of 8)
  heads = buf(0, 256).reshape((2, 8, 16)).permute((1, 0, 2)).reshape((8, 32))
  yield "heads through a modulo", heads * 2.0, [x], Opts(vector=(1, 4), upcast={1: 2})
  yield "gemm", ((X.reshape((8, 1, 32)).expand((8, 8, 32))) * Y.reshape((1, 8, 32)).expand((8, 8, 32))).reduce(Ops.ADD, 1), \
    [x, y], Opts(vector=(1, 8), upcast={0: 2}, fma=True)


@pytest.mark.parametrize("name, root, inputs, opts", list(programs()), ids=[p[0] for p in programs()])
def test_the_vectorized_program_computes_what_the_lanes_as_a_loop_compute(name, root, inputs, opts):
  n = max(1, math.prod(root.shape))
  program = lower(root, buf(len(inputs), n, root.dtype), Ctx(opts=opts))
  vectors = vectorize(program)
  nodes = vectors.toposort()
  assert not any(u.op is Ops.RANGE and u.arg.kind is AxisType.UPCAST for u in nodes)     # no lane loop left
  assert any(u.dtype.count > 1 for u in nodes)
  assert bits(run(vectors, inputs, n)) == bits(run(program, inputs, n))


def test_the_lane_sum_shortcut_gives_the_address_the_proof_gives():
  """A lane address that is a sum of the lane and lane-free terms (x + lane + 16) takes a shortcut to lane 0's address:
  for every such address of these programs (and of a GEMM tile whose B rows are read at +8), the shortcut's address is
  the very node the contiguity proof finds, and the other addresses (gathers, modulo heads) get no shortcut."""
  X = buf(0, 256).reshape((8, 32))
  extra = [("gemm tile", ((X.reshape((8, 1, 32)).expand((8, 16, 32))) * buf(1, 512).reshape((1, 16, 32)).expand((8, 16, 32))).reduce(Ops.ADD, 1),
            Opts(vector=(1, 8), upcast={0: 2, 1: 2}, fma=True))]
  took = refused = 0
  for _, root, inputs, opts in [(n, r, i, o) for n, r, i, o in programs()] + [(n, r, [], o) for n, r, o in extra]:
    program = lower(root, buf(9, max(1, math.prod(root.shape)), root.dtype), Ctx(opts=opts))
    lanes = _Lanes(program)
    lanes.rewrite(program)
    for u in program.toposort():
      if u.op not in (Ops.LOAD, Ops.STORE) or (lane := lanes._address_lane(u.src[0])) is None: continue
      address = u.src[0].src[1]
      if (base := lanes._lane_sum(address, lane)) is None:
        refused += 1
        continue
      took += 1
      assert lanes.rewrite(base) is lanes._contiguous_proof(address, lane), address
  assert took >= 10 and refused >= 4


def test_contiguous_lanes_are_one_vector_load_and_one_vector_store():
  program = vectorize(lower(buf(0, 64) * 2.0, buf(1, 64), Ctx(opts=Opts(vector=(0, 16)))))
  wide = [u for u in program.toposort() if u.op is Ops.INDEX and u.arg is not None]
  assert [u.arg for u in wide] == [dtypes.f32.vec(16)] * 2 and {u.src[0].arg.slot for u in wide} == {0, 1}
  assert not any(u.op is Ops.LOAD and u.dtype is dtypes.f32 for u in program.toposort())


def test_lanes_across_rows_gather_and_scatter_lane_by_lane():
  program = vectorize(lower(buf(0, 64).reshape((8, 8)) + 1.0, buf(1, 64), Ctx(opts=Opts(vector=(0, 4)))))
  nodes = program.toposort()
  assert not any(u.op is Ops.INDEX and u.arg is not None for u in nodes)
  assert sum(u.op is Ops.LOAD for u in nodes) == 4 and sum(u.op is Ops.STORE for u in nodes) == 4      # each lane's own address
  assert any(u.op is Ops.VECTORIZE and all(s.op is Ops.LOAD for s in u.src) for u in nodes)


def test_a_horizontal_sum_adds_the_lanes_in_order_into_the_scalar_accumulator():
  program = vectorize(lower(buf(0, 64).reshape((2, 32)).reduce(Ops.ADD, 1), buf(1, 2), Ctx(opts=Opts(reduce_vector=8))))
  geps = [u for u in program.toposort() if u.op is Ops.GEP]
  assert sorted(u.arg for u in geps) == list(range(8))
  # lane c's update reads the accumulator after lane c - 1's store: one chain, lane 0 first
  lane = lambda u: next((s.arg for s in u.src if s.op is Ops.GEP), None)
  updates = {lane(u.src[1]): u for u in program.toposort() if u.op is Ops.STORE and lane(u.src[1]) is not None}
  assert sorted(updates) == list(range(8))
  for c in range(1, 8): assert updates[c - 1] in updates[c].src[1].toposort()


def test_a_machine_without_vectors_keeps_the_lanes_as_a_loop():
  program = lower(buf(0, 64) * 2.0, buf(1, 64), Ctx(opts=Opts(vector=(0, 16))))
  assert vectorize(program, lanes=False) is program


def test_a_vector_stored_to_one_scalar_address_is_refused():
  lane = range_(4, 0, AxisType.UPCAST)
  program = sink(buf(0, 1).index(0).store(lane.cast(dtypes.f32)).end(lane))
  with pytest.raises(LowerError, match="every lane would write the same element"): vectorize(program)


# ---- wide memory moves (a GPU's 16-byte loads) --------------------------------------------------------------------------

def gpu(root: UOp, n: int, **opts) -> UOp: return lower(root, buf(1, n, root.dtype), Ctx(opts=Opts(gpu=True, **opts)))


def test_a_threads_neighbouring_elements_move_as_one_aligned_vector():
  x = rng.standard_normal(256).astype(np.float32)
  program = gpu(buf(0, 256) * 2.0 + 1.0, 256, local={0: 16}, upcast={0: 4})
  folded = vectorize(program, lanes=False, memory_bytes=16)
  assert [u.arg for u in folded.toposort() if u.op is Ops.INDEX and u.arg is not None] == [dtypes.f32.vec(4)] * 2
  assert bits(run(folded, [x], 256)) == bits(run(program, [x], 256))


def test_neighbours_that_do_not_start_on_a_multiple_of_the_vector_stay_scalar():
  shifted = buf(0, 260).shrink(((1, 257),)) * 2.0          # loads at 4k + 1: a float4 there would be misaligned
  program = vectorize(gpu(shifted, 256, local={0: 16}, upcast={0: 4}), lanes=False, memory_bytes=16)
  wide = [(u.src[0].arg.slot, u.arg) for u in program.toposort() if u.op is Ops.INDEX and u.arg is not None]
  # the stores are aligned; of the loads at 4k+1 .. 4k+4 only the pair at 4k+2 is (a float2), the others stay scalar
  assert sorted(wide, key=str) == sorted([(1, dtypes.f32.vec(4)), (0, dtypes.f32.vec(2))], key=str), wide
  x = rng.standard_normal(260).astype(np.float32)
  assert bits(run(program, [x], 256)) == bits((x[1:257] * np.float32(2)).tolist())


def test_stores_whose_values_read_the_stored_memory_are_not_folded():
  out = buf(0, 4)
  first = out.index(0).store(UOp.const(1.0))
  later = out.after(first).index(0).load()                    # reads what the first store wrote
  program = sink(first, *(out.index(k).store(later + float(k)) for k in range(1, 4)))
  folded = vectorize(program, lanes=False, memory_bytes=16)
  assert not any(u.op is Ops.INDEX and u.arg is not None for u in folded.toposort())
  mem = {0: [None] * 4}
  run_linear(linearize(folded), mem)
  assert mem[0] == [1.0, 2.0, 3.0, 4.0]


def test_lanes_inside_a_period_of_a_modulo_are_one_vector_load():
  """A transformer's attention output (B, H, T, D) read by its projection as (B, T, H*D): column c is h = c // D and
  d = c % D, so 16 lanes at column 32*j + lane read (32*j + lane) % 64: the lanes never cross a multiple of 32, the
  address is 32*j % 64 + lane, one vector. Before, every lane was a scalar load (36 GFLOP/s for nanoGPT's projection
  gradient). The memory-safety proof sees the base as a multiple of 32 below 64."""
  y = buf(0, 2 * 64 * 64).reshape((2, 64, 64)).permute((1, 0, 2)).reshape((64, 128))    # (T, H*D) from (H, T, D)
  program = vectorize(lower(y * 2.0, buf(1, 64 * 128), Ctx(opts=Opts(vector=(1, 16), upcast={1: 2}))))
  wide = [u for u in program.toposort() if u.op is Ops.INDEX and u.arg is not None]
  assert {u.src[0].arg.slot for u in wide} == {0, 1} and not any(u.op is Ops.VECTORIZE and u.src[0].op is Ops.LOAD for u in program.toposort())
  x = rng.standard_normal(2 * 64 * 64).astype(np.float32)
  assert bits(run(program, [x], 64 * 128)) == bits((x.reshape(2, 64, 64).transpose(1, 0, 2).reshape(-1) * np.float32(2)).tolist())


def test_the_lane_step_of_an_affine_address_is_its_coefficient_of_the_lane():
  """A contiguity proof reads the lane's coefficient in the address (its derivative) instead of simplifying the address
  at lanes 0 and 1 and their difference: the same verdict, for a constant step, a step through a product, and a step
  that depends on another loop (never contiguous)."""
  from uopc.vectorize import _lane_step
  from uopc.symbolic import simplify
  i, n, lane = range_(8, 0), range_(4, 1), range_(16, 2, AxisType.UPCAST)
  for address, step in [(i * 16 + lane + 3, 1), ((lane + i) * 2 + 5, 2), (i * 32 + lane * 1 + lane * 0, 1), (i * 7, 0)]:
    got = simplify(_lane_step(address, lane))
    assert got.op is Ops.CONST and got.arg == step
    at = lambda c: simplify(address.substitute({lane: UOp.const(c)}))
    assert simplify(at(1) - at(0)) is got
  assert simplify(_lane_step(i * 16 + lane * n, lane)) is n


def test_the_step_of_an_index_along_a_range():
  # (the C renderer's prefetch distance: a constant step, or None where a floor division, modulo or product hides it)
  from uopc.vectorize import index_step
  from uopc.uop import AxisType, range_
  r, q = range_(16, 0, AxisType.REDUCE), range_(8, 1, AxisType.LOOP)
  assert index_step(r * 32 + q * 512 + 7, r) == 32
  assert index_step((r + 3) * 4 * 16 + q, r) == 64
  assert index_step(q * 100 + 5, r) == 0
  assert index_step((r % 4) * 32, r) is None and index_step((r // 2) * 32, r) is None and index_step(r * q, r) is None
