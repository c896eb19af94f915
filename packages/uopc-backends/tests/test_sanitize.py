"""UOPC_SANITIZE (what `nox -s sanitize` runs every test under) really catches what it is for: in a child process with
the ASan runtime preloaded, a kernel that reads one element past its buffer, and one with undefined behaviour, each end
the process with the sanitizer's report, while correct kernels run. Without the runtime preloaded, the setting is a
CompileError that says how to run it, not an abort inside dlopen."""
import os, shutil, subprocess, sys
from pathlib import Path
import pytest
import uopc.backends.c as C
from uopc.backends import CompileError
from uopc.backends.c import CCompiler
from test_cache import child_env

CHILD = r'''
import sys, numpy as np
from uopc.backends.c import CCompiler, CBackend
from uopc.dtype import dtypes
what = sys.argv[1]
backend = CBackend()
if what == "overread":      # a loop one element too long: reads data0[n]
  n = int(sys.argv[2])
  src = f"void k(float* restrict data0, float* restrict data1) {{ for (int i = 0; i <= {n}; i++) data1[0] += data0[i]; }}\n"
  prog = CCompiler().compile(src, "k")
  backend.launch(prog, [backend.alloc(n, dtypes.f32), backend.alloc(1, dtypes.f32)])
elif what == "undefined":   # a shift past the width of int
  prog = CCompiler().compile("void k(int* restrict data0) { data0[0] = 1 << (data0[0] + 31); }\n", "k")
  x = backend.alloc(1, dtypes.i32); x[0] = 9
  backend.launch(prog, [x])
else:                       # correct kernels through the whole road: a GEMM, x - rowmax(x), a padded gather of windows
  from uopc.uop import UOp, Ops, buf
  from uopc.testing import run_shaped
  from uopc.composite import pad_axis
  a, b = np.arange(48, dtype=np.float32).reshape(6, 8) / 10, np.ones((8, 5), np.float32)
  gemm = (buf(0, 48).reshape((6, 1, 8)).expand((6, 5, 8)) * buf(1, 40).reshape((8, 5)).permute((1, 0)).reshape((1, 5, 8)).expand((6, 5, 8)))
  gemm = gemm.reduce(Ops.ADD, 1)
  assert np.allclose(run_shaped(gemm, [a, b]), a @ b)
  m = buf(0, 48).reshape((6, 8))
  assert np.array_equal(run_shaped(m - m.reduce(Ops.MAX, 1).reshape((6, 1)).expand((6, 8)), [a]), a - a.max(1, keepdims=True))
  x = pad_axis(buf(0, 10), 0, 1, 1)                                                      # a 1-D convolution over a padded input
  conv = (UOp(Ops.STACK, tuple(x.shrink(((s, s + 10),)) for s in range(3))).permute((1, 0)) * buf(1, 3).reshape((1, 3)).expand((10, 3)))
  v, k = np.arange(10, dtype=np.float32), np.array([1, 2, 3], np.float32)
  assert np.allclose(run_shaped(conv.reduce(Ops.ADD, 1), [v, k]), np.correlate(np.pad(v, 1), k, "valid"))
print("no report")
'''


def asan_runtime() -> str | None:
  if shutil.which("gcc") is None: return None
  path = subprocess.run(["gcc", "-print-file-name=libasan.so"], capture_output=True, text=True).stdout.strip()
  return path if os.path.isabs(path) and os.path.exists(path) else None


def run_sanitized(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
  asan = asan_runtime()
  if asan is None: pytest.skip("gcc has no AddressSanitizer runtime (libasan) here: nothing to check the sanitize session with")
  stdcpp = subprocess.run(["gcc", "-print-file-name=libstdc++.so"], capture_output=True, text=True).stdout.strip()
  env = child_env(UOPC_SANITIZE="1", UOPC_CACHE_DIR=str(tmp_path / "cache"), LD_PRELOAD=f"{asan} {stdcpp}",
                  ASAN_OPTIONS="detect_leaks=0", UBSAN_OPTIONS="print_stacktrace=1")
  return subprocess.run([sys.executable, "-c", CHILD, *args], env=env, capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize("n", [3, 16, 1000])
def test_a_read_one_past_the_end_of_a_buffer_is_reported_and_ends_the_process(tmp_path, n):
  r = run_sanitized(tmp_path, "overread", str(n))
  assert r.returncode != 0 and "no report" not in r.stdout
  assert "ERROR: AddressSanitizer" in r.stderr, r.stderr[-2000:]


def test_undefined_behaviour_is_reported_and_ends_the_process(tmp_path):
  r = run_sanitized(tmp_path, "undefined")
  assert r.returncode != 0 and "no report" not in r.stdout
  assert "runtime error: shift exponent 40 is too large" in r.stderr, r.stderr[-2000:]


def test_correct_kernels_run_clean_under_the_sanitizers(tmp_path):
  r = run_sanitized(tmp_path, "clean")
  assert r.returncode == 0 and r.stdout.strip() == "no report", r.stderr[-3000:]
  assert "Sanitizer" not in r.stderr and "runtime error" not in r.stderr


def test_sanitize_without_the_runtime_preloaded_says_how_to_run_it(monkeypatch, tmp_path):
  if os.environ.get("UOPC_SANITIZE"): pytest.skip("this process runs with the sanitizer runtime preloaded")
  monkeypatch.setenv("UOPC_SANITIZE", "1")
  monkeypatch.setenv("UOPC_CACHE_DIR", str(tmp_path))
  with pytest.raises(CompileError, match=r"LD_PRELOAD=\$\(gcc -print-file-name=libasan.so\)"):
    CCompiler().compile("void k(void) {}\n", "k")
  assert C.SANITIZE_FLAGS[0] == "-fsanitize=address,undefined"
