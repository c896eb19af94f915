"""The C backend's safety net (DESIGN 5.2, 5.3, 8): out-of-range memory indices are refused before gcc runs, integer
division never traps, run_c checks every array before native code sees it, gcc's errors come back readable, and
kernel names can't inject C."""
import os, re, subprocess
from pathlib import Path
import numpy as np
import pytest
import uopc.backends.c as C
from uopc.dtype import dtypes
from uopc.uop import Ops, buf, range_, sink
from uopc.rangeify import lower
from uopc.backends import BackendError, UnsafeKernelError
from uopc.backends.c import CCompiler, CompileError, render_c, run_c, sanitize_name

I32_MIN, I32_MAX = -2**31, 2**31 - 1


@pytest.fixture(autouse=True)
def cache(tmp_path, monkeypatch) -> Path:
  monkeypatch.setenv("UOPC_CACHE_DIR", str(tmp_path / "cache"))
  return tmp_path / "cache"


@pytest.fixture
def no_gcc(cache, monkeypatch):
  """Fails the test if anything is compiled: gcc is never started and the compile cache stays empty."""
  def refuse(*a, **kw): raise AssertionError(f"compiled although the kernel is unsafe: {a} {kw}")
  monkeypatch.setattr(C.subprocess, "run", refuse)
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
