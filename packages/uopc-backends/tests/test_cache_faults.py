"""The compile cache under faults: a process killed at random points while it compiles, over and over; a
disk that fills up (an injected ENOSPC, and a real tiny tmpfs where a mount namespace can be made); a cache directory
that is a file, or is removed while a process runs. After each, the kernel still gives the right answer, the cache
holds only whole, sealed entries, and the next run uses it."""
import errno, os, shutil, signal, subprocess, sys, textwrap, time, warnings
from pathlib import Path
import numpy as np
import pytest
import uopc.backends.ccompiler as CC
import uopc.compile_cache as compile_cache
from uopc.backends.c import CCompiler, CBackend
from uopc.testing import render_c
from test_cache import RUN, child_env, fresh_scale, check_scale, scale_program


def entries(cache: Path) -> list[Path]:
  return sorted(cache.iterdir()) if cache.is_dir() else []


def assert_only_sealed_entries(cache: Path) -> None:
  """Every visible file of the cache is a whole entry: an ELF shared object followed by its seal. (A process killed
  between creating its temporary file and renaming it may leave a hidden .tmp behind; it is never read.)"""
  for e in entries(cache):
    if e.name.startswith("."):
      assert e.name.endswith(".tmp"), e
      continue
    data = e.read_bytes()
    assert e.suffix == ".so" and data.startswith(b"\x7fELF"), e
    assert compile_cache.unseal(data) is not None, f"{e}: the seal doesn't match"


def child(cache: Path, scale: float, tmp: Path, **popen) -> subprocess.Popen:
  """A new process that compiles and runs the scale kernel (nothing in memory: it must build or use the disk cache)."""
  return subprocess.Popen([sys.executable, "-c", RUN, repr(scale)], env=child_env(UOPC_CACHE_DIR=str(cache), TMPDIR=str(tmp)),
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **popen)


def test_processes_killed_at_random_points_of_a_compile_never_leave_a_bad_entry(tmp_path):
  cache, scratch = tmp_path / "cache", tmp_path / "tmp"
  scratch.mkdir()
  rng = np.random.default_rng(1)
  t0 = time.monotonic()
  first = child(tmp_path / "timing-cache", fresh_scale(), scratch)
  assert first.communicate(timeout=120)[0].strip() == "ok"
  whole = time.monotonic() - t0                              # one cold run: import, render, gcc, write, load, run
  scales = [fresh_scale() for _ in range(3)]
  for k in range(8):
    # the whole process group, so gcc dies too, as when a machine loses power or the OOM killer takes the session
    p = child(cache, scales[k % 3], scratch, start_new_session=True)
    time.sleep(rng.uniform(0.3, 1.1) * whole)
    try: os.killpg(p.pid, signal.SIGKILL)
    except ProcessLookupError: pass                          # it had finished: an entry was written whole
    p.communicate(timeout=60)
    assert_only_sealed_entries(cache)
  for scale in scales:                                       # the next run of each kernel is right, and then cached
    done = child(cache, scale, scratch)
    out, err = done.communicate(timeout=120)
    assert done.returncode == 0 and out.strip() == "ok", err
  assert_only_sealed_entries(cache)
  assert len([e for e in entries(cache) if not e.name.startswith(".")]) == 3


def full_disk(monkeypatch, cache: Path) -> None:
  """Make every write to a file in `cache` fail with ENOSPC, as on a full disk: the temporary file is created, its
  write fails. Other files (a private fallback directory elsewhere) are written normally."""
  real_fdopen = os.fdopen
  class Full:
    def __init__(self, f): self.f = f
    def __enter__(self): return self
    def __exit__(self, *exc): self.f.close()
    def write(self, data): raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
  def fdopen(fd, *a, **kw):
    f = real_fdopen(fd, *a, **kw)
    return Full(f) if Path(os.readlink(f"/proc/self/fd/{fd}")).parent == cache else f
  monkeypatch.setattr(os, "fdopen", fdopen)


def test_a_full_disk_compiles_into_a_private_directory_with_one_warning_and_leaves_the_cache_clean(tmp_path, monkeypatch):
  cache = tmp_path / "cache"
  monkeypatch.setenv("UOPC_CACHE_DIR", str(cache))
  full_disk(monkeypatch, cache)
  compiler = CCompiler()
  scales = [fresh_scale(), fresh_scale()]
  with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    for scale in scales:
      prog = compiler.compile(render_c(scale_program(scale), "scale"), "scale")
      check_scale(lambda arrays: CBackend().launch(prog, [arrays[0], arrays[1]]), scale)
  [w] = [w for w in caught if issubclass(w.category, RuntimeWarning)]                      # once, not per kernel
  assert f"UOPC_CACHE_DIR={cache} can't be written (No space left on device)" in str(w.message)
  assert entries(cache) == []                                                               # no partial entry, no temporary
  assert compiler._private is not None and len(list(compiler._private.glob("*.so"))) == 2
  monkeypatch.undo()                                                                        # space again: the next run caches
  monkeypatch.setenv("UOPC_CACHE_DIR", str(cache))
  prog = CCompiler().compile(render_c(scale_program(scales[0]), "scale"), "scale")
  check_scale(lambda arrays: CBackend().launch(prog, [arrays[0], arrays[1]]), scales[0])
  assert len(entries(cache)) == 1
  assert_only_sealed_entries(cache)


TINY_TMPFS = textwrap.dedent("""
  set -e
  mount -t tmpfs -o size=256k tmpfs "$CACHE"
  head -c 1M /dev/zero > "$CACHE/filler" 2>/dev/null || true      # fills the disk to the last block
  "$PY" -W always -c "$RUN" "$SCALE" > "$OUT/first" 2> "$OUT/first.err"
  ls -A "$CACHE" > "$OUT/after-full"
  rm "$CACHE/filler"                                                # space again
  "$PY" -c "$RUN" "$SCALE" > "$OUT/second" 2> "$OUT/second.err"
  ls -A "$CACHE" > "$OUT/after-space"
""")


def test_a_real_tiny_tmpfs_that_is_full_still_gives_right_answers(tmp_path):
  if shutil.which("unshare") is None or subprocess.run(["unshare", "-rm", "true"], capture_output=True).returncode != 0:
    pytest.skip("no user and mount namespaces here (unshare -rm) to mount a tiny tmpfs in; the injected ENOSPC test covers a full disk")
  cache, out = tmp_path / "cache", tmp_path / "out"
  cache.mkdir(); out.mkdir()
  env = child_env(CACHE=str(cache), OUT=str(out), PY=sys.executable, RUN=RUN, SCALE=repr(fresh_scale()), UOPC_CACHE_DIR=str(cache))
  proc = subprocess.run(["unshare", "-rm", "sh", "-c", TINY_TMPFS], env=env, capture_output=True, text=True, timeout=300)
  assert proc.returncode == 0, proc.stderr + "".join((out / f).read_text() for f in ("first.err", "second.err") if (out / f).exists())
  assert (out / "first").read_text().strip() == "ok" and (out / "second").read_text().strip() == "ok"
  assert "can't be written (No space left on device)" in (out / "first.err").read_text()
  assert (out / "after-full").read_text().split() == ["filler"]                              # nothing half-written
  [entry] = (out / "after-space").read_text().split()
  assert entry.endswith(".so") and not entry.startswith(".")


def test_a_cache_dir_that_is_a_file_warns_once_naming_the_variable(tmp_path, monkeypatch):
  (tmp_path / "file").write_text("not a directory")
  for cache in (tmp_path / "file", tmp_path / "file" / "below"):
    monkeypatch.setenv("UOPC_CACHE_DIR", str(cache))
    compiler = CCompiler()
    with warnings.catch_warnings(record=True) as caught:
      warnings.simplefilter("always")
      for scale in (fresh_scale(), fresh_scale()):
        prog = compiler.compile(render_c(scale_program(scale), "scale"), "scale")
        check_scale(lambda arrays: CBackend().launch(prog, [arrays[0], arrays[1]]), scale)
    [w] = caught
    assert f"UOPC_CACHE_DIR={cache} can't be written" in str(w.message)
    assert (tmp_path / "file").read_text() == "not a directory"


def test_a_cache_dir_removed_while_running_is_made_again(tmp_path, monkeypatch):
  cache = tmp_path / "cache"
  monkeypatch.setenv("UOPC_CACHE_DIR", str(cache))
  compiler = CCompiler()
  first = fresh_scale()
  compiler.compile(render_c(scale_program(first), "scale"), "scale")
  shutil.rmtree(cache)                                              # between compiles
  second = fresh_scale()
  prog = compiler.compile(render_c(scale_program(second), "scale"), "scale")
  check_scale(lambda arrays: CBackend().launch(prog, [arrays[0], arrays[1]]), second)
  assert len(entries(cache)) == 1
  real_run = CC.subprocess.run
  def gcc_then_remove(cmd, *a, **kw):                               # during a compile: right after gcc, before the write
    r = real_run(cmd, *a, **kw)
    if "-shared" in cmd: shutil.rmtree(cache, ignore_errors=True)
    return r
  monkeypatch.setattr(CC.subprocess, "run", gcc_then_remove)
  third = fresh_scale()
  prog = compiler.compile(render_c(scale_program(third), "scale"), "scale")
  check_scale(lambda arrays: CBackend().launch(prog, [arrays[0], arrays[1]]), third)
  assert len(entries(cache)) == 1
  real_mkstemp = CC.tempfile.mkstemp
  removed = []
  def remove_then_mkstemp(*a, **kw):                                # the narrowest race: after mkdir, before the temporary
    if not removed: removed.append(shutil.rmtree(cache))
    return real_mkstemp(*a, **kw)
  monkeypatch.setattr(CC.tempfile, "mkstemp", remove_then_mkstemp)
  fourth = fresh_scale()
  prog = compiler.compile(render_c(scale_program(fourth), "scale"), "scale")
  check_scale(lambda arrays: CBackend().launch(prog, [arrays[0], arrays[1]]), fourth)
  assert removed and len(entries(cache)) == 1
  assert_only_sealed_entries(cache)
  prog = CCompiler().compile(render_c(scale_program(second), "scale"), "scale")       # an entry removed with its dir: rebuilt
  check_scale(lambda arrays: CBackend().launch(prog, [arrays[0], arrays[1]]), second)


def test_a_run_after_a_kernel_written_only_in_part_rebuilds_it(tmp_path, monkeypatch):
  # a write interrupted half-way (an exception from inside it, as a signal handler or a full disk would raise) leaves
  # neither the entry nor its temporary file
  cache = tmp_path / "cache"
  monkeypatch.setenv("UOPC_CACHE_DIR", str(cache))
  real_replace = CC.os.replace
  def interrupted(src, dst): raise KeyboardInterrupt
  monkeypatch.setattr(CC.os, "replace", interrupted)
  scale = fresh_scale()
  with pytest.raises(KeyboardInterrupt): CCompiler().compile(render_c(scale_program(scale), "scale"), "scale")
  assert entries(cache) == []
  monkeypatch.setattr(CC.os, "replace", real_replace)
  prog = CCompiler().compile(render_c(scale_program(scale), "scale"), "scale")
  check_scale(lambda arrays: CBackend().launch(prog, [arrays[0], arrays[1]]), scale)


def test_a_kernel_that_is_built_but_wont_load_says_why(tmp_path, monkeypatch):
  # the dynamic loader refusing a freshly built entry (an mmap that fails, a full address space) is an error that
  # carries the loader's own reason, not only that the load failed
  monkeypatch.setenv("UOPC_CACHE_DIR", str(tmp_path / "cache"))
  def refuse(path, *a, **kw): raise OSError(f"{path}: failed to map segment from shared object")
  monkeypatch.setattr(CC.ctypes, "CDLL", refuse)
  with pytest.raises(CC.CompileError, match="was built but can't be loaded.*failed to map segment from shared object"):
    CCompiler().compile(render_c(scale_program(fresh_scale()), "scale"), "scale")


def test_a_fresh_entry_the_loader_takes_for_another_object_is_loaded_from_a_file_of_its_own(tmp_path, monkeypatch):
  # another process may replace the entry between its write and its load, and the dynamic loader may answer with an
  # object it already holds (seen in CI: another kernel's handle, without this kernel's function). The bytes just built
  # are then loaded from a file of the compiler's own, and the kernel runs
  cache = tmp_path / "cache"
  monkeypatch.setenv("UOPC_CACHE_DIR", str(cache))
  real, refused = CC.ctypes.CDLL, []
  def not_the_cache(path, *a, **kw):
    if str(path).startswith(str(cache)):
      refused.append(path)
      raise OSError(f"{path}: undefined symbol: scale")
    return real(path, *a, **kw)
  monkeypatch.setattr(CC.ctypes, "CDLL", not_the_cache)
  scale = fresh_scale()
  prog = CCompiler().compile(render_c(scale_program(scale), "scale"), "scale")
  check_scale(lambda arrays: CBackend().launch(prog, [arrays[0], arrays[1]]), scale)
  assert refused and not str(prog.path).startswith(str(cache))
