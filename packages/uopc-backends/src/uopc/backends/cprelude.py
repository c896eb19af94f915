"""The pieces of C a kernel's prelude is made of, for uopc.backends.c's renderer (and CUDA's, which takes some of them).

    HELPERS, vector_helpers(w)   (a pattern that finds a use, the code): math declarations, floor division, exp2, and
                                 for GCC vectors of w lanes their types, broadcast, select, fma, sqrt, exp2 and gathers
    used_helpers(helpers, code)  the pieces `code` uses, with what they use in turn, in their order
    gathers(lin)                 the VECTORIZEs of a linearized program that one gather instruction loads

A kernel's prelude holds only the pieces its code uses: a kernel without exp2 has no exp2 polynomial, one without
vectors no vector types. x86 instructions come from gcc's builtins behind the ISA's predefined macro (immintrin.h
would cost 0.15 s of every compile to parse), with a lane-by-lane loop elsewhere.
"""
from __future__ import annotations
import re
from typing import Sequence
from uopc.uop import UOp, Ops
from uopc.dtype import dtypes, I32_MAX
from uopc.backends import base_memory
from uopc.backends.ccompiler import INLINE


# 2**x in f32 to within an ulp (libm's exp2f is 0.5 ulp but a call per element, and per lane of a vector): round x to
# an integer n, a degree-6 polynomial for 2**f on f = x - n in [-0.5, 0.5] (a relative fit, error 1.9e-9) by Horner's
# rule in fused multiply-adds, times 2**n built from exponent bits in two factors so that subnormal results round once.
# The vector version below does the same operations on every lane in the same order, so scalar and vector code give the
# same bits. x is clamped to [-160, 160] first, which NaN passes through. (Each step a multiply and an add, rounded
# twice, was a fifth more work: an attention's softmax, exp(x - max) over 512 x 512, 65 -> 51 us a pass.) From x <= -150
# down the result is +0 (2**-150 rounds to even, 0): given as such, never made by a scaling that underflows, which the
# x86 cores run in a microcode assist of about a hundred cycles: a causal softmax's masked half (exp of -inf) took 20x
# longer than its other half (the default GPT's (16, 4, 64, 64) exps 485 -> 25 us a layer)
EXP2_POLY = (1.0, 0.6931471824645996, 0.24022646248340607, 0.05550329014658928, 0.009618489071726799, 0.0013399907620623708,
             0.00015345732390414923)


def exp2_horner(fma: str, const: str = "") -> str:
  """The polynomial's steps after its leading coefficient, highest degree first: `p = fma(p, f, c);` with `fma` the
  fused multiply-add's name and `const` what makes a coefficient its operand (a vector's broadcast)."""
  return "".join(f" p = {fma}(p, f, {const}({repr(c)}f));" for c in EXP2_POLY[-2::-1])


EXP2_SCALAR = f"""{INLINE} float uopc_exp2(float x) {{    /* 2**x to an ulp, see EXP2_POLY in uopc.backends.c */
  x = x < -160.0f ? -160.0f : x; x = x > 160.0f ? 160.0f : x;
  if (x <= -150.0f) return 0.0f;
  float t = (x + 12582912.0f) - 12582912.0f, f = x - t, p = {repr(EXP2_POLY[-1])}f;{exp2_horner("__builtin_fmaf")}
  int n = t == t ? (int)t : 0, a = n >> 1, b = n - a;
  union {{ int i; float f; }} sa = {{(a + 127) << 23}}, sb = {{(b + 127) << 23}};
  return (p * sa.f) * sb.f;
}}
"""
FLOORDIV_I32 = INLINE + """ int floordiv_i32(int a, int b) {
  if (b == 0) return 0;                               /* numpy's x // 0 */
  if (b == -1) return (int)(0u - (unsigned)a);        /* INT_MIN // -1 wraps, it does not trap */
  int q = a / b;
  return q - ((a % b != 0) & ((a < 0) != (b < 0)));
}
"""
FLOORMOD_I32 = INLINE + """ int floormod_i32(int a, int b) {
  if (b == 0 || b == -1) return 0;
  int r = a % b;
  return r + ((r != 0) & ((r < 0) != (b < 0))) * b;
}
"""
CAST_F32_I32 = INLINE + """ int cast_f32_i32(float x) {
  /* C leaves NaN and out-of-range undefined; uopc says INT_MIN */
  return (x >= -2147483648.0f && x < 2147483648.0f) ? (int)x : (-2147483647-1);
}
"""

# The prelude's pieces, in the order they are written: (a pattern that finds a use, the code). A kernel's prelude holds
# the pieces its code uses, and those the pieces it holds use in turn (a piece uses only pieces before it).
# The libm names a kernel uses, declared as <math.h> declares them (gcc takes each for its builtin: sqrtf is one
# instruction under -fno-math-errno, the same machine code as with the header), without the header: parsing <math.h>
# was 8 ms of gcc's CPU for each source that used one of them (every batch of a training step's kernels).
MATH_DECLS = ('#define NAN (__builtin_nanf(""))\n#define INFINITY (__builtin_inff())\n'
              "float fmaf(float, float, float); float log2f(float); float sqrtf(float); float sinf(float);\n")
HELPERS: list[tuple[str, str]] = [
  (r"\b(?:NAN|INFINITY|fmaf|log2f|sqrtf|sinf)\b", MATH_DECLS),
  (r"\bfloordiv_i32\b", FLOORDIV_I32), (r"\bfloormod_i32\b", FLOORMOD_I32), (r"\bcast_f32_i32\b", CAST_F32_I32),
  (r"\buopc_exp2\b", EXP2_SCALAR),
]


def _isa_or_lanes(w: int, isa: dict[int, tuple[str, str]], lane: str) -> str:
  """A helper's body on w lanes: the x86 builtin isa[w] where the compiler targets its ISA (isa[w][0], a predefined
  macro), else the scalar expression `lane` on every lane l."""
  lanewise = f"f32x{w} r; for (int l = 0; l < {w}; l++) r[l] = {lane}; return r;"
  if w not in isa: return f" {lanewise} "
  macro, builtin = isa[w]
  return f"\n#if defined(__x86_64__) && defined({macro})\n  return {builtin};\n#else\n  {lanewise}\n#endif\n"


_X86_AVX512 = "#if defined(__x86_64__) && defined(__AVX512F__) && !defined(__SANITIZE_ADDRESS__)"

# exp2's rounding of x to an integer t and its p * 2**t on w lanes: AVX-512's instructions for them (at 8 and 4 lanes
# with its VL extension), else what uopc_exp2 does (see EXP2_POLY)
# (the scaling masked to the lanes above -150 and NaN, compare predicate 6: not less or equal, unordered true; a masked
# lane is +0 from the zero vector and raises nothing, so takes no assist)
_EXP2_ISA = {16: ("__AVX512F__", "__builtin_ia32_rndscaleps_mask(x, 0, x, (unsigned short)-1, 4)",
                  "__builtin_ia32_scalefps512_mask(p, t, (f32x16){}, "
                  "__builtin_ia32_cmpps512_mask(x, bcast_f32x16(-150.0f), 6, (unsigned short)-1, 4), 4)"),
             8: ("__AVX512VL__", "__builtin_ia32_rndscaleps_256_mask(x, 0, x, (unsigned char)-1)",
                 "__builtin_ia32_scalefps256_mask(p, t, (f32x8){}, __builtin_ia32_cmpps256_mask(x, bcast_f32x8(-150.0f), 6, (unsigned char)-1))"),
             4: ("__AVX512VL__", "__builtin_ia32_rndscaleps_128_mask(x, 0, x, (unsigned char)-1)",
                 "__builtin_ia32_scalefps128_mask(p, t, (f32x4){}, __builtin_ia32_cmpps128_mask(x, bcast_f32x4(-150.0f), 6, (unsigned char)-1))")}


def _exp2_step(w: int, which: int, plain: str) -> str:
  """exp2's rounding (which = 1) or scaling (2) on w lanes: AVX-512's instruction for it where the compiler targets it
  (_EXP2_ISA), else the C of `plain`."""
  if w not in _EXP2_ISA: return plain
  macro, isa = _EXP2_ISA[w][0], _EXP2_ISA[w][which]
  code = f"  f32x{w} t = {isa};\n" if which == 1 else f"  return {isa};\n"
  return f"#if defined(__x86_64__) && defined({macro})\n{code}#else\n{plain}#endif\n"


def vector_helpers(w: int) -> list[tuple[str, str]]:
  """The prelude's pieces for GCC vectors of w lanes: the types (a bool vector is a mask of ints, -1 true and 0 false,
  which is what vector comparisons give), unaligned views for moves at any element, and broadcast, select, exp2 and
  fused multiply-add."""
  nb = w * 4
  # gcc's own builtins for the x86 fused multiply-adds: immintrin.h would cost 0.15 s of every compile to parse
  fma = _isa_or_lanes(w, {16: ("__AVX512F__", "__builtin_ia32_vfmaddps512_mask(a, b, c, (unsigned short)-1, 4)"),
                          8: ("__FMA__", "__builtin_ia32_vfmaddps256(a, b, c)"), 4: ("__FMA__", "__builtin_ia32_vfmaddps(a, b, c)")},
                      "fmaf(a[l], b[l], c[l])")
  # and for the square root (correctly rounded, as sqrtf): a lane loop only gcc's vectorizer would make one instruction
  sqrt = _isa_or_lanes(w, {16: ("__AVX512F__", "__builtin_ia32_sqrtps512_mask(x, x, (unsigned short)-1, 4)"),
                           8: ("__AVX__", "__builtin_ia32_sqrtps256(x)"), 4: ("__SSE__", "__builtin_ia32_sqrtps(x)")}, "sqrtf(x[l])")
  clamp = _isa_or_lanes(w, {16: ("__AVX512F__", "__builtin_ia32_minps512_mask(bcast_f32x16(160.0f), __builtin_ia32_maxps512_mask("
                                                  "bcast_f32x16(-160.0f), x, x, (unsigned short)-1, 4), x, (unsigned short)-1, 4)"),
                              8: ("__AVX__", "__builtin_ia32_minps256(bcast_f32x8(160.0f), __builtin_ia32_maxps256(bcast_f32x8(-160.0f), x))"),
                              4: ("__SSE__", "__builtin_ia32_minps(bcast_f32x4(160.0f), __builtin_ia32_maxps(bcast_f32x4(-160.0f), x))")},
                         "x[l] < -160.0f ? -160.0f : x[l] > 160.0f ? 160.0f : x[l]")
  # exp2's rounding to an integer by the 1.5 * 2**23 trick and its 2**n in two factors from exponent bits (see
  # EXP2_POLY), where there are no vrndscaleps and vscalefps
  rounded = f"  f32x{w} t = (x + 12582912.0f) - 12582912.0f;\n"
  # (2**n left 1 on the lanes at -150 or below, then +0 selected there: no product underflows, see EXP2_POLY)
  scale = (f"  i32x{w} live = (x > -150.0f) | (x != x);\n"
           f"  i32x{w} n = __builtin_convertvector(sel_f32x{w}(t == t, t, bcast_f32x{w}(0.0f)), i32x{w}) & live, a = n >> 1, b = n - a;\n"
           f"  return sel_f32x{w}(live, (p * (f32x{w})((a + 127) << 23)) * (f32x{w})((b + 127) << 23), bcast_f32x{w}(0.0f));\n")
  name = lambda n: rf"(?<![A-Za-z0-9]){n}(?![A-Za-z0-9])"    # f32x8 in bcast_f32x8 and f32x8_u too, never in f32x16
  return [
    (name(f"i32x{w}"), f"typedef int i32x{w} __attribute__((vector_size({nb})));\n"),
    (name(f"u32x{w}"), f"typedef unsigned u32x{w} __attribute__((vector_size({nb})));\n"),
    (name(f"f32x{w}"), f"typedef float f32x{w} __attribute__((vector_size({nb})));\n"),
    # unaligned views for vector loads and stores at any element (aligned(4)), that may alias the buffer's floats
    (rf"\bf32x{w}_u\b", f"typedef float f32x{w}_u __attribute__((vector_size({nb}), aligned(4), may_alias));\n"),
    (rf"\bi32x{w}_u\b", f"typedef int i32x{w}_u __attribute__((vector_size({nb}), aligned(4), may_alias));\n"),
    # x - (+0) is x for every x, -0.0 and NaN included (x + 0 would turn -0.0 into +0.0)
    (rf"\bbcast_f32x{w}\b", f"{INLINE} f32x{w} bcast_f32x{w}(float x) {{ return x - (f32x{w}){{}}; }}\n"),
    (rf"\bbcast_i32x{w}\b", f"{INLINE} i32x{w} bcast_i32x{w}(int x) {{ return x - (i32x{w}){{}}; }}\n"),
    (rf"\bsel_f32x{w}\b",
     f"{INLINE} f32x{w} sel_f32x{w}(i32x{w} m, f32x{w} a, f32x{w} b) "
     f"{{ return (f32x{w})((m & (i32x{w})a) | (~m & (i32x{w})b)); }}\n"),
    (rf"\bsel_i32x{w}\b",
     f"{INLINE} i32x{w} sel_i32x{w}(i32x{w} m, i32x{w} a, i32x{w} b) {{ return (m & a) | (~m & b); }}\n"),
    (rf"\bfma_f32x{w}\b", f"{INLINE} f32x{w} fma_f32x{w}(f32x{w} a, f32x{w} b, f32x{w} c) {{{fma}}}\n"),
    (rf"\bsqrt_f32x{w}\b", f"{INLINE} f32x{w} sqrt_f32x{w}(f32x{w} x) {{{sqrt}}}\n"),
    # x clamped to [-160, 160], NaN passed through, as uopc_exp2's selects: x86's max and min return their second
    # operand, x, where either is NaN (two instructions where the selects were six)
    (rf"\bclamp160_f32x{w}\b", f"{INLINE} f32x{w} clamp160_f32x{w}(f32x{w} x) {{{clamp}}}\n"),
    # uopc_exp2 on every lane, operation for operation (see EXP2_POLY); with AVX-512 the rounding is one instruction
    # (vrndscaleps, to nearest even as the 1.5 * 2**23 trick) and so is 2**n (vscalefps, exact or rounded once as the two
    # factors), the same bits for every one of the 2**32 floats, in 13 instructions where there were 22 (they all share
    # two ports: an attention's exp(s - max) over 512 x 512, 40 -> 25 us)
    (rf"\bexp2_f32x{w}\b", f"{INLINE} f32x{w} exp2_f32x{w}(f32x{w} x) {{\n"
     f"  x = clamp160_f32x{w}(x);\n"
     f"{_exp2_step(w, 1, rounded)}"
     f"  f32x{w} f = x - t, p = bcast_f32x{w}({repr(EXP2_POLY[-1])}f);{exp2_horner(f'fma_f32x{w}', f'bcast_f32x{w}')}\n"
     f"{_exp2_step(w, 2, scale)}}}\n"),
  ] + ([
    # 16 elements `s` apart from p on (see gathers): AVX-512's gather, one instruction where 16 scalar loads were each
    # moved into a lane; lane by lane elsewhere and under AddressSanitizer, which sees no instruction it didn't emit
    *((rf"\bgather_{t}x16\b", f"{INLINE} {t}x16 gather_{t}x16(const {c} *p, int s) {{\n{_X86_AVX512}\n"
       f"  return __builtin_ia32_gathersiv16{k}(({t}x16){{}}, p, (i32x16){{{', '.join(map(str, range(16)))}}} * s, (unsigned short)-1, 4);\n"
       f"#else\n  {t}x16 r; for (int l = 0; l < 16; l++) r[l] = p[l * s]; return r;\n#endif\n}}\n")
      for t, c, k in (("f32", "float", "sf"), ("i32", "int", "si"))),
    # a vector stored past the caches, to a 64-byte aligned address (see uopc.backends.c's streams), and the fence
    # that orders such stores before the kernel returns; ordinary stores elsewhere and under AddressSanitizer
    (r"\bstream_f32x16\b", f"{INLINE} void stream_f32x16(float *p, f32x16 v) {{\n{_X86_AVX512}\n"
     "  __builtin_ia32_movntps512(p, v);\n#else\n  *(f32x16 *)p = v;\n#endif\n}\n"),
    (r"\bstream_fence\b", f"{INLINE} void stream_fence(void) {{\n{_X86_AVX512}\n  __builtin_ia32_sfence();\n#endif\n}}\n"),
    # 16 bools (bytes, 0 or 1) as a mask: AVX-512's zero-extending byte -> int move (gcc's __builtin_convertvector
    # makes 16 scalar loads of it), negated to 0 / -1
    (r"\bldmask_i32x16\b", "typedef char c8x16_u __attribute__((vector_size(16), aligned(1), may_alias));\n"
     f"{INLINE} i32x16 ldmask_i32x16(const _Bool* p) {{\n#if defined(__x86_64__) && defined(__AVX512F__)\n"
     "  return -(i32x16)__builtin_ia32_pmovzxbd512_mask(*(const c8x16_u*)p, (i32x16){}, (unsigned short)-1);\n#else\n"
     "  i32x16 r; for (int l = 0; l < 16; l++) r[l] = -(int)p[l]; return r;\n#endif\n}\n"),
  ] if w == 16 else [])


def used_helpers(helpers: list[tuple[str, str]], code: str) -> str:
  """The pieces of `helpers` that `code` uses, with what they use in turn, in their order. Every pattern matches inside one
  run of word characters and looks no further than its ends (\b, or a lookaround for a letter or digit), so it is
  looked for among the distinct words of the code, not in the code itself: every pattern searching a GEMM kernel's 50
  KB of source was 80 ms of a cold GPT step's planning."""
  chosen = []
  words = "\n".join(set(re.findall(r"\w+", code)))
  for pattern, piece in reversed(helpers):
    if re.search(pattern, words):
      chosen.append(piece)
      words += "\n" + "\n".join(set(re.findall(r"\w+", piece)))
  return "".join(reversed(chosen))


GATHER_WIDTHS = (16,)      # vectors of these many lanes load a VECTORIZE of evenly spaced elements with a gather (AVX-512's)


def gathers(lin: Sequence[UOp]) -> dict[UOp, tuple[UOp, int]]:
  """The VECTORIZEs of the linearized program `lin` that are gathers: the f32 or i32 lanes (GATHER_WIDTHS of them) are
  LOADs of one BUFFER at addresses a, a + s, a + 2s, ... for a constant s other than 0 and 1 (uopc.vectorize makes such a
  VECTORIZE of a vector lane whose address jumps: k's gradient read transposed, a panel's column). Each maps to (lane 0's
  INDEX, s); the renderer loads it with one gather instruction (gather_f32x16) instead of w loads moved into lanes one by
  one, and leaves out the lanes' own loads where nothing else reads them. None of the BUFFER's stores may lie between
  the first lane's load and the VECTORIZE, where the gather loads."""
  out: dict[UOp, tuple[UOp, int]] = {}
  position = {u: i for i, u in enumerate(lin)}
  stores: dict[UOp, list[int]] = {}
  for i, u in enumerate(lin):
    if u.op is Ops.STORE: stores.setdefault(base_memory(u.src[0].src[0]) if u.src[0].op is Ops.INDEX else u.src[0], []).append(i)
  for v in lin:
    if v.op is not Ops.VECTORIZE or v.dtype.count not in GATHER_WIDTHS or v.dtype.scalar() not in (dtypes.f32, dtypes.i32): continue
    loads = v.src
    if not all(ld.op is Ops.LOAD and ld.src[0].op is Ops.INDEX and ld.src[0].arg is None and len(ld.src[0].src) == 2 for ld in loads): continue
    mem = loads[0].src[0].src[0]
    if mem.op is not Ops.BUFFER or any(ld.src[0].src[0] is not mem for ld in loads): continue
    parts = [_offset(ld.src[0].src[1]) for ld in loads]
    base, k0 = parts[0]
    stride = parts[1][1] - k0
    if stride in (0, 1) or abs(stride) * (len(loads) - 1) > I32_MAX or any(p != (base, k0 + c * stride) for c, p in enumerate(parts)): continue
    first = min(position[ld] for ld in loads)
    if any(first < i < position[v] for i in stores.get(mem, ())): continue
    out[v] = (loads[0].src[0], stride)
  return out


def _offset(address: UOp) -> tuple[UOp | None, int]:
  """address as (its part that is not a constant, the constant added to it): x + 12 is (x, 12), 7 is (None, 7)."""
  if address.op is Ops.CONST: return None, address.arg
  if address.op is Ops.ADD:
    a, b = address.src
    if b.op is Ops.CONST: return a, b.arg
    if a.op is Ops.CONST: return b, a.arg
  return address, 0


__all__ = ["EXP2_POLY", "exp2_horner", "EXP2_SCALAR", "FLOORDIV_I32", "FLOORMOD_I32", "CAST_F32_I32", "MATH_DECLS", "HELPERS",
           "vector_helpers", "used_helpers", "GATHER_WIDTHS", "gathers"]
