"""The C backend: render a linearized program as one C function, compile it with gcc (cached on disk), run it.

    CRenderer().render(program)  -> C source: a prelude and `void name(float* restrict data0, ...)`
    compiler.compile(src, name)  -> the loaded function (uopc.backends.ccompiler: gcc, cached on disk)
    CBackend                     -> the backend get_backend("C") returns: host memory, launches are C calls

(uopc.testing's render_c and run_c do the same for the SINK that lower() returns.)

The renderer is tables over every op a linearized program can hold: `code_for_op` (ALU: op -> a small format
function), `range_code` (a RANGE by its AxisType: LOOP and REDUCE as `for` loops, THREAD as a `for` under OpenMP's
pragma, GLOBAL and LOCAL as index expressions a GPU subclass supplies), `alloc_code` (an ALLOC by its address space),
`barrier`, and the `prelude` and `signature` hooks. A CUDA renderer is a subclass that changes a handful of those
entries. Names are fixed, so listings read alike: `dataN` is the BUFFER in slot N, `ridxN` the counter of RANGE N, `accN` an accumulator
(ALLOC), `valN` a loaded value, `aluN` an expression that gets a variable because it is used more than once, inside a
deeper loop than where it is computed, or is long (so the source stays linear in the size of the program: inlining a
chain of 20,000 multiplies would copy each prefix into the next). C's / and % appear only where bounds prove the
operands non-negative (and the divisor positive); elsewhere the prelude's floordiv_i32/floormod_i32 give floor
semantics, NumPy's 0 for a zero divisor, and wrap INT_MIN / -1 instead of trapping.

Vectors are printed, never decided here: uopc.vectorize made them (vector dtypes, VECTORIZE, GEP, vector LOADs and
STOREs). They are GCC vector types (`f32x16`; a bool vector is an int mask), `vector_code_for_op` is code_for_op on
them, and a vector LOAD or STORE moves n elements through an unaligned view (`f32x16_u`); a VECTORIZE of 16 loads of
one buffer evenly apart (a transposed read's lanes) is one gather (`gather_f32x16`: AVX-512's vgatherdps). The prelude
holds only the helpers a kernel's code uses (uopc.backends.cprelude): a kernel without exp2 has no exp2 polynomial, one
without vectors no vector types.

Compilation keeps IEEE semantics (no -ffast-math, no contraction of a*b+c into an fma). The IR's i32 arithmetic wraps
around; C's signed arithmetic may not overflow, so an i32 ADD or MUL whose operands' bounds allow a result outside i32
is done on unsigned ints (`(int)((unsigned)a+(unsigned)b)`: modular, and gcc converts back by two's complement), and
every other one, which bounds prove can't overflow (index arithmetic: counters, strides, offsets), stays plain `+` and
`*`, which gcc may widen into 64-bit pointer steps. (-fwrapv would make all of them wrap, and cost a GEMM half its
speed: a wrapping 32-bit index can't be strength-reduced.) gcc and the cache of shared objects on disk are
uopc.backends.ccompiler's.
"""
from __future__ import annotations
import ctypes, functools, math, os, platform, re, weakref
from pathlib import Path
from typing import Callable, Sequence
import numpy as np
from uopc.uop import UOp, Ops, AxisType, ALU, users_of
from uopc.dtype import AddrSpace, DType, dtypes, I32_MIN, I32_MAX
from uopc.symbolic import vmin, bounds, simplify
from uopc.evaluate import round_f32, round_f16, const_value
from uopc.opt import Caps
from uopc.vectorize import index_step
from uopc.backends import BackendError, LinearProgram, base_memory, memory_name
from uopc.backends.ccompiler import CFLAGS, VECTORIZE_PRAGMA, MATH_PRAGMA, SANITIZE_FLAGS, CCompiler, CProgram, compiler, sanitizing
# the prelude's pieces (uopc.backends.cprelude's; EXP2_POLY, HELPERS and the rest are importable from here too)
from uopc.backends.cprelude import EXP2_POLY, exp2_horner, MATH_DECLS, HELPERS, vector_helpers, used_helpers, GATHER_WIDTHS, gathers


_C_KEYWORDS = {"auto", "break", "case", "char", "const", "continue", "default", "do", "double", "else", "enum", "extern", "float",
               "for", "goto", "if", "inline", "int", "long", "register", "restrict", "return", "short", "signed", "sizeof", "static",
               "struct", "switch", "typedef", "union", "unsigned", "void", "volatile", "while", "main", "asm", "typeof",
               "bool", "true", "false", "alignas", "alignof", "static_assert", "thread_local", "nullptr", "constexpr"}
# Names <math.h> (glibc, -std=gnu11), which MATH_DECLS stands in for, and gcc itself use: a kernel called `exp`, `y0`, `NAN`
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


def render_const(v, dtype: DType, half: str = "_Float16") -> str:
  if dtype is dtypes.bool: return "1" if v else "0"
  if dtype is dtypes.i32: return "(-2147483647-1)" if v == I32_MIN else str(v)   # C has no literal for INT_MIN
  if dtype is dtypes.f32: return _float_lit(round_f32(v))
  return f"(({half}){_float_lit(round_f16(v))})"


def _fmax(a: str, b: str) -> str: return f"((({a}>{b})||({a}!={a}))?{a}:{b})"   # NaN propagates, as numpy.maximum
def _loop(var: str, end: str) -> str: return f"for (int {var} = 0; {var} < {end}; {var}++) {{"
def _array(ctype: str, name: str, n: int, offset: int = 0) -> str: return f"{ctype} {name}{f'[{n}]' if n != 1 else ''};"

def shared_layout(lin: tuple[UOp, ...] | list[UOp]) -> tuple[dict[UOp, int], int]:
  """Where each shared-memory ALLOC of a program lies in its block's shared memory, in bytes (each 16-byte aligned, in
  program order), and the bytes they take in all: the one layout the renderer declares and a GPU backend launches with."""
  offsets, total = {}, 0
  for u in lin:
    if u.op is Ops.ALLOC and u.addrspace is AddrSpace.SHARED and u not in offsets:
      offsets[u] = total
      total += -(-u.arg.shape[0] * u.dtype.itemsize // 16) * 16
  return offsets, total


_VIA_F32 = {Ops.RECIP, Ops.EXP2, Ops.LOG2, Ops.SQRT, Ops.SIN}

# an expression longer than this gets a variable instead of being pasted into its users: the source stays linear in the
# program's size (a chain of inlined multiplies would copy every prefix into the next: quadratic memory and time)
MAX_INLINE = 200


class CRenderer:
  """One kernel as C. Subclasses change the strings and the table entries that differ (see the module docstring)."""
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
    Ops.MULACC: lambda d, a, b, c: f"fmaf({a},{b},{c})",   # one rounding, in hardware where there is an FMA unit
    # f32 only: f16 math is done in f32 and rounded back (_Body.emit)
    Ops.RECIP: lambda d, x: f"(1.0f/{x})",
    Ops.EXP2: lambda d, x: f"uopc_exp2({x})",
    Ops.LOG2: lambda d, x: f"log2f({x})",
    Ops.SQRT: lambda d, x: f"sqrtf({x})",
    Ops.SIN: lambda d, x: f"sinf({x})",
  }
  # the ALU ops GCC's vector extension does on whole vectors: (vector dtype, the first operand's dtype, operands). A bool
  # vector is a mask (-1 true, 0 false): + and max are "or", * is "and", a < b is ~a & b. The other ops, and f16, are done
  # lane by lane with the scalar code (_Body.vector_alu); floor division is C's / and % where bounds allow
  vector_code_for_op: dict[Ops, Callable[..., str]] = {
    Ops.ADD: lambda d, s, a, b: f"({a}|{b})" if s.scalar() is dtypes.bool else f"({a}+{b})",
    Ops.MUL: lambda d, s, a, b: f"({a}&{b})" if s.scalar() is dtypes.bool else f"({a}*{b})",
    Ops.CMPNE: lambda d, s, a, b: f"({a}!={b})",
    Ops.CMPLT: lambda d, s, a, b: f"(~{a}&{b})" if s.scalar() is dtypes.bool else f"({a}<{b})",
    # NaN wins, as numpy.maximum
    Ops.MAX: lambda d, s, a, b: f"({a}|{b})" if s.scalar() is dtypes.bool else
      f"sel_{_gcc(d)}({f'(({a}>{b})|({a}!={a}))' if d.is_float else f'({a}>{b})'}, {a}, {b})",
    Ops.WHERE: lambda d, s, c, a, b: f"sel_{_gcc(d)}({c}, {a}, {b})",
    Ops.RECIP: lambda d, s, x: f"(1.0f/{x})",
    Ops.EXP2: lambda d, s, x: f"exp2_{_gcc(d)}({x})",
    Ops.SQRT: lambda d, s, x: f"sqrt_{_gcc(d)}({x})",
    Ops.MULACC: lambda d, s, a, b, c: f"fma_{_gcc(d)}({a}, {b}, {c})",
  }
  # a RANGE by its kind: (renderer, counter, end, its position among the ranges of its kind, the sizes of all of the
  # ranges of its kind) -> the lines that open it. LOOP, REDUCE, THREAD and UPCAST open a block that their END closes;
  # GLOBAL and LOCAL are the launch grid's coordinates (see grid_index). UPCAST lanes reach a renderer as a range only for
  # a machine without vectors (uopc.vectorize turns them into vector values): a loop, the program's scalar meaning
  range_code: dict[AxisType, Callable[[CRenderer, str, str, int, list[int]], list[str]]] = {
    AxisType.LOOP: lambda renderer, var, end, dim, sizes: [_loop(var, end)],
    AxisType.REDUCE: lambda renderer, var, end, dim, sizes: [_loop(var, end)],
    AxisType.UPCAST: lambda renderer, var, end, dim, sizes: [_loop(var, end)],
    AxisType.THREAD: lambda renderer, var, end, dim, sizes: ["#pragma omp parallel for", _loop(var, end)],
    AxisType.GLOBAL: lambda renderer, var, end, dim, sizes: [f"int {var} = {renderer.grid_index(AxisType.GLOBAL, dim, sizes)};"],
    AxisType.LOCAL: lambda renderer, var, end, dim, sizes: [f"int {var} = {renderer.grid_index(AxisType.LOCAL, dim, sizes)};"],
  }
  opens_block = {AxisType.LOOP, AxisType.REDUCE, AxisType.UPCAST, AxisType.THREAD}
  # an ALLOC by its address space: (C type, name, elements, its byte offset in the block's shared memory: shared_layout)
  # -> its declaration. On a CPU one thread is the whole "block", so shared memory is an ordinary array
  alloc_code: dict[AddrSpace, Callable[[str, str, int, int], str]] = {AddrSpace.LOCAL: _array, AddrSpace.SHARED: _array}
  helpers = HELPERS                 # the prelude's pieces (see used_helpers)

  half = "_Float16"                 # the C type of f16 values
  # a kernel whose accumulators take chains of multiply-adds (a convolution's unrolled window: acc = fma(x8, w8, fma(x7,
  # ...))) is compiled as if with -fwrapv: gcc then loads each shifted window vector once and reuses it, 1.4-1.9x faster
  # than the code it makes for non-wrapping indices (a GEMM's tile, one multiply-add per accumulator and k, is the other
  # way round: 1.6x slower with it). Nothing here relies on signed overflow either way (see may_overflow)
  chain_pragma = '#pragma GCC optimize ("wrapv")\n'
  # a kernel with a loop gcc's vectorizer improves is built at the level it runs at (see CFLAGS and scalar_loop)
  scalar_loop_pragma = VECTORIZE_PRAGMA
  # ... for a kernel whose largest buffer has at least this many elements: gcc's -O1 and vectorizer cost about 6 ms a
  # kernel more than -Og, which a loop over fewer elements doesn't win back in a few hundred launches (a 65 x 128 Adam
  # update read transposed: a few us a launch). A default GPT's cold first step: 10 of its 18 such kernels at -Og, gcc's
  # CPU time 1.03-1.16 -> 0.92-1.08 s, the jitted step 20.8-20.9 -> 20.1-20.5 ms (alternating, three runs each)
  scalar_loop_min = 1 << 16
  # ... and a kernel of vector exp2 with such a buffer moves its loops' invariants out (see MATH_PRAGMA). Not a GEMM
  # whose epilogue takes an exp (once an output, outside its loop of multiply-adds)
  math_pragma = MATH_PRAGMA
  long_tile_index = True            # a kernel of multiply-adds holds its indices in longs (see render)
  # a vector load in a reduction's loop that moves a cache line or more at each step (a GEMM's packed panel of B walked
  # down its rows, B's rows themselves) is prefetched this many bytes ahead: the hardware's prefetcher meets each such
  # stream late, and a decode step's weights are such streams, read once (nanoGPT's b16 sampling 2.85-2.92 -> 3.52-3.54
  # thousand tokens/s; its training step 630-636 -> 611-619 ms; GEMM 1024 6.11 -> 5.64-5.77 ms; 2 KB and 8 KB were
  # slower). 0: none
  prefetch_bytes = 4096
  # a sum of products' kernel (a GEMM, a convolution) whose output has this many bytes or more stores its vectors past
  # the caches (see streams). Each tile's outputs are written once, after their long sum, and an ordinary store first
  # reads the line it overwrites from memory: in a training step the output's memory was last touched long ago.
  # nanoGPT's step (outputs of 9.4 and 12.6 MB streamed; alternating, four runs each): best 623-657 ms against 634-670;
  # its GEMMs with such outputs 6-10% faster. Not lower: a GEMM of 1024 called again and again (4 MB of output, in the
  # cache from the call before) was 6-14% slower streamed, attention's blocks (3 MB, read at once by the softmax) 5-13%;
  # a GEMM of 2048 (16 MB) is the same either way (58-59 ms). 0: none
  stream_min_bytes = 8 << 20

  def type_name(self, d: DType) -> str:
    if d.count > 1: return _gcc(d)
    return self.half if d is dtypes.f16 else d.ctype

  def grid_index(self, kind: AxisType, dim: int, sizes: list[int]) -> str:
    raise BackendError(f"the C renderer has no GPU grid for a {kind.name} range: lower with Opts(gpu=False) for a CPU backend")

  def render_cast(self, x: UOp, to: DType, xs: str) -> str:
    # the constant's value (an f32 CONST's is its double rounded to f32), then rounded to f16: one literal, two roundings
    if x.op is Ops.CONST and to is dtypes.f16: return render_const(const_value(x), dtypes.f16, self.half)
    if to is dtypes.i32 and x.dtype.is_float: return f"cast_f32_i32({xs})"
    return f"(({self.type_name(to)})({xs}))"

  def render_wmma(self, body: _Body, u: UOp) -> None:
    raise BackendError(f"{type(self).__name__} has no tensor cores: WMMA is lowered only for a GPU backend (Opts(tc=True))")

  def render_async(self, body: _Body, u: UOp) -> None:
    """ASYNC_COPY, ASYNC_COMMIT, ASYNC_WAIT and LDMATRIX: a GPU's (a pipelined tensor-core GEMM, Opts(tc=True, stage=S))."""
    raise BackendError(f"{type(self).__name__} has no {u.op.name}: it is lowered only for a GPU backend (Opts(tc=True, stage=S))")

  # -- vectors (GCC's vector extension): a VECTORIZE, a lane, and a vector moved from or to n elements of memory
  def render_vectorize(self, d: DType, xs: list[str]) -> str:
    mask = d.scalar() is dtypes.bool                     # C's 0 or 1 becomes a lane's 0 or -1
    if all(x == xs[0] for x in xs): return f"(-({_gcc(d)})bcast_{_gcc(d)}({xs[0]}))" if mask else f"bcast_{_gcc(d)}({xs[0]})"
    return f"(({_gcc(d)}){{{', '.join(f'-({x})' if mask else x for x in xs)}}})"

  # a mask lane is -1 or 0; `& 1` makes it C's 1 or 0. Not `!= 0`: gcc 12 at -O2 folds (mask[l] != 0) into mask[l] and gives
  # -1 for true (found by the Opts fuzzer on (x < y).cast(i32))
  def render_gep(self, x: str, d: DType, lane: int | str) -> str: return f"({x}[{lane}]&1)" if d.scalar() is dtypes.bool else f"{x}[{lane}]"

  def vector_load(self, mem: str, at: str, d: DType) -> str:
    # memory holds bools as bytes, a bool vector is a mask of ints: 16 bytes widen in one instruction (ldmask), other
    # widths are read lane by lane (an attention's causal mask, read per vector, cost as much as its multiply-adds)
    if d.scalar() is dtypes.bool and d.count == 16: return f"ldmask_i32x16({mem}+{at})"
    if d.scalar() is dtypes.bool: return f"(({_gcc(d)}){{{', '.join(f'-(int){mem}[({at}+{c})]' for c in range(d.count))}}})"
    return f"(*({_gcc(d)}_u*)({mem}+{at}))"

  def vector_store(self, mem: str, at: str, d: DType, value: str) -> list[str]:
    if d.scalar() is dtypes.bool:
      return [f"{{ {_gcc(d)} _s = {value};"] + [f"  {mem}[({at}+{c})] = (_s[{c}]&1);" for c in range(d.count)] + ["}"]
    return [f"*({_gcc(d)}_u*)({mem}+{at}) = {value};"]

  def prelude(self, program: LinearProgram, code: str) -> str:
    """The helpers `code` (the kernel's function) uses: a kernel without exp2 has no exp2 polynomial, one without
    vectors no vector types."""
    widths = sorted({int(w) for w in re.findall(r"[fi]32x(\d+)", code)})
    return used_helpers(self.helpers + [h for w in widths for h in vector_helpers(w)], code)

  def signature(self, program: LinearProgram) -> str:
    params = ", ".join(f"{self.type_name(b.dtype)}*{self.buffer_qualifier} {memory_name(b)}" for b in program.params)
    return f"{self.kernel_prefix} {sanitize_name(program.name)}({params})"   # a name is never pasted in unchecked

  def render(self, program: LinearProgram) -> str:
    """C source for `program` (see uopc.backends.LinearProgram): prelude, signature, then the statements in order."""
    lin = program.uops
    if len({b.arg.slot for b in program.params}) != len(program.params): raise BackendError("two parameters of this kernel share a slot")
    if missing := {u for u in lin if u.op is Ops.BUFFER} - set(program.params):
      raise BackendError(f"the program uses BUFFER slots {sorted(b.arg.slot for b in missing)} that are not among its parameters")
    chains = self.chain_pragma if any(u.op is Ops.MULACC and u.src[2].op is Ops.MULACC for u in lin) else ""
    # a loop of multiply-adds (a GEMM's or a convolution's k loop) at -Og, without gcc's induction-variable passes,
    # recomputes its addresses from the counter at each step: in 64-bit longs they need no sign extension (a GEMM of
    # 1024 as fast as at -O1; with ints 2% slower)
    mulacc = any(u.op is Ops.MULACC for u in lin)
    body = _Body(self, lin, long_index=self.long_tile_index and mulacc, streams=streams(lin, self.stream_min_bytes) if mulacc else set())
    for u in lin: body.emit(u)
    # streamed stores are weakly ordered: fenced before the kernel returns (a thread of a parallel loop is ordered by
    # OpenMP's barrier, a locked instruction)
    fence = ["  stream_fence();"] if body.streams else []
    code = self.signature(program) + " {\n" + "\n".join(body.lines + fence) + "\n}\n"
    # loops gcc's vectorizer takes: scalar work on memory, or an op done lane by lane
    big = max((b.shape[0] for b in program.params), default=0) >= self.scalar_loop_min
    level = self.scalar_loop_pragma if body.lane_loops or (scalar_loop(lin) and big) else \
      self.math_pragma if big and not mulacc and any(u.op is Ops.EXP2 and u.dtype.count > 1 for u in lin) else ""
    return level + chains + self.prelude(program, code) + code


def streams(lin: Sequence[UOp], min_bytes: int) -> set[UOp]:
  """The vector STOREs of `lin` (a kernel with a sum of products) that go past the caches (CRenderer.stream_min_bytes):
  16 f32 lanes, outside every reduction's loop, into a BUFFER of min_bytes or more that the kernel doesn't read, at an
  element index proven a multiple of 16 (a 64-byte line: buffers start on one, see _aligned). None when min_bytes is 0."""
  if not min_bytes: return set()
  read = {base_memory(u.src[0].src[0]) for u in lin if u.op is Ops.LOAD and u.src[0].op is Ops.INDEX}
  out, loops = set(), []
  for u in lin:
    if u.op is Ops.RANGE: loops.append(u.arg.kind)
    elif u.op is Ops.END: loops.pop()
    elif u.op is Ops.STORE and u.src[0].op is Ops.INDEX and u.src[0].arg is not None and AxisType.REDUCE not in loops:
      index = u.src[0]
      mem = base_memory(index.src[0])
      if index.dtype.count == 16 and index.dtype.scalar() is dtypes.f32 and mem.op is Ops.BUFFER and mem not in read and \
         mem.shape[0] * mem.dtype.itemsize >= min_bytes and simplify(index.src[1] % 16) is UOp.const(0): out.add(u)
  return out


def scalar_loop(lin: Sequence[UOp]) -> bool:
  """Does the linearized program `lin` have an innermost loop that loads or stores with no vector value in it: scalar work
  on memory, which gcc's loop vectorizer may take (see CFLAGS)?"""
  loops: list[list[bool]] = []    # for each open loop: holds a loop, holds a vector value, touches memory
  for u in lin:
    if u.op is Ops.RANGE:
      if loops: loops[-1][0] = True
      loops.append([False, False, False])
    elif u.op is Ops.END:
      if loops and (lp := loops.pop()) and not lp[0] and not lp[1] and lp[2]: return True
    elif loops:
      if u.dtype.count > 1: loops[-1][1] = True
      if u.op in (Ops.LOAD, Ops.STORE): loops[-1][2] = True
  return False


def may_overflow(u: UOp) -> bool:
  """Whether u, an ALU op, is an i32 ADD or MUL whose result the bounds of its operands don't keep within i32 (so C
  would overflow a signed int, which is undefined: it is rendered on unsigned ints, which wrap)."""
  if u.op not in (Ops.ADD, Ops.MUL) or u.dtype.scalar() is not dtypes.i32: return False
  (alo, ahi), (blo, bhi) = bounds(u.src[0]), bounds(u.src[1])
  lo, hi = (alo + blo, ahi + bhi) if u.op is Ops.ADD else (min(c := (alo * blo, alo * bhi, ahi * blo, ahi * bhi)), max(c))
  return lo < I32_MIN or hi > I32_MAX


CACHE_LINE = 64   # bytes: a stream that moves less a step reads each line more than once (prefetch_bytes)


def _gcc(d: DType) -> str:
  """The GCC vector type of vector dtype d: f32xN, or i32xN for i32 and for bool (a mask). f16 is never vectorized."""
  if d.scalar() is dtypes.f16: raise BackendError(f"f16 values are never vectorized in C ({d.name}): lower this kernel without a vector axis")
  return f"{'f32' if d.scalar() is dtypes.f32 else 'i32'}x{d.count}"


class _Body:
  """The statements of one kernel, rendered in order (CRenderer.render's working state)."""
  def __init__(self, renderer: CRenderer, lin: tuple[UOp, ...], long_index: bool = False, streams: set[UOp] = frozenset()):
    self.renderer, self.lin = renderer, lin
    self.streams = streams        # the STOREs that go past the caches (see streams)
    # a kernel compiled as if with -fwrapv (CRenderer.chain_pragma), or with a loop of multiply-adds (render's `tile`,
    # CRenderer.long_tile_index), holds its loop counters and scalar i32 arithmetic in 64-bit longs: a wrapping 32-bit
    # index can't become a pointer step, and gcc sign-extended and recomputed every address of the window's loads at
    # each step (a 3 x 3 convolution's loop: 1150 instructions for 288 FMAs, 530 of them integer; with longs 606, and
    # the kernel 2.08 -> 1.96 ms). Every value is the same: the only i32 ops that can leave i32 (ADD and MUL, see
    # may_overflow) wrap through unsigned ints and give an int, and every other op of in-range operands stays in range
    self.long_index = long_index
    self.users = users_of(list(lin))
    # the loop depth of every node, to see which values are used deeper than where they are computed
    self.depth: dict[UOp, int] = {}
    d = 0
    for u in lin:
      if u.op is Ops.END: d -= 1
      self.depth[u] = d
      if u.op is Ops.RANGE: d += 1
    self.gathers = gathers(lin) if renderer.vector_code_for_op else {}
    self.gathered = {ld for v in self.gathers for ld in v.src if all(w in self.gathers for w in self.users.get(ld, ()))}
    self.r: dict[UOp, str] = {}
    self.lines: list[str] = []
    self.counter = {"v": 1, "acc": 0}
    self.dims = {AxisType.GLOBAL: 0, AxisType.LOCAL: 0}
    # the sizes of the launch grid's ranges, in range order (uopc.backends: the first is the most significant digit)
    self.grid = {kind: [bounds(u.src[0])[1] for u in sorted((u for u in lin if u.op is Ops.RANGE and u.arg.kind is kind), key=lambda r: r.arg)]
                 for kind in self.dims}
    self.shared, _ = shared_layout(lin)         # each shared ALLOC's byte offset in the block's shared memory
    self.stacks: dict[UOp, list[str]] = {}     # a STACK (a WMMA operand): its elements' expressions
    self.registers: dict[tuple[str, str], str] = {}   # (low half, high half) -> the 32-bit register an ldmatrix filled with them
    self.wide: dict[UOp, tuple[str, str]] = {}  # a vector INDEX: (its memory, its first element's index)
    self.blocks: list[bool] = []       # for each open RANGE: did it open a { block
    self.loops: list[UOp] = []         # the open RANGEs, innermost last
    self.lane_loops = False            # has an op on vectors been done lane by lane, in a loop (vector_alu)

  def ctype(self, u: UOp) -> str:
    # a scalar bool value is held in an int (0 or 1; memory stays _Bool): GCC 12 at -O2 miscompiles
    # ((a < b) & c) | (c != 1) with c a _Bool temporary, and gets it right with an int
    if u.dtype is dtypes.bool: return "int"
    return "long" if self.long_index and u.dtype is dtypes.i32 and u.op in ALU else self.renderer.type_name(u.dtype)

  # -- emitting
  def pad(self) -> str: return "  " * (sum(self.blocks) + 1)
  def var(self, prefix: str, u: UOp, expr: str) -> None:
    self.r[u] = f"{prefix}{self.counter['v']}"
    self.counter["v"] += 1
    self.lines.append(f"{self.pad()}{self.ctype(u)} {self.r[u]} = {expr};")

  def uses(self, u: UOp) -> list[UOp]:   # an INDEX is inlined into its LOAD/STORE, so its users are the value's users
    return [w for v in self.users.get(u, ()) for w in (self.uses(v) if v.op is Ops.INDEX else [v])]

  def value(self, u: UOp, expr: str) -> None:
    """u is the expression `expr`, pasted into its users, or a variable when it is used more than once, inside a deeper
    loop than where it is computed, is long (see MAX_INLINE), or is a step of a chain of multiply-adds: the linearizer
    lays a register tile's steps out in turns (uopc.linearize), and pasted into the next step each chain would be one
    expression again, one accumulator's whole chain after another's."""
    self.r[u] = expr
    us = self.uses(u)
    if len(us) > 1 or len(expr) > MAX_INLINE or any(self.depth[w] > self.depth[u] for w in us) or \
       (u.op is Ops.MULACC and any(w.op is Ops.MULACC and w.src[2] is u for w in us)): self.var("alu", u, expr)

  def emit(self, u: UOp) -> None:
    """Render one statement of the program: an ALU op is an expression (see value), every other op one of the
    statements below."""
    if u.op in ALU: self.value(u, self.alu(u))
    elif (statement := _Body.statements.get(u.op)) is not None: statement(self, u)
    else: raise BackendError(f"the C renderer has no rule for {u.op!r} (is the program lowered?)")

  def alu(self, u: UOp) -> str:
    """The expression of an ALU op: the renderer's code_for_op, except casts and floor division (which read their
    operands' types and bounds), f16 math (done in f32 and rounded back to f16) and vectors."""
    renderer, r, op = self.renderer, self.r, u.op
    if u.dtype.count > 1 or u.src[0].dtype.count > 1: return self.vector_alu(u)
    if op is Ops.CAST: return renderer.render_cast(u.src[0], u.dtype, r[u.src[0]])
    if op in (Ops.FLOORDIV, Ops.FLOORMOD): return self.divmod(u, r[u.src[0]], r[u.src[1]])
    if may_overflow(u): return f"((int)((unsigned){r[u.src[0]]}{'+' if op is Ops.ADD else '*'}(unsigned){r[u.src[1]]}))"
    if u.dtype is dtypes.f16 and op in _VIA_F32:
      return f"(({renderer.half})({renderer.code_for_op[op](dtypes.f32, *(f'((float){r[s]})' for s in u.src))}))"
    if op not in renderer.code_for_op: raise BackendError(f"the C renderer has no rule for {op!r}")
    code = renderer.code_for_op[op](u.dtype, *(r[s] for s in u.src))
    # every f16 result is rounded to f16 by a cast: gcc computes _Float16 arithmetic in float where the CPU has none of
    # its own (all but AVX512-FP16) and rounds only at a cast or an assignment, so an expression pasted into its user
    # kept float's bits ((float)(a * b + c) rounded once, not twice: acosh(|x| + 1) of f16 x was 7 f16 ulps off)
    return f"(({renderer.half}){code})" if u.dtype is dtypes.f16 else code

  def vector_alu(self, u: UOp) -> str:
    """An ALU op on vectors: the renderer's vector_code_for_op, else (a cast, a transcendental, floor division that
    bounds don't allow as C's) the scalar code on every lane, in a loop gcc unrolls."""
    op, d, srcs, renderer = u.op, u.dtype, u.src, self.renderer
    v = [self.r[s] for s in srcs]
    if op in (Ops.FLOORDIV, Ops.FLOORMOD) and vmin(srcs[0]) >= 0 and vmin(srcs[1]) > 0: return f"({v[0]}{'/' if op is Ops.FLOORDIV else '%'}{v[1]})"
    if may_overflow(u) and renderer.vector_code_for_op:      # the lanes wrap as unsigned ints (a bit-for-bit vector cast)
      u32 = f"u32x{d.count}"
      return f"(({_gcc(d)})(({u32}){v[0]}{'+' if op is Ops.ADD else '*'}({u32}){v[1]}))"
    if (rule := renderer.vector_code_for_op.get(op)) is not None: return rule(d, srcs[0].dtype, *v)
    if not renderer.vector_code_for_op: raise BackendError(f"{type(renderer).__name__} has no arithmetic on vectors ({op!r} of {d.name})")
    if op is Ops.CAST and srcs[0].dtype.scalar() is dtypes.bool and d.scalar() is dtypes.f32:    # a mask's -1 / 0 as 1.0f / 0.0f
      return f"(({_gcc(d)})({v[0]}&(i32x{d.count})bcast_f32x{d.count}(1.0f)))"
    args = [f"_a{i}" for i in range(len(srcs))]
    lane = [renderer.render_gep(a, s.dtype, "_l") for a, s in zip(args, srcs)]
    scalar = d.scalar()
    if op is Ops.CAST: code = renderer.render_cast(srcs[0], scalar, lane[0])
    elif op in (Ops.FLOORDIV, Ops.FLOORMOD): code = self.divmod(u, *lane)
    else: code = renderer.code_for_op[op](scalar, *lane)
    if scalar is dtypes.bool: code = f"-(int)({code})"
    decls = " ".join(f"{renderer.type_name(s.dtype)} {a} = {x};" for a, s, x in zip(args, srcs, v))
    self.lane_loops = True
    return f"({{ {decls} {renderer.type_name(d)} _r; for (int _l = 0; _l < {d.count}; _l++) _r[_l] = {code}; _r; }})"

  def divmod(self, u: UOp, a: str, b: str) -> str:
    if vmin(u.src[0]) >= 0 and vmin(u.src[1]) > 0: return f"({a}{'/' if u.op is Ops.FLOORDIV else '%'}{b})"
    return f"{'floordiv_i32' if u.op is Ops.FLOORDIV else 'floormod_i32'}({a}, {b})"

  # -- the statements: every op of a linearized program that is not ALU (the table `statements` below)
  def buffer(self, u: UOp) -> None: self.r[u] = memory_name(u)
  def const(self, u: UOp) -> None: self.r[u] = render_const(u.arg, u.dtype, self.renderer.half)
  def after(self, u: UOp) -> None: self.r[u] = self.r[u.src[0]]                 # memory, once its dependencies have run
  def stack(self, u: UOp) -> None: self.stacks[u] = [self.r[s] for s in u.src]   # a WMMA operand: its elements
  def barrier(self, u: UOp) -> None: self.lines.append(f"{self.pad()}{self.renderer.barrier}")
  def wmma(self, u: UOp) -> None: self.renderer.render_wmma(self, u)
  def vectorize(self, u: UOp) -> None:
    if (g := self.gathers.get(u)) is not None:
      index, stride = g
      self.value(u, f"gather_{_gcc(u.dtype)}({self.r[index.src[0]]}+{self.r[index.src[1]]}, {stride})")
      return
    expr = self.renderer.render_vectorize(u.dtype, [self.r[s] for s in u.src])
    # a constant vector, and one value broadcast to every lane, are pasted where they are used (gcc hoists them; a variable
    # outside a parallel loop would be a vector the threads share)
    if all(s.op is Ops.CONST for s in u.src) or all(s is u.src[0] for s in u.src): self.r[u] = expr
    else: self.value(u, expr)
  def gep(self, u: UOp) -> None: self.value(u, self.renderer.render_gep(self.r[u.src[0]], u.src[0].dtype, u.arg))

  def open_range(self, u: UOp) -> None:
    renderer, kind = self.renderer, u.arg.kind
    self.r[u] = f"ridx{u.arg.idx}"
    dim = self.dims.get(kind, 0)
    if kind in self.dims: self.dims[kind] += 1
    lines = renderer.range_code[kind](renderer, self.r[u], self.r[u.src[0]], dim, self.grid.get(kind, []))
    if self.long_index: lines = [line.replace(f"for (int {self.r[u]} = ", f"for (long {self.r[u]} = ") for line in lines]
    self.lines.extend(self.pad() + line for line in lines)
    self.blocks.append(kind in renderer.opens_block)
    self.loops.append(u)

  def close_range(self, u: UOp) -> None:
    self.loops.pop()
    if self.blocks.pop(): self.lines.append(f"{self.pad()}}}")

  def alloc(self, u: UOp) -> None:
    self.r[u] = f"acc{self.counter['acc']}"
    self.counter["acc"] += 1
    offset = self.shared.get(u, 0)
    self.lines.append(self.pad() + self.renderer.alloc_code[u.addrspace](self.renderer.type_name(u.dtype), self.r[u], u.arg.shape[0], offset))

  def index(self, u: UOp) -> None:
    if u.src[0].op is Ops.LDMATRIX:    # a half of the registers an ldmatrix filled
      self.r[u] = self.stacks[u.src[0]][u.src[1].arg]
      return
    r, mem = self.r, base_memory(u.src[0])
    if u.arg is not None: self.wide[u] = (r[u.src[0]], r[u.src[1]])
    else: r[u] = r[u.src[0]] if mem.op is Ops.ALLOC and mem.arg.shape[0] == 1 else f"{r[u.src[0]]}[{r[u.src[1]]}]"

  def load(self, u: UOp) -> None:
    if u in self.gathered: return    # a lane of a gather (see gathers), loaded by the gather alone
    at = u.src[0]
    self.var("val", u, self.renderer.vector_load(*self.wide[at], at.dtype) if at in self.wide else self.r[at])
    if at in self.wide and (ahead := self.prefetch_ahead(at)):
      mem, base = self.wide[at]
      self.lines.append(f"{self.pad()}__builtin_prefetch({mem}+{base}+{ahead});")

  def prefetch_ahead(self, at: UOp) -> int:
    """How many elements ahead of vector INDEX `at` to prefetch (see CRenderer.prefetch_bytes): 0 unless the innermost
    open loop is a reduction's and the address moves by a constant cache line or more at each of its steps."""
    ahead = self.renderer.prefetch_bytes
    if not ahead or not self.loops or self.loops[-1].arg.kind is not AxisType.REDUCE: return 0
    item = at.dtype.scalar().itemsize
    if (step := index_step(at.src[1], self.loops[-1])) is None or abs(step) * item < CACHE_LINE: return 0
    return step * max(1, ahead // (abs(step) * item))

  def store(self, u: UOp) -> None:
    target, value = u.src
    pad = self.pad()
    if u in self.streams:
      self.lines.append(f"{pad}stream_f32x16({self.wide[target][0]}+{self.wide[target][1]}, {self.r[value]});")
    elif target in self.wide: self.lines.extend(pad + line for line in self.renderer.vector_store(*self.wide[target], target.dtype, self.r[value]))
    else: self.lines.append(f"{pad}{self.r[target]} = {self.r[value]};")

  statements: dict[Ops, Callable[[_Body, UOp], None]] = {
    Ops.BUFFER: buffer, Ops.CONST: const, Ops.RANGE: open_range, Ops.END: close_range, Ops.ALLOC: alloc, Ops.AFTER: after,
    Ops.INDEX: index, Ops.LOAD: load, Ops.STORE: store, Ops.SINK: lambda body, u: None, Ops.BARRIER: barrier, Ops.STACK: stack,
    Ops.WMMA: wmma, Ops.VECTORIZE: vectorize, Ops.GEP: gep,
    **dict.fromkeys((Ops.ASYNC_COPY, Ops.ASYNC_COMMIT, Ops.ASYNC_WAIT, Ops.LDMATRIX), lambda body, u: body.renderer.render_async(body, u)),
  }


# ---- the backend ---------------------------------------------------------------------------------------------------

def _cpu_flags() -> set[str]:
  """The CPU's feature flags (what -march=native will use); empty when /proc/cpuinfo can't be read."""
  try: return set(Path("/proc/cpuinfo").read_text().split("flags")[1].split("\n")[0].split(":", 1)[-1].split())
  except (OSError, IndexError): return set()


def _cache_bytes(root: str = "/sys/devices/system/cpu/cpu0/cache") -> dict[str, int]:
  """The per-core data caches Linux describes ({"l1_bytes": ..., "l2_bytes": ...}, Caps' fields); those it can't read
  are left out, and Caps keeps its defaults for them."""
  out: dict[str, int] = {}
  for d in sorted(Path(root).glob("index*")):
    try: level, kind, size = ((d / f).read_text().strip() for f in ("level", "type", "size"))
    except OSError: continue
    scale = {"K": 1 << 10, "M": 1 << 20}.get(size[-1:], 1)
    try: n = int(size.rstrip("KM")) * scale
    except ValueError: continue
    if level == "1" and kind in ("Data", "Unified"): out["l1_bytes"] = n
    elif level == "2" and kind in ("Data", "Unified"): out["l2_bytes"] = n
  return {k: v for k, v in out.items() if v > 0}


def _threads() -> int:
  """The threads an OpenMP loop gets: OMP_NUM_THREADS when set, else the CPUs this process may run on."""
  try: return max(1, int(os.environ.get("OMP_NUM_THREADS", "").split(",")[0]))
  except ValueError: pass
  try: return max(1, len(os.sched_getaffinity(0)))
  except (AttributeError, OSError): return os.cpu_count() or 1


def _address(handle: np.ndarray) -> int:
  """The address of a handle's memory: through a ctypes view of its buffer, a sixth of the time of NumPy's .ctypes.data
  (1.8 us, 3 a GEMM's launch); .ctypes for what has no writable contiguous memory to view."""
  try: return _addressof(_c_char_view(handle))
  except (TypeError, ValueError, BufferError): return handle.ctypes.data   # read-only, strided, empty
_addressof, _c_char_view = ctypes.addressof, ctypes.c_char.from_buffer


def _aligned(n: int, dtype: np.dtype, alignment: int = 64) -> np.ndarray:
  """Memory for n elements starting on a 64-byte boundary (a cache line; NumPy's 16-byte default made the same kernel
  vary by 30% from run to run), not zeroed: a buffer from the pool holds its last owner's values anyway, and every
  kernel stores its whole output before anything reads it (a test runs programs on memory filled with NaN to hold them
  to it). Zeroing cost nanoGPT's plain step 100 ms of its 750: the step's temporaries outgrow the pool, and each step's
  fresh gigabyte was cleared by calloc. Under UOPC_SANITIZE it is zeros (a run that read unwritten memory would read the
  same each time), and the bytes around it are poisoned for ASan, so that an access just outside the buffer is reported
  as if the buffer were its own malloc."""
  nbytes = n * dtype.itemsize
  sanitized = sanitizing()
  poison = _asan_poison() if sanitized else None
  # at least 4 KiB under ASan: NumPy keeps small freed blocks for reuse without freeing them, poison and all
  raw = (np.zeros if sanitized else np.empty)(nbytes + alignment if poison is None else max(nbytes + alignment, 4096), np.uint8)
  offset = (-raw.ctypes.data) % alignment
  if poison is not None:
    poison(ctypes.c_void_p(raw.ctypes.data), ctypes.c_size_t(offset))
    poison(ctypes.c_void_p(raw.ctypes.data + offset + nbytes), ctypes.c_size_t(raw.nbytes - offset - nbytes))
  return raw[offset:offset + nbytes].view(dtype)


@functools.lru_cache(maxsize=None)
def _asan_poison():
  """ASan's __asan_poison_memory_region when its runtime is loaded in this process, else None."""
  try: fn = ctypes.CDLL(None).__asan_poison_memory_region
  except (OSError, AttributeError): return None
  fn.restype, fn.argtypes = None, [ctypes.c_void_p, ctypes.c_size_t]
  return fn


class CBackend:
  """The default backend: C functions compiled by gcc, over host memory (64-byte aligned NumPy arrays)."""
  name = "C"
  renderer = CRenderer()

  POOL_BYTES = 512 << 20    # freed buffers kept for reuse, by exact size: a training step allocates the same sizes again

  def __init__(self):
    self._pool: dict[tuple[int, str], list[np.ndarray]] = {}
    self._pooled = 0
    flags = _cpu_flags()
    # f32 lanes of the widest vector unit; 4 (SSE, NEON) when the flags can't tell
    width = 16 if "avx512f" in flags else 8 if "avx2" in flags or "avx" in flags else 4
    # AArch64 has 32 SIMD registers (v0-v31) of 4 lanes; on x86-64 Caps reads the count off the width (0): 32 with
    # AVX-512 (zmm0-31), else 16 (ymm0-15)
    registers = 32 if platform.machine() in ("aarch64", "arm64") else 0
    # GEMM operands read badly are packed into panels of 32 columns (two 16-lane vectors, four 8-lane ones) first
    # AVX-512's gathers load a transposed read's vector in one instruction (see gathers)
    self.caps = Caps(threads=_threads(), vector_width=width, vector_registers=registers, fma="fma" in flags, gemm_panel=32,
                     gather=width in GATHER_WIDTHS, **_cache_bytes())

  def compile(self, src: str, name: str) -> CProgram: return compiler.compile(src, sanitize_name(name))   # as the signature has it
  def compile_many(self, items: Sequence[tuple[str, str]]) -> list[CProgram]:
    return compiler.compile_many([(src, sanitize_name(name)) for src, name in items])
  def identity(self) -> str: return compiler.identity()   # what a measured choice of Opts depends on (uopc.search)
  def alloc(self, n: int, dtype: DType) -> np.ndarray:
    if dtype.fmt is None: raise BackendError(f"can't allocate {dtype} memory")
    if free := self._pool.get((n, dtype.fmt)):
      self._pooled -= free[-1].nbytes
      return free.pop()
    return _aligned(n, np.dtype(dtype.fmt))
  def free(self, handle: np.ndarray) -> None:
    # reused memory would hide a use after free. Without the ASan runtime loaded nothing sanitized can run (compile
    # refuses), so the environment is read only with it (os.environ's lookup was 2% of a plain GPT step's Python)
    if _asan_poison() is not None and sanitizing(): return
    if self._pooled + handle.nbytes <= self.POOL_BYTES and handle.base is not None:
      self._pool.setdefault((handle.size, handle.dtype.char), []).append(handle)
      self._pooled += handle.nbytes
  def copyin(self, handle: np.ndarray, array: np.ndarray) -> None: handle[...] = array
  def copyout(self, handle: np.ndarray) -> np.ndarray: return handle.copy()
  def launch(self, program: CProgram, handles: list[np.ndarray], global_size=None, local_size=None) -> None:
    if global_size or local_size: raise BackendError(f"{program.name}: the C backend has no launch grid (got {global_size}, {local_size})")
    fn = program.fn
    # pointers travel as c_void_p: without argtypes ctypes would pass a python int as a 32-bit C int
    if fn.argtypes is None: fn.argtypes = [ctypes.c_void_p] * len(handles)
    fn(*map(_address, handles))
  def synchronize(self) -> None: pass   # a C call returns when the kernel is done
  def graph(self, launches: list[tuple], slots: int) -> CGraph:
    """Launches that always run together, in order, as one C call: `launches` are (program, slots of its arguments,
    global size, local size), as launch takes them (see CGraph)."""
    for prog, _, global_size, local_size in launches:
      if global_size or local_size: raise BackendError(f"{prog.name}: the C backend has no launch grid (got {global_size}, {local_size})")
    return CGraph([p for p, *_ in launches], [list(a) for _, a, *_ in launches], slots)


class CGraph:
  """Launches that run together as one native call: a C function that calls each kernel in order, through a table of
  kernel pointers, with its arguments from a table of buffer pointers. `programs[i]` is launched on the handles of
  slots `args[i]`; calling the graph with every slot's handle runs them all (or `set` the slots that changed, then
  `run`). A ctypes call costs about 3 us and its arguments 1 us a pointer: a jitted step of 300 kernels paid a
  millisecond in Python, now one call. The source says only which slot goes where (no address), so every graph of one
  shape shares a compile-cache entry. The pointer of each slot is read again only when its handle changes: the handle
  last seen is known by a weak reference (a plain schedule's temporaries of the last run are not kept alive by it;
  the pool hands the same arrays to the next run, whose pointers are then not read again)."""
  def __init__(self, programs: list[CProgram], args: list[list[int]], slots: int):
    lines = []
    for i, (prog, arg) in enumerate(zip(programs, args)):
      if any(not 0 <= s < slots for s in arg): raise BackendError(f"graph: {prog.name} reads slot {max(arg)} of {slots}")
      sig = ", ".join(["void *"] * len(arg)) or "void"
      lines.append(f"  ((void (*)({sig}))k[{i}])({', '.join(f'b[{s}]' for s in arg)});   /* {prog.name} */")
    src = "void uopc_graph(void **restrict k, void **restrict b) {\n" + "\n".join(lines) + "\n}\n"
    self.programs = list(programs)   # their libraries stay loaded while the graph calls into them
    self.fn = compiler.compile(src, "uopc_graph").fn
    self.kernels = (ctypes.c_void_p * max(1, len(programs)))(*[ctypes.cast(p.fn, ctypes.c_void_p).value for p in programs])
    self.pointers = (ctypes.c_void_p * max(1, slots))()
    self.seen: list = [None] * slots

  def __call__(self, handles: list[np.ndarray]) -> None:
    """Run with every slot's handle."""
    for i, h in enumerate(handles): self.set(i, h)
    self.run()

  def set(self, i: int, handle: np.ndarray) -> None:
    """Slot i's handle for the runs from now on."""
    if (ref := self.seen[i]) is None or ref() is not handle:
      self.seen[i] = weakref.ref(handle)
      self.pointers[i] = _address(handle)

  def set_many(self, pairs: list[tuple[int, int]], table: list) -> None:
    """set(i, table[s].handle) for each (i, s) of `pairs`, `table` holding Buffers: a replay's slots in one loop."""
    seen, pointers = self.seen, self.pointers
    for i, s in pairs:
      handle = table[s].handle
      if (ref := seen[i]) is None or ref() is not handle:
        seen[i] = weakref.ref(handle)
        pointers[i] = _address(handle)

  def run(self) -> None: self.fn(self.kernels, self.pointers)


__all__ = ["CRenderer", "CBackend", "CCompiler", "CProgram", "CGraph", "compiler", "sanitize_name", "render_const", "HELPERS", "vector_helpers",
           "used_helpers", "shared_layout", "EXP2_POLY",
           "exp2_horner", "MATH_DECLS", "scalar_loop", "CFLAGS", "VECTORIZE_PRAGMA", "MATH_PRAGMA", "SANITIZE_FLAGS", "sanitizing",
           "MAX_INLINE"]
