"""Opts is the single source of truth for its options (uopc.lowering): its constructor checks every field by the field's
type, to_dict/from_dict carry every field, check_opts refuses an option of the other machine by the field's metadata,
and uopc.opt's search candidates change a base Opts with dataclasses.replace, keeping every field they don't vary.

Before, each of these was a hand-written list of some of the fields: search stored 9 of the 12 (group, stage and tc were
dropped, so a stored GPU choice came back as another kernel), and the candidates rebuilt Opts from 7 fields (a GPU
base's candidates came out as CPU Opts)."""
import dataclasses, json
import pytest
from uopc.uop import UOp, Ops, AxisType, buf, prod
from uopc.dtype import dtypes
from uopc.lowering import Opts, LowerError
from uopc.rangeify import check_opts, gemm_pattern
from uopc.kernelize import kernelize
from uopc.packing import GemmPacking
from uopc.opt import Caps, candidates, choose_opts, graph_rewrite

# a value other than the default for every field (each a valid Opts on its own type)
EVERY_FIELD = Opts(upcast={0: 2}, thread=1, unroll=4, tile={1: 8}, gpu=True, local={0: 16, 1: 4}, vector=(1, 8), reduce_vector=4,
                   fma=True, group=32, stage=16, tc=True, split=True, inner={0: 4})


def test_every_field_is_set_in_the_example_so_the_round_trips_below_cover_them_all():
  assert all(getattr(EVERY_FIELD, f.name) != f.default for f in dataclasses.fields(Opts))


def test_to_dict_and_from_dict_keep_every_field_through_json():
  d = EVERY_FIELD.to_dict()
  assert set(d) == {f.name for f in dataclasses.fields(Opts)}
  back = Opts.from_dict(json.loads(json.dumps(d)))
  assert back == EVERY_FIELD and hash(back) == hash(EVERY_FIELD)
  assert [getattr(back, f.name) for f in dataclasses.fields(Opts)] == [getattr(EVERY_FIELD, f.name) for f in dataclasses.fields(Opts)]


@pytest.mark.parametrize("d, says", [({}, "from_dict takes a dict of the fields"), ([], "from_dict takes a dict of the fields"),
                                     ({**Opts().to_dict(), "colour": 1}, "from_dict takes a dict of the fields"),
                                     ({**Opts().to_dict(), "stage": "16"}, "Opts.stage is an int")])
def test_from_dict_refuses_what_to_dict_never_writes(d, says):
  with pytest.raises(LowerError, match=says): Opts.from_dict(d)


WRONG = {"upcast": ({0: "x"}, "Opts.upcast takes {axis: size}"), "thread": (1.0, "Opts.thread is an axis number"),
         "unroll": (1.5, "Opts.unroll is an int"), "tile": (3, "Opts.tile takes {axis: size}"), "gpu": (1, "Opts.gpu is a bool"),
         "local": (((0, 2), (0, 4)), "Opts.local names an axis twice"), "vector": ((0,), r"Opts.vector is \(axis, lanes\)"),
         "reduce_vector": (None, "Opts.reduce_vector is an int"), "fma": ("yes", "Opts.fma is a bool"), "group": (True, "Opts.group is an int"),
         "stage": (2.0, "Opts.stage is an int"), "tc": (0, "Opts.tc is a bool"), "split": (1, "Opts.split is a bool"),
         "inner": ([(0, 16.0)], "Opts.inner takes {axis: size}")}


def test_every_field_has_a_wrong_value_below():
  assert set(WRONG) == {f.name for f in dataclasses.fields(Opts)}


@pytest.mark.parametrize("name", list(WRONG))
def test_the_constructor_checks_every_field_by_its_type(name):
  value, says = WRONG[name]
  with pytest.raises(LowerError, match=says): Opts(**{name: value})


def gemm(n: int = 64):
  a = buf(0, n * n).reshape((n, 1, n)).expand((n, n, n))
  b = buf(1, n * n).reshape((n, n)).permute((1, 0)).reshape((1, n, n)).expand((n, n, n))
  [k] = kernelize([((a * b).reduce(Ops.ADD, 1), buf(2, n * n))])
  return k


@pytest.mark.parametrize("machine", ["cpu", "gpu"])
def test_check_opts_refuses_each_option_of_the_other_machine_by_name(machine):
  root = gemm().canonical_root
  others = [f for f in dataclasses.fields(Opts) if f.metadata.get("machine") == ("gpu" if machine == "cpu" else "cpu")]
  assert others
  for f in others:
    o = dataclasses.replace(Opts(gpu=machine == "gpu"), **{f.name: getattr(EVERY_FIELD, f.name)})
    with pytest.raises(LowerError, match=f"Opts.{f.name}: {f.metadata['elsewhere']}"): check_opts(root, o)


@pytest.mark.parametrize("caps", [Caps(threads=4, vector_width=8, fma=True), Caps(gpu=True, max_local=1024, fma=True)], ids=["cpu", "gpu"])
def test_candidates_keep_every_field_of_their_base_that_they_dont_vary(caps):
  k = gemm()
  base = choose_opts(k, caps)
  varied = {"upcast", "thread", "unroll", "tile", "vector", "reduce_vector"} | ({"local", "stage", "tc", "group", "fma"} if caps.gpu else set())
  found = candidates(k, caps, base)
  assert found[0] is base and len(found) > 1
  for o in found:
    for f in dataclasses.fields(Opts):
      if f.name not in varied: assert getattr(o, f.name) == getattr(base, f.name), (f.name, o, base)


NESTED = r"""
import sys
from uopc.uop import Ops, AxisType, buf
from uopc.kernelize import make_kernel
from uopc.opt import analyze
garbage = [object() for _ in range(int(sys.argv[1]))]       # other allocations before: other ids for every UOp
a = buf(0, 16 * 32).reshape((16, 32))
inner = (a * buf(1, 32).reshape((1, 32)).expand((16, 32))).reduce(Ops.ADD, 1)       # sum_k a[j, k] * b[k]
print(analyze(make_kernel((inner * buf(2, 16)).reduce(Ops.ADD, 1), buf(3, 1))).reduce_strides)   # sum_j inner[j] * c[j]
"""


def test_analyze_reads_a_load_of_nested_reductions_along_the_outer_ones_axis_in_every_process():
  # a[j, k] moves by 32 along the outer sum's axis j and by 1 along the inner one's k; analyze took the first of a *set*
  # of UOps (ordered by their ids), so the same kernel got reduce_vector=16 in one process and none in another
  import subprocess, sys
  seen = {subprocess.run([sys.executable, "-c", NESTED, str(n)], capture_output=True, text=True, check=True).stdout.strip()
          for n in (0, 1, 7, 100, 1000, 5000)}
  assert seen == {"(32, 1, 1)"}, seen


# ---- packing GEMM operands: a CPU's choice (uopc.opt.graph_rewrite), never made for a GPU ----------------------------

def gemm_graph(n: int, dtype=dtypes.f32):
  """C = A @ B over BUFFERs 0 and 1 (n x n, row major), as Tensor.matmul builds it: f16 operands are cast to f32 and
  their products summed in f32."""
  a, b = buf(0, n * n, dtype), buf(1, n * n, dtype)
  if dtype is dtypes.f16: a, b = a.cast(dtypes.f32), b.cast(dtypes.f32)
  a = a.reshape((n, 1, n)).expand((n, n, n))
  b = b.reshape((n, n)).permute((1, 0)).reshape((1, n, n)).expand((n, n, n))
  return (a * b).reduce(Ops.ADD, 1)


CPU, GPU = Caps(threads=4, vector_width=16, fma=True, gemm_panel=32), Caps(gpu=True, max_local=1024, fma=True, tensor_cores=True, vector_bytes=16)


@pytest.mark.parametrize("n", [2048, 8192])
def test_a_gpu_schedule_keeps_an_f16_gemms_operands_for_the_tensor_cores_and_a_cpu_packs_them(n):
  # kernelize packed B (rows 8 KiB apart) for every backend: the CUDA kernel read an f32 copy, gemm_pattern saw no f16
  # operands, and the tensor cores were never used at 2048 and above
  root = gemm_graph(n, dtypes.f16)
  assert graph_rewrite(GPU) is None
  [k] = kernelize([(root, buf(2, n * n))], rewrite=graph_rewrite(GPU))
  assert gemm_pattern(k.canonical_root).f16 and choose_opts(k, GPU).tc
  packed = kernelize([(root, buf(2, n * n))], rewrite=graph_rewrite(CPU))
  assert len(packed) == 2 and packed[0].root.shape == (n // 32, n, 32)            # B in panels of 32 columns, then the GEMM
  assert {u.dtype for u in packed[1].canonical_root.toposort() if u.op is Ops.BUFFER} == {dtypes.f16, dtypes.f32}   # A, packed B


def test_the_cpu_packs_what_it_packed_before_and_nothing_more():
  # NN GEMMs of 2048, 1024 and 512 (rows 8, 4 and 2 KiB apart: a column panel of B falls into a few cache sets; 512
  # rows read a B of 1 MiB) and an NT one (B read along its columns) are packed; 256 NN (a B of 256 KiB) not
  for n, kernels in ((2048, 2), (1024, 2), (512, 2), (256, 1)):
    assert len(kernelize([(gemm_graph(n), buf(2, n * n))], rewrite=graph_rewrite(CPU))) == kernels
  a = buf(0, 256 * 256).reshape((256, 1, 256)).expand((256, 256, 256))
  bt = buf(1, 256 * 256).reshape((1, 256, 256)).expand((256, 256, 256))      # B[k, j] = w[j, k]: x @ w.T
  assert len(kernelize([((a * bt).reduce(Ops.ADD, 1), buf(2, 256 * 256))], rewrite=graph_rewrite(CPU))) == 2
  assert len(kernelize([((a * bt).reduce(Ops.ADD, 1), buf(2, 256 * 256))])) == 1                  # no rewrite: as written
  with pytest.raises(LowerError, match="Caps.gemm_panel must be an int >= 0, got -1"): Caps(gemm_panel=-1)


def deep_gemm(m: int, k: int, n: int):
  """(m, k) @ (k, n) over BUFFERs 0 and 1, as Tensor.matmul builds it."""
  a = buf(0, m * k).reshape((m, 1, k)).expand((m, n, k))
  b = buf(1, k * n).reshape((k, n)).permute((1, 0)).reshape((1, n, k)).expand((m, n, k))
  return (a * b).reduce(Ops.ADD, 1)


@pytest.mark.parametrize("m, k, n, l2, chunks", [(1024, 8192, 128, 2 << 20, 4), (1024, 8192, 128, 1 << 20, 8), (64, 32768, 32, 2 << 20, 4),
                                                 (1024, 2048, 128, 2 << 20, 1), (2048, 2048, 2048, 2 << 20, 1), (1024, 8192, 128, 0, 1)])
def test_a_deep_narrow_gemm_is_summed_in_chunks_whose_b_fits_half_the_l2(m, k, n, l2, chunks):
  # K 16 times N or more and a B over half the L2: partial GEMMs over chunks of K (stored, the chunks their first axis),
  # then their sum; shallower or wider GEMMs (every GEMM of the two GPT steps) are as written, and so is any without an L2
  # to size chunks by (a GPU's rewrite, or none)
  ks = kernelize([(deep_gemm(m, k, n), buf(2, m * n))], rewrite=GemmPacking(32, 8, l2))
  partial = [kk for kk in ks if kk.root.shape == (chunks, m, n)]
  if chunks == 1: assert not partial and all(kk.root.shape != (m, n) or kk.root.src[0].shape[-1] == k for kk in ks if kk.root.op is Ops.REDUCE)
  else:
    assert len(partial) == 1 and partial[0].root.op is Ops.REDUCE and partial[0].root.src[0].shape[-1] == k // chunks
    assert 8 * (k // chunks) * n <= l2 and ks[-1].root.shape == (m, n) and ks[-1].root.src[0].shape[-1] == chunks


def test_kernelize_cached_keeps_one_schedule_per_rewrite():
  import uopc.kernelize as K
  from itertools import count
  slots = count(100)
  new = lambda n, d: buf(next(slots), n, d)
  cpu = K.kernelize_cached([(gemm_graph(2048), buf(2, 2048 * 2048))], new, graph_rewrite(CPU))
  gpu = K.kernelize_cached([(gemm_graph(2048), buf(2, 2048 * 2048))], new, graph_rewrite(GPU))
  again = K.kernelize_cached([(gemm_graph(2048), buf(2, 2048 * 2048))], new, graph_rewrite(Caps(gemm_panel=32)))   # an equal rewrite
  assert (len(cpu), len(gpu), len(again)) == (2, 1, 2)


# ---- the search's candidates on a GPU ----------------------------------------------------------------------------------

def kernel_of(root, n_out: int):
  [k] = kernelize([(root, buf(9, n_out))])
  return k


@pytest.mark.parametrize("what", ["f16-gemm", "f32-gemm", "row-sums", "elementwise"])
def test_candidates_of_a_gpu_base_are_other_gpu_choices_each_valid_for_the_kernel_and_the_machine(what):
  # candidates() proposed nothing but the base for a GPU: a GPU search timed one choice and stored it
  from uopc.gpulower import block_threads
  root, n_out = {"f16-gemm": (gemm_graph(256, dtypes.f16), 256 * 256), "f32-gemm": (gemm_graph(256), 256 * 256),
                 "row-sums": (buf(0, 64 * 1024).reshape((64, 1024)).reduce(Ops.ADD, 1), 64),
                 "elementwise": (buf(0, 64 * 1024) * 2.0, 64 * 1024)}[what]
  k = kernel_of(root, n_out)
  base = choose_opts(k, GPU)
  found = candidates(k, GPU, base)
  assert found[0] is base and len(found) > 2 and len(set(found)) == len(found), found
  for o in found:
    assert o.gpu and block_threads(o) <= GPU.max_local
    check_opts(k.canonical_root, o)
  kinds = {"f16-gemm": lambda o: o.tc, "f32-gemm": lambda o: o.stage, "row-sums": lambda o: o.group > 1, "elementwise": lambda o: o.local}[what]
  assert sum(map(bool, map(kinds, found))) > 1, found                            # other choices of the base's kind
  if what == "f16-gemm": assert any(o.stage and o.fma for o in found)            # and the staged GEMM, with its fma
  no_tensor_cores = Caps(gpu=True, max_local=1024, fma=True)
  assert not any(o.tc for o in candidates(k, no_tensor_cores, choose_opts(k, no_tensor_cores)))


# ---- what the heuristics read: strides that hold, and register tiles of short rows --------------------------------------

def test_a_window_read_as_one_axis_has_no_stride_and_gets_no_vector_lanes():
  """A 2x2 max pool reduces a (2, 2) window reshaped to 4 positions: +1, then +15, then +1. Read at counters 0 and 1
  alone it looked contiguous, and its lanes became a gather of four scalars and a horizontal max (126 us a call for a
  ResNet's 8192 outputs; 12.5 unrolled)."""
  from uopc.kernelize import make_kernel
  from uopc.opt import analyze
  x = buf(0, 16 * 16).reshape((8, 2, 8, 2)).permute((0, 2, 1, 3)).reshape((8, 8, 4))
  k = make_kernel(x.reduce(Ops.MAX, 1), buf(1, 64))
  assert analyze(k).reduce_strides == (None,)
  o = choose_opts(k, CPU)
  assert o.reduce_vector == 1 and o.unroll == 4


def test_short_rows_grow_the_register_tile_along_another_axis_that_reuses_each_vector():
  """out[c, i, j] = sum_k W[c, k] X[k, i, j] (a convolution's output channels c, rows i, columns j): 4 rows of
  16-lane vectors alone are 4 accumulators, each FMA waiting on the one before; 4 channels more make 16 (a ResNet's
  64 -> 64 convolution at 4x4: 66 -> 39 us). With 32 vector registers (AVX-512), 8 channels: 32, so each loaded input
  vector feeds 8 FMAs, and 2 rows: 16 accumulators, which with a window's chains updated step by step (uopc.linearize)
  and their loaded vectors fill the registers (a 3x3 convolution of 64 -> 64 channels at 32 x 32, the kernel alone:
  3.66-3.80 ms with 32 accumulators, 2.83-3.32 with 16)."""
  from uopc.kernelize import make_kernel
  w = buf(0, 64 * 32).reshape((64, 1, 1, 32)).expand((64, 4, 16, 32))
  x = buf(1, 32 * 4 * 16).reshape((32, 4, 16)).permute((1, 2, 0)).reshape((1, 4, 16, 32)).expand((64, 4, 16, 32))
  k = make_kernel((w * x).reduce(Ops.ADD, 1), buf(2, 64 * 4 * 16))
  o = choose_opts(k, CPU)
  assert o.vector == (2, 16) and dict(o.upcast) == {0: 8, 1: 2}
  o = choose_opts(k, Caps(threads=2, vector_width=8, fma=True))
  # 16 registers (AVX2): 4 channels x 2 vectors, 8 accumulators, so each loaded vector feeds 4 FMAs and each weight 2
  # (16 accumulators spilled: a 3x3 convolution of 64 -> 64 channels at 32 x 32 on an AMD Zen 1, 13.3 -> 7.9 ms)
  assert o.vector == (2, 8) and dict(o.upcast) == {0: 4, 2: 2}


def test_a_convolution_two_vectors_wide_tiles_one_vector_by_8_channels_and_2_rows():
  """The same at 32 columns, two vectors a row: one vector x 8 channels x 2 rows, 16 accumulators, not two vectors and
  fewer rows, whose weights each fed fewer FMAs (batch 8, 64 -> 64 channels, 32 x 32, 3 x 3, the whole conv2d best of
  2-3 runs alternating, when the tile was 32 accumulators: 4 rows x 2 vectors x 4 channels 2.92-3.03 ms, 2 x 2 x 8
  2.59-2.64, 4 x 1 x 8 2.50), nor 4 rows (32 accumulators: see the test above)."""
  from uopc.kernelize import make_kernel
  w = buf(0, 64 * 32).reshape((64, 1, 1, 32)).expand((64, 4, 32, 32))
  x = buf(1, 32 * 4 * 32).reshape((32, 4, 32)).permute((1, 2, 0)).reshape((1, 4, 32, 32)).expand((64, 4, 32, 32))
  k = make_kernel((w * x).reduce(Ops.ADD, 1), buf(2, 64 * 4 * 32))
  o = choose_opts(k, CPU)
  assert o.vector == (2, 16) and dict(o.upcast) == {0: 8, 1: 2}, o
  check_opts(k.canonical_root, o)


def test_a_sum_vectorized_along_an_earlier_axis_tiles_the_axis_its_vector_loads_are_constant_along():
  """A convolution's input gradient before its windows are summed: out[n, h, w, c, k] = sum over o of dy[n, o, h, w] *
  W[o, c, k], k the 9 window positions. Only w is read contiguously (dy along it; W is constant), so the lanes go
  along w, an earlier axis than the last. dy's vector is then the same for every c and k: a tile of the 9 positions
  feeds each loaded vector to 9 FMAs (8 x 64 x 32 x 32, 3 x 3: 24.8 -> 6.5-6.9 ms, 44 -> 102-109 GFLOP/s). Not c as
  well: 18 accumulators ran slower."""
  from uopc.kernelize import make_kernel
  N, O, H, W, C, K = 2, 8, 4, 32, 4, 9
  dy = buf(0, N * O * H * W).reshape((N, O, H, W)).permute((0, 2, 3, 1)).reshape((N, H, W, 1, 1, O)).expand((N, H, W, C, K, O))
  w = buf(1, O * C * K).reshape((O, C, K)).permute((1, 2, 0)).reshape((1, 1, 1, C, K, O)).expand((N, H, W, C, K, O))
  k = make_kernel((dy * w).reduce(Ops.ADD, 1), buf(2, N * H * W * C * K))
  o = choose_opts(k, CPU)
  assert o.vector == (2, 16) and dict(o.upcast) == {4: 9}, o
  check_opts(k.canonical_root, o)


def test_a_sum_over_axes_of_one_size_is_read_along_its_innermost_and_a_stack_branch_axis_is_unrolled_whole():
  """A convolution's weight gradient: out[o, k] = sum over (n, h, w) of dy[o, n, h, w] * x's window k at (n, h, w),
  the 3 windows a STACK of shifted views. h and w are both 16 long: the strides that decide are along w, the innermost
  (1: lanes of partial sums), not along h (16: kept scalar, 12 GFLOP/s for the 3x3 kernel at 8 x 64 x 32 x 32). k
  moves no load (each window is a load of its own, k picks one), so it is unrolled whole: each copy loads its window
  (11.4 -> 6.5 ms), instead of the dot products' tile of o, which loaded every window to pick one."""
  from uopc.kernelize import make_kernel
  from uopc.opt import analyze
  O, N, H, W = 8, 2, 16, 16
  x = buf(1, N * H * (W + 2)).reshape((N, H, W + 2))
  windows = UOp(Ops.STACK, tuple(x.shrink(((0, N), (0, H), (k, k + W))) for k in range(3)))      # (3, N, H, W)
  dy = buf(0, O * N * H * W).reshape((O, 1, N, H, W)).expand((O, 3, N, H, W))
  k = make_kernel((dy * windows.reshape((1, 3, N, H, W)).expand((O, 3, N, H, W))).reduce(Ops.ADD, 3), buf(2, O * 3))
  a = analyze(k)
  assert a.reduce_sizes == (W,) and set(a.reduce_strides) == {1}
  o = choose_opts(k, CPU)
  assert o.reduce_vector == 16 and dict(o.upcast) == {1: 3} and o.unroll == 1, o
  check_opts(k.canonical_root, o)


def test_a_linear_layer_on_batch_and_tokens_is_tiled_as_one_gemm_not_as_a_convolution():
  """x @ W for x (16, 64, 128) and W (128, 512): the batch and token axes are both rows of x under one weight, so the tile
  is a GEMM's, 8 rows x 2 vectors along the tokens. Taken as a convolution's second tile axis (the weights moving along
  it, as along output channels), 4 rows x 2 vectors x 4 batches made 32 accumulators, 3 more registers than AVX-512
  has: the default GPT's MLP up projection ran at 145-207 GFLOP/s (its jitted step 14.2 -> 13.9 ms)."""
  from uopc.kernelize import make_kernel
  x = buf(0, 16 * 64 * 128).reshape((16, 64, 1, 128)).expand((16, 64, 512, 128))
  w = buf(1, 128 * 512).reshape((128, 512)).permute((1, 0)).reshape((1, 1, 512, 128)).expand((16, 64, 512, 128))
  k = make_kernel((x * w).reduce(Ops.ADD, 1), buf(2, 16 * 64 * 512))
  o = choose_opts(k, CPU)
  assert o.vector == (2, 16) and dict(o.upcast) == {1: 8, 2: 2}, o
  check_opts(k.canonical_root, o)


def test_a_linear_layer_read_as_heads_is_tiled_as_one_gemm_not_along_its_heads():
  """x @ W for x (2, 64, 128) and W (128, 6 * 64), read as heads: out[b, h, t, d] (an attention projection's gradient
  written where the heads want it). The heads are more columns of W, so x is constant along them as along the vector
  axis d: the tile is a GEMM's, 8 rows of t x 2 vectors of d (16 accumulators, 10 loads a step). Taken as a
  convolution's channels, 6 heads x 2 rows x 1 vector made 12 accumulators fed by 8 loads a step: nanoGPT's
  (8, 6, 256, 64) from 384 ran at 163 GFLOP/s alone, 299-317 with the GEMM's tile."""
  from uopc.kernelize import make_kernel
  B, T, C, H, D = 2, 64, 128, 6, 64
  x = buf(0, B * T * C).reshape((B, 1, T, 1, C)).expand((B, H, T, D, C))
  w = buf(1, C * H * D).reshape((C, H, D)).permute((1, 2, 0)).reshape((1, H, 1, D, C)).expand((B, H, T, D, C))
  k = make_kernel((x * w).reduce(Ops.ADD, 1), buf(2, B * H * T * D))
  o = choose_opts(k, CPU)
  assert o.vector == (3, 16) and dict(o.upcast) == {2: 8, 3: 2}, o
  check_opts(k.canonical_root, o)
  o = choose_opts(k, Caps(threads=2, vector_width=8, fma=True))      # 16 registers: 4 rows x 2 vectors
  assert o.vector == (3, 8) and dict(o.upcast) == {2: 4, 3: 2}, o


@pytest.mark.parametrize("cols, vectors", [(1536, 4), (512, 4), (384, 2), (16 * 31, 1)])
def test_a_sum_down_the_rows_of_32_vectors_of_columns_or_more_reads_4_vectors_a_row(cols, vectors):
  """sum over i of x[i, j]: the lanes go along j, each row's read is `vectors` vectors at a time. 4 from 32 vectors of
  columns up (a row's read 256 B: over 2048 rows of 1536 on an Intel AVX-512 machine 444 -> 316-338 us, of 768 225 ->
  177-197); 2 below (over 2048 rows of 384, 4 vectors were no faster: 6 column blocks for the threads)."""
  from uopc.kernelize import make_kernel
  x = buf(0, 64 * cols).reshape((64, cols)).permute((1, 0))
  k = make_kernel(x.reduce(Ops.ADD, 1), buf(1, cols))
  o = choose_opts(k, CPU)
  assert o.vector == (0, 16) and dict(o.upcast) == ({0: vectors} if vectors > 1 else {}), o
  check_opts(k.canonical_root, o)

def matmul_kernel(m: int, k: int, n: int):
  """C = A @ B for A (m, k) and B (k, n), row major, as Tensor.matmul builds it."""
  from uopc.kernelize import make_kernel
  a = buf(0, m * k).reshape((m, 1, k)).expand((m, n, k))
  b = buf(1, k * n).reshape((k, n)).permute((1, 0)).reshape((1, n, k)).expand((m, n, k))
  return make_kernel((a * b).reduce(Ops.ADD, 1), buf(2, m * n))


@pytest.mark.parametrize("m, k, n, upcast, thread, narrow_upcast, unroll, narrow_unroll", [
  (1024, 128, 384, {0: 8, 1: 3}, 0, {0: 4, 1: 3}, 1, 1),    # 24 accumulators where the columns take 3 vectors; a tall GEMM splits its rows
  (1024, 512, 128, {0: 8, 1: 2}, 0, {0: 4, 1: 2}, 1, 1),    # else 16 (not 32: see below)
  (1024, 1024, 1024, {0: 8, 1: 2}, 1, {0: 4, 1: 2}, 4, 4),  # a GEMM whose B (4 MiB) is over half the L2 splits its column tiles
  (512, 512, 512, {0: 8, 1: 2}, 1, {0: 4, 1: 2}, 4, 4),     # 512^3 = GEMM_UNROLL_WORK: its k loop takes 4 steps a trip
  (256, 256, 256, {0: 8, 1: 2}, 0, {0: 4, 1: 2}, 1, 1),     # a square one whose B (256 KiB) fits splits its rows (167 -> 192 GFLOP/s)
  (2048, 1536, 384, {0: 8, 1: 3}, 1, {0: 4, 1: 3}, 1, 1),   # and so does one whose B (2.4 MB) would be read from memory by every row tile
  (1024, 128, 16, {0: 8}, 0, {0: 4, 1: 2}, 1, 1),           # one vector of columns (two of 8 lanes)
])
def test_a_gemms_register_tile_fills_the_vector_registers_and_its_threads_split_the_operand_read_whole(m, k, n, upcast, thread, narrow_upcast,
                                                                                                      unroll, narrow_unroll):
  """A GEMM's register tile of 8 rows x 2 vectors keeps 16 of AVX-512's 32 registers busy; 8 x 3 reuses each element of
  A for 3 vectors and still fits (1536^3, the loops alone: 316 -> 341 GFLOP/s). 8 x 4 does not: 32 accumulators, 4
  vectors of B and A's broadcast are 37 registers, and gcc kept 5 accumulators on the stack (1024^3: 286 -> 251). Its threads took
  column tiles, so each read all of A, half of it from the other core's cache where the kernel before had written it;
  where B fits in half an L2 (the GPT's activation @ weight GEMMs: 1024 rows, B 64-256 KiB) rows are split instead
  (120-170 -> 200-240). A GEMM of 512^3 multiply-adds or more takes 4 steps of k a trip of its loop where the
  accumulators leave half the registers free (GEMM 1024, the whole call: 1.03-1.06x); 8 x 3's 24 unrolled had gcc
  spill two (9-13% slower), and a smaller GEMM doesn't win back what its copies cost a cold compile."""
  kern = matmul_kernel(m, k, n)
  o = choose_opts(kern, Caps(threads=2, vector_width=16, fma=True))
  assert dict(o.upcast) == upcast and o.vector == (1, 16) and o.thread == thread and o.unroll == unroll
  check_opts(kern.canonical_root, o)
  # 16 vector registers (AVX2): 4 x 3 or 4 x 2, whose accumulators, vectors of B and broadcast of A fit in 16 (8 x 2
  # needed 19: AMD Zen 1, GEMM 256 and 512, the kernels alone: 55-63 -> 66-75 GFLOP/s); the split is the same
  narrow = choose_opts(kern, Caps(threads=2, vector_width=8, fma=True))
  assert dict(narrow.upcast) == narrow_upcast and narrow.thread == thread and narrow.unroll == narrow_unroll
  check_opts(kern.canonical_root, narrow)


def packed_matmul_kernel(m: int, k: int, n: int, panel: int = 32):
  """matmul_kernel with B read from a copy packed into panels of `panel` columns (uopc.packing): B[k, j] = P[j // panel, k, j % panel]."""
  from uopc.kernelize import make_kernel
  a = buf(0, m * k).reshape((m, 1, k)).expand((m, n, k))
  b = buf(1, k * n).reshape((n // panel, k, panel)).permute((1, 0, 2)).reshape((k, n))
  b = b.permute((1, 0)).reshape((1, n, k)).expand((m, n, k))
  return make_kernel((a * b).reduce(Ops.ADD, 1), buf(2, m * n))


def test_a_gemm_whose_packed_b_is_as_large_as_a_splits_its_columns_a_block_a_thread():
  """B fits in half the L2, so an unpacked GEMM splits its rows; packed, each thread would read half of B from the
  other core's cache (the pack kernel gave each thread its part of the panels): its columns are split instead, one
  block a thread, outermost, with the 64-row blocks inside it. Not where A is the larger: each thread then reads all of
  A (attention's p @ v, 512 x 512 @ 512 x 64, was twice as slow)."""
  caps = Caps(threads=2, vector_width=16, fma=True, l2_bytes=2 << 20, gemm_panel=32)
  plain = choose_opts(matmul_kernel(512, 512, 512), caps)
  assert plain.thread == 0 and dict(plain.tile) == {0: 64, 1: 32}, plain
  kern = packed_matmul_kernel(512, 512, 512)
  o = choose_opts(kern, caps)
  assert o.thread == 1 and dict(o.tile) == {0: 64, 1: 256} and dict(o.upcast) == {0: 8, 1: 2}, o
  # the threads' loop is the outermost, the row blocks inside it (not a parallel region per row block)
  from uopc.lowering import Ctx
  from uopc.rangeify import lower
  ranges = [u for u in lower(kern.canonical_root, kern.canonical_out, Ctx(opts=o)).toposort() if u.op is Ops.RANGE]
  outer = min(ranges, key=lambda r: r.arg.idx)
  assert outer.arg.kind is AxisType.THREAD and outer.src[0].arg == 2
  narrow = choose_opts(packed_matmul_kernel(512, 512, 64), caps)
  assert narrow.thread == 0, narrow


def test_a_gemm_split_by_columns_takes_a_block_a_thread_where_its_part_of_b_fits_the_l2():
  """B too large for half the L2 splits a GEMM's column tiles across the threads, its rows walked in blocks of 64: the
  threads' loop inside the row blocks was a parallel region per block. Where a thread's part of B and a block of A fit in
  most of its L2 (nanoGPT's projections) the columns go in one block a thread, its loop the outermost; where they don't
  (1024^3: each 8 rows then read the thread's columns from L3 again, 3% slower) the row blocks stay outside, up to a
  depth of ROW_TILE_MAX_DEPTH; deeper, the rows are not tiled at all (see the next test)."""
  from uopc.lowering import Ctx
  from uopc.rangeify import lower
  caps = Caps(threads=2, vector_width=16, fma=True, l2_bytes=2 << 20, gemm_panel=32)
  for (m, k, n), tiled in (((2048, 384, 1536), True), ((2048, 1536, 384), True), ((1024, 1024, 1024), False)):
    kern = matmul_kernel(m, k, n)
    o = choose_opts(kern, caps)
    assert o.thread == 1 and dict(o.tile) == ({0: 64, 1: n // 2} if tiled else {0: 64}), (m, k, n, o)
    ranges = [u for u in lower(kern.canonical_root, kern.canonical_out, Ctx(opts=o)).toposort() if u.op is Ops.RANGE]
    outer = min(ranges, key=lambda r: r.arg.idx)
    assert (outer.arg.kind is AxisType.THREAD) is tiled and outer.src[0].arg == (2 if tiled else m // 64), (m, k, n, outer)


def test_a_deep_gemm_split_by_columns_walks_each_panel_down_all_its_rows():
  """A GEMM whose threads split its columns, each thread's part of B too large for its L2, summing more than
  ROW_TILE_MAX_DEPTH products with its A read row by row: no 64-row cache tiles. The threads' loop over the column panels
  is the outermost, and each panel is walked down every row while it stays in the L2 (2048^3 4% faster than in blocks of
  64 rows, each block reading every panel from L3 again). A shallower sum keeps the row blocks (4096 x 256 @ 256 x 4096:
  8% faster so), and so does an A packed into panels of 8 rows (a weight's gradient, dy.T @ x over 2048 tokens: 7% slower
  without them)."""
  from uopc.lowering import Ctx
  from uopc.rangeify import lower
  from uopc.opt import ROW_TILE_MAX_DEPTH
  caps = Caps(threads=2, vector_width=16, fma=True, l2_bytes=2 << 20, gemm_panel=32)
  assert 1024 <= ROW_TILE_MAX_DEPTH < 2048   # the shapes below sit on either side of it
  for (m, k, n), rows_tiled in (((2048, 2048, 2048), False), ((1536, 2048, 384), False), ((1024, 4096, 1024), False),
                                ((1024, 1024, 1024), True), ((4096, 256, 4096), True)):
    kern = matmul_kernel(m, k, n)
    o = choose_opts(kern, caps)
    assert o.thread == 1 and dict(o.tile) == ({0: 64} if rows_tiled else {}), (m, k, n, o)
    ranges = [u for u in lower(kern.canonical_root, kern.canonical_out, Ctx(opts=o)).toposort() if u.op is Ops.RANGE]
    outer = min(ranges, key=lambda r: r.arg.idx)
    assert (outer.arg.kind is AxisType.THREAD) is not rows_tiled, (m, k, n, outer)
  from uopc.kernelize import make_kernel
  m, k, n = 1536, 2048, 384   # A packed into panels of 8 rows: A[i, k] = P[i // 8, k, i % 8]
  a = buf(0, m * k).reshape((m // 8, k, 8)).permute((0, 2, 1)).reshape((m, 1, k)).expand((m, n, k))
  b = buf(1, k * n).reshape((k, n)).permute((1, 0)).reshape((1, n, k)).expand((m, n, k))
  o = choose_opts(make_kernel((a * b).reduce(Ops.ADD, 1), buf(2, m * n)), caps)
  assert o.thread == 1 and dict(o.tile) == {0: 64}, o


def test_a_register_tile_is_the_most_accumulators_that_fit_in_the_registers():
  from uopc.opt import _register_tile
  # Caps' registers as the width says on x86-64 unless given (AArch64: 32 of 4 lanes)
  assert (Caps(vector_width=16).vector_registers, Caps(vector_width=8).vector_registers, Caps().vector_registers) == (32, 16, 16)
  assert Caps(vector_width=4, vector_registers=32).vector_registers == 32 and Caps(vector_width=16) == Caps(vector_width=16, vector_registers=32)
  assert _register_tile(1024, 48, 32) == (8, 3) and _register_tile(1024, 2, 32) == (8, 2)   # AVX-512: the most rows, vectors
  assert _register_tile(12, 48, 32) == (6, 3) and _register_tile(7, 5, 32) == (7, 1)
  assert _register_tile(1024, 48, 16) == (4, 3)        # 12 accumulators + 3 vectors of B + A's broadcast = 16 registers
  assert _register_tile(1536, 2, 16) == (6, 2)         # 12 + 2 + 1
  assert _register_tile(1024, 2, 16) == (4, 2)         # 8 accumulators: 4 x 2 loads 6 values a step, 8 x 1 would load 9
  assert _register_tile(1024, 1, 16) == (8, 1) and _register_tile(1, 1, 16) == (1, 1)
  for rows, vectors, registers in [(1024, 64, 16), (96, 6, 16), (5, 7, 16), (1024, 64, 32)]:
    r, v = _register_tile(rows, vectors, registers)
    assert rows % r == 0 and vectors % v == 0 and r * v + v + 1 <= registers


@pytest.mark.parametrize("n, tile", [(10, 10), (7, 7), (18, 9), (34, 2)])
def test_a_scalar_reduction_runs_a_chain_of_multiply_adds_per_column_of_its_tile(n, tile):
  """x @ W with W a few columns wide (an MLP's logits: 10) has no vector axis: W is read down its columns and the
  columns don't fill a vector. Each output then summed in one chain of dependent multiply-adds (256 x 10 from K = 256:
  0.28 ms); a tile of up to 16 columns runs that many chains on one load of x (0.045 ms). A reduction of 16 or fewer
  (unrolled whole: its copies are side by side already) and a prime number of columns keep no tile; 8 or 16 lanes alike."""
  for width in (16, 8):
    o = choose_opts(matmul_kernel(256, 256, n), Caps(threads=2, vector_width=width, fma=True))
    assert o.vector is None and dict(o.upcast) == {1: tile} and o.thread == 0
    check_opts(matmul_kernel(256, 256, n).canonical_root, o)
  for m, k, n in ((64, 8, 10), (64, 16, 10), (256, 256, 17)):
    assert dict(choose_opts(matmul_kernel(m, k, n), Caps(threads=2, vector_width=16, fma=True)).upcast) == {}


def test_a_batch_of_gemms_gets_no_cache_tile_and_a_gemm_batched_over_one_b_keeps_it():
  """A cache tile's loop runs outside the threads': for a batch of GEMMs (attention's, over batch and heads) it walked a
  block of every GEMM's rows at a time, reading each GEMM's B again for every block. Over one B (a linear layer on
  (batch, tokens, features)) the rows of every batch are one GEMM's, and the tile stays."""
  from uopc.kernelize import make_kernel
  g, m, k, n = 48, 256, 256, 64
  a = buf(0, g * m * k).reshape((g, m, 1, k)).expand((g, m, n, k))
  b = buf(1, g * k * n).reshape((g, k, n)).permute((0, 2, 1)).reshape((g, 1, n, k)).expand((g, m, n, k))
  caps = Caps(threads=2, vector_width=16, fma=True)
  o = choose_opts(make_kernel((a * b).reduce(Ops.ADD, 1), buf(2, g * m * n)), caps)
  assert o.tile == () and o.thread == 0 and dict(o.upcast) == {1: 8, 2: 2}
  a = buf(0, 8 * m * k).reshape((8, m, 1, k)).expand((8, m, n, k))
  b = buf(1, k * n).reshape((k, n)).permute((1, 0)).reshape((1, 1, n, k)).expand((8, m, n, k))
  assert choose_opts(make_kernel((a * b).reduce(Ops.ADD, 1), buf(2, 8 * m * n)), caps).tile == ((1, 64), (2, 32))   # (and a panel's)


def test_a_batch_of_gemms_with_a_bias_in_its_a_is_tiled_as_one_gemm_not_along_the_batch():
  """Attention's scores over (batch, heads, queries, keys) with the projection's bias added to q inside the sum: the
  bias is constant along the batch axis, but q and k both move along it, so a tile over it shares no loaded value. As a
  convolution's second tile axis it made 4 batches x 4 rows x 2 vectors, 32 accumulators (nanoGPT's scores ran at
  73-100 GFLOP/s); the tile is the GEMM's own, 8 rows x 2 vectors."""
  from uopc.kernelize import make_kernel
  bt, h, m, n, d = 8, 6, 64, 256, 64
  q = buf(0, bt * h * m * d).reshape((bt, h, m, 1, d)).expand((bt, h, m, n, d))
  bias = buf(1, h * d).reshape((1, h, 1, 1, d)).expand((bt, h, m, n, d))
  k = buf(2, bt * h * n * d).reshape((bt, h, d, n)).permute((0, 1, 3, 2)).reshape((bt, h, 1, n, d)).expand((bt, h, m, n, d))   # k packed
  kern = make_kernel(((q + bias) * k).reduce(Ops.ADD, 1), buf(3, bt * h * m * n))
  o = choose_opts(kern, Caps(threads=2, vector_width=16, fma=True))
  assert o.vector == (3, 16) and dict(o.upcast) == {2: 8, 3: 2}, o
  check_opts(kern.canonical_root, o)


def test_a_gemm_read_as_dot_products_gets_a_register_tile_and_threads_on_its_long_axis():
  """out[i, j] = sum_k x[i, k] w[j, k] for 16 rows of x (a decode step's x @ w.T, unpacked): both operands contiguous
  along k, so lanes of partial sums there. One accumulator per output read w once per row (61 GFLOP/s); 8 rows x 2
  columns of accumulators reuse each loaded vector (170), and the threads split w's 1536 rows, not x's 16."""
  from uopc.kernelize import make_kernel
  x = buf(0, 16 * 384).reshape((16, 1, 384)).expand((16, 1536, 384))
  w = buf(1, 1536 * 384).reshape((1, 1536, 384)).expand((16, 1536, 384))
  k = make_kernel((x * w).reduce(Ops.ADD, 1), buf(2, 16 * 1536))
  o = choose_opts(k, CPU)
  assert o.reduce_vector == 16 and dict(o.upcast) == {0: 8, 1: 2} and o.thread == 1 and o.unroll == 1
  check_opts(k.canonical_root, o)
  narrow = Caps(threads=2, vector_width=8, fma=True)         # 16 vector registers: 8 accumulators
  assert dict(choose_opts(k, narrow).upcast) == {0: 8}


def test_a_reduction_whose_loads_move_along_every_output_axis_gets_no_register_tile():
  """A layer norm's gradient, out[b, t] = sum_c x[b, t, c] * w[c] * dy[b, t, c]: contiguous along c like a GEMM read as
  dot products, but only w is shared across (b, t). A tile of 8 x 2 outputs would load nearly as many vectors per
  multiply-add as none (x and dy, one each per output) and made 30 KB of C a kernel; lanes along c and an unrolled sum instead."""
  from uopc.kernelize import make_kernel
  x = buf(0, 16 * 64 * 128).reshape((16, 64, 128))
  dy = buf(1, 16 * 64 * 128).reshape((16, 64, 128))
  w = buf(2, 128).reshape((1, 1, 128)).expand((16, 64, 128))
  k = make_kernel((x * w * dy).reduce(Ops.ADD, 2), buf(3, 16 * 64))
  o = choose_opts(k, CPU)
  assert o.reduce_vector == 16 and not o.upcast and o.unroll == 4, o
  check_opts(k.canonical_root, o)


def test_a_reduction_contiguous_along_an_earlier_output_axis_gets_its_lanes_there():
  """An embedding's gradient, out[c, v] = sum_n (tokens[n] == v) * dx[n, c]: nothing is contiguous along v (the last
  axis) or along n, but dx is along c. Scalar, each output's 1024 compares and adds ran at 2.4 GFLOP/s (7 ms of a 35 ms
  GPT step); with lanes along c, 16 outputs share each compare."""
  from uopc.kernelize import make_kernel
  tokens = buf(0, 1024, dtypes.i32).reshape((1, 1, 1024)).expand((128, 65, 1024))
  vocab = buf(1, 65, dtypes.i32).reshape((1, 65, 1)).expand((128, 65, 1024))
  dx = buf(2, 1024 * 128).reshape((1024, 128)).permute((1, 0)).reshape((128, 1, 1024)).expand((128, 65, 1024))
  k = make_kernel(tokens.ne(vocab).where(0.0, dx).reduce(Ops.ADD, 2), buf(3, 128 * 65))
  o = choose_opts(k, CPU)
  assert o.vector == (0, 16) and o.reduce_vector == 1
  check_opts(k.canonical_root, o)


def test_a_weight_gradient_is_packed_like_the_gemm_it_is():
  """dW = dy^T @ x comes from autodiff as a permuted product, PERMUTE(MUL(EXPAND(dy), EXPAND(x))) summed over its last
  axis: seen through the permutation it is a GEMM whose B (x, rows 2 KiB apart) is packed (a GPT's MLP weight gradient:
  95 -> 210 GFLOP/s). Its A, dy transposed, is read down its columns and packed into row panels too."""
  dy = buf(0, 1024 * 128).reshape((1024, 128, 1)).expand((1024, 128, 512))
  x = buf(1, 1024 * 512).reshape((1024, 1, 512)).expand((1024, 128, 512))
  dw = (dy * x).permute((1, 2, 0)).reduce(Ops.ADD, 1)
  ks = kernelize([(dw, buf(2, 128 * 512))], rewrite=graph_rewrite(CPU))
  assert sorted(k.root.shape for k in ks)[:2] == [(128 // 8, 1024, 8), (512 // 32, 1024, 32)] and len(ks) == 3
  assert len(kernelize([(dw, buf(2, 128 * 512))])) == 1


def test_an_a_read_down_its_columns_is_packed_into_row_panels():
  """dW = dy.T @ x for nanoGPT's MLP (2048 tokens, 1536 -> 384): A is dy transposed, each k a cache line 6 KiB from the
  last, and the register tile's 8 rows one line each (59 GFLOP/s). Packed as P[i // 8, k, i % 8], the rows for one k are
  one run (137 GFLOP/s). A short sum (k < PACK_MIN_DEPTH) pays for no copy."""
  from uopc.packing import PACK_MIN_DEPTH, PACK_ROWS
  for k, packed in ((2048, True), (PACK_MIN_DEPTH // 2, False)):
    dy = buf(0, k * 1536).reshape((k, 1536)).permute((1, 0)).reshape((1536, 1, k)).expand((1536, 384, k))
    x = buf(1, k * 384).reshape((k, 384)).permute((1, 0)).reshape((1, 384, k)).expand((1536, 384, k))
    ks = kernelize([((dy * x).reduce(Ops.ADD, 1), buf(2, 1536 * 384))], rewrite=graph_rewrite(CPU))
    stages = [kk for kk in ks if kk.root.shape == (1536 // PACK_ROWS, k, PACK_ROWS)]
    assert bool(stages) is packed, [kk.root.shape for kk in ks]


def test_an_a_is_packed_in_panels_of_the_register_tiles_rows():
  """With 16 vector registers (AVX2) the register tile is 4 rows (_register_tile), and A's panels are 4 rows: a panel of
  8 put each k's 4 rows in half a run, and every other half-line of A came along unused (a GPT's MLP weight gradient,
  128 x 512 from 1024 tokens, the kernel alone on an AMD Zen 1, 10 runs alternating: 1.87-1.89 -> 1.76 ms)."""
  assert graph_rewrite(CPU).rows == 8 and graph_rewrite(Caps(vector_width=8, gemm_panel=32)).rows == 4
  dy = buf(0, 1024 * 128).reshape((1024, 128, 1)).expand((1024, 128, 512))
  x = buf(1, 1024 * 512).reshape((1024, 1, 512)).expand((1024, 128, 512))
  dw = (dy * x).permute((1, 2, 0)).reduce(Ops.ADD, 1)
  ks = kernelize([(dw, buf(2, 128 * 512))], rewrite=graph_rewrite(Caps(threads=2, vector_width=8, fma=True, gemm_panel=32)))
  assert (128 // 4, 1024, 4) in [k.root.shape for k in ks] and len(ks) == 3


def test_a_b_with_rows_apart_is_packed_when_too_big_for_l2_or_read_by_enough_rows():
  """A B whose rows are 1 KiB or more apart is packed into panels when it holds more than a core's L2 keeps between the
  row tiles that walk each panel: nanoGPT's dx = dy @ W for the q, k and v weight (2048 x 1152 @ 1152 x 384, rows 384
  floats apart, 1.7 MiB: packed, the nanoGPT step 640 -> 616 ms) and an NN GEMM 1024. From 512 KiB, when 512 rows or
  more read it: rows that far apart fall in a few of the L1's sets, so each row tile reads the panel from L2 again (GEMM
  512: 1.09-1.96 -> 1.06-1.14 ms; 2048 x 384 @ 384 x 384: 2.15-2.20 -> 2.05-2.08 ms), counting the rows of every batch
  that shares B. A GEMM 384 (384 rows) and a GEMM 256 (256 KiB) stay unpacked: the copy costs more than it saves (384:
  0.44-0.46 against 0.49 ms packed; 256: 0.147 against 0.173 ms)."""
  from uopc.packing import PACK_STRIDE, PACK_MID
  for m, k, n, packed in ((2048, 1152, 384, True), (1024, 1024, 1024, True), (512, 512, 512, True), (256, 256, 256, False),
                          (384, 384, 384, False), (2048, 384, 384, True), (2048, PACK_MID // 384 - 1, 384, False),
                          (2048, 2048, PACK_STRIDE // 2, False)):
    a = buf(0, m * k).reshape((m, 1, k)).expand((m, n, k))
    b = buf(1, k * n).reshape((k, n)).permute((1, 0)).reshape((1, n, k)).expand((m, n, k))
    ks = kernelize([((a * b).reduce(Ops.ADD, 1), buf(2, m * n))], rewrite=graph_rewrite(CPU))
    assert ((n // 32, k, 32) in [kk.root.shape for kk in ks]) is packed, (m, k, n, [kk.root.shape for kk in ks])
  # a batch of 8 x 256 rows under one 384 x 384 weight: 2048 rows read it, packed; 8 GEMMs of 256 rows, each with a B of
  # its own, are not
  for shared, packed in ((True, True), (False, False)):
    x = buf(0, 8 * 256 * 384).reshape((8, 256, 1, 384)).expand((8, 256, 384, 384))
    w = buf(1, (1 if shared else 8) * 384 * 384).reshape(((1 if shared else 8), 384, 384)).permute((0, 2, 1))
    w = w.reshape(((1 if shared else 8), 1, 384, 384)).expand((8, 256, 384, 384))
    ks = kernelize([((x * w).reduce(Ops.ADD, 1), buf(2, 8 * 256 * 384))], rewrite=graph_rewrite(CPU))
    assert any(kk.root.shape[-3:] == (12, 384, 32) for kk in ks) is packed, (shared, [kk.root.shape for kk in ks])


def test_a_b_read_along_its_columns_is_packed_from_fewer_products_when_enough_rows_reuse_it():
  """x @ w.T reads w's rows as B's columns. Left unpacked, its kernel takes dot products along k, each output a
  horizontal sum: a decode step's projections (16 x 128 @ 128 x 384) and an MLP's backward through a 10-class head
  (256 x 10 @ 10 x 256) spent as long in those sums as in their multiply-adds. From PACK_REUSE_ROWS rows and
  PACK_SMALL_WORK products B is packed; fewer rows, or fewer products (a 64 x 16 attention's scores), keep one kernel."""
  from uopc.packing import PACK_REUSE_ROWS, PACK_SMALL_WORK, PACK_MIN_WORK
  assert PACK_SMALL_WORK < 16 * 128 * 128 < 16 * 128 * 384 < PACK_MIN_WORK
  for m, k, n, packed in ((16, 128, 384, True), (16, 128, 128, True), (256, 10, 256, True), (PACK_REUSE_ROWS - 8, 128, 384, False),
                          (64, 16, 64, False), (2048, 64, 64, True)):
    a = buf(0, m * k).reshape((m, 1, k)).expand((m, n, k))
    b = buf(1, n * k).reshape((1, n, k)).expand((m, n, k))
    ks = kernelize([((a * b).reduce(Ops.ADD, 1), buf(2, m * n))], rewrite=graph_rewrite(CPU))
    assert ((n // 32, k, 32) in [kk.root.shape for kk in ks]) is packed, (m, k, n, [kk.root.shape for kk in ks])


def test_a_b_narrower_than_a_vector_is_copied_transposed_for_dot_products():
  """x @ W into fewer columns than a vector has lanes (an MLP's 10 classes), W stored row by row: no vector fits a row
  of W, so its kernel ran scalar. W is copied column by column (panels of one column, k contiguous) when each output
  sums PACK_NARROW_DEPTH products or more, and the kernel takes dot products along k; a W read along k already, or a
  short sum, is left as it is."""
  from uopc.packing import PACK_NARROW, PACK_NARROW_DEPTH
  for m, k, n, w_rows, packed in ((256, 256, 10, True, True), (256, PACK_NARROW_DEPTH // 2, 10, True, False),
                                  (256, 256, 10, False, False), (256, 256, PACK_NARROW, True, False)):
    a = buf(0, m * k).reshape((m, 1, k)).expand((m, n, k))
    w = buf(1, k * n).reshape((k, n)).permute((1, 0)) if w_rows else buf(1, n * k).reshape((n, k))   # (n, k): B[k, j]
    b = w.reshape((1, n, k)).expand((m, n, k))
    ks = kernelize([((a * b).reduce(Ops.ADD, 1), buf(2, m * n))], rewrite=graph_rewrite(CPU))
    assert ((n, k, 1) in [kk.root.shape for kk in ks]) is packed, (m, k, n, w_rows, [kk.root.shape for kk in ks])


def test_a_gemm_whose_columns_are_not_whole_panels_is_computed_over_zero_padded_columns():
  """C = A @ B with n columns not a whole number of panels (a GPT's head over a vocabulary of 65, 1000 classes): its
  kernel's columns took no vector lanes (65) or half of them (1000), at 34-70 GFLOP/s where whole panels run at 300.
  From PAD_MIN_WORK multiply-adds B is copied into panels padded with zero columns to whole panels, the GEMM stores C
  that wide, and C is read back through a SHRINK. Not for a smaller GEMM (the two kernels more cost what they save), C
  one panel wide or less, a C stored transposed (its lanes go along i), or a B stored row by row whose C is whole
  vectors wide (48 columns: all its lanes are C's already, and padded it was 45% slower). Rows that only register tiles
  of a quarter of PACK_ROWS or fewer divide are padded likewise, with A stored padded."""
  from uopc.packing import PAD_MIN_WORK
  assert 128 * 128 * 65 < PAD_MIN_WORK <= 512 * 64 * 100
  for m, k, n, w_rows, padded in ((1024, 128, 65, False, 96), (1024, 128, 65, True, 96), (512, 64, 100, True, 128), (300, 70, 1001, False, 1024),
                                  (128, 128, 65, True, None), (1024, 128, 20, True, None), (1024, 128, 96, True, None),
                                  (2048, 384, 48, False, 64), (2048, 384, 48, True, None), (1024, 256, 1008, True, None),
                                  (1024, 256, 1000, True, 1024)):
    a = buf(0, m * k).reshape((m, 1, k)).expand((m, n, k))
    w = buf(1, k * n).reshape((k, n)).permute((1, 0)) if w_rows else buf(1, n * k).reshape((n, k))   # (n, k): B[k, j]
    c = (a * w.reshape((1, n, k)).expand((m, n, k))).reduce(Ops.ADD, 1)
    ks = kernelize([(c, buf(2, m * n))], rewrite=graph_rewrite(CPU))
    shapes = [kk.root.shape for kk in ks]
    if padded: assert (padded // 32, k, 32) in shapes and (m, padded) in shapes and shapes[-1] == (m, n), (m, k, n, shapes)   # C read back n wide
    else: assert all(s[-1] == n for s in shapes if len(s) == 2), (m, k, n, shapes)
  # rows that only tiles of 1 or 2 rows divide (997, 998; 37 rows of a 37 x 300 @ 300 x 512): A padded with zero rows and
  # stored, C computed that tall and read back; rows that tiles of 3 or more divide (999) are left as they are
  for m, k, n, tall in ((997, 256, 1024, 1000), (998, 256, 1024, 1000), (37, 300, 512, 40), (999, 256, 1024, None), (996, 256, 1024, None)):
    a = buf(0, m * k).reshape((m, 1, k)).expand((m, n, k))
    b = buf(1, k * n).reshape((k, n)).permute((1, 0)).reshape((1, n, k)).expand((m, n, k))
    shapes = [kk.root.shape for kk in kernelize([((a * b).reduce(Ops.ADD, 1), buf(2, m * n))], rewrite=graph_rewrite(CPU))]
    if tall: assert (tall, 1, k) in shapes and (tall, n) in shapes and shapes[-1] == (m, n), (m, shapes)
    else: assert all(s[0] == m for s in shapes if len(s) == 2), (m, shapes)
  # two GEMMs padding one B pack it once, padded (not the pad's own concatenation, 96 wide, as a slice of which the
  # padded B looks like one of attention's blocks)
  w = buf(1, 48 * 384).reshape((48, 384))
  cs = [(buf(s, 2048 * 384).reshape((2048, 1, 384)).expand((2048, 48, 384)) * w.reshape((1, 48, 384)).expand((2048, 48, 384))).reduce(Ops.ADD, 1)
        for s in (0, 3)]
  shapes = [kk.root.shape for kk in kernelize([(cs[0], buf(2, 2048 * 48)), (cs[1], buf(4, 2048 * 48))], rewrite=graph_rewrite(CPU))]
  assert shapes.count((2, 384, 32)) == 1 and not any(s[0] == 3 for s in shapes if len(s) == 3), shapes
  # stored transposed (k's gradient in attention: (q.T @ ds).T), C's lanes go along its i: no padding of its j
  a = buf(0, 64 * 520).reshape((520, 64)).permute((1, 0)).reshape((64, 1, 520)).expand((64, 65 * 8, 520))
  b = buf(1, 520 * 520).reshape((520, 520)).permute((1, 0)).reshape((1, 520, 520)).expand((64, 520, 520))
  ks = kernelize([((a * b).reduce(Ops.ADD, 1).permute((1, 0)), buf(2, 520 * 64))], rewrite=graph_rewrite(CPU))
  assert not any(520 < s for kk in ks for s in kk.root.shape), [kk.root.shape for kk in ks]


def test_a_gemm_stored_transposed_packs_its_a_into_panels_a_vector_wide():
  """k's gradient in attention, ds.T @ q (512 x 64 from 512 x 512 by 512 x 64), comes from autodiff as (q.T @ ds).T: a
  GEMM C = A @ B with A = q.T (read down its columns: packed) whose kernel stores C transposed. That kernel's vector lanes
  go along C's rows, A's i: in panels of 8 rows each 16-lane vector was two runs, gathered lane by lane (111 GFLOP/s);
  in panels of the B width (32) it is one vector load. An A stored plainly keeps its panels of 8 rows."""
  from uopc.packing import PACK_ROWS
  from uopc.vectorize import vectorize
  from uopc.rangeify import lower
  from uopc.lowering import Ctx
  a = buf(0, 512 * 64).reshape((512, 64)).permute((1, 0)).reshape((64, 1, 512)).expand((64, 512, 512))
  b = buf(1, 512 * 512).reshape((512, 512)).permute((1, 0)).reshape((1, 512, 512)).expand((64, 512, 512))
  c = (a * b).reduce(Ops.ADD, 1)
  for root, rows in ((c.permute((1, 0)), 32), (c, PACK_ROWS)):
    ks = kernelize([(root, buf(2, 512 * 64))], rewrite=graph_rewrite(CPU))
    assert (64 // rows, 512, rows) in [k.root.shape for k in ks], [k.root.shape for k in ks]
  gemm = kernelize([(c.permute((1, 0)), buf(2, 512 * 64))], rewrite=graph_rewrite(CPU))[-1]
  o = choose_opts(gemm, CPU)
  assert o.vector == (1, 16)
  program = vectorize(lower(gemm.canonical_root, gemm.canonical_out, Ctx(opts=o)), lanes=True)
  # A's lanes come in one vector load: no VECTORIZE gathers different scalar loads (a broadcast repeats one)
  gathers = [u for u in program.toposort() if u.op is Ops.VECTORIZE and len(set(u.src)) > 1 and all(s.op is Ops.LOAD for s in u.src)]
  assert not gathers and any(u.op is Ops.LOAD and u.dtype == dtypes.f32.vec(16) for u in program.toposort())


def test_a_gemm_stored_transposed_packs_a_b_whose_rows_are_far_apart():
  """v's gradient in attention, p.T @ do (512 x 64 from 512 x 512 by 512 x 64), comes from autodiff as (do.T @ p).T, a
  kernel that stores C transposed: its register tile's rows run along p's keys, so each of the 512 steps of k read 8
  floats of a new line of p, rows 2 KiB apart (218 us in attention's forward and backward at N = 512). Such a B is
  packed when its rows are PACK_STRIDE or more apart, over PACK_MIN_DEPTH steps or more, though no B rule would pack a 1
  MiB B read by 64 rows; in panels as wide as the register tile's rows (PACK_ROWS), so that the rows one step reads are
  one contiguous run (panels of 32: 31 + 155 us; of 8: 37 + 122). The same GEMM stored plainly, summing fewer steps, or
  over a B whose rows are nearer (an MLP's w gradient, x 1024 x 128: 513 us as it is, 20 + 554 packed) keeps B as it is."""
  from uopc.packing import PACK_MIN_DEPTH, PACK_STRIDE, PACK_ROWS
  for k, n, transposed, packed in ((512, 512, True, True), (512, 512, False, False), (PACK_MIN_DEPTH // 2, 512, True, False),
                                   (1024, PACK_STRIDE // 2, True, False)):
    a = buf(0, k * 64).reshape((k, 64)).permute((1, 0)).reshape((64, 1, k)).expand((64, n, k))     # do.T
    b = buf(1, k * n).reshape((k, n)).permute((1, 0)).reshape((1, n, k)).expand((64, n, k))        # p, row-major
    c = (a * b).reduce(Ops.ADD, 1)
    ks = kernelize([(c.permute((1, 0)) if transposed else c, buf(2, n * 64))], rewrite=graph_rewrite(CPU))
    assert ((n // PACK_ROWS, k, PACK_ROWS) in [kk.root.shape for kk in ks]) is packed, (k, n, transposed, [kk.root.shape for kk in ks])
    assert (n // 32, k, 32) not in [kk.root.shape for kk in ks]


def test_gemms_reading_slices_of_one_operand_share_one_pack_of_it_and_a_lone_slice_packs_itself():
  """Attention's blocks of queries (uopc.tensor.attention) each read the first e keys of k, transposed: packed one by
  one, the 4 blocks' packs copied 2.5 times the keys (64 + 128 + 192 + 256 of 256), in 4 kernels. Where other GEMMs
  read slices of the same operand, each GEMM reads its panels from one pack of the whole; a slice no other GEMM shares
  packs itself alone (a whole too long for it would be wasted)."""
  g, m, k, n = 4, 64, 64, 256
  kt = buf(1, g * n * k).reshape((g, n, k)).permute((0, 2, 1))                 # (g, k, n): k transposed, as attention has it
  def scores(e: int, out: int) -> tuple[UOp, UOp]:
    a = buf(0, g * m * k).reshape((g, m, 1, k)).expand((g, m, e, k))
    b = kt.shrink(((0, g), (0, k), (0, e))).permute((0, 2, 1)).reshape((g, 1, e, k)).expand((g, m, e, k))
    return (a * b).reduce(Ops.ADD, 1), buf(out, g * m * e)
  packs = lambda ks: sorted(kk.root.shape for kk in ks if kk.root.op is not Ops.REDUCE)
  ks = kernelize([scores(e, 2 + i) for i, e in enumerate((64, 128, 192, 256))], rewrite=graph_rewrite(CPU))
  assert packs(ks) == [(g, n // 32, k, 32)] and len(ks) == 5, packs(ks)
  ks = kernelize([scores(128, 2)], rewrite=graph_rewrite(CPU))
  assert packs(ks) == [(g, 128 // 32, k, 32)]


def test_a_transposing_copy_walks_blocks_of_rows_inside_each_column_and_its_threads_split_the_blocks():
  """P[j // 8, k, j % 8] = A[k, j], A's rows 16 elements or more apart (a GEMM operand packed into panels): in output
  order each step of k read a new line of A, whose other half waited for the next panel, and 2048 rows later it had left
  the L1 (2048 x 1536 alone: 1.33 ms). Blocks of 16 rows, split across the threads, each walked panel by panel with its
  rows innermost: every line read serves 16 rows (0.68 ms). The copy is the same, element for element."""
  import numpy as np
  from uopc.kernelize import make_kernel
  from uopc.linearize import linearize
  from uopc.interpret import run_linear
  from uopc.rangeify import lower
  from uopc.lowering import Ctx
  from uopc.opt import TRANSPOSE_BLOCK
  caps = Caps(threads=2, vector_width=16, fma=True)
  def copy(k: int, n: int):
    view = buf(0, k * n).reshape((k, n // 8, 8)).permute((1, 0, 2))
    return make_kernel(view, buf(1, k * n))
  kernel = copy(1024, 64)
  o = choose_opts(kernel, caps)
  assert o.thread == 1 and o.tile == ((1, TRANSPOSE_BLOCK),) and o.vector == (2, 8)
  alone = choose_opts(kernel, Caps(threads=1, vector_width=16))     # one thread: the same loops, none of them parallel
  assert alone.thread is None and alone.tile == o.tile
  sink = lower(kernel.canonical_root, kernel.canonical_out, Ctx(opts=o))
  loops = sorted((u for u in sink.toposort() if u.op is Ops.RANGE and u.arg.kind is not AxisType.UPCAST), key=lambda r: r.arg)
  blocks, panels, rows = [(r.arg.kind, r.src[0].arg) for r in loops]
  assert blocks == (AxisType.THREAD, 1024 // TRANSPOSE_BLOCK) and panels == (AxisType.LOOP, 8) and rows == (AxisType.LOOP, TRANSPOSE_BLOCK)
  a = np.arange(1024 * 64, dtype=np.float32)
  out = [0.0] * a.size
  run_linear(linearize(sink), {0: list(a), 1: out})
  assert np.array_equal(np.array(out, np.float32), a.reshape(1024, 8, 8).transpose(1, 0, 2).ravel())
  # blocks of 16 where 32 doesn't divide the rows. Rows that fit the L1 as lines (k * 64 bytes) take blocks too: A was
  # most often just written with its rows split across the threads, and blocks of them read each thread's own (attention's
  # gradient at N = 512, its 512 x 512 packed into panels of 8: 75 -> 45 us); blocks too few for the threads, or a
  # contiguous read, keep the output's order
  assert TRANSPOSE_BLOCK == 32 and choose_opts(copy(1040, 64), caps).tile == ((1, 16),)
  assert choose_opts(copy(256, 32), caps).tile == ((1, 32),)
  assert choose_opts(copy(24, 32), caps).tile == ()
  assert choose_opts(make_kernel(buf(0, 1024 * 32).reshape((1024, 32)) * 2.0, buf(1, 1024 * 32)), caps).tile == ()



def test_a_transpose_walks_blocks_of_its_last_axis_split_across_the_threads():
  """out[i, j] = x[j, i] (x.T.contiguous(), a + b.T): no vector lanes (the load jumps along j) and, in output order,
  each element a new line of x, 2048 lines later read again for the next i (2048 x 2048 alone: 15.3 ms at 2 GB/s).
  Blocks of 32 columns j, split across the threads, each walked down every i with its 32 j innermost: the 32 lines of x
  serve 32 steps of i, and the output is written in whole lines (1.16-1.23 ms; PyTorch 5.0, NumPy 28.8)."""
  import numpy as np
  from uopc.kernelize import make_kernel
  from uopc.linearize import linearize
  from uopc.interpret import run_linear
  from uopc.rangeify import lower
  from uopc.lowering import Ctx
  from uopc.opt import TRANSPOSE_BLOCK
  caps = Caps(threads=2, vector_width=16, fma=True)
  n, m = 64, 1024
  kernel = make_kernel(buf(0, m * n).reshape((m, n)).permute((1, 0)), buf(1, m * n))
  o = choose_opts(kernel, caps)
  assert o.vector is None and o.thread == 1 and o.tile == ((1, TRANSPOSE_BLOCK),), o
  sink = lower(kernel.canonical_root, kernel.canonical_out, Ctx(opts=o))
  a = np.arange(m * n, dtype=np.float32)
  out = [0.0] * a.size
  run_linear(linearize(sink), {0: list(a), 1: out})
  assert np.array_equal(np.array(out, np.float32), a.reshape(m, n).T.ravel())
  # an elementwise kernel with a transposed operand the same way; a transpose of a short last axis keeps its order
  plus = make_kernel(buf(0, n * m).reshape((n, m)) + buf(1, m * n).reshape((m, n)).permute((1, 0)), buf(2, n * m))
  assert choose_opts(plus, caps).tile == ((1, TRANSPOSE_BLOCK),)
  assert choose_opts(make_kernel(buf(0, n * 256).reshape((256, n)).permute((1, 0)), buf(1, n * 256)), caps).tile == ()

def test_a_transposing_copy_on_a_machine_with_gathers_gathers_vectors_and_walks_the_read_rows_innermost():
  """With gathers (Caps.gather: AVX-512), a copy all of whose loads read across its last axis takes vectors along it,
  each one gather, and walks the axis x is read contiguously along in blocks of 16 innermost (Opts.inner): the 16 lines
  a gather touches serve the block's 16 steps. x.T of 2048 x 2048: 1.04 -> 0.77 ms alone; attention's k packed into
  panels of k.T, 176 -> 134 us. Elementwise with a contiguous operand too (a + b.T), or without gathers: as before."""
  from uopc.kernelize import make_kernel
  from uopc.opt import INNER_BLOCK
  caps = Caps(threads=2, vector_width=16, fma=True, gather=True)
  n, m = 64, 1024
  t = make_kernel(buf(0, m * n).reshape((m, n)).permute((1, 0)), buf(1, m * n))
  assert choose_opts(t, caps) == Opts(vector=(1, 16), thread=1, tile={1: 32}, inner={0: INNER_BLOCK})
  assert choose_opts(t, dataclasses.replace(caps, gather=False)).vector is None
  assert choose_opts(t, dataclasses.replace(caps, threads=1)) == Opts(vector=(1, 16), inner={0: INNER_BLOCK})
  k = buf(0, 8 * 256 * 1152).reshape((8, 256, 1152)).shrink(((0, 8), (0, 256), (384, 768))).reshape((8, 256, 6, 64))
  panels = k.permute((0, 2, 3, 1)).reshape((8, 6, 64, 8, 32)).permute((0, 1, 3, 2, 4))       # P[b, h, j // 32, d, j % 32] = k[b, j, h, d]
  assert choose_opts(make_kernel(panels, buf(1, 8 * 256 * 384)), caps) == Opts(vector=(4, 16), thread=0, inner={3: INNER_BLOCK})
  plus = make_kernel(buf(0, n * m).reshape((n, m)) + buf(1, m * n).reshape((m, n)).permute((1, 0)), buf(2, n * m))
  assert choose_opts(plus, caps).vector is None and not choose_opts(plus, caps).inner
  # an int32 transpose too; an f16 one, a reduction, or a last axis the lanes don't divide, not
  assert choose_opts(make_kernel(buf(0, m * n, dtypes.i32).reshape((m, n)).permute((1, 0)), buf(1, m * n, dtypes.i32)), caps).inner
  assert not choose_opts(make_kernel(buf(0, m * n, dtypes.f16).reshape((m, n)).permute((1, 0)), buf(1, m * n, dtypes.f16)), caps).inner
  assert not choose_opts(make_kernel(buf(0, 1000 * n).reshape((1000, n)).permute((1, 0)), buf(1, 1000 * n)), caps).inner


def test_a_concatenation_with_a_gathered_part_walks_the_gathered_rows_innermost():
  """q's, k's and v's gradients joined into qkv's, v's read transposed (from (head dim, keys)): its vector lanes gather
  rows 256 floats apart, 4 of the L1's 64 sets, so in output order each line was evicted before the next key read it
  again. The keys walked innermost in blocks of 16 (Opts.inner, each piece of the split loop its own): 0.99 -> 0.47 ms."""
  from uopc.kernelize import make_kernel
  from uopc.opt import INNER_BLOCK
  from uopc.composite import pad
  caps = Caps(threads=2, vector_width=16, fma=True)
  q, k = (buf(i, 8 * 256 * 384).reshape((8, 256, 384)) for i in range(2))
  v = buf(2, 8 * 384 * 256).reshape((8, 384, 256)).permute((0, 2, 1))
  cat = pad(q, ((0, 0), (0, 0), (0, 768))) + pad(k, ((0, 0), (0, 0), (384, 384))) + pad(v, ((0, 0), (0, 0), (768, 0)))
  o = choose_opts(make_kernel(cat, buf(3, 8 * 256 * 1152)), caps)
  assert o.split and o.vector == (2, 16) and o.inner == ((1, INNER_BLOCK),)
  assert not choose_opts(make_kernel(pad(q, ((0, 0), (0, 0), (0, 384))) + pad(k, ((0, 0), (0, 0), (384, 0))), buf(3, 8 * 256 * 768)), caps).inner


def test_a_small_copy_reading_a_line_an_element_is_threaded_below_the_work_threads_need_otherwise():
  """k packed into panels, P[j // 32, d, j % 32] = k[j, d]: no vector lanes (each element of a panel row a new line of
  k), so each element costs what a vector kernel's does, and two threads pay from LINE_COPY_MIN_WORK, under
  THREAD_MIN_WORK (attention's 512 keys of 64, 32K elements: 21 -> 14 us in place when THREAD_MIN_WORK was 64K). A
  contiguous copy of that size, or a strided one under LINE_COPY_MIN_WORK, stays on one thread; an elementwise kernel with
  no axis (a 0-d value) is no strided copy."""
  from uopc.kernelize import make_kernel
  from uopc.opt import THREAD_MIN_WORK, LINE_COPY_MIN_WORK
  caps = Caps(threads=2, vector_width=16, fma=True)
  def panels(n: int, d: int):
    return make_kernel(buf(0, n * d).reshape((n // 32, 32, d)).permute((0, 2, 1)), buf(1, n * d))
  assert LINE_COPY_MIN_WORK <= 256 * 64 < THREAD_MIN_WORK
  o = choose_opts(panels(256, 64), caps)
  assert o.vector is None and o.thread == 0
  assert choose_opts(panels(128, 64), caps).thread is None                        # 8K elements: under LINE_COPY_MIN_WORK
  assert choose_opts(make_kernel(buf(0, 256 * 64).reshape((256, 64)) * 2.0, buf(1, 256 * 64)), caps).thread is None
  assert choose_opts(make_kernel(buf(0, 512 * 64).reshape((512, 64)) * 2.0, buf(1, 512 * 64)), caps).thread == 0   # 32K: threaded
  assert choose_opts(make_kernel(buf(0, 1).reshape(()) * 2.0, buf(1, 1)), caps).thread is None


def test_a_concatenations_kernel_splits_its_last_loop_and_others_dont():
  """The heuristics split the last loop of an elementwise kernel with a concatenation (a convolution's padding: 0.91 ->
  0.23 ms), never a GEMM's or a plain elementwise kernel's."""
  from uopc.kernelize import make_kernel
  from uopc.composite import pad
  caps = Caps(threads=2, vector_width=16, fma=True)
  padded = pad(buf(0, 8 * 64 * 32 * 32).reshape((8, 64, 32, 32)), ((0, 0), (0, 0), (1, 1), (1, 1)))
  assert choose_opts(make_kernel(padded, buf(1, 8 * 64 * 34 * 34)), caps).split
  assert not choose_opts(gemm(), caps).split
  assert not choose_opts(make_kernel(buf(0, 64 * 64).reshape((64, 64)) * 2.0, buf(1, 64 * 64)), caps).split
  # a concatenation under a reduction can't split (check_opts refuses it): the rest of the choice stays, its lanes too
  summed = pad(buf(0, 64 * 64).reshape((64, 64)), ((0, 0), (0, 64))).reduce(Ops.ADD, 1)
  o = choose_opts(make_kernel(summed, buf(1, 64)), caps)
  assert not o.split and o.reduce_vector == 16


def test_a_gemm_threaded_over_its_rows_walks_each_column_panel_down_its_rows_unless_its_epilogue_is_costly():
  """A GEMM whose threads split its rows (B fits half an L2) walks one column panel of B (a register tile's columns)
  down all of a thread's rows before the next, so the panel stays in the L1 while A streams past: the loops are the
  threads' row blocks, the panels, then the row tiles. Threaded over a batch of its row axes (a linear layer on
  (batch, tokens, features)) the panels go inside the batch's loop. Not under a costly epilogue (exp, a division), nor
  for a GEMM split by columns (a B too big for that). The sums are the same, element for element."""
  import numpy as np
  from uopc.kernelize import make_kernel
  from uopc.linearize import linearize
  from uopc.interpret import run_linear
  from uopc.rangeify import lower
  from uopc.lowering import Ctx
  caps = Caps(threads=2, vector_width=16, fma=True)
  def gemm(lead: tuple[int, ...], m: int, k: int, n: int, epilogue=lambda c: c):
    a = buf(0, prod(lead) * m * k).reshape(lead + (m, 1, k)).expand(lead + (m, n, k))
    b = buf(1, k * n).reshape((k, n)).permute((1, 0)).reshape((1,) * len(lead) + (1, n, k)).expand(lead + (m, n, k))
    return make_kernel(epilogue((a * b).reduce(Ops.ADD, 1)), buf(2, prod(lead) * m * n))
  def loops(kernel, o):
    sink = lower(kernel.canonical_root, kernel.canonical_out, Ctx(opts=o))
    rngs = sorted((u for u in sink.toposort() if u.op is Ops.RANGE and u.arg.kind in (AxisType.THREAD, AxisType.LOOP)), key=lambda r: r.arg)
    return sink, [(r.arg.kind, r.src[0].arg) for r in rngs]
  rows = gemm((), 1024, 64, 128)
  o = choose_opts(rows, caps)
  assert o.thread == 0 and o.tile == ((0, 64), (1, 32)) and dict(o.upcast) == {0: 8, 1: 2}
  sink, order = loops(rows, o)
  assert order[:3] == [(AxisType.THREAD, 16), (AxisType.LOOP, 4), (AxisType.LOOP, 8)]   # row blocks, panels, row tiles
  batched = gemm((2,), 64, 8, 64)
  o = choose_opts(batched, caps)
  assert o.thread == 0 and o.tile == ((2, 32),)
  sink, order = loops(batched, o)
  assert order[:3] == [(AxisType.THREAD, 2), (AxisType.LOOP, 2), (AxisType.LOOP, 8)]     # the batch, panels, row tiles
  rng = np.random.default_rng(0)
  x, w = rng.standard_normal((2, 64, 8)).astype(np.float32), rng.standard_normal((8, 64)).astype(np.float32)
  out = [0.0] * (2 * 64 * 64)
  run_linear(linearize(sink), {0: x.ravel().tolist(), 1: w.ravel().tolist(), 2: out})
  np.testing.assert_allclose(np.array(out, np.float32).reshape(2, 64, 64), x @ w, rtol=1e-5, atol=1e-5)
  costly = gemm((), 1024, 64, 128, lambda c: UOp(Ops.RECIP, (UOp(Ops.EXP2, (c,)) + 1.0,)))
  assert choose_opts(costly, caps).tile == ((0, 64),)
  assert choose_opts(gemm((), 1024, 1024, 1024), caps).tile == ((0, 64),)              # split by columns: B is 4 MiB
