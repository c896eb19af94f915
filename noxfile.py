"""Sessions for the uopc monorepo: one test session per package, sanitize, lint, benchmarks and the demo.

`nox` runs the default sessions (every package's tests and lint); `nox -s demo` runs the main job.
Each test session installs its package and the in-repo packages it depends on from their paths (not
editable, so a file missing from a wheel fails here), plus the test tools, and runs that package's tests.
`build`, `compat` and `example_backend` (not part of `nox`) treat the packages as separately versioned
distributions: their wheels and metadata, uopc-tensor against the oldest dependencies its pins allow, and a
backend from another distribution.
"""
import ast, email.parser, io, os, re, shutil, subprocess, sys, tarfile, zipfile
import nox
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.utils import canonicalize_name
from packaging.version import Version
try: import tomllib
except ModuleNotFoundError: import tomli as tomllib   # python 3.10: nox itself depends on tomli there

nox.options.sessions = ["ir", "lower", "backends", "tensor", "torch", "onnx", "distributed", "cuda(arch='sm_90')", "sanitize", "lint"]
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


# pip's options for every install here: no byte-compiling of what it installs (python compiles a module when it is
# first imported, and the tests import a fraction of torch's: the torch session's install took 62-71 s with pip
# compiling every file, 26-30 s without), and no asking the index whether pip itself is the newest
PIP = ["--no-compile", "--disable-pip-version-check"]


def _install_chain(session: nox.Session, package: str, *extra: str, extras: str = "") -> None:
  """Install the package (with `extras`, such as "[gpt]") and every in-repo package below it, plus `extra`. The
  packages are built with the session's own hatchling (their build backend): pip's isolated build made a virtualenv
  and installed hatchling into it for each package, 12 s of every session's 20 s of installing."""
  session.install(*PIP, "hatchling")
  session.install(*PIP, "--no-build-isolation", *(f"./packages/{p}" + (extras if p == package else "") for p in CHAIN[package]), *extra)


# the compile cache the test sessions share: under .nox, so no run shares state with the user's ~/.cache, and one
# for all sessions, so a kernel the tensor session compiled is not compiled again by torch's (entries are keyed by the
# source, the flags, the compiler and the CPU: the sanitizer's builds are entries of their own)
CACHE = os.path.join(os.path.dirname(os.path.abspath(__file__)), ".nox", "uopc-cache")


def _pytest(session: nox.Session, *paths: str, env: dict | None = None) -> None:
  """pytest over `paths` on UOPC_TEST_WORKERS processes with the shared compile cache, every skip printed with its
  reason and failing unless conftest.py expects it."""
  env = {"UOPC_CACHE_DIR": CACHE, "UOPC_STRICT_SKIPS": "1", **(env or {})}
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


ONNX = "onnx==1.23.2"   # the node tests and their exclusion list (tests_onnx/test_node_backend.py) are this release's
ONNX_MODEL_TESTS = "packages/uopc-tensor/tests_onnx/test_models_torch.py"


@nox.session(python=PYTHON)
def onnx(session: nox.Session) -> None:
  """uopc.onnx (uopc-tensor[onnx]): the loader's tests and, of ONNX's own node tests, the first one running each op
  uopc.onnx supports (UOPC_ONNX_NODE_TESTS=one-per-op); `onnx_full` runs all of them."""
  _install_chain(session, "uopc-tensor", *TEST_TOOLS, ONNX, extras="[onnx]")
  _pytest(session, "packages/uopc-tensor/tests_onnx", f"--ignore={ONNX_MODEL_TESTS}", env={"UOPC_ONNX_NODE_TESTS": "one-per-op"})


@nox.session(python=PYTHON)
def distributed(session: nox.Session) -> None:
  """uopc.distributed (uopc-tensor[dist]: mpi4py and the mpich wheel, whose mpiexec the tests run on loopback): the
  collectives with 2 and 3 ranks against NumPy, training on 2 and 3 ranks against one process, a rank failing mid-step,
  resuming on another number of ranks. One test at a time: each job's ranks take the cores."""
  _install_chain(session, "uopc-tensor", *TEST_TOOLS, extras="[dist]")
  session.run("pytest", "packages/uopc-tensor/tests_dist", "-q", "-rs", *session.posargs, env={"UOPC_CACHE_DIR": CACHE})


@nox.session(python=PYTHON, default=False)
def onnx_full(session: nox.Session) -> None:
  """Every ONNX node test but the excluded ones (the fixed list in tests_onnx/test_node_backend.py, each with its reason),
  and models exported from PyTorch 2.13.0 with torch.onnx.export against onnxruntime (tests_onnx/test_models_torch.py).
  Prints the pass rate over all 1,884 node tests."""
  _install_chain(session, "uopc-tensor", *TEST_TOOLS, ONNX, "torch==2.13.0", "onnxruntime", extras="[onnx]")
  _pytest(session, "packages/uopc-tensor/tests_onnx", env={"UOPC_ONNX_NODE_TESTS": "all"})


@nox.session(python=PYTHON)
@nox.parametrize("arch", ["sm_80", "sm_90"])
def cuda(session: nox.Session, arch: str) -> None:
  """The GPU suite (packages/uopc-tensor/tests_gpu) for one architecture: every kernel it needs compiled for `arch` by
  nvcc (skipped, saying why, where nvcc is missing) and by NVRTC (from NVIDIA's pip wheels, installed here), the suite
  run on the PYTHON emulator against NumPy, the SASS checks (tests_gpu/test_sass.py: the f16 GEMM 8192's and the GPT
  step's kernels compiled for sm_90 and read with cuobjdump and nvdisasm, from NVIDIA's wheels installed here; their
  counts printed by testing/sass.py), and where a CUDA device is present, the suite on it and benchmarks/gpu.py (which
  otherwise prints each row's FLOPs, bytes and H200 roofline and says there is no device). `arch` is for the compile
  checks only (UOPC_CUDA_ARCH): what runs on a device is compiled for the device's own architecture."""
  _test(session, "uopc-tensor", "tests_gpu", "nvidia-cuda-nvrtc", "nvidia-cuda-runtime", "nvidia-cuda-cuobjdump", "nvidia-cuda-nvdisasm",
        env={"UOPC_CUDA_ARCH": arch})
  env = {"UOPC_CACHE_DIR": CACHE, "UOPC_CUDA_ARCH": arch}
  session.run("python", "testing/sass.py", env=env)
  session.run("python", "benchmarks/gpu.py", env=env)


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
  env = {"UOPC_CACHE_DIR": CACHE, "UOPC_SANITIZE": "1",
         # the CUDA compile checks are the backends session's: this one audits the C kernels, without NVRTC installed
         "UOPC_EXPECTED_SKIPS": "libnvrtc is not installed",
         # libstdc++ too: ASan must find the real __cxa_throw when it starts, or a C++ library that throws (matplotlib's)
         # trips ASan's own CHECK
         "LD_PRELOAD": " ".join(libs),
         # python's own allocations are not ours to audit: no leak checking
         "ASAN_OPTIONS": f"detect_leaks=0:allocator_may_return_null=1:log_path={logs}/asan",
         "UBSAN_OPTIONS": f"print_stacktrace=1:log_path={logs}/ubsan"}
  try:
    # apart: both have a test_hostile.py. Left out: the `uopc gpt train` runs (training_run), whose kernels are the GPT
    # step's, which test_gpt.py's few-steps test runs here too, and the JIT's contract and fuzzer, which test what a
    # replay binds and publishes (Python) over kernels the other files run; they would add minutes to the 15 of `nox`.
    # And the long-chain rendering test: a check of Python's memory, whose kernel multiplies 4 floats 20,000 times (gcc
    # with the sanitizers took 14-22 s of this session on it)
    _pytest(session, "packages/uopc-backends/tests", "--deselect",
            "packages/uopc-backends/tests/test_hostile.py::test_a_chain_of_tens_of_thousands_of_multiplies_renders_in_linear_memory", env=env)
    _pytest(session, "packages/uopc-tensor/tests", "-m", "not training_run", "--ignore=packages/uopc-tensor/tests/test_jit_contract.py",
            "--ignore=packages/uopc-tensor/tests/test_jit_fuzz.py", env=env)
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
  session.install(*PIP, "ruff>=0.5")
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
  """The main job: train the course GPT on 2-digit additions on the C backend (about three minutes on 2 cores), write
  gpt-run/model.safetensors and gpt-run/loss.png, then ask the trained model a few additions."""
  _install_chain(session, "uopc-tensor", extras="[gpt]")
  session.run("uopc", "gpt", "train", "--task", "addition", "--out", "gpt-run", *session.posargs)
  for prompt in DEMO_PROMPTS: session.run("uopc", "gpt", "sample", "gpt-run", "--prompt", prompt)


# ---- packages as distributions: build, compat, example_backend (none of them part of `nox`) ---------------------------

PACKAGES = list(CHAIN)          # each after the packages it depends on
EXAMPLE_BACKEND = "examples/uopc-example-backend"


def _project(pyproject_text: str) -> dict:
  """The [project] table of a pyproject.toml."""
  return tomllib.loads(pyproject_text)["project"]


def _read(path: str) -> str:
  with open(path) as f: return f.read()


def _fresh_dir(session: nox.Session, name: str) -> str:
  path = os.path.join(session.create_tmp(), name)
  shutil.rmtree(path, ignore_errors=True)
  os.makedirs(path)
  return path


def _requirements(requires: list[str]) -> set[tuple]:
  """Requirements as comparable values: (canonical name, extras, specifier, marker), whatever their spelling."""
  return {(canonicalize_name(r.name), tuple(sorted(r.extras)), str(r.specifier), str(r.marker or "")) for r in map(Requirement, requires)}


def _declared(project: dict) -> list[str]:
  """What a [project] table requires, as a wheel's Requires-Dist spells it: its dependencies, then each extra's."""
  extras = project.get("optional-dependencies", {})
  return list(project.get("dependencies", [])) + [f'{r}; extra == "{x}"' for x, rs in extras.items() for r in rs]


def _changelog_versions(text: str) -> list[tuple[str, str | None]]:
  """A CHANGELOG.md's entries, newest first: (version, the commit it names or None), from headings `## 0.2.0 (commit abc1234)`."""
  return [(m[1], m[2]) for m in re.finditer(r"^## (\S+)(?: \(commit ([0-9a-f]{7,40})\))?\s*$", text, re.M)]


def _wheel_metadata(wheel: str) -> tuple[email.message.Message, dict[str, str]]:
  """A wheel's METADATA, and the source of every module it ships, by dotted name."""
  with zipfile.ZipFile(wheel) as z:
    meta = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
    modules = {n[:-3].replace("/", ".").removesuffix(".__init__"): z.read(n).decode() for n in z.namelist() if n.endswith(".py")}
    return email.parser.Parser().parsestr(z.read(meta).decode()), modules


def _check_metadata(package: str, wheel: str, sdist: str) -> list[str]:
  """What is wrong with a package's wheel and sdist against its pyproject.toml and CHANGELOG.md, one line per fault."""
  project = _project(_read(f"packages/{package}/pyproject.toml"))
  meta, modules = _wheel_metadata(wheel)
  faults = []
  for field, want in (("Name", project["name"]), ("Version", project["version"]), ("Summary", project["description"])):
    if meta[field] != want: faults.append(f"the wheel's {field} is {meta[field]!r}, pyproject.toml says {want!r}")
  requires = meta.get_all("Requires-Dist") or []
  if _requirements(requires) != _requirements(_declared(project)):
    faults.append(f"the wheel requires {sorted(requires)}, pyproject.toml declares {_declared(project)}")
  for r in map(Requirement, project.get("dependencies", [])):
    if not any(s.operator in (">=", "==", "~=", "===") for s in r.specifier):
      faults.append(f"{r} has no lower bound: pin the oldest version it works with")
    if (dep := canonicalize_name(r.name)) in CHAIN:
      current = _project(_read(f"packages/{dep}/pyproject.toml"))["version"]
      if not r.specifier.contains(current, prereleases=True): faults.append(f"{r} refuses {dep} {current}, the repository's own")
  if "uopc" in modules: faults.append("the wheel ships uopc/__init__.py: uopc is a namespace the four packages share")
  entries = _changelog_versions(_read(f"packages/{package}/CHANGELOG.md"))
  if not entries or entries[0][0] != project["version"]:
    faults.append(f"CHANGELOG.md's first entry is {entries[0][0] if entries else 'missing'}, the version is {project['version']}")
  with tarfile.open(sdist) as t:
    info = t.extractfile(next(m for m in t.getmembers() if m.name.count("/") == 1 and m.name.endswith("/PKG-INFO")))
    sdist_meta = email.parser.Parser().parsestr(info.read().decode())
  for field in ("Name", "Version", "Summary"):
    if sdist_meta[field] != meta[field]: faults.append(f"the sdist's {field} is {sdist_meta[field]!r}, the wheel's {meta[field]!r}")
  return faults


def _imported_modules(source: str) -> set[str]:
  """Every absolute module name a module imports, at any depth (function-level imports too); `from a import b` gives a
  and a.b (b may be a module)."""
  names = set()
  for node in ast.walk(ast.parse(source)):
    if isinstance(node, ast.Import): names.update(a.name for a in node.names)
    elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
      names.add(node.module)
      names.update(f"{node.module}.{a.name}" for a in node.names)
  return names


def _check_imports_declared(package: str, wheel: str, shipped: dict[str, str]) -> list[str]:
  """A module of the wheel that imports another uopc package's module, or a third-party one, which the wheel doesn't
  declare: an install of the wheel alone would miss it (a function-level import fails only when it runs)."""
  meta, modules = _wheel_metadata(wheel)
  declared = {canonicalize_name(Requirement(r).name) for r in meta.get_all("Requires-Dist") or []}
  faults = []
  for module, source in sorted(modules.items()):
    undeclared: dict[str, set[str]] = {}     # the distribution (or top-level module) not declared -> what is imported from it
    for name in _imported_modules(source):
      top = name.partition(".")[0]
      if top in sys.stdlib_module_names or name == "uopc": continue
      if top != "uopc":
        if canonicalize_name(top) not in declared: undeclared.setdefault(top, set()).add(top)
        continue
      owner = next(((shipped[m], m) for m in (name.rsplit(".", k)[0] for k in range(name.count("."))) if m in shipped), None)
      if owner is None and name.count(".") == 1: faults.append(f"{module} imports {name}, which no uopc package ships")
      elif owner is not None and owner[0] != package and owner[0] not in declared: undeclared.setdefault(owner[0], set()).add(owner[1])
    for dist, names in sorted(undeclared.items()):
      faults.append(f"{module} imports {', '.join(sorted(names))} ({dist}), which {package} does not declare")
  return faults


# Run in a clean environment by `build`: import every module a distribution ships and load its entry points.
IMPORT_EVERY_MODULE = """
import importlib, importlib.metadata as md, sys
dist = md.distribution(sys.argv[1])
modules = sorted({str(f)[:-3].replace("/", ".").removesuffix(".__init__") for f in dist.files or []
                  if str(f).endswith(".py") and not str(f).startswith("..")})
failed, broken = [], []
for m in modules:
  try: importlib.import_module(m)
  except Exception as e: failed.append(f"import {m}: {type(e).__name__}: {e}")
for ep in dist.entry_points:
  try: ep.load()
  except Exception as e: broken.append(f"entry point {ep.group} {ep.name} = {ep.value}: {type(e).__name__}: {e}")
others = sorted(f"{d.metadata['Name']} {d.version}" for d in md.distributions() if d.metadata["Name"] not in (dist.metadata["Name"], "pip"))
print(f"{dist.metadata['Name']} {dist.version} alone (beside {', '.join(others) or 'nothing'}): imported {len(modules) - len(failed)} "
      f"of {len(modules)} modules, loaded {len(dist.entry_points) - len(broken)} of {len(dist.entry_points)} entry points")
if failed or broken: sys.exit("\\n".join(failed + broken))
"""


@nox.session(python=PYTHON, default=False)
def build(session: nox.Session) -> None:
  """Each package's sdist and wheel, built by hatchling through `python -m build` (the sdist first, the wheel from it,
  so a file the sdist lacks fails here) into the session's tmp/dist; `twine check --strict`; each wheel's metadata
  against its pyproject.toml (name, version, description, dependencies with lower bounds that admit the repository's own
  versions), its CHANGELOG.md's first entry against its version, and every uopc or third-party module it imports
  against what it declares. Then each wheel is installed alone into a clean virtual environment with only its declared
  dependencies and its extras' (the in-repo ones from the wheels just built, third-party ones from the index), `pip
  check`ed, and every module it ships imported and every entry point loaded."""
  session.install("build>=1", "twine>=5")
  dist = _fresh_dir(session, "dist")
  for package in PACKAGES: session.run("python", "-m", "build", "--outdir", dist, f"packages/{package}", silent=True)
  built = sorted(os.path.join(dist, f) for f in os.listdir(dist))
  session.run("twine", "check", "--strict", *built)
  wheels = {}
  for package in PACKAGES:
    stem = f"{package.replace('-', '_')}-{_project(_read(f'packages/{package}/pyproject.toml'))['version']}"
    wheel, sdist = os.path.join(dist, f"{stem}-py3-none-any.whl"), os.path.join(dist, f"{stem}.tar.gz")
    if not (os.path.exists(wheel) and os.path.exists(sdist)):
      session.error(f"{package}: expected {os.path.basename(wheel)} and {os.path.basename(sdist)}, built {built}")
    wheels[package] = wheel
  shipped = {m: p for p, w in wheels.items() for m in _wheel_metadata(w)[1]}
  faults = [f"{p}: {fault}" for p in PACKAGES for fault in _check_metadata(p, wheels[p], wheels[p].replace("-py3-none-any.whl", ".tar.gz"))
            + _check_imports_declared(p, wheels[p], shipped)]
  if faults: session.error("\n".join(faults))
  for package, wheel in wheels.items():
    meta = _wheel_metadata(wheel)[0]
    print(f"{meta['Name']} {meta['Version']}: {meta['Summary']}\n  requires {', '.join(meta.get_all('Requires-Dist') or ['nothing'])}")
  script = os.path.join(session.create_tmp(), "import_every_module.py")
  with open(script, "w") as f: f.write(IMPORT_EVERY_MODULE)
  for package in PACKAGES:
    env = os.path.join(session.create_tmp(), f"alone-{package}")
    shutil.rmtree(env, ignore_errors=True)
    session.run("python", "-m", "venv", env)
    python = os.path.join(env, "bin", "python")
    session.run(python, "-m", "pip", "uninstall", "-q", "-y", "setuptools", external=True)   # older pythons' venvs come with it
    needs = [p for p in PACKAGES if p == package or p in _in_repo_closure(package, wheels)]   # what its metadata names
    # the package with every extra it declares: the modules an extra serves (uopc.onnx needs onnx) import only with it
    extras = sorted(_project(_read(f"packages/{package}/pyproject.toml")).get("optional-dependencies", {}))
    wanted = [wheels[p] + (f"[{','.join(extras)}]" if p == package and extras else "") for p in needs]
    session.run(python, "-m", "pip", "install", "-q", *wanted, external=True)
    session.run(python, "-m", "pip", "check", external=True)
    session.run(python, "-I", script, package, external=True)   # -I: nothing from the checkout or the environment


def _in_repo_closure(package: str, wheels: dict[str, str]) -> set[str]:
  """The in-repo packages a wheel requires, directly or through another one's wheel."""
  todo, seen = [package], set()
  while todo:
    for r in _wheel_metadata(wheels[todo.pop()])[0].get_all("Requires-Dist") or []:
      req = Requirement(r)
      if (name := canonicalize_name(req.name)) in CHAIN and name not in seen and not req.marker: seen.add(name); todo.append(name)
  return seen


def _git(*args: str) -> str:
  return subprocess.run(["git", *args], capture_output=True, text=True, check=True).stdout


def _versions(package: str) -> dict[Version, str | None]:
  """Each version the package has had, with the commit that made it (the oldest whose pyproject.toml says it); the
  working tree's version, when no commit has it yet, maps to None."""
  path = f"packages/{package}/pyproject.toml"
  made: dict[Version, str | None] = {}
  for commit in _git("log", "--reverse", "--format=%H", "--", path).split():
    made.setdefault(Version(_project(_git("show", f"{commit}:{path}"))["version"]), commit)
  made.setdefault(Version(_project(_read(path))["version"]), None)
  return made


def _pins(project: dict) -> dict[str, SpecifierSet]:
  return {canonicalize_name(r.name): r.specifier for r in map(Requirement, project.get("dependencies", [])) if canonicalize_name(r.name) in CHAIN}


def _oldest_allowed(session: nox.Session, package: str) -> dict[str, tuple[Version, str | None]]:
  """For each in-repo package `package` needs, directly or through another, the oldest version that its pins and those
  of the other chosen versions (as they were at their commits) all allow, with the commit that made it."""
  pins = _pins(_project(_read(f"packages/{package}/pyproject.toml")))
  chosen: dict[str, tuple[Version, str | None]] = {}
  while True:
    for name, spec in pins.items():
      allowed = sorted(v for v in _versions(name) if spec.contains(v, prereleases=True))
      if not allowed: session.error(f"no version of {name} in the history satisfies {spec} (it has {sorted(map(str, _versions(name)))})")
      chosen[name] = (allowed[0], _versions(name)[allowed[0]])
    wider = dict(pins)
    for name, (version, commit) in chosen.items():
      path = f"packages/{name}/pyproject.toml"
      for dep, spec in _pins(_project(_git("show", f"{commit}:{path}") if commit else _read(path))).items():
        wider[dep] = wider[dep] & spec if dep in wider else spec
    if wider == pins: return chosen
    pins = wider


def _export(commit: str, path: str, dest: str) -> None:
  """`path` as it was at `commit`, written under `dest` (git archive, so nothing in the checkout changes)."""
  archive = subprocess.run(["git", "archive", "--format=tar", commit, path], capture_output=True, check=True).stdout
  with tarfile.open(fileobj=io.BytesIO(archive)) as t: t.extractall(dest, **({"filter": "data"} if hasattr(tarfile, "data_filter") else {}))


@nox.session(python=PYTHON, default=False)
def compat(session: nox.Session) -> None:
  """uopc-tensor's tests against the oldest uopc-ir, uopc-lower and uopc-backends its pins allow. Each such version is
  built from the commit that made it (the first whose pyproject.toml has it; its CHANGELOG.md entry must name the same
  commit, when it names one), exported with git archive; the current uopc-tensor is installed over them without its
  dependencies, `pip check` proves its pins accept them, and its tests run. Needs the git history (not a shallow clone)."""
  if _git("rev-parse", "--is-shallow-repository").strip() == "true":
    session.error("compat builds old versions from the git history, and this clone is shallow: git fetch --unshallow")
  oldest = _oldest_allowed(session, "uopc-tensor")
  work = _fresh_dir(session, "compat")
  sources = []
  for name, (version, commit) in oldest.items():
    recorded = dict(_changelog_versions(_read(f"packages/{name}/CHANGELOG.md")))
    if str(version) not in recorded: session.error(f"{name} {version}: its CHANGELOG.md has no entry for it")
    if recorded[str(version)] and not (commit or "").startswith(recorded[str(version)]):
      session.error(f"{name} {version}: CHANGELOG.md says it was made at commit {recorded[str(version)]}, but its pyproject.toml "
                    f"got that version at {commit or 'no commit yet (the working tree)'}")
    if commit is None:
      sources.append(f"./packages/{name}")
      session.log(f"{name} {version}: not committed yet, built from the working tree")
    else:
      _export(commit, f"packages/{name}", os.path.join(work, commit[:12]))
      sources.append(os.path.join(work, commit[:12], "packages", name))
      session.log(f"{name} {version}: built from commit {commit[:12]}, where that version was made")
  session.install(*sources)      # each one's pins on the others are resolved among these, third-party ones from the index
  tensor = _project(_read("packages/uopc-tensor/pyproject.toml"))
  session.install("--no-deps", "./packages/uopc-tensor")
  session.install(*TEST_TOOLS, "safetensors", *tensor.get("optional-dependencies", {}).get("gpt", []))
  session.run("python", "-m", "pip", "check")
  names = ["uopc-tensor", *oldest]
  got = session.run("python", "-I", "-c", f"import importlib.metadata as m; print(*(m.version(n) for n in {names!r}))", silent=True).split()
  want = [tensor["version"], *(str(v) for v, _ in oldest.values())]
  if got != want: session.error(f"installed {dict(zip(names, got))}, meant {dict(zip(names, want))}")
  session.log("testing " + ", ".join(f"{n} {v}" for n, v in zip(names, got)))
  _pytest(session, "packages/uopc-tensor/tests")


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
