"""The C backend: render a lowered program as one C function, compile it with gcc (cached on disk), run it.

    render_c(sink, name)       -> C source: a prelude and `void name(float* restrict data0, ...)`
    run_c(sink, {slot: array}) -> runs the kernel on NumPy arrays, after checking every buffer

Rendering walks the linearized program once. The renderer is a table (`CRenderer.code_for_op`: op -> a
small format function) plus a handful of strings a subclass changes (CUDA swaps the kernel prefix, the
barrier and the loop openers). Names follow the book: `dataN` is the BUFFER in slot N, `ridxN` the counter of
RANGE N, `accN` an accumulator (ALLOC), `valN` a loaded value, `aluN` an expression that gets a variable
because it is used more than once or inside a deeper loop than where it is computed (everything else is
inlined). C's / and % appear only where bounds prove the operands non-negative (and the divisor positive);
elsewhere the prelude's floordiv_i32/floormod_i32 give floor semantics, NumPy's 0 for a zero divisor, and wrap
INT_MIN / -1 instead of trapping.

Compilation keeps IEEE semantics (no -ffast-math, no contraction of a*b+c into an fma, -fwrapv for the i32
wrap-around the IR defines) and caches shared objects on disk under $UOPC_CACHE_DIR (default ~/.cache/uopc),
keyed by a hash of the source, the flags, the compiler version and the target CPU. An entry is written to a
temporary file and renamed into place, so concurrent processes and killed ones never leave a half-written
entry. Each entry ends with a SHA-256 of the shared object, checked before dlopen: a damaged entry (a truncated
.so makes dlopen crash the process with SIGBUS, not fail) is rebuilt, like one that fails to load.
"""
from __future__ import annotations
import ctypes, hashlib, math, os, re, shutil, subprocess, tempfile, threading
from dataclasses import dataclass
from pathlib import Path
from typing import Callable
import numpy as np
from uopc.uop import UOp, Ops, AxisType
from uopc.dtype import DType, dtypes
from uopc.symbolic import vmin
from uopc.evaluate import round_f32, round_f16
from uopc.linearize import linearize
from uopc.backends import BackendError, check_memory_safety, base_memory, memory_name


class CompileError(BackendError):
  """gcc refused a kernel; the message has gcc's output and the numbered source."""


PRELUDE = """#include <math.h>
static inline int floordiv_i32(int a, int b) {
  if (b == 0) return 0;                               /* numpy's x // 0 */
  if (b == -1) return (int)(0u - (unsigned)a);        /* INT_MIN // -1 wraps, it does not trap */
  int q = a / b;
  return q - ((a % b != 0) & ((a < 0) != (b < 0)));
}
static inline int floormod_i32(int a, int b) {
  if (b == 0 || b == -1) return 0;
  int r = a % b;
  return r + ((r != 0) & ((r < 0) != (b < 0))) * b;
}
static inline int cast_f32_i32(float x) {             /* C leaves NaN and out-of-range undefined; uopc says INT_MIN */
  return (x >= -2147483648.0f && x < 2147483648.0f) ? (int)x : (-2147483647-1);
}
"""

_C_KEYWORDS = {"auto", "break", "case", "char", "const", "continue", "default", "do", "double", "else", "enum", "extern", "float",
               "for", "goto", "if", "inline", "int", "long", "register", "restrict", "return", "short", "signed", "sizeof", "static",
               "struct", "switch", "typedef", "union", "unsigned", "void", "volatile", "while", "main", "asm", "typeof",
               "bool", "true", "false", "alignas", "alignof", "static_assert", "thread_local", "nullptr", "constexpr"}
# Names the prelude's #include <math.h> (glibc, -std=gnu11) and gcc itself already use: a kernel called `exp`, `y0`, `NAN`
# or `linux` (a predefined macro) would not compile. Each math function also comes with an f and an l variant.
_MATH_FUNCS = ("acos acosh asin asinh atan atan2 atanh cbrt ceil copysign cos cosh drem erf erfc exp exp2 expm1 fabs fdim finite "
               "floor fma fmax fmin fmod frexp gamma hypot ilogb isinf isnan j0 j1 jn ldexp lgamma lgamma_r llrint llround log "
               "log10 log1p log2 logb lrint lround modf nan nearbyint nextafter nexttoward pow remainder remquo rint round scalb "
               "scalbln scalbn significand sin sinh sqrt tan tanh tgamma trunc y0 y1 yn").split()
_C_TAKEN = _C_KEYWORDS | {f + s for f in _MATH_FUNCS for s in ("", "f", "l")} | {"lgammaf_r", "lgammal_r"} | set(
  "INFINITY NAN HUGE_VAL HUGE_VALF HUGE_VALL FP_ILOGB0 FP_ILOGBNAN FP_INFINITE FP_NAN FP_NORMAL FP_SUBNORMAL FP_ZERO MATH_ERRNO "
  "MATH_ERREXCEPT math_errhandling M_E M_LOG2E M_LOG10E M_LN2 M_LN10 M_PI M_PI_2 M_PI_4 M_1_PI M_2_PI M_2_SQRTPI M_SQRT2 M_SQRT1_2 "
  "fpclassify isfinite isnormal signbit isgreater isgreaterequal isless islessequal islessgreater isunordered signgam float_t "
  "double_t unix linux i386 floordiv_i32 floormod_i32".split())


def sanitize_name(name: str) -> str:
  """A C identifier made from `name`: other characters become _; a leading digit or underscore (identifiers the C
  implementation reserves), a keyword, or a name the prelude already uses gets a prefix."""
  s = re.sub(r"[^A-Za-z0-9_]", "_", str(name))[:64] or "kernel"
  if s[0].isdigit() or s[0] == "_" or s in _C_TAKEN: s = "k_" + s
  return s


def _float_lit(v: float, suffix: str = "f") -> str:
  if v != v: return "NAN"
  if math.isinf(v): return "INFINITY" if v > 0 else "-INFINITY"
  return repr(v) + suffix


def render_const(v, dtype: DType) -> str:
  if dtype is dtypes.bool: return "1" if v else "0"
  if dtype is dtypes.i32: return "(-2147483647-1)" if v == -2**31 else str(v)
  if dtype is dtypes.f32: return _float_lit(round_f32(v))
  return f"((_Float16){_float_lit(round_f16(v))})"


def _fmax(a: str, b: str) -> str: return f"((({a}>{b})||({a}!={a}))?{a}:{b})"   # NaN propagates, as numpy.maximum


class CRenderer:
  """One kernel as C. Subclasses change the strings and the few table entries that differ."""
  kernel_prefix = "void"
  buffer_qualifier = " restrict"
  barrier = "/* barrier: one thread, nothing to wait for */"
  code_for_op: dict[Ops, Callable[..., str]] = {
    Ops.ADD: lambda d, a, b: f"({a}|{b})" if d is dtypes.bool else f"({a}+{b})",
    Ops.MUL: lambda d, a, b: f"({a}&{b})" if d is dtypes.bool else f"({a}*{b})",
    Ops.MAX: lambda d, a, b: f"({a}|{b})" if d is dtypes.bool else (_fmax(a, b) if d.is_float else f"(({a}>{b})?{a}:{b})"),
    Ops.CMPLT: lambda d, a, b: f"({a}<{b})",
    Ops.CMPNE: lambda d, a, b: f"({a}!={b})",
    Ops.WHERE: lambda d, c, a, b: f"({c}?{a}:{b})",
    Ops.RECIP: lambda d, x: f"(1.0f/{x})" if d is dtypes.f32 else f"((_Float16)(1.0f/(float){x}))",
    Ops.EXP2: lambda d, x: f"exp2f({x})" if d is dtypes.f32 else f"((_Float16)exp2f((float){x}))",
    Ops.LOG2: lambda d, x: f"log2f({x})" if d is dtypes.f32 else f"((_Float16)log2f((float){x}))",
    Ops.SQRT: lambda d, x: f"sqrtf({x})" if d is dtypes.f32 else f"((_Float16)sqrtf((float){x}))",
    Ops.SIN: lambda d, x: f"sinf({x})" if d is dtypes.f32 else f"((_Float16)sinf((float){x}))",
  }

  def render_cast(self, x: UOp, to: DType, xs: str) -> str:
    if x.op is Ops.CONST and to is dtypes.f16: return render_const(x.arg, dtypes.f16)
    if to is dtypes.i32 and x.dtype.is_float: return f"cast_f32_i32({xs})"
    return f"(({to.ctype})({xs}))"

  def render(self, lin: list[UOp], name: str = "kernel") -> str:
    """C source for the linearized program `lin` (see uopc.linearize)."""
    name = sanitize_name(name)
    check_memory_safety(lin)
    users: dict[UOp, list[UOp]] = {}
    for u in lin:
      for s in u.src: users.setdefault(s, []).append(u)
    # the loop depth of every node, to see which values are used deeper than where they are computed
    depth: dict[UOp, int] = {}
    d = 0
    for u in lin:
      if u.op is Ops.END: d -= 1
      depth[u] = d
      if u.op is Ops.RANGE: d += 1
    def uses(u: UOp) -> list[UOp]:   # an INDEX is inlined into its LOAD/STORE, so its users are the value's users
      return [w for v in users.get(u, ()) for w in (uses(v) if v.op is Ops.INDEX else [v])]
    r: dict[UOp, str] = {}
    lines: list[str] = []
    counter = {"v": 1, "acc": 0}
    buffers = sorted({u for u in lin if u.op is Ops.BUFFER}, key=lambda b: b.arg.slot)
    if len({b.arg.slot for b in buffers}) != len(buffers): raise BackendError("two BUFFERs of this kernel share a slot")
    pad = lambda: "  " * (len(indent) + 1)
    indent: list[UOp] = []
    def var(prefix: str, u: UOp, expr: str) -> None:
      r[u] = f"{prefix}{counter['v']}"
      counter["v"] += 1
      lines.append(f"{pad()}{u.dtype.ctype} {r[u]} = {expr};")
    for u in lin:
      op = u.op
      if op is Ops.BUFFER: r[u] = memory_name(u)
      elif op is Ops.CONST: r[u] = render_const(u.arg, u.dtype)
      elif op is Ops.RANGE:
        r[u] = f"ridx{u.arg.idx}"
        if u.arg.kind is AxisType.THREAD: lines.append(f"{pad()}#pragma omp parallel for")
        lines.append(f"{pad()}for (int {r[u]} = 0; {r[u]} < {r[u.src[0]]}; {r[u]}++) {{")
        indent.append(u)
      elif op is Ops.END:
        indent.pop()
        lines.append(f"{pad()}}}")
      elif op is Ops.ALLOC:
        r[u] = f"acc{counter['acc']}"
        counter["acc"] += 1
        n = u.arg.shape[0]
        lines.append(f"{pad()}{u.dtype.ctype} {r[u]}{f'[{n}]' if n != 1 else ''};")
      elif op is Ops.AFTER: r[u] = r[u.src[0]]
      elif op is Ops.INDEX:
        mem = base_memory(u.src[0])
        r[u] = r[u.src[0]] if mem.op is Ops.ALLOC and mem.arg.shape[0] == 1 else f"{r[u.src[0]]}[{r[u.src[1]]}]"
      elif op is Ops.LOAD: var("val", u, r[u.src[0]])
      elif op is Ops.STORE: lines.append(f"{pad()}{r[u.src[0]]} = {r[u.src[1]]};")
      elif op is Ops.SINK: pass
      elif op is Ops.BARRIER: lines.append(f"{pad()}{self.barrier}")
      elif op is Ops.CAST: r[u] = self.render_cast(u.src[0], u.dtype, r[u.src[0]])
      elif op in (Ops.FLOORDIV, Ops.FLOORMOD):
        a, b = u.src
        if vmin(a) >= 0 and vmin(b) > 0: r[u] = f"({r[a]}{'/' if op is Ops.FLOORDIV else '%'}{r[b]})"
        else: r[u] = f"{'floordiv_i32' if op is Ops.FLOORDIV else 'floormod_i32'}({r[a]}, {r[b]})"
      elif op in self.code_for_op: r[u] = self.code_for_op[op](u.dtype, *(r[s] for s in u.src))
      else: raise BackendError(f"the C renderer has no rule for {op!r} (is the program lowered?)")
      if op in self.code_for_op or op in (Ops.CAST, Ops.FLOORDIV, Ops.FLOORMOD):
        us = uses(u)
        if len(us) > 1 or any(depth[w] > depth[u] for w in us): var("alu", u, r[u])
    params = ", ".join(f"{b.dtype.ctype}*{self.buffer_qualifier} {r[b]}" for b in buffers)
    return PRELUDE + f"{self.kernel_prefix} {name}({params}) {{\n" + "\n".join(lines) + "\n}\n"


def render_c(sink: UOp, name: str = "kernel") -> str:
  """C source for the output of lower(): the prelude and one function `void name(T* restrict dataN, ...)`."""
  if not isinstance(sink, UOp) or sink.op is not Ops.SINK: raise BackendError("render_c takes the SINK that lower() returns")
  return CRenderer().render(linearize(sink), name)


# ---- compiling, with a content-addressed cache on disk -----------------------------------------------------------

CFLAGS = ["-O2", "-march=native", "-fPIC", "-shared", "-std=gnu11", "-fwrapv", "-ffp-contract=off", "-fno-math-errno"]


def cache_dir() -> Path:
  return Path(os.environ.get("UOPC_CACHE_DIR") or Path.home() / ".cache" / "uopc")


_SEAL_TAG = b"uopc-sha256:"
_SEAL_LEN = len(_SEAL_TAG) + 32


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

  def identity(self) -> str:
    """The compiler's version and what -march=native means on this CPU: both change the machine code."""
    if self._ident is None:
      if shutil.which(self.cc) is None: raise CompileError(f"{self.cc} not found: the C backend needs a C compiler on PATH")
      ver = subprocess.run([self.cc, "--version"], capture_output=True, text=True).stdout.splitlines()[:1]
      native = subprocess.run([self.cc, "-march=native", "-Q", "--help=target"], capture_output=True, text=True).stdout
      march = [l.split() for l in native.splitlines() if l.strip().startswith(("-march=", "-mtune="))]
      self._ident = repr((ver, march))
    return self._ident

  def compile(self, src: str, name: str) -> CProgram:
    """The loaded function `name` of C source `src` (with -fopenmp when the source has an OpenMP pragma)."""
    flags = CFLAGS + (["-fopenmp"] if "#pragma omp" in src else [])
    key = hashlib.sha256("\0".join([src, " ".join(flags), self.identity()]).encode()).hexdigest()[:32]
    with self._lock:
      if (p := self._loaded.get(key)) is not None: return p
      path = cache_dir() / f"{key}.so"
      prog = self._load(path, name, src)
      if prog is None:
        self._build(src, flags, path)
        prog = self._load(path, name, src)
        if prog is None: raise CompileError(f"the shared object {path} was built but can't be loaded")
      self._loaded[key] = prog
      return prog

  @staticmethod
  def _load(path: Path, name: str, src: str) -> CProgram | None:
    if not path.exists(): return None
    try:
      data = path.read_bytes()
      so, tag, digest = data[:-_SEAL_LEN], data[-_SEAL_LEN:-32], data[-32:]
      if tag != _SEAL_TAG or hashlib.sha256(so).digest() != digest: raise OSError(f"{path}: damaged cache entry")
      lib = ctypes.CDLL(str(path))
      return CProgram(name, src, path, getattr(lib, name), lib)
    except (OSError, AttributeError):
      # a corrupt or foreign entry (a truncated file, the wrong symbol): remove it, and the caller rebuilds it
      try: path.unlink()
      except OSError: pass
      return None

  def _build(self, src: str, flags: list[str], path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="uopc-build-") as tmp:
      c_file = Path(tmp) / "kernel.c"
      c_file.write_text(src)
      out = Path(tmp) / "kernel.so"
      try: proc = subprocess.run([self.cc, *flags, "-o", str(out), str(c_file), "-lm"], capture_output=True, text=True, timeout=600)
      except subprocess.TimeoutExpired: raise CompileError(f"{self.cc} took more than 10 minutes") from None
      if proc.returncode != 0:
        numbered = "\n".join(f"{i:4d} | {l}" for i, l in enumerate(src.splitlines(), 1))
        raise CompileError(f"{self.cc} failed (exit {proc.returncode}):\n{proc.stderr.strip()}\n--- source ---\n{numbered}")
      # write beside the final name, then rename: readers see the old entry or the whole new one, never a part
      fd, tmp_final = tempfile.mkstemp(dir=path.parent, prefix=f".{path.stem}.", suffix=".tmp")
      try:
        so = out.read_bytes()
        # the checksum goes after the ELF data, where the dynamic loader never looks
        with os.fdopen(fd, "wb") as f: f.write(so + _SEAL_TAG + hashlib.sha256(so).digest())
        os.replace(tmp_final, path)
      except BaseException:
        try: os.unlink(tmp_final)
        except OSError: pass
        raise


compiler = CCompiler()


# ---- running -------------------------------------------------------------------------------------------------------

def np_dtype(dtype: DType) -> np.dtype:
  """The NumPy dtype that holds values of `dtype`."""
  if dtype.fmt is None: raise BackendError(f"no NumPy dtype for {dtype}")
  return np.dtype(dtype.fmt)


def kernel_buffers(sink: UOp) -> list[UOp]:
  """The BUFFERs of a lowered program, in slot order (the order of the C function's parameters)."""
  bufs = sorted({u for u in sink.toposort() if u.op is Ops.BUFFER}, key=lambda b: b.arg.slot)
  if len({b.arg.slot for b in bufs}) != len(bufs):
    raise BackendError(f"two BUFFERs share a slot: {sorted((b.arg.slot, b.dtype.name, b.shape[0]) for b in bufs)}")
  return bufs


def stored_buffers(sink: UOp) -> set[int]:
  return {base_memory(u.src[0].src[0]).arg.slot for u in sink.toposort()
          if u.op is Ops.STORE and base_memory(u.src[0].src[0]).op is Ops.BUFFER}


def check_buffers(sink: UOp, buffers: dict[int, np.ndarray]) -> list[np.ndarray]:
  """The arrays for the kernel's parameters, after checking each: present, a NumPy array of the BUFFER's dtype,
  C-contiguous, large enough, writeable where the kernel stores, and not overlapping an array it writes."""
  args = []
  written = stored_buffers(sink)
  bufs = kernel_buffers(sink)
  for b in bufs:
    slot, n, want = b.arg.slot, b.shape[0], np_dtype(b.dtype)
    if slot not in buffers: raise BackendError(f"no array for buffer slot {slot} ({b.dtype.name}[{n}]); got slots {sorted(buffers)}")
    a = buffers[slot]
    if not isinstance(a, np.ndarray): raise BackendError(f"buffer slot {slot}: expected a numpy array, got {type(a).__name__}")
    if a.dtype != want: raise BackendError(f"buffer slot {slot}: expected dtype {want} ({b.dtype.name}), got {a.dtype}")
    if not a.flags.c_contiguous: raise BackendError(f"buffer slot {slot}: the array must be C-contiguous (use np.ascontiguousarray)")
    if a.size < n: raise BackendError(f"buffer slot {slot}: the kernel uses {n} elements, the array has {a.size}")
    if slot in written and not a.flags.writeable: raise BackendError(f"buffer slot {slot}: the kernel writes it, but the array is read-only")
    args.append(a)
  for i, bi in enumerate(bufs):
    for j in range(i):
      bj = bufs[j]
      if (bi.arg.slot in written or bj.arg.slot in written) and np.may_share_memory(args[i], args[j]):
        raise BackendError(f"buffers {bj.arg.slot} and {bi.arg.slot} overlap in memory and the kernel writes one of them "
                           "(its pointers are restrict)")
  return args


def run_c(sink: UOp, buffers: dict[int, np.ndarray], name: str = "kernel") -> None:
  """Render, compile (cached) and run a lowered program on NumPy arrays keyed by BUFFER slot, in place."""
  args = check_buffers(sink, buffers)
  lin = linearize(sink)
  prog = compiler.compile(CRenderer().render(lin, name), sanitize_name(name))
  CBackend.launch_program(prog, args)


class CBackend:
  """The default backend: C functions over NumPy arrays."""
  name = "C"
  renderer = CRenderer()

  def render(self, linear_program: list[UOp], name: str = "kernel") -> str: return self.renderer.render(linear_program, name)
  def compile(self, src: str, name: str = "kernel") -> CProgram: return compiler.compile(src, sanitize_name(name))
  def alloc(self, n: int, dtype: DType) -> np.ndarray: return np.zeros(n, np_dtype(dtype))
  def copyin(self, buf: np.ndarray, arr) -> None: buf[...] = np.asarray(arr, buf.dtype).reshape(buf.shape)
  def copyout(self, buf: np.ndarray) -> np.ndarray: return buf.copy()
  def launch(self, program: CProgram, buffers: list[np.ndarray], launch_dims=None) -> None: self.launch_program(program, buffers)

  @staticmethod
  def launch_program(program: CProgram, arrays: list[np.ndarray]) -> None:
    program.fn.argtypes = [ctypes.c_void_p] * len(arrays)
    program.fn.restype = None
    program.fn(*(a.ctypes.data for a in arrays))


__all__ = ["render_c", "run_c", "CRenderer", "CBackend", "CCompiler", "CompileError", "compiler", "np_dtype", "sanitize_name",
           "render_const", "PRELUDE", "CFLAGS", "cache_dir", "kernel_buffers", "check_buffers"]
