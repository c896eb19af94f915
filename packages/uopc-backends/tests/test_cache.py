"""Generated C is a pure function of the program (the compile cache's key depends on it), and the compile cache on
disk is shared, atomic and self-healing: one entry per kernel, found again without gcc by a fresh
compiler, rebuilt when damaged, and written once, whole, when several processes race for it."""
import os, subprocess, sys, time, uuid
from pathlib import Path
import numpy as np
import pytest
import uopc.backends.c as C
import uopc.backends.ccompiler as CC
import uopc.rangeify, uopc.uop
from uopc.uop import UOp, Ops, buf
from uopc.rangeify import lower, Ctx, Opts
import uopc.compile_cache as compile_cache
from uopc.backends.c import CBackend, CCompiler
from uopc.testing import render_c, run_c


def child_env(**extra: str) -> dict[str, str]:
  """The environment of a child python that imports the same uopc packages as this process."""
  roots = {str(Path(m.__file__).resolve().parents[1]) for m in (uopc.uop, uopc.rangeify)} | {str(Path(C.__file__).resolve().parents[2])}
  inherited = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
  return {**os.environ, "PYTHONPATH": os.pathsep.join(sorted(roots) + inherited), **extra}


# ---- the generated C is deterministic -------------------------------------------------------------------------------

RENDER = r'''
import sys
from uopc.uop import Ops, buf
from uopc.rangeify import lower, Ctx, Opts
from uopc.testing import render_c
N = 16
def gemm():   # C[i, j] = sum_k A[i, k] * B[k, j]
  a = buf(0, N * N).reshape((N, 1, N)).expand((N, N, N))
  b = buf(1, N * N).reshape((N, N)).permute((1, 0)).reshape((1, N, N)).expand((N, N, N))
  return (a * b).reduce(Ops.ADD, 1), buf(2, N * N)
def sub_max():
  x = buf(0, 12).reshape((3, 4))
  return x - x.reduce(Ops.MAX, 1).reshape((3, 1)).expand((3, 4)), buf(1, 12)
PROGRAMS = {"gemm": (gemm, Opts()), "sub_max": (sub_max, Opts()),
            "gemm_upcast_unroll_thread": (gemm, Opts(upcast={1: 4}, unroll=4, thread=0)),
            "gemm_tiled": (gemm, Opts(upcast={1: 2}, tile={0: 4, 1: 8}, thread=0))}
# building the programs in another order must not change a single character (counters, variable names, loop order)
order = list(PROGRAMS) if sys.argv[1] == "forward" else list(reversed(PROGRAMS))
out = {}
for name in order:
  make, opts = PROGRAMS[name]
  root, dest = make()
  out[name] = render_c(lower(root, dest, Ctx(opts=opts)), name)
for name in PROGRAMS: sys.stdout.write(f"==== {name}\n{out[name]}")
'''


def test_generated_c_is_identical_across_processes_hash_seeds_and_build_orders():
  runs = [("forward", "0"), ("reverse", "4242"), ("forward", "random")]
  procs = [subprocess.Popen([sys.executable, "-c", RENDER, order], env=child_env(PYTHONHASHSEED=seed), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True) for order, seed in runs]
  outputs = []
  for p in procs:
    out, err = p.communicate(timeout=120)
    assert p.returncode == 0, err
    outputs.append(out)
  assert outputs[0].count("==== ") == 4 and outputs[0].count("void ") == 4 and "#pragma omp parallel for" in outputs[0]
  assert outputs[1] == outputs[0] and outputs[2] == outputs[0]


# ---- the compile cache ----------------------------------------------------------------------------------------------

def count_gcc_builds(monkeypatch) -> list[list[str]]:
  """The gcc command lines that build a shared object from now on (the compiler's version queries don't count)."""
  builds, real_run = [], subprocess.run
  def spy(cmd, *a, **kw):
    if "-shared" in cmd: builds.append(cmd)
    return real_run(cmd, *a, **kw)
  monkeypatch.setattr(CC.subprocess, "run", spy)
  return builds


def scale_program(scale: float):
  """data1[i] = data0[i] * scale + 1 for 16 elements; a fresh scale makes a kernel no cache has seen."""
  return lower(buf(0, 16) * scale + 1.0, buf(1, 16))


def check_scale(run, scale: float) -> None:
  a, out = np.arange(-8, 8, dtype=np.float32), np.zeros(16, np.float32)
  run({0: a, 1: out})
  assert np.array_equal(out, a * np.float32(scale) + np.float32(1.0))


def fresh_scale() -> float:
  return 1.0 + uuid.uuid4().int % 10**6 / 2**20


def test_a_compile_writes_one_entry_that_a_fresh_compiler_loads_without_gcc(tmp_path, monkeypatch):
  monkeypatch.setenv("UOPC_CACHE_DIR", str(tmp_path))
  builds = count_gcc_builds(monkeypatch)
  scale = fresh_scale()
  src = render_c(scale_program(scale), "scale")
  first = CCompiler()
  prog = first.compile(src, "scale")
  assert len(builds) == 1 and first.compile(src, "scale") is prog          # the in-memory cache answers the second time
  [entry] = list(tmp_path.iterdir())
  assert entry.suffix == ".so"
  before = entry.stat()
  again = CCompiler().compile(src, "scale")                                   # nothing in memory: found on disk
  assert len(builds) == 1
  after = entry.stat()
  assert (after.st_ino, after.st_mtime_ns) == (before.st_ino, before.st_mtime_ns)
  check_scale(lambda arrays: CBackend().launch(again, [arrays[0], arrays[1]]), scale)


def test_the_compiler_flags_are_part_of_the_cache_key(tmp_path, monkeypatch):
  monkeypatch.setenv("UOPC_CACHE_DIR", str(tmp_path))
  builds = count_gcc_builds(monkeypatch)
  src = render_c(scale_program(fresh_scale()), "scale")
  CCompiler().compile(src, "scale")
  monkeypatch.setattr(CC, "CFLAGS", CC.CFLAGS + ["-fno-unroll-loops"])
  CCompiler().compile(src, "scale")                            # the same source, other flags: a build of its own
  assert len(builds) == 2 and "-fno-unroll-loops" in builds[1] and "-fno-unroll-loops" not in builds[0]
  assert len(list(tmp_path.glob("*.so"))) == 2


def test_openmp_is_used_exactly_when_the_kernel_has_a_thread_axis(tmp_path, monkeypatch):
  monkeypatch.setenv("UOPC_CACHE_DIR", str(tmp_path))
  builds = count_gcc_builds(monkeypatch)
  g = buf(0, 64).reshape((8, 8)) * 2.0
  for opts in (Opts(), Opts(thread=0)):
    out = np.zeros(64, np.float32)
    run_c(lower(g, buf(1, 64), Ctx(opts=opts)), {0: np.arange(64, dtype=np.float32), 1: out})
    np.testing.assert_array_equal(out, np.arange(64) * 2)
  assert len(builds) == 2 and "-fopenmp" not in builds[0] and "-fopenmp" in builds[1]


def exp_program(scale: float):
  """data1[i] = 2 ** (data0[i] * scale) in vectors: a kernel that needs the renderer's static helpers (the vector exp2)."""
  return lower(UOp(Ops.EXP2, (buf(0, 64) * scale,)), buf(1, 64), Ctx(opts=Opts(upcast={0: 16})))


def test_kernels_compiled_together_are_one_gcc_run_and_each_an_entry_a_fresh_compiler_loads(tmp_path, monkeypatch):
  monkeypatch.setenv("UOPC_CACHE_DIR", str(tmp_path))
  builds = count_gcc_builds(monkeypatch)
  scales = [fresh_scale() for _ in range(3)]
  # two kernels of one name (their functions and their static helpers would collide in one file), one with OpenMP
  items = [(render_c(scale_program(scales[0]), "k"), "k"), (render_c(scale_program(scales[1]), "k"), "k"),
           (render_c(exp_program(scales[2]), "e"), "e"), (render_c(exp_program(scales[0]), "e2"), "e2"),
           (render_c(lower(buf(0, 64).reshape((8, 8)) * 2.0, buf(1, 64), Ctx(opts=Opts(thread=0))), "t"), "t")]
  items.append(items[0])                                                 # a repeat is one kernel
  progs = CCompiler().compile_many(items)
  assert len(builds) == 1 and "-fopenmp" in builds[0]    # one run, OpenMP's flags for all (nothing changes without a pragma)
  assert progs[5] is progs[0] and len({id(p) for p in progs}) == 5
  assert len({id(p.lib) for p in progs}) == 1                            # the run's object, loaded once for all five
  backend = CBackend()
  def check_all(progs):
    for prog, scale in zip(progs[:2], scales): check_scale(lambda arrays: backend.launch(prog, [arrays[0], arrays[1]]), scale)
    for prog, scale in zip(progs[2:4], (scales[2], scales[0])):
      x, out = np.linspace(-3, 3, 64, dtype=np.float32), np.zeros(64, np.float32)
      backend.launch(prog, [x, out])
      np.testing.assert_allclose(out, np.exp2(x * np.float32(scale)), rtol=2e-6)
    x, out = np.arange(64, dtype=np.float32), np.zeros(64, np.float32)
    backend.launch(progs[4], [x, out])
    np.testing.assert_array_equal(out, x * 2)
  check_all(progs)
  entries = sorted(tmp_path.glob("*.so"))
  assert len(entries) == 5 and len({e.stat().st_ino for e in entries}) == 1   # all five are links to one file
  # a new process: each kernel is found under its own entry, by compile() and compile_many() alike, without gcc
  again = CCompiler()
  check_all([again.compile(src, name) for src, name in items[:5]])
  check_all(CCompiler().compile_many(items[:5]))
  assert len(builds) == 1


def test_a_batch_whose_object_cant_be_loaded_once_loads_each_member_from_its_own_entry(tmp_path, monkeypatch):
  """A batch's shared object is read back and loaded once for all its members; where that fails (here: refused), each
  member is loaded from its own entry, as a later process would, and computes what it should."""
  monkeypatch.setenv("UOPC_CACHE_DIR", str(tmp_path))
  monkeypatch.setattr(CC.CCompiler, "_open", staticmethod(lambda path, key: None))
  scales = [fresh_scale() for _ in range(3)]
  progs = CCompiler().compile_many([(render_c(scale_program(s), "k"), "k") for s in scales])
  assert len({p.path for p in progs}) == 3
  for prog, scale in zip(progs, scales): check_scale(lambda arrays: CBackend().launch(prog, [arrays[0], arrays[1]]), scale)


def test_threads_switch_often_while_a_compile_runs_and_the_interval_comes_back_after(tmp_path, monkeypatch):
  """A compile's Python part (storing, linking, loading a finished run's entries) runs beside the planner's thread:
  while any compile runs, Python switches threads every SWITCH_WHILE_COMPILING s; when the last one ends, the
  interpreter's own interval is back, however the compiles overlapped (two threads here, each compiling twice)."""
  import sys, threading
  monkeypatch.setenv("UOPC_CACHE_DIR", str(tmp_path))
  seen, real_run = [], subprocess.run
  def spy(cmd, *a, **kw):
    if "-shared" in cmd: seen.append(sys.getswitchinterval())
    return real_run(cmd, *a, **kw)
  monkeypatch.setattr(CC.subprocess, "run", spy)
  before = sys.getswitchinterval()
  compiler = CCompiler()
  def work():
    for _ in range(2):
      items = [(render_c(scale_program(fresh_scale()), "k"), "k"), (render_c(scale_program(fresh_scale()), "k"), "k")]
      for prog, (src, _) in zip(compiler.compile_many(items), items): assert prog.src == src
      compiler.compile(render_c(scale_program(fresh_scale()), "one"), "one")
  threads = [threading.Thread(target=work) for _ in range(2)]
  for t in threads: t.start()
  for t in threads: t.join()
  assert len(seen) == 8 and all(x == CC.SWITCH_WHILE_COMPILING for x in seen)
  assert sys.getswitchinterval() == before != CC.SWITCH_WHILE_COMPILING


def test_a_batch_in_a_cache_without_hard_links_stores_copies(tmp_path, monkeypatch):
  monkeypatch.setenv("UOPC_CACHE_DIR", str(tmp_path))
  def no_links(*a): raise OSError(1, "Operation not permitted")
  monkeypatch.setattr(CC.os, "link", no_links)
  scales = [fresh_scale() for _ in range(2)]
  progs = CCompiler().compile_many([(render_c(scale_program(s), "k"), "k") for s in scales])
  entries = list(tmp_path.glob("*.so"))
  assert len(entries) == 2 and len({e.stat().st_ino for e in entries}) == 2
  assert not list(tmp_path.glob(".*.tmp"))
  for prog, scale in zip(progs, scales): check_scale(lambda arrays: CBackend().launch(prog, [arrays[0], arrays[1]]), scale)


def test_a_batch_with_a_kernel_gcc_refuses_reports_that_kernel_and_its_source(tmp_path, monkeypatch):
  monkeypatch.setenv("UOPC_CACHE_DIR", str(tmp_path))
  good = render_c(scale_program(fresh_scale()), "good")
  bad = "void bad(float* restrict data0) { data0[0] = undeclared_thing; }\n"
  with pytest.raises(CC.CompileError, match=r"(?s)undeclared_thing.*--- source ---.*1 \| void bad"):
    CCompiler().compile_many([(good, "good"), (bad, "bad")])
  [entry] = list(tmp_path.glob("*.so"))                  # the good one, built on its own after the batch failed
  assert CCompiler().compile(good, "good").path == entry


def test_run_c_reads_the_cache_dir_from_the_environment_at_call_time(tmp_path, monkeypatch):
  for sub in ("one", "two"):
    monkeypatch.setenv("UOPC_CACHE_DIR", str(tmp_path / sub))
    scale = fresh_scale()
    check_scale(lambda arrays: run_c(scale_program(scale), arrays), scale)
    assert len(list((tmp_path / sub).glob("*.so"))) == 1


RUN = r'''
import pathlib, sys, time
import numpy as np
from uopc.uop import buf
from uopc.rangeify import lower, Ctx, Opts
from uopc.testing import run_c
scale = float(sys.argv[1])
if len(sys.argv) > 2:   # a start line: every process has imported everything before any of them compiles
  ready, go = pathlib.Path(sys.argv[2]), pathlib.Path(sys.argv[3])
  ready.touch()
  deadline = time.monotonic() + 60
  while not go.exists() and time.monotonic() < deadline: time.sleep(0.002)
a, out = np.arange(-8, 8, dtype=np.float32), np.zeros(16, np.float32)
run_c(lower(buf(0, 16) * scale + 1.0, buf(1, 16)), {0: a, 1: out})
print("ok" if np.array_equal(out, a * np.float32(scale) + np.float32(1.0)) else f"wrong: {out}")
'''


def run_in_child(cache: Path, scale: float) -> subprocess.CompletedProcess:
  """Compile and run the scale kernel in a new process, which has nothing in memory and must use the cache on disk."""
  return subprocess.run([sys.executable, "-c", RUN, repr(scale)], env=child_env(UOPC_CACHE_DIR=str(cache)), capture_output=True,
                        text=True, timeout=120)


CORRUPTIONS = {
  "garbage": lambda so: np.random.default_rng(0).integers(0, 256, len(so), dtype=np.uint8).tobytes(),
  "truncated": lambda so: so[:len(so) // 2],          # dlopen of a truncated ELF dies with SIGBUS unless it is caught first
  "empty": lambda so: b"",
  "one byte flipped": lambda so: so[:len(so) // 3] + bytes([so[len(so) // 3] ^ 0xFF]) + so[len(so) // 3 + 1:],
}


@pytest.mark.parametrize("damage", list(CORRUPTIONS))
def test_a_damaged_cache_entry_is_rebuilt_and_the_kernel_still_gives_correct_results(tmp_path, damage):
  cache, scale = tmp_path / "cache", fresh_scale()
  made = run_in_child(cache, scale)
  assert made.returncode == 0 and made.stdout.strip() == "ok", made.stderr
  [entry] = list(cache.iterdir())
  bad = CORRUPTIONS[damage](entry.read_bytes())
  entry.write_bytes(bad)
  # a child process loads it: were the damage missed, a crash would fail this test instead of the test session
  again = run_in_child(cache, scale)
  assert again.returncode == 0 and again.stdout.strip() == "ok", (again.returncode, again.stderr)
  [rebuilt] = list(cache.iterdir())
  assert rebuilt.name == entry.name and rebuilt.read_bytes() != bad and rebuilt.read_bytes().startswith(b"\x7fELF")


def test_processes_racing_to_compile_one_new_kernel_all_succeed_and_leave_one_entry(tmp_path):
  cache, scale, n = tmp_path / "cache", fresh_scale(), 6
  go = tmp_path / "go"
  ready = [tmp_path / f"ready{i}" for i in range(n)]
  procs = [subprocess.Popen([sys.executable, "-c", RUN, repr(scale), str(r), str(go)], env=child_env(UOPC_CACHE_DIR=str(cache)),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for r in ready]
  try:
    deadline = time.monotonic() + 60
    while not all(r.exists() or p.poll() is not None for p, r in zip(procs, ready)) and time.monotonic() < deadline: time.sleep(0.005)
    go.touch()
    results = [p.communicate(timeout=120) for p in procs]
  finally:
    for p in procs:
      if p.poll() is None: p.kill()
  for p, (out, err) in zip(procs, results):
    assert p.returncode == 0 and out.strip() == "ok", (p.returncode, err)
  entries = sorted(e.name for e in cache.iterdir())
  assert len(entries) == 1 and entries[0].endswith(".so") and not entries[0].startswith("."), entries   # no temporary files


def test_temporaries_left_by_killed_writers_are_swept_when_an_hour_old(tmp_path):
  cache = tmp_path / "cache"
  cache.mkdir()
  old, young = cache / ".abc.1234.tmp", cache / ".def.5678.tmp"
  for f in (old, young): f.write_bytes(b"half a kernel")
  os.utime(old, (time.time() - 2 * compile_cache.STALE_TEMP_SECONDS,) * 2)
  compile_cache.write_entry(cache / "k.so", b"entry")
  assert not old.exists() and young.exists()            # a young one may be another process's write in progress
  assert compile_cache.read_entry(cache / "k.so") == b"entry"


def test_every_file_uopc_writes_gets_the_mode_open_gives_and_a_file_without_a_seal_is_synced(tmp_path, monkeypatch):
  # one writer (uopc.compile_cache.write_file) for kernels, searched Opts and `uopc run --save`; the kernel cache and the
  # Opts store once made their files 0600. A user's file (the saved output) is synced, the data, then its rename into
  # the directory; a cache entry is not (200 fsyncs were 0.17 s of a cold GPT step): its seal finds what a power loss
  # tore (truncated, empty or garbage: test_a_damaged_cache_entry_is_rebuilt_and_the_kernel_still_gives_correct_results)
  import uopc.cli as cli
  from example_programs import ROWSUM_UIR
  from uopc.lowering import Opts
  from uopc.kernelize import make_kernel
  from uopc.runtime import store_opts
  monkeypatch.setenv("UOPC_CACHE_DIR", str(tmp_path / "cache"))
  synced: list[Path] = []
  real_fsync = os.fsync
  def fsync(fd: int) -> None:
    synced.append(Path(os.readlink(f"/proc/self/fd/{fd}")))
    real_fsync(fd)
  monkeypatch.setattr(os, "fsync", fsync)
  umask = os.umask(0o022)
  os.umask(umask)
  CCompiler().compile(render_c(scale_program(fresh_scale()), "scale"), "scale")
  store_opts(make_kernel(buf(0, 4) * 2.0, buf(1, 4)), CBackend(), Opts(), seconds=1.0)
  (tmp_path / "rowsum.uir").write_text(ROWSUM_UIR)
  assert cli.main(["run", str(tmp_path / "rowsum.uir"), "--save", str(tmp_path / "out.npy")]) == 0
  files = [f for d in (tmp_path / "cache", tmp_path / "cache" / "opts") for f in d.iterdir() if f.is_file()] + [tmp_path / "out.npy"]
  assert {f.suffix for f in files} == {".so", ".json", ".npy"}            # kernels, a choice of Opts, the saved output
  for f in files:
    if f.suffix == ".npy":
      at = next(i for i, p in enumerate(synced) if p.name.startswith(f".{f.name}."))
      assert synced[at + 1] == f.parent, f                                 # the data, then its rename into the directory
    else:
      assert not any(p.name.startswith(f".{f.name}.") or p == f for p in synced), f
      assert compile_cache.read_entry(f) is not None, f                    # sealed, and whole
    assert f.stat().st_mode & 0o777 == 0o666 & ~umask, f


def test_options_a_batch_member_sets_stay_with_that_member(tmp_path, monkeypatch):
  """A member's `#pragma GCC optimize` (the C renderer's wrapv for chains of multiply-adds) applies to its own function
  and not to the members batched after it. gcc shows which options a function got: without -fwrapv it folds x + 1 > x
  to true (signed overflow being undefined), with it INT_MAX + 1 wraps and the comparison is false."""
  monkeypatch.setenv("UOPC_CACHE_DIR", str(tmp_path))
  tag = uuid.uuid4().hex[:8]     # sources no earlier run has cached
  probe = "void {name}(int* restrict data0) {{ /* %s */ int x = data0[0]; data0[1] = x + 1 > x; }}\n" % tag
  wrapping = '#pragma GCC optimize ("wrapv")\n' + probe.format(name="wrapping")
  progs = CCompiler().compile_many([(wrapping, "wrapping"), (probe.format(name="plain"), "plain")])
  got = {}
  for prog in progs:
    a = np.array([2**31 - 1, -1], np.int32)
    CBackend().launch(prog, [a])
    got[prog.name] = int(a[1])
  assert got == {"wrapping": 0, "plain": 1}
