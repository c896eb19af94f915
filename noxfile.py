"""Sessions for the uopc monorepo: one test session per package, sanitize, lint, benchmarks and the demo.

`nox` runs the default sessions (every package's tests and lint); `nox -s demo` runs the main job.
Each test session installs its package and the in-repo packages it depends on from their paths (not
editable, so a file missing from a wheel fails here), plus the test tools, and runs that package's tests.
"""
import os, shutil
import nox

nox.options.sessions = ["ir", "lower", "backends", "tensor", "torch", "cuda(arch='sm_90')", "sanitize", "lint"]
nox.options.reuse_existing_virtualenvs = False

PYTHON = os.environ.get("UOPC_NOX_PYTHON")   # None: the python that runs nox
TEST_TOOLS = ["pytest>=8", "hypothesis>=6.100", "pytest-xdist>=3", "numpy>=1.24"]   # numpy: the oracle in every package's tests
# ir <- lower <- backends <- tensor: a package's chain is itself and everything below it
CHAIN = {
  "uopc-ir": ["uopc-ir"],
  "uopc-lower": ["uopc-ir", "uopc-lower"],
  "uopc-backends": ["uopc-ir", "uopc-lower", "uopc-backends"],
  "uopc-tensor": ["uopc-ir", "uopc-lower", "uopc-backends", "uopc-tensor"],
}


def _install_chain(session: nox.Session, package: str, *extra: str, extras: str = "") -> None:
  """Install the package (with `extras`, such as "[gpt]") and every in-repo package below it, plus `extra`."""
  session.install(*(f"./packages/{p}" + (extras if p == package else "") for p in CHAIN[package]), *extra)


def _pytest(session: nox.Session, *paths: str, env: dict | None = None) -> None:
  """pytest over `paths` on UOPC_TEST_WORKERS processes, the compile cache in the session's own directory (runs don't
  share state with the user's ~/.cache), every skip printed with its reason and failing unless conftest.py expects it."""
  env = {"UOPC_CACHE_DIR": os.path.join(session.virtualenv.location, "uopc-cache"), "UOPC_STRICT_SKIPS": "1", **(env or {})}
  session.run("pytest", *paths, "-q", "-rs", "-n", os.environ.get("UOPC_TEST_WORKERS", "2"), *session.posargs, env=env)


def _test(session: nox.Session, package: str, tests: str = "tests", *extra: str, extras: str = "", env: dict | None = None) -> None:
  _install_chain(session, package, *TEST_TOOLS, *extra, extras=extras)
  _pytest(session, f"packages/{package}/{tests}", env=env)


@nox.session(python=PYTHON)
def ir(session: nox.Session) -> None:
  """uopc-ir's tests: nothing but the IR package and the test tools is installed."""
  _test(session, "uopc-ir")


@nox.session(python=PYTHON)
def lower(session: nox.Session) -> None:
  """uopc-lower's tests."""
  _test(session, "uopc-lower")


@nox.session(python=PYTHON)
def backends(session: nox.Session) -> None:
  """uopc-backends' tests, with NVIDIA's NVRTC wheel so that the CUDA backend's NVRTC road is compiled too."""
  _test(session, "uopc-backends", "tests", "nvidia-cuda-nvrtc", "nvidia-cuda-runtime")


@nox.session(python=PYTHON)
def tensor(session: nox.Session) -> None:
  """uopc-tensor's tests, with the `uopc gpt` command's extra (tqdm, matplotlib) and the safetensors library (which
  must read the GPT's checkpoints)."""
  _test(session, "uopc-tensor", "tests", "safetensors", extras="[gpt]")


@nox.session(python=PYTHON)
def torch(session: nox.Session) -> None:
  """uopc-tensor's forward and backward against PyTorch 2.13.0 (the only session that installs torch), and the
  safetensors files against the safetensors library."""
  _test(session, "uopc-tensor", "tests_torch", "torch==2.13.0", "safetensors")


@nox.session(python=PYTHON)
@nox.parametrize("arch", ["sm_80", "sm_90"])
def cuda(session: nox.Session, arch: str) -> None:
  """The GPU suite (packages/uopc-tensor/tests_gpu) for one architecture: every kernel it needs compiled for `arch` by
  nvcc (skipped, saying why, where nvcc is missing) and by NVRTC (from NVIDIA's pip wheels, installed here), the suite
  run on the PYTHON emulator against NumPy, and where a CUDA device is present, the suite on it and benchmarks/gpu.py
  (which otherwise says there is no device)."""
  _test(session, "uopc-tensor", "tests_gpu", "nvidia-cuda-nvrtc", "nvidia-cuda-runtime", env={"UOPC_CUDA_ARCH": arch})
  session.run("python", "benchmarks/gpu.py")


@nox.session(python=PYTHON)
def sanitize(session: nox.Session) -> None:
  """uopc-backends' and uopc-tensor's tests with every generated kernel built with AddressSanitizer and
  UndefinedBehaviorSanitizer (UOPC_SANITIZE=1) and run in a python that has the ASan runtime preloaded. The first report
  ends its process, and the session fails on any report (each is written to a log file and printed)."""
  _install_chain(session, "uopc-tensor", *TEST_TOOLS, "safetensors", extras="[gpt]")
  libs = [session.run("gcc", f"-print-file-name={lib}", silent=True, external=True).strip() for lib in ("libasan.so", "libstdc++.so")]
  if not os.path.isabs(libs[0]): session.error("gcc has no AddressSanitizer runtime (libasan.so): install it (libasan8 or gcc's) for this session")
  logs = os.path.join(session.virtualenv.location, "sanitizer-logs")
  shutil.rmtree(logs, ignore_errors=True)
  os.makedirs(logs)
  env = {"UOPC_CACHE_DIR": os.path.join(session.virtualenv.location, "uopc-cache"), "UOPC_SANITIZE": "1",
         # the CUDA compile checks are the backends session's: this one audits the C kernels, without NVRTC installed
         "UOPC_EXPECTED_SKIPS": "libnvrtc is not installed",
         # libstdc++ too: ASan must find the real __cxa_throw when it starts, or a C++ library that throws (matplotlib's)
         # trips ASan's own CHECK
         "LD_PRELOAD": " ".join(libs),
         # python's own allocations are not ours to audit: no leak checking
         "ASAN_OPTIONS": f"detect_leaks=0:allocator_may_return_null=1:log_path={logs}/asan",
         "UBSAN_OPTIONS": f"print_stacktrace=1:log_path={logs}/ubsan"}
  try:
    for tests in ("packages/uopc-backends/tests", "packages/uopc-tensor/tests"):   # apart: both have a test_hostile.py
      _pytest(session, tests, env=env)
  finally:
    reports = 0
    for name in sorted(os.listdir(logs)):
      with open(os.path.join(logs, name)) as f: text = f.read()
      print(f"---- {name}\n{text}")
      # a report is an error; a refused huge allocation (allocator_may_return_null: a MemoryError in python, which the
      # hostile-input tests ask for) only leaves a WARNING line
      reports += "ERROR: AddressSanitizer" in text or "runtime error:" in text or "ERROR: UndefinedBehaviorSanitizer" in text
  if reports: session.error(f"{reports} sanitizer report(s), printed above")


FUZZERS = ["packages/uopc-ir/tests/test_symbolic_fuzz.py", "packages/uopc-backends/tests/test_eval_vs_c.py",
           "packages/uopc-backends/tests/test_opt_fuzz.py", "packages/uopc-tensor/tests/test_fuzz_numpy.py",
           "packages/uopc-tensor/tests/test_jit_fuzz.py"]


@nox.session(python=PYTHON, default=False)
def fuzz(session: nox.Session) -> None:
  """Every differential fuzzer at random (not the fixed draws CI replays), UOPC_FUZZ_ITERS examples each (default 300):
  for a nightly job. A failure prints its reproducer; make it a regression test."""
  _install_chain(session, "uopc-tensor", *TEST_TOOLS)
  _pytest(session, *FUZZERS, env={"UOPC_FUZZ_ITERS": os.environ.get("UOPC_FUZZ_ITERS", "300")})


@nox.session(python=PYTHON)
def lint(session: nox.Session) -> None:
  """ruff over the whole repository."""
  session.install("ruff>=0.5")
  session.run("ruff", "check", ".")


@nox.session(python=PYTHON)
def benchmarks(session: nox.Session) -> None:
  """Speed against references measured in the same run (printed as ratios). Not part of `nox`."""
  _install_chain(session, "uopc-tensor")
  # the reference columns: PyTorch (the CPU build on this disk) and tinygrad; one that can't be installed is skipped
  session.run("python", "-m", "pip", "install", "-q", "torch==2.13.0", success_codes=[0, 1])
  session.run("python", "-m", "pip", "install", "-q", "tinygrad==0.14.0", success_codes=[0, 1])
  session.run("python", "benchmarks/ir.py", *session.posargs)
  session.run("python", "benchmarks/gemm.py")
  session.run("python", "benchmarks/tensor.py")
  session.run("python", "benchmarks/cpu.py")
  session.run("python", "benchmarks/gpt.py")
  session.run("python", "benchmarks/gpu.py")


DEMO_PROMPTS = ["12+34=", "99+1=", "57+68=", "7+5="]


@nox.session(python=PYTHON)
def demo(session: nox.Session) -> None:
  """The main job: train the course GPT on 2-digit additions on the C backend (about a minute on 2 cores), write
  gpt-run/model.safetensors and gpt-run/loss.png, then ask the trained model a few additions."""
  _install_chain(session, "uopc-tensor", extras="[gpt]")
  session.run("uopc", "gpt", "train", "--task", "addition", "--out", "gpt-run", *session.posargs)
  for prompt in DEMO_PROMPTS: session.run("uopc", "gpt", "sample", "gpt-run", "--prompt", prompt)


# ---- a backend from another distribution (not part of `nox`) ----------------------------------------------------------

EXAMPLE_BACKEND = "examples/uopc-example-backend"


@nox.session(python=PYTHON, default=False)
def example_backend(session: nox.Session) -> None:
  """The example third-party backend, examples/uopc-example-backend: installed by pip beside uopc-tensor (from their
  paths), found through its `uopc.backends` entry point, chosen with UOPC_DEVICE=INTERP; its tests run Tensor code on
  it (elementwise math, reductions, a matmul, a training step under uopc.jit) against NumPy, with its own pytest
  settings, as an outside project's would."""
  _install_chain(session, "uopc-tensor", f"./{EXAMPLE_BACKEND}", "pytest>=8")
  env = {"UOPC_DEVICE": "INTERP", "UOPC_CACHE_DIR": os.path.join(session.virtualenv.location, "uopc-cache")}
  session.chdir(EXAMPLE_BACKEND)
  session.run("python", "-m", "pytest", "-q", "-rs", *session.posargs, env=env)
