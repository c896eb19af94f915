"""kernelize_cached: a schedule remembered by the graph's structure (BUFFERs anonymous) and replayed over new buffers.
Differential: every hit must run to the answer a fresh kernelize gives; graphs that differ in anything but their
buffers' slots (a constant's sign, which buffers alias, a dtype, a size) must not share a schedule."""
import numpy as np
import pytest
from uopc.dtype import dtypes
from uopc.uop import UOp, Ops, buf
import uopc.kernelize as K
from uopc.kernelize import kernelize, kernelize_cached
from test_kernelize import run_schedule, softmax


@pytest.fixture(autouse=True)
def empty_cache(monkeypatch):
  monkeypatch.setattr(K, "_schedules", type(K._schedules)())
  monkeypatch.setattr(K, "_schedule_nodes", 0)


def counter(start: int):
  slots = iter(range(start, start + 1000))
  return lambda n, d: buf(next(slots), n, d)


def attention(q: UOp, k: UOp, v: UOp) -> UOp:
  """softmax(q k^T) v on (4, 3) operands: broadcast reductions to materialize, a chain of two matmuls."""
  s = (q.reshape((4, 1, 3)).expand((4, 4, 3)) * k.reshape((1, 4, 3)).expand((4, 4, 3))).reduce(Ops.ADD, 1)
  p = softmax(s)
  return (p.reshape((4, 1, 4)).expand((4, 3, 4)) * v.reshape((4, 3)).permute((1, 0)).reshape((1, 3, 4)).expand((4, 3, 4))).reduce(Ops.ADD, 1)


def test_a_graph_of_the_same_structure_over_other_buffers_reuses_the_schedule_and_gets_the_same_answer():
  rng = np.random.default_rng(0)
  first = attention(buf(0, 12), buf(1, 12), buf(2, 12))
  ks1 = kernelize_cached([(first, buf(3, 12))], counter(100))
  assert len(K._schedules) == 1 and len(ks1) > 1
  second = attention(buf(10, 12), buf(11, 12), buf(12, 12))
  ks2 = kernelize_cached([(second, buf(13, 12))], counter(200))
  assert len(K._schedules) == 1                                            # a hit
  fresh = kernelize([(second, buf(13, 12))], counter(200))
  assert [(k.canonical_root, k.canonical_out) for k in ks2] == [(k.canonical_root, k.canonical_out) for k in fresh]
  assert [k.buffers for k in ks2] == [k.buffers for k in fresh]           # this graph's buffers, new temporaries
  assert all(b.arg.slot >= 200 for k in ks2[:-1] for b in (k.out,))
  inputs = {s: rng.standard_normal(12).astype(np.float32) for s in (10, 11, 12)}
  np.testing.assert_allclose(run_schedule(ks2, inputs)[13], run_schedule(fresh, inputs)[13], rtol=1e-6)


def c(v) -> UOp: return UOp.const(v).reshape((1,)).expand((6,))


@pytest.mark.parametrize("other", [
  lambda a, b: a * b + c(-0.0),     # -0.0 == 0.0 in python: the key must still tell them apart
  lambda a, b: a * a + c(0.0),      # one buffer read twice is not two buffers
  lambda a, b: a * b.cast(dtypes.i32).cast(dtypes.f32) + c(0.0),
], ids=["negative zero", "aliased buffers", "another op"])
def test_graphs_that_differ_in_more_than_their_buffers_do_not_share_a_schedule(other):
  base = lambda a, b: a * b + c(0.0)
  kernelize_cached([(base(buf(0, 6), buf(1, 6)), buf(2, 6))], counter(100))
  kernelize_cached([(other(buf(0, 6), buf(1, 6)), buf(2, 6))], counter(100))
  assert len(K._schedules) == 2


def test_a_buffer_of_another_size_or_dtype_is_another_schedule():
  kernelize_cached([(buf(0, 8).reduce(Ops.ADD, 1), buf(1, 1))], counter(100))
  kernelize_cached([(buf(0, 9).reduce(Ops.ADD, 1), buf(1, 1))], counter(100))
  kernelize_cached([(buf(0, 8, dtypes.i32).reduce(Ops.ADD, 1), buf(1, 1, dtypes.i32))], counter(100))
  assert len(K._schedules) == 3


def test_the_cache_is_bounded_and_malformed_outputs_still_get_kernelizes_error(monkeypatch):
  monkeypatch.setattr(K, "SCHEDULE_CACHE_SIZE", 3)
  for n in range(1, 8): kernelize_cached([(buf(0, n) * buf(1, n), buf(2, n))], counter(100))
  assert len(K._schedules) == 3 and K._schedule_nodes == 12                 # 4 nodes per key: two BUFFERs, the MUL, the SINK
  monkeypatch.setattr(K, "SCHEDULE_CACHE_NODES", 11)                       # and bounded in nodes
  kernelize_cached([(buf(0, 9) * buf(1, 9), buf(2, 9))], counter(100))
  assert len(K._schedules) == 2 and K._schedule_nodes == 8
  with pytest.raises(K.KernelizeError, match="can't hold"): kernelize_cached([(buf(0, 8) * buf(1, 8), buf(2, 4))], counter(100))
  with pytest.raises(K.KernelizeError): kernelize_cached([buf(0, 8)], counter(100))


def test_a_schedule_carries_one_plan_per_structure_whose_slots_index_its_table():
  """kernelize_cached's Schedule: the same Plan object on every hit (a runtime keeps one launch graph per plan), and each
  kernel's buffers are the table's entries at the plan's slots, on the miss and on a hit; the entries a kernel writes
  first (outputs, temporaries) are marked, the graph's inputs are not."""
  first = attention(buf(0, 12), buf(1, 12), buf(2, 12))
  miss = kernelize_cached([(first, buf(3, 12))], counter(100))
  hit = kernelize_cached([(attention(buf(10, 12), buf(11, 12), buf(12, 12)), buf(13, 12))], counter(200))
  assert isinstance(miss, K.Schedule) and hit.plan is miss.plan and not miss.plan.aliased
  for ks in (miss, hit):
    assert len(ks.table) == len({b for k in ks for b in k.buffers})
    assert all([ks.table[s] for s in slots] == list(k.buffers) for k, slots in zip(ks, ks.plan.slots))
    inputs = {i for i, b in enumerate(ks.table) if b not in {k.out for k in ks}}
    assert ks.plan.written_first == frozenset(range(len(ks.table))) - inputs and len(inputs) == 3
  other = kernelize_cached([(first * 2.0, buf(3, 12))], counter(300))
  assert other.plan is not miss.plan


def test_a_hit_makes_its_kernels_and_temporaries_when_they_are_first_read():
  """A hit's Schedule has its plan and the graph's and outputs' BUFFERs in `table` at once; its kernels, and the
  temporaries' BUFFERs with them, are made when first read (a runtime running it through its plan reads only the
  table). Read, they are the kernels a fresh kernelize gives."""
  kernelize_cached([(attention(buf(0, 12), buf(1, 12), buf(2, 12)), buf(3, 12))], counter(100))
  made = []
  def new_buffer(n, d):
    made.append(buf(200 + len(made), n, d))
    return made[-1]
  second = attention(buf(10, 12), buf(11, 12), buf(12, 12))
  hit = kernelize_cached([(second, buf(13, 12))], new_buffer)
  assert not made and len(hit) > 1 and hit.temps
  assert {i for i, u in enumerate(hit.table) if u is None} == set(hit.temps)
  assert {u for u in hit.table if u is not None} == {buf(10, 12), buf(11, 12), buf(12, 12), buf(13, 12)}
  fresh = kernelize([(second, buf(13, 12))], counter(200))
  assert [k.buffers for k in hit] == [k.buffers for k in fresh] and made   # read: made, and in the fresh order
  assert not hit.temps and None not in hit.table and set(made) <= set(hit.table)
  assert hit == list(hit) and hit[0] is list(hit)[0]


def test_a_live_graph_is_keyed_once_and_its_memo_keeps_nothing_alive(monkeypatch):
  """kernelize_cached remembers a graph's key on its first root: the same live roots with outputs of the same kinds are
  not walked again, other roots or outputs of another size are. The memo holds the other roots and the BUFFERs weakly:
  dropped by everyone else, they die though the first root lives."""
  import gc, weakref
  walks = []
  structure = K._structure
  monkeypatch.setattr(K, "_structure", lambda roots, outs: walks.append(len(roots)) or structure(roots, outs))
  first, other = attention(buf(0, 12), buf(1, 12), buf(2, 12)), buf(5, 12) * 2.0
  for _ in range(2): kernelize_cached([(first, buf(3, 12)), (other, buf(4, 12))], counter(100))
  assert walks == [2]
  again = kernelize_cached([(first, buf(3, 12)), (other, buf(4, 12))], counter(100))
  assert [k.buffers for k in again] == [k.buffers for k in kernelize([(first, buf(3, 12)), (other, buf(4, 12))], counter(100))]
  kernelize_cached([(first, buf(3, 12)), (buf(6, 12) * 2.0, buf(4, 12))], counter(100))   # another second root
  kernelize_cached([(first, buf(3, 12)), (other, buf(4, 13))], counter(100))                # an output of another size
  assert walks == [2, 2, 2]
  gone = [weakref.ref(other), weakref.ref(other.src[0])]
  del other, again
  gc.collect()
  assert all(r() is None for r in gone) and first.op is Ops.REDUCE
