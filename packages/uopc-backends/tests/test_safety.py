"""The C backend's safety net: out-of-range memory indices are refused before gcc runs, integer
division never traps, run_c checks every array before native code sees it, gcc's errors come back readable, and
kernel names can't inject C."""
import os, re, subprocess
from pathlib import Path
import numpy as np
import pytest
import uopc.backends.c as C
import uopc.backends.ccompiler as CC
from uopc.dtype import AddrSpace, dtypes
from uopc.uop import UOp, Ops, AxisType, ParamArg, buf, prod, range_, sink, stack
from uopc.rangeify import Opts, lower
from uopc.lowering import Ctx
from uopc.gpulower import STAGE_PAD
from uopc.backends import BackendError, UnsafeKernelError
from uopc.backends import CompileError
from uopc.backends.c import CCompiler, sanitize_name
from uopc.testing import render_c, run_c, run_lowered

I32_MIN, I32_MAX = -2**31, 2**31 - 1


@pytest.fixture(autouse=True)
def cache(tmp_path, monkeypatch) -> Path:
  monkeypatch.setenv("UOPC_CACHE_DIR", str(tmp_path / "cache"))
  return tmp_path / "cache"


@pytest.fixture
def no_gcc(cache, monkeypatch):
  """Fails the test if anything is compiled: gcc is never started and the compile cache stays empty."""
  def refuse(*a, **kw): raise AssertionError(f"compiled although the kernel is unsafe: {a} {kw}")
  monkeypatch.setattr(CC.subprocess, "run", refuse)
  monkeypatch.setattr(C.compiler, "compile", refuse)
  yield
  assert not cache.exists() or not any(cache.iterdir())


def copy_through(index_of, n_in: int, n_out: int):
  """A lowered program: for r in range(n_out): data1[r] = data0[index_of(r)]."""
  r = range_(n_out, 0)
  return sink(buf(1, n_out).index(r).store(buf(0, n_in).index(index_of(r)).load()).end(r))


def refused(sink_, arrays) -> str:
  """The UnsafeKernelError message, after checking that render_c and run_c both refuse the program."""
  with pytest.raises(UnsafeKernelError) as rendered: render_c(sink_, "unsafe")
  with pytest.raises(UnsafeKernelError) as ran: run_c(sink_, arrays, "unsafe")
  assert str(rendered.value) == str(ran.value)
  return str(ran.value)


def test_a_load_past_the_end_of_its_buffer_is_refused_before_compiling(no_gcc):
  out = np.zeros(5, np.float32)
  msg = refused(copy_through(lambda r: r, 4, 5), {0: np.zeros(4, np.float32), 1: out})
  assert "data0" in msg and "4 elements" in msg and "0..4" in msg and "0..3" in msg
  assert not out.any()


def test_a_negative_offset_load_is_refused_with_its_bounds(no_gcc):
  msg = refused(copy_through(lambda r: r + -1, 4, 4), {0: np.zeros(4, np.float32), 1: np.zeros(4, np.float32)})
  assert "data0" in msg and "4 elements" in msg and "-1..2" in msg


def test_a_store_past_the_end_of_its_buffer_is_refused(no_gcc):
  r = range_(5, 0)
  prog = sink(buf(0, 4).index(r).store(buf(1, 5).index(r).load()).end(r))
  msg = refused(prog, {0: np.zeros(4, np.float32), 1: np.zeros(5, np.float32)})
  assert "data0" in msg and "4 elements" in msg and "0..4" in msg


def test_a_gather_by_loaded_indices_is_refused_because_they_can_be_any_i32(no_gcc):
  # table[ids[0]]: the index is a value read from memory, so its bounds are the whole i32 range
  root = buf(0, 4).index(buf(1, 1, dtypes.i32).reshape(()))
  prog = lower(root, buf(2, 1))
  msg = refused(prog, {0: np.zeros(4, np.float32), 1: np.array([2], np.int32), 2: np.zeros(1, np.float32)})
  assert "data0" in msg and "4 elements" in msg and f"{I32_MIN}..{I32_MAX}" in msg


def test_the_bounds_check_accepts_an_index_that_exactly_fills_its_buffer():
  a, out = np.arange(5, dtype=np.float32), np.zeros(4, np.float32)
  run_c(copy_through(lambda r: r + 1, 5, 4), {0: a, 1: out})
  assert np.array_equal(out, a[1:])


def wide_copy(start_of, n_in: int, n_out: int, lanes: int = 4):
  """A lowered program that moves vectors: for r: data1[r*lanes:(r+1)*lanes] = data0[start_of(r):start_of(r)+lanes]."""
  r = range_(n_out // lanes, 0)
  vec = dtypes.f32.vec(lanes)
  load = UOp(Ops.INDEX, (buf(0, n_in), start_of(r)), vec).load()
  return sink(UOp(Ops.INDEX, (buf(1, n_out), r * lanes), vec).store(load).end(r))


def test_a_vector_load_whose_last_lanes_pass_the_end_is_refused(no_gcc):
  # the index of the last vector is 12..15 of 16, but its first element's index, 13, is inside: every lane must be
  msg = refused(wide_copy(lambda r: r * 4 + 1, 16, 16), {0: np.zeros(16, np.float32), 1: np.zeros(16, np.float32)})
  assert "data0 has 16 elements but the index can be 1..13 and a f32x4 reaches 3 elements past it, outside 0..15" in msg


def test_a_vector_load_that_exactly_fills_its_buffer_runs():
  a, out = np.arange(17, dtype=np.float32), np.zeros(16, np.float32)
  run_c(wide_copy(lambda r: r * 4 + 1, 17, 16), {0: a, 1: out})
  assert np.array_equal(out, a[1:])


# ---- i32 arithmetic wraps without -fwrapv: unsigned where bounds allow overflow, plain where they prove none --------

@pytest.mark.parametrize("vector", [False, True], ids=["scalar", "vector"])
def test_i32_add_and_mul_of_loaded_values_wrap_as_numpy(vector):
  a, b = division_operands()
  a, b = a[:4096], b[:4096] * np.int32(99991)       # products far past i32
  x, y = buf(0, a.size, dtypes.i32), buf(1, a.size, dtypes.i32)
  prog = lower((x + y) * y + x * x, buf(2, a.size, dtypes.i32), Ctx(opts=Opts(vector=(0, 16))) if vector else None)
  src = render_c(prog)
  assert "-fwrapv" not in C.CFLAGS and ("u32x16" in src if vector else "(unsigned)" in src)
  out = np.zeros(a.size, np.int32)
  run_c(prog, {0: a, 1: b, 2: out})
  with np.errstate(all="ignore"): want = (a + b) * b + a * a        # NumPy's int32 arithmetic wraps
  assert np.array_equal(out, want)


def test_index_arithmetic_that_bounds_keep_in_i32_is_plain_c():
  # counters, strides and offsets can't overflow (their bounds say so), so gcc may widen them into pointer steps: the
  # unsigned detour would cost a GEMM half its speed
  x = buf(0, 64 * 64).reshape((64, 64)).permute((1, 0))
  src = render_c(lower(x + 1.0, buf(1, 64 * 64)))
  assert "unsigned" not in src and "ridx0" in src


# ---- integer division: floor semantics, and NumPy's answers where C would trap -------------------------------------

EDGES = [I32_MIN, I32_MIN + 1, -7, -3, -2, -1, 0, 1, 2, 3, 7, I32_MAX - 1, I32_MAX]


def division_operands() -> tuple[np.ndarray, np.ndarray]:
  """Every pair of edge values (zero divisors and INT_MIN // -1 included), then random pairs of every sign."""
  ea, eb = np.meshgrid(np.array(EDGES, np.int64), np.array(EDGES, np.int64))
  rng = np.random.default_rng(5)
  ra, rb = rng.integers(I32_MIN, I32_MAX, 4000, endpoint=True), rng.integers(-20, 21, 4000)
  return np.concatenate([ea.ravel(), ra]).astype(np.int32), np.concatenate([eb.ravel(), rb]).astype(np.int32)


@pytest.mark.parametrize("op, np_op", [(Ops.FLOORDIV, np.floor_divide), (Ops.FLOORMOD, np.mod)], ids=["floordiv", "floormod"])
def test_integer_division_by_loaded_values_follows_numpy_without_trapping(op, np_op):
  a, b = division_operands()
  x, y = buf(0, a.size, dtypes.i32), buf(1, a.size, dtypes.i32)
  out = np.zeros(a.size, np.int32)
  run_c(lower(x.alu(op, y), buf(2, a.size, dtypes.i32)), {0: a, 1: b, 2: out})
  with np.errstate(all="ignore"): want = np_op(a, b)
  assert np.array_equal(out, want)
  by_pair = dict(zip(zip(a.tolist(), b.tolist()), out.tolist()))
  assert by_pair[(7, 0)] == 0 and by_pair[(I32_MIN, 0)] == 0                   # x // 0 == x % 0 == 0
  assert by_pair[(I32_MIN, -1)] == (I32_MIN if op is Ops.FLOORDIV else 0)      # wraps instead of SIGFPE


@pytest.mark.parametrize("divisor", [3, -3, 7, -1])
def test_integer_division_of_signed_values_by_a_constant_follows_numpy(divisor):
  a = np.array(EDGES + list(range(-20, 21)), np.int32)
  x = buf(0, a.size, dtypes.i32)
  for op, np_op in ((Ops.FLOORDIV, np.floor_divide), (Ops.FLOORMOD, np.mod)):
    out = np.zeros(a.size, np.int32)
    run_c(lower(x.alu(op, divisor), buf(1, a.size, dtypes.i32)), {0: a, 1: out})
    with np.errstate(all="ignore"): want = np_op(a, np.int32(divisor))
    assert np.array_equal(out, want), op


# ---- run_c checks every array before calling native code -----------------------------------------------------------

def double_program():
  """data1[i] = data0[i] * 2 for i < 4: slot 0 is read, slot 1 is written."""
  return lower(buf(0, 4) * 2.0, buf(1, 4))


def readonly(a: np.ndarray) -> np.ndarray:
  a.setflags(write=False)
  return a


def overlapping() -> dict[int, np.ndarray]:
  base = np.zeros(8, np.float32)
  return {0: base[:4], 1: base[2:6]}


# case -> (the arrays, how the message names the slot, what it says is wrong)
BAD_BUFFERS = {
  "missing slot": (lambda: {0: np.ones(4, np.float32)}, "slot 1", "no array"),
  "wrong dtype": (lambda: {0: np.ones(4, np.float64), 1: np.zeros(4, np.float32)}, "slot 0", "float32"),
  "too small": (lambda: {0: np.ones(3, np.float32), 1: np.zeros(4, np.float32)}, "slot 0", "4 elements"),
  "not contiguous": (lambda: {0: np.ones(8, np.float32)[::2], 1: np.zeros(4, np.float32)}, "slot 0", "contiguous"),
  "read-only output": (lambda: {0: np.ones(4, np.float32), 1: readonly(np.zeros(4, np.float32))}, "slot 1", "read-only"),
  "not an ndarray": (lambda: {0: [1.0, 2.0, 3.0, 4.0], 1: np.zeros(4, np.float32)}, "slot 0", "list"),
  "output overlaps input": (overlapping, "buffers 0 and 1", "overlap"),
}


@pytest.mark.parametrize("case", list(BAD_BUFFERS))
def test_run_c_refuses_a_bad_array_with_a_message_naming_its_slot(case):
  make, names_slot, says = BAD_BUFFERS[case]
  arrays = make()
  before = {k: np.array(v, copy=True) for k, v in arrays.items()}
  with pytest.raises(BackendError) as e: run_c(double_program(), arrays)
  msg = str(e.value)
  assert re.search(rf"{names_slot}\b", msg) and says in msg, msg
  assert all(np.array_equal(arrays[k], before[k]) for k in arrays)   # nothing ran
  # the process is intact: the same kernel still runs on good arrays
  a, out = np.arange(4, dtype=np.float32), np.zeros(4, np.float32)
  run_c(double_program(), {0: a, 1: out})
  assert np.array_equal(out, a * 2)


def test_run_c_accepts_read_only_inputs_that_share_memory_when_nothing_writes_them():
  a = readonly(np.arange(4, dtype=np.float32))
  out = np.zeros(4, np.float32)
  run_c(lower(buf(0, 4) + buf(1, 4), buf(2, 4)), {0: a, 1: a, 2: out})
  assert np.array_equal(out, a + a)


# ---- gcc failures and kernel names ----------------------------------------------------------------------------------

def test_a_gcc_failure_raises_compile_error_with_gccs_message_and_the_numbered_source(cache, tmp_path):
  with pytest.raises(CompileError) as e: CCompiler().compile("this is not C", "kernel")
  msg = str(e.value)
  # the oracle: what gcc itself says about that file, without the file's path (e.g. ":1:1: error: unknown type name 'this'")
  (tmp_path / "bad.c").write_text("this is not C")
  gcc = subprocess.run(["gcc", "-c", "-o", os.devnull, str(tmp_path / "bad.c")], capture_output=True, text=True)
  diagnostics = [l.removeprefix(str(tmp_path / "bad.c")) for l in gcc.stderr.splitlines() if l.startswith(str(tmp_path / "bad.c") + ":1:")]
  assert gcc.returncode != 0 and diagnostics
  assert all(d in msg for d in diagnostics), (diagnostics, msg)
  assert "   1 | this is not C" in msg
  assert not cache.exists() or not list(cache.iterdir())     # no entry, no temporary file left behind


HOSTILE_NAMES = ['my kernel; system("rm -rf /")', "3d", "int", "", "_Bool", "asm", "exp", "y0", "linux", "INFINITY", "NAN",
                 "floordiv_i32", "\u00e9t\u00e9", "x" * 200]
C_KEYWORDS = {"int", "void", "float", "return", "asm", "typeof", "_Bool", "main"}


@pytest.mark.parametrize("name", HOSTILE_NAMES)
def test_a_kernel_name_becomes_a_c_identifier_that_compiles_and_runs(name):
  prog = double_program()
  src = render_c(prog, name)
  ident = re.search(r"^void (.*)\(float\* restrict data0, float\* restrict data1\) \{$", src, re.M).group(1)
  assert ident == sanitize_name(name)
  assert re.fullmatch(r"[A-Za-z][A-Za-z0-9_]*", ident) and ident not in C_KEYWORDS
  assert "system(" not in src and "rm -rf" not in src
  a, out = np.arange(4, dtype=np.float32), np.zeros(4, np.float32)
  run_c(prog, {0: a, 1: out}, name)
  assert np.array_equal(out, a * 2)


def test_a_plain_kernel_name_is_kept_as_it_is():
  assert sanitize_name("rowsum") == "rowsum" and sanitize_name("gemm_256x256") == "gemm_256x256"


# ---- the proof covers every address space, on every road that compiles a program ------------------------------------
# Hand-built programs over data0 (8 f32, read) and data1 (8 f32, written), each with one access the proof must refuse,
# and each (but the last three) with a twin of the right size that runs: the refusal is the proof's, not an accident.

def local_accumulator(n: int):
  """acc[r] = data0[r] * 2 for r < 8, then data1[q] = acc[q]: `acc` is n elements of a thread's local memory."""
  r, q = range_(8, 0), range_(8, 1)
  acc = UOp(Ops.ALLOC, (), ParamArg(0, dtypes.f32, (n,)))
  fill = acc.index(r).store(buf(0, 8).index(r).load() * 2.0).end(r)
  return sink(buf(1, 8).index(q).store(acc.after(fill).index(q).load()).end(q))


def shared_memory(n: int):
  """A GPU program: 2 blocks of 4 threads, each thread puts its element into the block's shared memory (n elements),
  and after a BARRIER writes the element of the thread opposite it: each block's 4 elements reversed."""
  g, t = range_(2, 0, AxisType.GLOBAL), range_(4, 1, AxisType.LOCAL)
  shared = UOp(Ops.ALLOC, (), ParamArg(0, dtypes.f32, (n,), AddrSpace.SHARED))
  put = shared.index(t).store(buf(0, 8).index(g * 4 + t).load())
  mirrored = shared.after(UOp(Ops.BARRIER, (put,))).index(t * -1 + 3).load()
  return sink(buf(1, 8).index(g * 4 + t).store(mirrored).end(g, t))


def global_buffer(n: int):
  """data1[r] = data0[r + 8 - n] for r < 8: in bounds for n = 8."""
  r = range_(8, 0)
  return sink(buf(1, 8).index(r).store(buf(0, 8).index(r + (8 - n)).load()).end(r))


def stored_vector():
  """The issue's case: four elements stored into one element of a two-element accumulator."""
  acc = UOp(Ops.ALLOC, (), ParamArg(0, dtypes.f32, (2,)))
  four = stack(*(buf(0, 8).index(i).load() for i in range(4)))
  r = range_(8, 0)
  return sink(buf(1, 8).index(r).store(acc.after(acc.index(0).store(four)).index(0).load()).end(r))


def store_without_an_index():
  acc = UOp(Ops.ALLOC, (), ParamArg(0, dtypes.f32, (2,)))
  r = range_(8, 0)
  return sink(buf(1, 8).index(r).store(acc.after(acc.store(buf(0, 8).index(0).load())).index(0).load()).end(r))


def register_array(n: int):
  """data1[r] = STACK(data0[0], ..., data0[n-1])[r % 4]: an element of a register array of n."""
  r = range_(8, 0)
  return sink(buf(1, 8).index(r).store(stack(*(buf(0, 8).index(i).load() for i in range(n))).index(r % 4)).end(r))


def through_a_reshape():
  r = range_(8, 0)
  return sink(buf(1, 8).index(r).store(buf(0, 8).reshape((2, 4)).index(r).index(0).load()).end(r))


X8 = np.arange(8, dtype=np.float32) + 1
# name -> (the unsafe program, its safe twin or None, the twin's backend and answer, what the refusal says)
UNSAFE = {
  "local accumulator": (lambda: local_accumulator(2), lambda: local_accumulator(8), "C", X8 * 2, r"acc0 \(local\) has 2 elements .* 0\.\.7"),
  "shared memory": (lambda: shared_memory(3), lambda: shared_memory(4), "PYTHON", X8.reshape(2, 4)[:, ::-1].reshape(-1),
                    r"acc0 \(shared\) has 3 elements .* 0\.\.3"),
  "global buffer": (lambda: global_buffer(7), lambda: global_buffer(8), "C", X8, r"data0 has 8 elements .* 1\.\.8"),
  "register array": (lambda: register_array(2), lambda: register_array(4), "PYTHON", np.tile(X8[:4], 2),
                     r"a STACK of shape \(2,\) is indexed on axis 0 at 0\.\.3"),
  "4 elements stored into one": (stored_vector, None, None, None, r"acc0 \(local\): a STORE writes one element, got a value of shape \(4,\)"),
  "a store with no index": (store_without_an_index, None, None, None, r"a STORE reaches memory only through an INDEX of one element"),
  "an index through a reshape": (through_a_reshape, None, None, None, r"a RESHAPE of GLOBAL memory is indexed"),
}


@pytest.fixture
def nothing_compiled(monkeypatch):
  """Fails the test if any backend is asked to compile: the proof must refuse before that."""
  from uopc.backends.python import PythonBackend
  def refuse(*a, **kw): raise AssertionError("a backend was asked to compile an unsafe program")
  monkeypatch.setattr(C.CBackend, "compile", refuse)
  monkeypatch.setattr(PythonBackend, "compile", refuse)


def refuse_on(road: str, program, backend_name: str, monkeypatch, tmp_path) -> str:
  """Compile `program` (data0 -> data1) on one road; returns the UnsafeKernelError's message."""
  from uopc import runtime
  from uopc.backends import LinearProgram, get_backend
  from uopc.backends.cuda import CUDARenderer
  from uopc.kernelize import make_kernel
  from uopc.linearize import linearize
  from uopc.runtime import compile_kernel, compile_program, program_buffers, run_schedule, Buffer
  import uopc.cli as cli
  be = get_backend(backend_name)
  # compile_kernel and run_schedule lower a Kernel themselves: a lowering bug is what would hand them this program
  kernel = make_kernel(buf(0, 8) * 2.0, buf(1, 8))
  monkeypatch.setattr(runtime, "lower", lambda *a, **kw: program)
  with pytest.raises(UnsafeKernelError) as e:
    if road == "render_c": render_c(program, "unsafe")
    elif road == "compile_program": compile_program(program, be, "unsafe")
    elif road == "run_lowered": run_lowered(program, {0: X8.copy(), 1: np.zeros(8, np.float32)}, be, "unsafe")
    elif road == "compile_kernel": compile_kernel(kernel, be, Opts(gpu=backend_name == "PYTHON"))
    elif road == "run_schedule": run_schedule([kernel], be, {kernel.inputs[0]: Buffer.from_numpy(X8, be)})
    elif road == "a renderer's LinearProgram":
      lin = tuple(linearize(program))
      CUDARenderer().render(LinearProgram("unsafe", lin, tuple(program_buffers(lin))))
    elif road == "uopc run":
      from uopc.uir import to_uir
      (tmp_path / "unsafe.uir").write_text(to_uir(program))
      cli.main(["--debug", "run", str(tmp_path / "unsafe.uir"), "--device", backend_name])   # --debug: the error itself
    else: raise AssertionError(road)
  return str(e.value)


ROADS = ["render_c", "compile_program", "run_lowered", "compile_kernel", "run_schedule", "a renderer's LinearProgram", "uopc run"]


@pytest.mark.parametrize("road", ROADS)
@pytest.mark.parametrize("case", list(UNSAFE))
def test_an_out_of_bounds_access_in_any_address_space_is_refused_on_every_road(case, road, nothing_compiled, monkeypatch, tmp_path):
  unsafe, _, backend_name, _, says = UNSAFE[case]
  msg = refuse_on(road, unsafe(), backend_name or "C", monkeypatch, tmp_path)
  assert re.search(says, msg), msg
  assert "\n" not in msg


@pytest.mark.parametrize("case", [c for c in UNSAFE if UNSAFE[c][1] is not None])
def test_the_safe_twin_of_each_refused_program_runs(case):
  from uopc.backends import get_backend
  from uopc.testing import run_lowered
  _, safe, backend_name, want, _ = UNSAFE[case]
  out = np.zeros(8, np.float32)
  run_lowered(safe(), {0: X8.copy(), 1: out}, get_backend(backend_name))
  np.testing.assert_array_equal(out, want)


# Programs as lowering makes them, for a CPU and for a GPU (the PYTHON backend's grid), each mutated the way a lowering bug
# would be: one ALLOC of an address space made an element too small, or a register array indexed one past its end.

def rowsum(rows: int, cols: int):
  return buf(0, rows * cols).reshape((rows, cols)).reduce(Ops.ADD, 1)


def gemm(n: int, dtype=dtypes.f32):
  a = buf(0, n * n, dtype).reshape((n, 1, n)).expand((n, n, n))
  b = buf(1, n * n, dtype).reshape((n, n)).permute((1, 0)).reshape((1, n, n)).expand((n, n, n))
  if dtype is dtypes.f16: a, b = a.cast(dtypes.f32), b.cast(dtypes.f32)
  return (a * b).reduce(Ops.ADD, 1)


def shrink_an_alloc(space: AddrSpace, by: int = 1):
  def mutate(program):
    alloc = next(u for u in program.toposort() if u.op is Ops.ALLOC and u.addrspace is space)
    n = alloc.arg.shape[0]
    return program.substitute({alloc: UOp(Ops.ALLOC, (), ParamArg(alloc.arg.slot, alloc.dtype, (n - by,), alloc.arg.addrspace))})
  return mutate


def past_a_register_array(program):
  index = next(u for u in program.toposort() if u.op is Ops.INDEX and u.src[0].addrspace is AddrSpace.ALU and u.src[1].op is Ops.CONST)
  return program.substitute({index: index.src[0].index(index.src[0].shape[0])})


LOWERED = {   # name -> (shaped root, backend, Opts)
  "CPU accumulator": (lambda: rowsum(4, 8), "C", Opts()),
  "CPU vector lanes": (lambda: rowsum(4, 64), "C", Opts(reduce_vector=4)),
  "GPU shared reduction": (lambda: rowsum(4, 64), "PYTHON", Opts(gpu=True, group=16)),
  "GPU staged GEMM": (lambda: gemm(32), "PYTHON", Opts(gpu=True, local={0: 4, 1: 4}, upcast={0: 2, 1: 2}, stage=8)),
  "GPU tensor cores": (lambda: gemm(32, dtypes.f16), "PYTHON", Opts(gpu=True, tc=True)),
}
MUTATIONS = [("CPU accumulator", "local"), ("CPU vector lanes", "local"), ("GPU shared reduction", "local"), ("GPU shared reduction", "shared"),
             ("GPU staged GEMM", "local"), ("GPU staged GEMM", "shared"), ("GPU tensor cores", "local"), ("GPU tensor cores", "register")]


@pytest.mark.parametrize("case, mutation", MUTATIONS, ids=[f"{c}-{m}" for c, m in MUTATIONS])
def test_a_lowered_cpu_or_gpu_program_with_an_access_past_its_memory_is_refused_by_compile_kernel(case, mutation, monkeypatch):
  from uopc import runtime
  from uopc.backends import get_backend
  from uopc.kernelize import make_kernel
  root, backend_name, opts = LOWERED[case]
  kernel = make_kernel(root(), buf(2, prod(root().shape)))
  be = get_backend(backend_name)
  assert runtime.compile_kernel(kernel, be, opts) is not None                 # as lowered, it is proven safe
  # a staged GEMM's shared tile ends in STAGE_PAD words of padding no thread reads: one element less is still safe (and
  # proven so); one more than the padding is not
  by = STAGE_PAD + 1 if (case, mutation) == ("GPU staged GEMM", "shared") else 1
  mutate = past_a_register_array if mutation == "register" else shrink_an_alloc(AddrSpace[mutation.upper()], by)
  real_lower = runtime.lower
  monkeypatch.setattr(runtime, "lower", lambda *a, **kw: mutate(real_lower(*a, **kw)))
  monkeypatch.setattr(runtime, "_programs", runtime.ProgramCache(16))         # not the program compiled above
  says = r"a (STACK|WMMA) of shape \(\d+,\) is indexed on axis 0 at \d+\.\.\d+" if mutation == "register" else \
         rf"acc\d+ \({mutation}\) has \d+ elements"
  with pytest.raises(UnsafeKernelError, match=says): runtime.compile_kernel(kernel, be, opts)
