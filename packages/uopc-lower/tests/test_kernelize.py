"""kernelize: STAGE cuts, materialized broadcast reductions, shared work, order, canonical kernels, bounded
kernel bodies."""
import numpy as np
import pytest
from uopc.dtype import dtypes
from uopc.uop import UOp, Ops, ALU, buf, prod
from uopc.rangeify import lower
from uopc.kernelize import kernelize, Kernel, KernelizeError, canonicalize, MAX_KERNEL_BODY
from uopc.linearize import linearize
from uopc.interpret import run_linear
from fusion_work import executed, least


def run_schedule(kernels: list[Kernel], inputs: dict[int, np.ndarray]) -> dict[int, list]:
  """Run kernels in order with the loop interpreter; buffers by slot."""
  data = {s: [x.item() for x in a.ravel()] for s, a in inputs.items()}
  for k in kernels:
    slots = {b: i for i, b in enumerate(k.buffers)}
    args = {i: data[b.arg.slot] for b, i in slots.items() if b is not k.out}
    args[slots[k.out]] = [0.0] * k.out.shape[0]
    run_linear(linearize(lower(k.canonical_root, k.canonical_out)), args)
    data[k.out.arg.slot] = args[slots[k.out]]
  return data


def softmax(x: UOp) -> UOp:
  n, m = x.shape
  e = x - x.reduce(Ops.MAX, 1).reshape((n, 1)).expand((n, m))
  ex = UOp(Ops.EXP2, (e,))
  return ex * ex.reduce(Ops.ADD, 1).reshape((n, 1)).expand((n, m)).recip()


def test_elementwise_chain_is_one_kernel():
  x = buf(0, 12).reshape((3, 4))
  ks = kernelize([((x * 2.0 + 1.0).maximum(x.const_like(0.0)), buf(1, 12))])
  assert len(ks) == 1 and ks[0].inputs == (buf(0, 12),)


def test_broadcast_reductions_are_materialized():
  x = buf(0, 12).reshape((3, 4))
  ks = kernelize([(softmax(x), buf(1, 12))])
  assert [k.root.op for k in ks] == [Ops.REDUCE, Ops.REDUCE, Ops.MUL]     # max, sum of exp, normalize
  assert ks[1].inputs[-1] is ks[0].out and ks[2].inputs[-2:] == (ks[0].out, ks[1].out)
  a = np.random.default_rng(0).standard_normal(12).astype(np.float32)
  out = np.array(run_schedule(ks, {0: a})[1]).reshape(3, 4)
  ref = np.exp2(a.reshape(3, 4) - a.reshape(3, 4).max(1, keepdims=True))
  np.testing.assert_allclose(out, ref / ref.sum(1, keepdims=True), rtol=1e-6)


def test_a_reduce_used_elementwise_fuses():
  """matmul + bias + relu: the reduction is not broadcast, so it stays in the one kernel."""
  a, w, b = buf(0, 12).reshape((3, 4)), buf(1, 8).reshape((4, 2)), buf(2, 2)
  mm = (a.reshape((3, 1, 4)).expand((3, 2, 4)) * w.permute((1, 0)).reshape((1, 2, 4)).expand((3, 2, 4))).reduce(Ops.ADD, 1)
  out = (mm + b.reshape((1, 2)).expand((3, 2))).maximum(mm.const_like(0.0))
  assert len(kernelize([(out, buf(3, 6))])) == 1


def test_chained_matmuls_materialize_the_first():
  a, b, c = buf(0, 16).reshape((4, 4)), buf(1, 16).reshape((4, 4)), buf(2, 16).reshape((4, 4))
  def mm(x, y): return (x.reshape((4, 1, 4)).expand((4, 4, 4)) * y.permute((1, 0)).reshape((1, 4, 4)).expand((4, 4, 4))).reduce(Ops.ADD, 1)
  ks = kernelize([(mm(mm(a, b), c), buf(3, 16))])
  assert len(ks) == 2
  rng = np.random.default_rng(1)
  A, B, C = (rng.standard_normal((4, 4)).astype(np.float32) for _ in range(3))
  np.testing.assert_allclose(np.array(run_schedule(ks, {0: A, 1: B, 2: C})[3]).reshape(4, 4), A @ B @ C, rtol=1e-5, atol=1e-5)


def test_a_broadcast_gemm_is_stored_with_its_bias():
  """(a @ b + bias) @ c: the first GEMM's kernel stores its value with the bias added (its epilogue), and the second
  reads that, not the bias: a broadcast operand with the bias added again for each copy cost the second GEMM a
  vector slot per loaded value. The first GEMM's own users keep it stored alone (the bias is then recomputed)."""
  a, b, c, bias = buf(0, 16).reshape((4, 4)), buf(1, 16).reshape((4, 4)), buf(2, 16).reshape((4, 4)), buf(3, 4)
  def mm(x, y): return (x.reshape((4, 1, 4)).expand((4, 4, 4)) * y.permute((1, 0)).reshape((1, 4, 4)).expand((4, 4, 4))).reduce(Ops.ADD, 1)
  first = mm(a, b)
  ks = kernelize([(mm(first + bias.reshape((1, 4)).expand((4, 4)), c), buf(4, 16))])
  assert len(ks) == 2 and ks[0].root.op is Ops.ADD and buf(3, 4) in ks[0].inputs and buf(3, 4) not in ks[1].inputs
  rng = np.random.default_rng(1)
  A, B, C = (rng.standard_normal((4, 4)).astype(np.float32) for _ in range(3))
  Bias = rng.standard_normal(4).astype(np.float32)
  ref = (A @ B + Bias) @ C
  np.testing.assert_allclose(np.array(run_schedule(ks, {0: A, 1: B, 2: C, 3: Bias})[4]).reshape(4, 4), ref, rtol=1e-5, atol=1e-5)
  # the GEMM is also an output of its own: it is stored as it is, and the bias added where it is read
  ks = kernelize([(mm(first + bias.reshape((1, 4)).expand((4, 4)), c), buf(4, 16)), (first, buf(5, 16))])
  assert len(ks) == 2 and ks[0].root.op is Ops.REDUCE and buf(3, 4) in ks[1].inputs
  out = run_schedule(ks, {0: A, 1: B, 2: C, 3: Bias})
  np.testing.assert_allclose(np.array(out[4]).reshape(4, 4), ref, rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(np.array(out[5]).reshape(4, 4), A @ B, rtol=1e-5, atol=1e-5)


def test_stage_is_an_explicit_cut_and_sources_come_first():
  x = buf(0, 4)
  s = UOp(Ops.STAGE, (x * 3.0,))
  ks = kernelize([(s + 1.0, buf(1, 4)), (s * 2.0, buf(2, 4))])
  assert len(ks) == 3 and ks[0].root is x * 3.0
  out = run_schedule(ks, {0: np.arange(4, dtype=np.float32)})
  assert out[1] == [1.0, 4.0, 7.0, 10.0] and out[2] == [0.0, 6.0, 12.0, 18.0]


def test_a_reduction_shared_by_two_outputs_is_computed_once():
  x = buf(0, 12).reshape((3, 4))
  s = x.reduce(Ops.ADD, 1)
  ks = kernelize([(s * 2.0, buf(1, 3)), (s + 1.0, buf(2, 3))])
  assert len(ks) == 3 and sum(1 for k in ks for u in k.root.toposort() if u.op is Ops.REDUCE) == 1


def test_a_stored_value_that_is_also_an_output_behind_its_own_layout_is_stored_there():
  """An optimizer's step reads a parameter's gradient (a reduction over a materialized input, shared by the update and
  the .grad output) while .grad is the same elements reshaped, or transposed twice: the reduction is stored straight
  into the output's buffer (27 copy kernels fewer in the GPT step). A view that moves elements (one transpose) keeps
  its copy, and both schedules compute the right numbers."""
  x = buf(0, 12).reshape((3, 4))
  t = UOp(Ops.STAGE, (x * 2.0,))                    # a source stored first, so the reduction is rebuilt over it
  s = t.permute((1, 0)).reduce(Ops.ADD, 1)           # (4,): columns summed, shared by the two outputs below
  same = s.reshape((1, 4)).reshape((2, 2)).permute((1, 0)).permute((1, 0))
  moved = s.reshape((2, 2)).permute((1, 0))
  data = np.arange(12, dtype=np.float32).reshape(3, 4)
  for view, copies in ((same, 0), (moved, 1)):
    ks = kernelize([(view, buf(1, 4)), (s * 3.0, buf(2, 4))])
    assert len(ks) == 3 + copies
    out = run_schedule(ks, {0: data})
    want = (data * 2).sum(0)
    assert out[1] == (want.reshape(2, 2).T.ravel() if copies else want).tolist() and out[2] == (want * 3).tolist()


def test_a_staged_output_is_stored_straight_into_its_buffer():
  """x.T.contiguous() realized: the STAGE's value is the output, so the transpose stores into the output's buffer. It
  was stored into a temporary and copied (two kernels: a 64 x 64 x 1024 permute 1.26 -> 0.67 ms). Behind a reshape
  that renames elements in place too; a broadcast staged (an EXPAND, never stored as a view) is one kernel as well."""
  x = buf(0, 12).reshape((3, 4))
  data = np.arange(12, dtype=np.float32).reshape(3, 4)
  for root, want in ((UOp(Ops.STAGE, (x.permute((1, 0)),)), data.T), (UOp(Ops.STAGE, (x.permute((1, 0)),)).reshape((2, 6)), data.T),
                     (UOp(Ops.STAGE, (UOp(Ops.STAGE, (x * 2.0,)),)), data * 2),
                     (UOp(Ops.STAGE, (buf(0, 12).reshape((1, 12)).expand((2, 12)),)), np.broadcast_to(data.reshape(1, 12), (2, 12)))):
    ks = kernelize([(root, buf(1, want.size))])
    assert len(ks) == 1 and ks[0].out is buf(1, want.size), ks
    assert run_schedule(ks, {0: data})[1] == want.ravel().tolist()


@pytest.mark.parametrize("shape, views, same", [
  ((4, 6), [("reshape", (24,)), ("reshape", (2, 12))], True),
  ((4, 6), [("permute", (1, 0))], False),
  ((4, 6), [("permute", (1, 0)), ("permute", (1, 0))], True),
  ((4, 1, 6), [("permute", (1, 0, 2))], True),                          # only an axis of size 1 moves
  ((4, 6), [("reshape", (2, 2, 6)), ("permute", (1, 0, 2)), ("reshape", (4, 6))], False),
  ((4, 6), [("reshape", (2, 2, 6)), ("permute", (0, 2, 1)), ("reshape", (2, 6, 2)), ("permute", (0, 2, 1))], True),
  # a reshape no strides express (a transposed view merged): the elements come back in place, but a copy is kept
  ((4, 6), [("reshape", (2, 2, 6)), ("permute", (0, 2, 1)), ("reshape", (2, 12)), ("reshape", (2, 6, 2)),
            ("permute", (0, 2, 1))], False),
  ((4, 6), [("permute", (1, 0)), ("reshape", (24,))], False),
  # a shrink or an expand in the chain moves or repeats elements, whatever the reshapes around it
  ((4, 4), [("reshape", (16,)), ("shrink", ((0, 8),)), ("reshape", (2, 4))], False),
  ((4,), [("reshape", (1, 4)), ("shrink", ((0, 1), (0, 2))), ("expand", (2, 2)), ("reshape", (4,))], False),
])
def test_same_memory_follows_views_as_strides(shape, views, same):
  """_same_memory: a chain of reshapes and permutes is seen through when element i of the view is element i of the node
  below (NumPy's own views of an arange say when), and only then."""
  from uopc.kernelize import _same_memory
  base = buf(0, prod(shape)).reshape(shape) * 2.0
  u, ref = base, np.arange(prod(shape)).reshape(shape)
  for kind, arg in views:
    u = getattr(u, kind)(arg)
    ref = {"reshape": lambda: ref.reshape(arg), "permute": lambda: ref.transpose(arg),
           "shrink": lambda: ref[tuple(slice(a, b) for a, b in arg)], "expand": lambda: np.broadcast_to(ref, arg)}[kind]()
  in_place = ref.size == prod(shape) and bool((ref.ravel() == np.arange(prod(shape))).all())
  assert (_same_memory(u) is base) == same and (in_place or not same)


def test_cheap_shared_elementwise_values_are_recomputed():
  x = buf(0, 4)
  e = x * 2.0 + 1.0
  assert len(kernelize([(e * 3.0, buf(1, 4)), (e - 1.0, buf(2, 4))])) == 2


def test_a_costly_value_broadcast_into_a_reduction_is_computed_once():
  """A weight gradient dW[i, j] = sum_b x[b, i] * f(g[b, j]) with f costly (a sigmoid: EXP2 and RECIP): f(g) is stored,
  or the GEMM's kernel evaluates it once per column i, 16 times its transcendentals (the costly-broadcast rule)."""
  nb, ni, nj = 8, 16, 4
  x, g = buf(0, nb * ni).reshape((nb, ni)), buf(1, nb * nj).reshape((nb, nj))
  f = (UOp(Ops.EXP2, (g * -1.0,)) + 1.0).recip()
  dw = (x.permute((1, 0)).reshape((ni, 1, nb)).expand((ni, nj, nb)) * f.permute((1, 0)).reshape((1, nj, nb)).expand((ni, nj, nb))).reduce(Ops.ADD, 1)
  ks = kernelize([(dw, buf(2, ni * nj))])
  assert len(ks) == 2 and executed(ks) == least([dw]) == (2 * ni * nj * nb + 4 * nb * nj, 2 * nb * nj)
  rng = np.random.default_rng(3)
  X, G = rng.standard_normal((nb, ni)).astype(np.float32), rng.standard_normal((nb, nj)).astype(np.float32)
  ref = X.T @ (1 / (1 + np.exp2(-G)))
  np.testing.assert_allclose(np.array(run_schedule(ks, {0: X, 1: G})[2]).reshape(ni, nj), ref, rtol=1e-5, atol=1e-6)


def test_a_deep_gemm_times_a_costly_function_of_another_gemm_is_stored_first():
  """A GELU's gradient: g = dy @ W.T times f(h), f costly (a sigmoid) and h another GEMM's output. In g's epilogue, f
  made nanoGPT's 2048 x 384 x 1536 GEMM 1.6x slower, so g, summed over EPILOGUE_MIN_DEPTH or more, is stored and the
  product made in a kernel of its own. A shallower g keeps f in its epilogue (cheaper there than a pass of its own), and
  so do one times a costly function of no reduction (an optimizer's step size) and a dot product per row."""
  from uopc.kernelize import EPILOGUE_MIN_DEPTH
  m, n, kh = 4, 4, 32     # h sums more than a window's 16 (two GEMMs joined, one over a window, is another rule's)
  def mm(a, b, k): return (a.reshape((m, 1, k)).expand((m, n, k)) * b.permute((1, 0)).reshape((1, n, k)).expand((m, n, k))).reduce(Ops.ADD, 1)
  sig = lambda v: (UOp(Ops.EXP2, (v * -1.0,)) + 1.0).recip()
  rng = np.random.default_rng(4)
  X, W1 = rng.standard_normal((m, kh)).astype(np.float32), rng.standard_normal((kh, n)).astype(np.float32)
  h = mm(buf(0, m * kh).reshape((m, kh)), buf(1, kh * n).reshape((kh, n)), kh)
  for k, stored in ((EPILOGUE_MIN_DEPTH, True), (EPILOGUE_MIN_DEPTH // 2, False)):
    g = mm(buf(2, m * k).reshape((m, k)), buf(3, k * n).reshape((k, n)), k)
    ks = kernelize([(g * sig(h), buf(4, m * n))])
    assert len(ks) == (2 if stored else 1) and (ks[0].root is g) is stored
    DY, W = rng.standard_normal((m, k)).astype(np.float32), rng.standard_normal((k, n)).astype(np.float32)
    ref = (DY @ W) / (1 + np.exp2(-(X @ W1)))
    np.testing.assert_allclose(np.array(run_schedule(ks, {0: X, 1: W1, 2: DY, 3: W})[4]).reshape(m, n), ref, rtol=1e-4, atol=1e-5)
  k = EPILOGUE_MIN_DEPTH
  g = mm(buf(2, m * k).reshape((m, k)), buf(3, k * n).reshape((k, n)), k)
  assert len(kernelize([(g * sig(buf(0, m * n).reshape((m, n))), buf(4, m * n))])) == 1
  # a dot product per row (a layernorm's gradient: each output sums its own row, nothing broadcast) keeps its epilogue
  rows = (buf(2, m * k).reshape((m, k)) * buf(3, m * k).reshape((m, k))).reduce(Ops.ADD, 1)
  assert len(kernelize([(rows * sig(h.reshape((m * n,)).shrink(((0, m),))), buf(4, m))])) == 1


def test_a_gemm_read_elsewhere_too_is_stored_alone_under_a_reduction():
  """A sum of products under another reduction is stored first; where the GEMM is also read elsewhere (attention's e @ v:
  its output's rows, and the backward's row sums of do * (e @ v)), the GEMM is what is stored and the product is made in
  the outer reduction's kernel: storing the product too was a kernel more. A GEMM read by the reduction alone still has
  the value the reduction reads stored (a residual stream's layernorm reads one buffer)."""
  m, n, k = 4, 8, 16
  def mm(a, b): return (a.reshape((m, 1, k)).expand((m, n, k)) * b.permute((1, 0)).reshape((1, n, k)).expand((m, n, k))).reduce(Ops.ADD, 1)
  g = mm(buf(0, m * k).reshape((m, k)), buf(1, k * n).reshape((k, n)))
  r = buf(2, m * n).reshape((m, n))
  rows = (r * g).reduce(Ops.ADD, 1)
  rng = np.random.default_rng(5)
  A, B, R = (rng.standard_normal(shape).astype(np.float32) for shape in ((m, k), (k, n), (m, n)))
  # the GEMM an output too: two kernels, the GEMM and the row sums over its buffer
  ks = kernelize([(g, buf(3, m * n)), (rows, buf(4, m))])
  assert len(ks) == 2 and ks[0].root is g
  out = run_schedule(ks, {0: A, 1: B, 2: R})
  np.testing.assert_allclose(np.array(out[3]).reshape(m, n), A @ B, rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(np.array(out[4]), (R * (A @ B)).sum(1), rtol=1e-4, atol=1e-5)
  # the GEMM read by a second reduction in the same kernel: stored once, not inside each value the sums read
  ks = kernelize([(rows + g.reduce(Ops.ADD, 1), buf(4, m))])
  assert len(ks) == 2 and ks[0].root is g
  np.testing.assert_allclose(np.array(run_schedule(ks, {0: A, 1: B, 2: R})[4]), (R * (A @ B)).sum(1) + (A @ B).sum(1), rtol=1e-4, atol=1e-4)
  # read by the reduction alone: the value it reads, r * g, is stored (the GEMM with its epilogue)
  ks = kernelize([(rows, buf(4, m))])
  assert len(ks) == 2 and ks[0].root is (r * g)


def test_a_value_reading_many_buffers_shared_by_two_outputs_is_computed_once():
  """v = a0 + ... + a4 reads five buffers (more than MAX_SHARED_READS): stored once and read by both outputs' kernels,
  not recomputed in each (the shared-reads rule). A value that reads one buffer is recomputed (the test below)."""
  parts = [buf(i, 6) for i in range(5)]
  v = parts[0]
  for a in parts[1:]: v = v + a
  ks = kernelize([(v * 2.0, buf(5, 6)), (v + 1.0, buf(6, 6))])
  assert len(ks) == 3 and executed(ks) == least([v * 2.0, v + 1.0]) == (6 * 6, 0)
  arrays = {i: np.arange(6, dtype=np.float32) * (i + 1) for i in range(5)}
  out, total = run_schedule(ks, arrays), sum(arrays.values())
  assert out[5] == list(total * 2) and out[6] == list(total + 1)


def test_canonical_kernels_are_equal_up_to_buffer_numbering():
  k1 = kernelize([(buf(5, 4) * 2.0 + buf(9, 4), buf(11, 4))])[0]
  k2 = kernelize([(buf(7, 4) * 2.0 + buf(3, 4), buf(1, 4))])[0]
  assert k1.canonical_root is k2.canonical_root and k1.canonical_out is k2.canonical_out
  assert [b.arg.slot for b in k1.inputs] == [5, 9] and k1.canonical_out.arg.slot == 2
  root, out, ins = canonicalize(buf(5, 4) + 1.0, buf(6, 4))
  assert root is buf(0, 4) + 1.0 and out is buf(1, 4) and ins == (buf(5, 4),)


def test_no_kernel_evaluates_a_reduction_inside_a_loop_it_does_not_use():
  """attention-shaped: softmax(QK^T)V. Every accumulator update must run at most (rows * cols * reduce) times."""
  n, d = 8, 4
  q, k, v = buf(0, n * d).reshape((n, d)), buf(1, n * d).reshape((n, d)), buf(2, n * d).reshape((n, d))
  s = (q.reshape((n, 1, d)).expand((n, n, d)) * k.reshape((1, n, d)).expand((n, n, d))).reduce(Ops.ADD, 1)
  p = softmax(s)
  o = (p.reshape((n, 1, n)).expand((n, d, n)) * v.permute((1, 0)).reshape((1, d, n)).expand((n, d, n))).reduce(Ops.ADD, 1)
  ks = kernelize([(o, buf(3, n * d))])
  for kern in ks:
    sink = lower(kern.canonical_root, kern.canonical_out)
    out_elems = prod(kern.root.shape) or 1
    biggest_reduce = max([prod(u.src[0].shape[len(u.src[0].shape) - u.arg[1]:]) for u in kern.root.toposort() if u.op is Ops.REDUCE], default=1)
    for st in (u for u in sink.toposort() if u.op is Ops.STORE):
      trips = prod(r.src[0].arg for r in st.toposort() if r.op is Ops.RANGE)   # loops this store depends on
      assert trips <= out_elems * biggest_reduce
  rng = np.random.default_rng(2)
  Q, K, V = (rng.standard_normal((n, d)).astype(np.float32) for _ in range(3))
  S = Q @ K.T
  P = np.exp2(S - S.max(1, keepdims=True))
  P /= P.sum(1, keepdims=True)
  np.testing.assert_allclose(np.array(run_schedule(ks, {0: Q, 1: K, 2: V})[3]).reshape(n, d), P @ V, rtol=1e-5, atol=1e-6)


def test_kernelize_errors():
  with pytest.raises(KernelizeError, match="must be a BUFFER"): kernelize([(buf(0, 4) * 2.0, buf(1, 4).index(0))])
  with pytest.raises(KernelizeError, match="can't hold"): kernelize([(buf(0, 4) * 2.0, buf(1, 3))])
  with pytest.raises(KernelizeError, match="can't hold"): kernelize([(buf(0, 4) * 2.0, buf(1, 4, dtypes.i32))])


# ---- long fused chains are cut into kernels of at most MAX_KERNEL_BODY nodes ---------------------------------------------
# gcc's compile time grows faster than the source past about MAX_KERNEL_BODY nodes; these pin the cut by node counts.

def ops_of(k: Kernel) -> int:
  """The ALU ops and reductions a kernel computes (its body less the views, which kernelize's count also holds)."""
  return sum(1 for u in k.root.toposort() if u.op in ALU or u.op is Ops.REDUCE)


def sin_chain(x: UOp, steps: int) -> UOp:
  for i in range(steps): x = UOp(Ops.SIN, (x * (1.0 + i % 5 * 1e-3) + 0.5,))
  return x


def sin_chain_ref(a: np.ndarray, steps: int) -> np.ndarray:
  a = a.astype(np.float64)
  for i in range(steps): a = np.sin(a * np.float32(1.0 + i % 5 * 1e-3) + 0.5)
  return a


@pytest.mark.parametrize("steps", [MAX_KERNEL_BODY // 3 - 1, MAX_KERNEL_BODY, 2 * MAX_KERNEL_BODY])
def test_a_long_elementwise_chain_is_cut_into_kernels_of_bounded_size(steps):
  ks = kernelize([(sin_chain(buf(0, 6), steps), buf(1, 6))])
  # 3 ops a step; each kernel holds at most MAX_KERNEL_BODY - 1 of them and the view it reads its input through
  assert len(ks) == -(-3 * steps // (MAX_KERNEL_BODY - 1))
  assert max(map(ops_of, ks)) <= MAX_KERNEL_BODY and sum(map(ops_of, ks)) == 3 * steps   # nothing computed twice
  a = np.linspace(-2, 2, 6).astype(np.float32)
  np.testing.assert_allclose(run_schedule(ks, {0: a})[1], sin_chain_ref(a, steps), rtol=1e-4, atol=1e-5)


def test_a_long_chain_inside_a_reduction_is_cut_before_the_reduction():
  steps = MAX_KERNEL_BODY
  x = buf(0, 12).reshape((3, 4))
  ks = kernelize([(sin_chain(x, steps).reduce(Ops.ADD, 1), buf(1, 3))])
  assert len(ks) == -(-(3 * steps + 1) // (MAX_KERNEL_BODY - 1)) and max(map(ops_of, ks)) <= MAX_KERNEL_BODY
  assert [u.op for u in ks[-1].root.toposort()].count(Ops.REDUCE) == 1 and sum(map(ops_of, ks)) == 3 * steps + 1
  a = np.linspace(-2, 2, 12).astype(np.float32)
  np.testing.assert_allclose(run_schedule(ks, {0: a})[1], sin_chain_ref(a, steps).reshape(3, 4).sum(1), rtol=1e-4, atol=1e-5)


def test_a_long_chain_that_reuses_its_values_is_cut_by_distinct_nodes():
  """y = (y*y + y) * 0.5 uses y three times: the body counts each node once (a count of paths would double every step
  and cut after ten), and the cut is found without a walk per node (this kernelizes in well under a second)."""
  steps = MAX_KERNEL_BODY
  y = buf(0, 4)
  for _ in range(steps): y = (y * y + y) * 0.5
  ks = kernelize([(y, buf(1, 4))])
  assert len(ks) == -(-3 * steps // (MAX_KERNEL_BODY - 1)) and max(map(ops_of, ks)) <= MAX_KERNEL_BODY
  assert sum(map(ops_of, ks)) == 3 * steps
  a = np.array([0.1, 0.5, -0.3, 0.9], np.float32)
  ref = a.astype(np.float64)
  for _ in range(steps): ref = (ref * ref + ref) * 0.5
  np.testing.assert_allclose(run_schedule(ks, {0: a})[1], ref, rtol=1e-4, atol=1e-6)


def test_a_wide_sum_of_many_small_chains_is_cut_too():
  """Many sources, none large: the cut materializes the largest until the rest fits."""
  x = buf(0, 4)
  parts = [sin_chain(x * float(i + 1), 30) for i in range(2 * MAX_KERNEL_BODY // 91 + 1)]   # 91 ops each
  total = parts[0]
  for p in parts[1:]: total = total + p
  ks = kernelize([(total, buf(1, 4))])
  assert max(map(ops_of, ks)) <= MAX_KERNEL_BODY and sum(map(ops_of, ks)) == len(parts) * 91 + len(parts) - 1
  a = np.array([0.1, 0.5, -0.3, 0.9], np.float32)
  ref = sum(sin_chain_ref(a * np.float32(i + 1), 30) for i in range(len(parts)))
  np.testing.assert_allclose(run_schedule(ks, {0: a})[1], ref, rtol=1e-4, atol=1e-5)


def test_a_gather_fuses_with_what_it_reads_but_a_reduction_under_it_is_stored_first():
  # a gather of an elementwise value (and at computed indices) is one kernel: the value is computed at the rows picked.
  # A reduction under its rows or its indices is a kernel of its own: read at a loaded index, its loops would run once
  # per row picked, or once per element of the row for the indices' reduction (an argmax's row picked)
  rng = np.random.default_rng(5)
  a = rng.standard_normal((6, 4)).astype(np.float32)
  idx = np.array([5, 0, 3], np.int32)
  x, i = buf(0, 24).reshape((6, 4)), buf(1, 3, dtypes.i32)
  fused = (x * 2.0).gather(i * -1 + 5)
  ks = kernelize([(fused, buf(9, 12))])
  assert len(ks) == 1
  np.testing.assert_array_equal(np.array(run_schedule(ks, {0: a, 1: idx})[9]).reshape(3, 4), (a * 2)[5 - idx])
  sums = x.reduce(Ops.ADD, 1).reshape((6, 1)).expand((6, 4)) * x                        # rows of a broadcast sum
  ks = kernelize([(sums.gather(i), buf(9, 12))], lambda n, d: buf(20 + n % 7, n, d))
  assert len(ks) == 2 and ks[0].root.op is Ops.REDUCE
  np.testing.assert_allclose(np.array(run_schedule(ks, {0: a, 1: idx})[9]).reshape(3, 4), (a.sum(1, keepdims=True) * a)[idx], rtol=1e-6)
  best = UOp(Ops.CAST, (x.reduce(Ops.MAX, 1),), dtypes.i32)                                   # an index that is a reduction
  picked = x.gather(UOp(Ops.MAX, (UOp(Ops.MAX, (best, best.const_like(0))) * -1, best.const_like(-5))) * -1)
  ks = kernelize([(picked, buf(9, 24))], lambda n, d: buf(20 + n % 7, n, d))
  assert len(ks) == 2 and ks[0].out.dtype is dtypes.i32 and any(u.op is Ops.REDUCE for u in ks[0].root.toposort())   # the indices
  want = a[np.clip(a.max(1).astype(np.int32), 0, 5)]
  np.testing.assert_array_equal(np.array(run_schedule(ks, {0: a, 1: idx})[9]).reshape(6, 4), want)


def test_a_gathered_value_two_kernels_read_is_stored_once():
  # the rows a GATHER picks, read by two reductions' kernels (a layer norm's mean and variance of an embedding's
  # output), are stored once and loaded: recomputed, each kernel repeats the dependent loads, and kernels that read the
  # gather differ from those that read a buffer (a GPT's first block compiled 7 kernels its second block didn't need)
  rng = np.random.default_rng(6)
  a, idx = rng.standard_normal((10, 8)).astype(np.float32), np.array([3, 3, 9, 0], np.int32)
  x = buf(0, 80).reshape((10, 8)).gather(buf(1, 4, dtypes.i32)) + 1.0
  mean = x.reduce(Ops.ADD, 1).reshape((4, 1)).expand((4, 8))
  centered = x - mean
  slots = iter(range(20, 40))
  ks = kernelize([(centered * centered, buf(9, 32))], lambda n, d: buf(next(slots), n, d))
  assert sum(1 for k in ks for u in k.root.toposort() if u.op is Ops.GATHER) == 1
  got = np.array(run_schedule(ks, {0: a, 1: idx})[9]).reshape(4, 8)
  rows = a[idx] + 1
  np.testing.assert_allclose(got, (rows - rows.sum(1, keepdims=True)) ** 2, rtol=1e-5)
