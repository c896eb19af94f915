"""uopc.backends.ccompiler: C source into loaded functions, with gcc, cached in memory and on disk.

    compiler.compile(src, name)        the function `name` of `src`, loaded (gcc's shared object, from the disk cache
                                       when it is there)
    compiler.compile_many(items)       the same for a list of (src, name), the sources not in the cache built by one gcc run

Compilation keeps IEEE semantics (no -ffast-math, no contraction of a*b+c into an fma; see CFLAGS). Shared objects are
cached on disk under $UOPC_CACHE_DIR (default ~/.cache/uopc), keyed by a hash of the source, the flags, the compiler
version and the target CPU: entries of uopc.compile_cache, written atomically and sealed with a checksum that is checked
before dlopen (a damaged entry is rebuilt, like one that fails to load). A cache that can't be written costs a warning,
and the entries go to a private directory. uopc.backends.c renders the sources and runs the functions; CUDA's compiler
borrows the environment rule (CCompiler._compiler_env).
"""
from __future__ import annotations
import atexit, ctypes, hashlib, itertools, os, re, shutil, subprocess, sys, tempfile, threading, warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence
from uopc.compile_cache import cache_dir, read_entry, write_entry
from uopc.backends import CompileError, sanitizing   # (sanitizing: still importable from here)


# -Og: gcc's optimizations without its loop optimizer. uopc's source comes vectorized, tiled and unrolled (uopc.opt,
# uopc.vectorize), and gcc's loop passes find nothing to add to most of it. What -Og does not do is inline a helper on
# its own (each vector fma a call: a GEMM tile 2x slower), so the prelude's helpers are always_inline, nor step a loop's
# addresses (a GEMM's k loop recomputes them from its counter: in longs, as the C renderer writes a kernel of
# multiply-adds, as fast as -O1's; in ints 2% slower, for their sign extensions). The kernels the
# loop passes still improve are those with a loop of scalar work on memory or an op done lane by lane (a 65-token
# softmax, a transposing copy, a pad's selects: the vectorizer takes those loops, up to 6x faster than -Og's code):
# the C renderer starts them with VECTORIZE_PRAGMA, the level before, -O1 with the two -O3 passes that find work in
# uopc's source (-funswitch-loops hoists a pad's selects, whose loop the vectorizer then takes), and gcc builds the very
# machine code it built before (objdump, the 30 such kernels of a GPT step). The GPT step's 100 kernels, these flags
# against -O1 with the two passes for all: gcc's CPU time 1.07-1.23 s against 1.67-1.71 (the same sources, alternating);
# each kernel's median time the same within noise (their sum 21.8 ms a step against 23.3, UOPC_DEBUG); the jitted step
# 19.8-20.9 ms against 19.6-21.3, nanoGPT's 839-873 against 853-873; the cold first step 1.17-1.37 s against 1.47-1.73.
# -O3 had been no faster than -O1 either (the default step 21.9-22.1 ms against 19.3-20.9) for 1.5x gcc's time.
CFLAGS = ["-Og", "-march=native", "-fPIC", "-shared", "-std=gnu11", "-ffp-contract=off", "-fno-math-errno"]
INLINE = "static inline __attribute__((always_inline))"   # how a prelude helper is declared (see above)
VECTORIZE_PRAGMA = '#pragma GCC optimize ("O1", "unswitch-loops", "tree-vectorize", "vect-cost-model=dynamic")\n'
# The prelude's vector exp2 is a polynomial whose constants -Og loads and broadcasts again at every step of the loop that
# calls it (objdump: a softmax's exps, 9 broadcasts a step; log2 and sin are lane loops, VECTORIZE_PRAGMA's): a kernel
# of vector exp2 over many elements takes -O1's loop-invariant motion too (CRenderer.math_pragma). The softmax's exps
# of attention at N = 512, alone: -Og 24.8 us, with it 21.1, -O1 21.3, -O2 19.7; built at -O2 the default GPT's cold
# first step was 20-40 ms slower
MATH_PRAGMA = '#pragma GCC optimize ("move-loop-invariants")\n'
# UOPC_SANITIZE=1 (nox -s sanitize): every kernel is also built with AddressSanitizer and UndefinedBehaviorSanitizer, and
# the first report ends the process (-fno-sanitize-recover), so a test run fails on any out-of-bounds access, overflow
# or other undefined behaviour in generated code. The ASan runtime must be preloaded into python (LD_PRELOAD), and
# buffers are then allocated at their exact size, unpooled, so that a read one past the end hits ASan's red zone.
# -O1, the level the sanitizers are made for, comes after CFLAGS' -Og and so replaces it.
SANITIZE_FLAGS = ["-fsanitize=address,undefined", "-fno-sanitize-recover=all", "-fno-omit-frame-pointer", "-O1"]


def _check_asan_preloaded() -> None:
  """dlopen of an ASan-instrumented library into a process without the ASan runtime aborts the process: say why first."""
  try:
    with open("/proc/self/maps") as f: loaded = "libasan" in f.read()
  except OSError: loaded = True   # can't tell: let the loader decide
  if not loaded:
    raise CompileError("UOPC_SANITIZE is set but the ASan runtime is not loaded: run python with "
                       "LD_PRELOAD=$(gcc -print-file-name=libasan.so) ASAN_OPTIONS=detect_leaks=0 (as nox -s sanitize does)")


def _symbol(key: str) -> str:
  """What a batch's shared object calls the kernel with cache key `key` (CCompiler.compile_many)."""
  return f"k{key}"


_HELPER = re.compile(rf"^{re.escape(INLINE)} [\w ]+?\b(\w+)\(", re.M)   # a prelude helper's name


def _batch_source(members: Sequence[tuple[str, str, str]]) -> str:
  """One translation unit of kernel sources (key, source, function name): each behind #defines that rename its function
  to _symbol(key) and its static helpers to names of its own, #undef'd after it. The typedefs the sources repeat are
  the same text, as are the libm declarations (MATH_DECLS in uopc.backends.c), which C11 allows. Each source is also
  between push_options and pop_options: a source may set options for the functions after it (a convolution's
  `#pragma GCC optimize ("wrapv")`), which must not reach the next member's (a GEMM's tile is 1.6x slower with wrapv; in
  a cold GPT step's batches, 3-32 kernels after a pragma were built with it, which ones depending on how the kernels
  happened to be batched)."""
  parts = []
  for n, (key, src, name) in enumerate(members):
    renames = [(name, _symbol(key))] + [(h, f"{h}__{n}") for h in dict.fromkeys(_HELPER.findall(src))]
    parts += ["#pragma GCC push_options"] + [f"#define {old} {new}" for old, new in renames] + [src]
    parts += [f"#undef {old}" for old, _ in renames] + ["#pragma GCC pop_options"]
  return "\n".join(parts) + "\n"


class _SwitchingOften:
  """Python switches threads every SWITCH_WHILE_COMPILING s while a compile runs, not every 5 ms. A compile runs in a
  thread of its own beside the planning of the next kernels (uopc.runtime.compile_kernels), and each syscall of its
  Python part (writing, linking and loading the entries of a finished gcc run) waited up to 5 ms for the planner to let
  the GIL go: 0.1-0.2 s a batch, the next gcc waiting for it (a cold GPT step 2.75 -> 2.47 s). Nested and concurrent
  uses share one setting; the last to leave restores the interpreter's."""
  def __init__(self): self.lock, self.users, self.saved = threading.Lock(), 0, 0.0
  def __enter__(self):
    with self.lock:
      if self.users == 0:
        self.saved = sys.getswitchinterval()
        sys.setswitchinterval(SWITCH_WHILE_COMPILING)
      self.users += 1
  def __exit__(self, *exc):
    with self.lock:
      self.users -= 1
      if self.users == 0: sys.setswitchinterval(self.saved)


SWITCH_WHILE_COMPILING = 0.0005
_switching_often = _SwitchingOften()


@dataclass
class CProgram:
  name: str
  src: str
  path: Path
  fn: ctypes._CFuncPtr
  lib: ctypes.CDLL


class CCompiler:
  """gcc into shared objects, cached in memory (per process) and on disk (across processes)."""
  def __init__(self, cc: str = "gcc"):
    self.cc = cc
    self._ident: str | None = None
    self._loaded: dict[str, CProgram] = {}
    self._lock = threading.Lock()
    self._private: Path | None = None        # where entries go when the cache can't take them (see _fallback_dir)
    self._warned: set[Path] = set()
    self._own = itertools.count()               # names of the files in it that only this compiler loads (compile)

  def identity(self) -> str:
    """The compiler's version and what -march=native means on this CPU: both change the machine code."""
    if self._ident is None:
      if shutil.which(self.cc) is None: raise CompileError(f"{self.cc} not found: the C backend needs a C compiler on PATH")
      env = self._compiler_env()
      ver = subprocess.run([self.cc, "--version"], capture_output=True, text=True, env=env).stdout.splitlines()[:1]
      native = subprocess.run([self.cc, "-march=native", "-Q", "--help=target"], capture_output=True, text=True, env=env).stdout
      march = [l.split() for l in native.splitlines() if l.strip().startswith(("-march=", "-mtune="))]
      self._ident = repr((ver, march))
    return self._ident

  def compile(self, src: str, name: str) -> CProgram:
    """The loaded function `name` of C source `src` (with -fopenmp when the source has an OpenMP pragma)."""
    with _switching_often: return self._compile(src, name)

  def _compile(self, src: str, name: str) -> CProgram:
    flags, key = self._flags_key(src)
    with self._lock:
      if (p := self._loaded.get(key)) is not None: return p
    # outside the lock: gcc runs as a process of its own, and compiles of a schedule run side by side (two threads that
    # build one source both rename a whole file into place, so either result is the entry)
    path = cache_dir() / f"{key}.so"
    prog = self._load(path, name, src, key)
    if prog is None:
      so = self._build(src, flags)
      built = self._store(so, path)
      why: list[str] = []
      if (prog := self._load(built, name, src, key, why)) is None:
        # the entry is a path other processes write too, and the dynamic loader knows a file by its inode: twice in CI
        # (two test workers on one cache) loading a fresh entry gave the handle of another kernel's object, without
        # this kernel's function. The bytes built here, from a file of this compiler's own, are this kernel
        try:
          with self._lock: own = self._private_dir() / f"{key}.{next(self._own)}.so"
          write_entry(own, so)
          prog = self._load(own, name, src, key, why)
        except OSError as e: why.append(f"no file of its own either: {e.strerror or e}")
      if prog is None:
        raise CompileError(f"the shared object {built} was built but can't be loaded, or has no function {name!r}: {'; '.join(why)}")
    with self._lock: return self._loaded.setdefault(key, prog)

  def compile_many(self, items: Sequence[tuple[str, str]]) -> list[CProgram]:
    """compile(src, name) for each item, the sources not in the cache built by one gcc run. A gcc run costs about 45 ms
    before it compiles anything (the driver, cc1, the assembler, the linker) and a kernel 30 more: a cold GPT step's 107
    kernels built one per run took 8.3 s of gcc, in runs of 60 3.4 s. Sources with an OpenMP pragma and sources without
    are one run, with -fopenmp, which changes nothing in a function without a pragma (the object then needs libgomp); two
    runs, one after the other, had each part of a cold GPT step's last compile wait 0.2-0.3 s more for its kernels
    without threads. The run compiles one translation unit: every
    source in turn, each behind #defines that give its function and helpers names of their own (two kernels may share a
    name; their helpers are static and the same text), its function exported as k<key> (see _symbol). Its shared object
    becomes every member's cache entry (hard links to one file where the cache allows, copies otherwise), so a later
    process loads each kernel from its own entry as if it had been built alone. A run that fails is retried kernel by
    kernel, so that the error is the failing kernel's, with its source."""
    with _switching_often: return self._compile_many(items)

  def _compile_many(self, items: Sequence[tuple[str, str]]) -> list[CProgram]:
    results: list[CProgram | None] = [None] * len(items)
    todo: dict[str, list[tuple[int, list[str], str, str]]] = {}      # flags -> (index, flags, key, source) still to build
    for i, (src, name) in enumerate(items):
      flags, key = self._flags_key(src)
      with self._lock: results[i] = self._loaded.get(key)
      if results[i] is None and (prog := self._load(cache_dir() / f"{key}.so", name, src, key)) is not None:
        with self._lock: results[i] = self._loaded.setdefault(key, prog)
      # (sources with an OpenMP pragma and sources without are one run, with -fopenmp: see above)
      if results[i] is None: todo.setdefault(" ".join(f for f in flags if f != "-fopenmp"), []).append((i, flags, key, src))
    for group in todo.values():
      unique = list({key: (i, flags, key, src) for i, flags, key, src in group}.values())
      if len(unique) > 1:
        run_flags = max((flags for _, flags, _, _ in unique), key=lambda f: "-fopenmp" in f)
        try: so = self._build(_batch_source([(key, src, items[i][1]) for i, _, key, src in unique]), run_flags)
        except CompileError: so = None    # one of them doesn't compile: each alone says which
        if so is not None:
          first = self._store(so, cache_dir() / f"{unique[0][2]}.so")
          # the shared object is read back, checked and loaded once, and each member's function found in it (loading
          # each member's entry read and hashed the whole object again, and each of those syscalls waited for the planner
          # to let the GIL go: a third of the 25 ms a batch of a cold GPT step spent after its gcc)
          lib = self._open(first, unique[0][2])
          for i, _, key, src in unique:
            path = first if key == unique[0][2] else self._link(first, so, cache_dir() / f"{key}.so")
            if (prog := self._member(lib, path, items[i][1], src, key) or self._load(path, items[i][1], src, key)) is not None:
              with self._lock: self._loaded.setdefault(key, prog)
      for i, _, key, src in group:
        with self._lock: prog = self._loaded.get(key)
        results[i] = prog if prog is not None else self.compile(src, items[i][1])
    return results

  def _flags_key(self, src: str) -> tuple[list[str], str]:
    """The flags a source is built with and its cache key (the source, the flags, the compiler and the CPU)."""
    flags = CFLAGS + (["-fopenmp"] if "#pragma omp" in src else [])
    if sanitizing():
      _check_asan_preloaded()
      flags = flags + SANITIZE_FLAGS
    return flags, hashlib.sha256("\0".join([src, " ".join(flags), self.identity()]).encode()).hexdigest()[:32]

  @staticmethod
  def _open(path: Path, key: str) -> ctypes.CDLL | None:
    """The shared object a batch just stored at `path`, loaded (None when it can't be read back whole, or loaded, or
    lacks the first member's function: each member is then loaded from its own entry, as _load does)."""
    if read_entry(path) is None: return None
    try:
      lib = ctypes.CDLL(str(path))
      getattr(lib, _symbol(key))
      return lib
    except (OSError, AttributeError): return None

  @staticmethod
  def _member(lib: ctypes.CDLL | None, path: Path, name: str, src: str, key: str) -> CProgram | None:
    """The program of kernel `key` in a loaded object (its entry at `path`), or None. An object a batch built exports
    the kernel as k<key> (its name may be another member's too); one built alone, as `name`."""
    if lib is None: return None
    fn = getattr(lib, _symbol(key), None) or getattr(lib, name, None)
    if fn is None: return None
    fn.restype = None
    return CProgram(name, src, path, fn, lib)

  @staticmethod
  def _load(path: Path, name: str, src: str, key: str, why: list[str] | None = None) -> CProgram | None:
    # no entry, or a damaged one (removed by read_entry), or a cache directory we may not search (EACCES): _build makes it.
    # `why` gets the reason a None was returned, for an error that must say it
    if read_entry(path) is None:
      if why is not None: why.append("no entry, or a damaged one, was found where it was stored")
      return None
    try:
      lib = ctypes.CDLL(str(path))   # the seal after the ELF data is where the dynamic loader never looks
      if (prog := CCompiler._member(lib, path, name, src, key)) is None: raise AttributeError(f"no function {name} or {_symbol(key)}")
      return prog
    except (OSError, AttributeError) as e:
      if why is not None: why.append(str(e) or type(e).__name__)
      # an entry that doesn't load or lacks the symbol (a foreign file): remove it, and the caller rebuilds it
      try: path.unlink()
      except OSError: pass
      return None

  def _build(self, src: str, flags: list[str]) -> bytes:
    """The shared object gcc makes of `src` with `flags`."""
    try: build_dir = tempfile.TemporaryDirectory(prefix="uopc-build-")
    except OSError as e: raise CompileError(f"can't make a build directory under {tempfile.gettempdir()}: {e.strerror or e}") from None
    with build_dir as tmp:
      c_file = Path(tmp) / "kernel.c"
      out = Path(tmp) / "kernel.so"
      try:
        c_file.write_text(src)
        proc = subprocess.run([self.cc, *flags, "-o", str(out), str(c_file), "-lm"], capture_output=True, text=True, timeout=600,
                              env=self._compiler_env())
        so = out.read_bytes() if proc.returncode == 0 else b""
      except subprocess.TimeoutExpired: raise CompileError(f"{self.cc} took more than 10 minutes") from None
      except OSError as e: raise CompileError(f"compiling in {tmp} failed: {e.strerror or e}") from None
      if proc.returncode != 0:
        numbered = "\n".join(f"{i:4d} | {l}" for i, l in enumerate(src.splitlines(), 1))
        raise CompileError(f"{self.cc} failed (exit {proc.returncode}):\n{proc.stderr.strip()}\n--- source ---\n{numbered}")
    return so

  def _store(self, so: bytes, path: Path) -> Path:
    """Store a shared object as the cache entry `path`; returns where it went. A cache that can't be written (not a
    directory, read-only, full, removed under us) is no reason to fail: the entry goes to this compiler's private
    temporary directory instead, with a warning naming UOPC_CACHE_DIR once (see _fallback_dir)."""
    try:
      write_entry(path, so)
      return path
    except OSError as e:
      with self._lock: private = self._fallback_dir(path.parent, e) / path.name   # compiles run in threads
      try: write_entry(private, so)
      except OSError as e2:
        raise CompileError(f"can't store a compiled kernel: the cache {path.parent} fails ({e.strerror or e}) and so does {private.parent} "
                           f"({e2.strerror or e2})") from None
      return private

  def _link(self, entry: Path, so: bytes, path: Path) -> Path:
    """Make `path` the same entry as `entry` (which holds `so`): a hard link put in place by a rename (so a reader sees
    the old entry or the new one), or where the filesystem has none, a copy."""
    tmp = path.parent / f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp"
    try:
      os.link(entry, tmp)
      os.replace(tmp, path)
      return path
    except OSError:
      try: tmp.unlink()
      except OSError: pass
      return self._store(so, entry.parent / path.name)

  def _private_dir(self) -> Path:
    """This compiler's own temporary directory, removed at exit (made on first use; OSError if it can't be)."""
    if self._private is None:
      self._private = Path(tempfile.mkdtemp(prefix="uopc-private-cache-"))
      atexit.register(shutil.rmtree, self._private, True)
    return self._private

  def _fallback_dir(self, cache: Path, why: OSError) -> Path:
    """A temporary directory of this compiler's own, removed at exit, for the entries a broken cache can't take. The first
    time a cache directory fails, a warning says so and names the variable that chooses it."""
    try: self._private_dir()
    except OSError as e: raise CompileError(f"the compile cache {cache} can't be written ({why.strerror or why}), and no private "
                                            f"directory can be made under {tempfile.gettempdir()} ({e.strerror or e})") from None
    if cache not in self._warned:
      self._warned.add(cache)
      reason = "it is a file, not a directory" if cache.is_file() else (why.strerror or str(why))
      where = f"UOPC_CACHE_DIR={cache}" if os.environ.get("UOPC_CACHE_DIR") else f"the compile cache {cache} (set UOPC_CACHE_DIR to move it)"
      warnings.warn(f"uopc: {where} can't be written ({reason}); compiled kernels go to {self._private} for this process only",
                    RuntimeWarning, stacklevel=2)
    return self._private

  @staticmethod
  def _compiler_env() -> dict[str, str] | None:
    """The compiler's environment: ours, less a preloaded sanitizer runtime (gcc needs none, and some programs hang under
    it; see UOPC_SANITIZE)."""
    if "libasan" not in os.environ.get("LD_PRELOAD", ""): return None
    return {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}


compiler = CCompiler()


__all__ = ["CCompiler", "CProgram", "compiler", "CFLAGS", "VECTORIZE_PRAGMA", "MATH_PRAGMA", "SANITIZE_FLAGS", "sanitizing"]
