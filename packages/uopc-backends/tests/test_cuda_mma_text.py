"""The CUDA text of a tensor-core kernel checked against the PTX ISA, without a GPU.

The emulator runs a kernel's lowered UOps, and the lowering's fragment table is checked against the emulator's: both
are uopc's. What runs on a device is the rendered source: the uopc_pack packings of the registers and the order of
the mma.sync operands. A renderer that swapped the halves of B's registers compiled to a valid cubin computing wrong
products, and every other test passed. Here the rendered source itself is run, statement by statement, for every
thread of its grid (a small interpreter for the statements the CUDA renderer prints, which refuses any other), with
each loaded value standing for the element it came from; every register of every mma.sync is mapped back to the
(row, column) of A, B and C/D it holds, and compared with the fragment tables of the PTX ISA ("Matrix Fragments for
mma.m16n8k16 with floating point type"), written out below cell by cell as its figures draw them.
"""
import re
from collections import defaultdict
import pytest
from uopc.uop import Ops, buf
from uopc.dtype import dtypes
from uopc.lowering import Opts, Ctx
from uopc.rangeify import lower
from uopc.linearize import linearize
from uopc.backends import LinearProgram, get_backend
from uopc.backends.cuda import CUDARenderer
from uopc.runtime import program_buffers, vectorized

# The ISA's figures, one line per row of the matrix, each cell "lane.element": the lane of the warp that holds the cell,
# and which of its elements (a0..a7, b0..b3, c0..c3) it is. Two f16 elements share a 32-bit register, the lower-numbered
# one in the low half: a0 and a1 are the first register of A, a2 and a3 the second, and so on.
A_FIGURE = """
  0.0   0.1   1.0   1.1   2.0   2.1   3.0   3.1   0.4   0.5   1.4   1.5   2.4   2.5   3.4   3.5
  4.0   4.1   5.0   5.1   6.0   6.1   7.0   7.1   4.4   4.5   5.4   5.5   6.4   6.5   7.4   7.5
  8.0   8.1   9.0   9.1  10.0  10.1  11.0  11.1   8.4   8.5   9.4   9.5  10.4  10.5  11.4  11.5
 12.0  12.1  13.0  13.1  14.0  14.1  15.0  15.1  12.4  12.5  13.4  13.5  14.4  14.5  15.4  15.5
 16.0  16.1  17.0  17.1  18.0  18.1  19.0  19.1  16.4  16.5  17.4  17.5  18.4  18.5  19.4  19.5
 20.0  20.1  21.0  21.1  22.0  22.1  23.0  23.1  20.4  20.5  21.4  21.5  22.4  22.5  23.4  23.5
 24.0  24.1  25.0  25.1  26.0  26.1  27.0  27.1  24.4  24.5  25.4  25.5  26.4  26.5  27.4  27.5
 28.0  28.1  29.0  29.1  30.0  30.1  31.0  31.1  28.4  28.5  29.4  29.5  30.4  30.5  31.4  31.5
  0.2   0.3   1.2   1.3   2.2   2.3   3.2   3.3   0.6   0.7   1.6   1.7   2.6   2.7   3.6   3.7
  4.2   4.3   5.2   5.3   6.2   6.3   7.2   7.3   4.6   4.7   5.6   5.7   6.6   6.7   7.6   7.7
  8.2   8.3   9.2   9.3  10.2  10.3  11.2  11.3   8.6   8.7   9.6   9.7  10.6  10.7  11.6  11.7
 12.2  12.3  13.2  13.3  14.2  14.3  15.2  15.3  12.6  12.7  13.6  13.7  14.6  14.7  15.6  15.7
 16.2  16.3  17.2  17.3  18.2  18.3  19.2  19.3  16.6  16.7  17.6  17.7  18.6  18.7  19.6  19.7
 20.2  20.3  21.2  21.3  22.2  22.3  23.2  23.3  20.6  20.7  21.6  21.7  22.6  22.7  23.6  23.7
 24.2  24.3  25.2  25.3  26.2  26.3  27.2  27.3  24.6  24.7  25.6  25.7  26.6  26.7  27.6  27.7
 28.2  28.3  29.2  29.3  30.2  30.3  31.2  31.3  28.6  28.7  29.6  29.7  30.6  30.7  31.6  31.7
"""
B_FIGURE = """
  0.0   4.0   8.0  12.0  16.0  20.0  24.0  28.0
  0.1   4.1   8.1  12.1  16.1  20.1  24.1  28.1
  1.0   5.0   9.0  13.0  17.0  21.0  25.0  29.0
  1.1   5.1   9.1  13.1  17.1  21.1  25.1  29.1
  2.0   6.0  10.0  14.0  18.0  22.0  26.0  30.0
  2.1   6.1  10.1  14.1  18.1  22.1  26.1  30.1
  3.0   7.0  11.0  15.0  19.0  23.0  27.0  31.0
  3.1   7.1  11.1  15.1  19.1  23.1  27.1  31.1
  0.2   4.2   8.2  12.2  16.2  20.2  24.2  28.2
  0.3   4.3   8.3  12.3  16.3  20.3  24.3  28.3
  1.2   5.2   9.2  13.2  17.2  21.2  25.2  29.2
  1.3   5.3   9.3  13.3  17.3  21.3  25.3  29.3
  2.2   6.2  10.2  14.2  18.2  22.2  26.2  30.2
  2.3   6.3  10.3  14.3  18.3  22.3  26.3  30.3
  3.2   7.2  11.2  15.2  19.2  23.2  27.2  31.2
  3.3   7.3  11.3  15.3  19.3  23.3  27.3  31.3
"""
C_FIGURE = """
  0.0   0.1   1.0   1.1   2.0   2.1   3.0   3.1
  4.0   4.1   5.0   5.1   6.0   6.1   7.0   7.1
  8.0   8.1   9.0   9.1  10.0  10.1  11.0  11.1
 12.0  12.1  13.0  13.1  14.0  14.1  15.0  15.1
 16.0  16.1  17.0  17.1  18.0  18.1  19.0  19.1
 20.0  20.1  21.0  21.1  22.0  22.1  23.0  23.1
 24.0  24.1  25.0  25.1  26.0  26.1  27.0  27.1
 28.0  28.1  29.0  29.1  30.0  30.1  31.0  31.1
  0.2   0.3   1.2   1.3   2.2   2.3   3.2   3.3
  4.2   4.3   5.2   5.3   6.2   6.3   7.2   7.3
  8.2   8.3   9.2   9.3  10.2  10.3  11.2  11.3
 12.2  12.3  13.2  13.3  14.2  14.3  15.2  15.3
 16.2  16.3  17.2  17.3  18.2  18.3  19.2  19.3
 20.2  20.3  21.2  21.3  22.2  22.3  23.2  23.3
 24.2  24.3  25.2  25.3  26.2  26.3  27.2  27.3
 28.2  28.3  29.2  29.3  30.2  30.3  31.2  31.3
"""


def figure(text: str, rows: int, cols: int, per_lane: int) -> dict[tuple[int, int], tuple[int, int]]:
  """(lane, element) -> (row, column) from a figure; each cell must be named exactly once."""
  cells = [line.split() for line in text.strip().splitlines()]
  assert len(cells) == rows and all(len(r) == cols for r in cells)
  where = {}
  for r, line in enumerate(cells):
    for c, cell in enumerate(line):
      lane, element = map(int, cell.split("."))
      assert (lane, element) not in where and 0 <= lane < 32 and 0 <= element < per_lane
      where[(lane, element)] = (r, c)
  assert len(where) == 32 * per_lane
  return where


A_AT, B_AT, C_AT = figure(A_FIGURE, 16, 16, 8), figure(B_FIGURE, 16, 8, 4), figure(C_FIGURE, 16, 8, 4)


# ---- running the rendered source, one thread at a time --------------------------------------------------------------

class Load:
  """A value loaded from a global buffer: which buffer (its slot) and which element."""
  __slots__ = ("slot", "at")
  def __init__(self, slot: int, at: int): self.slot, self.at = slot, at


class Out:
  """Element `element` (d0..d3) of the D operand of mma.sync number `call` (of this thread)."""
  __slots__ = ("call", "element")
  def __init__(self, call: int, element: int): self.call, self.element = call, element


EXPR = re.compile(r"^[\w\s()+*/%.-]+$")
MMA = "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32"


def index(expr: str) -> str:
  """A C index expression as Python: the grid's coordinates by name, C's / of non-negative ints as //."""
  assert EXPR.match(expr), f"an index this test can't read: {expr}"
  return expr.replace("blockIdx.x", "bx").replace("threadIdx.x", "tx").replace("/", "//")


def to_python(src: str) -> tuple[str, list[str]]:
  """The body of the rendered kernel as the body of a Python function of (bx, tx), and the mma.sync templates in order.
  Every line the CUDA renderer prints for a tensor-core GEMM has a rule here; any other line fails the test."""
  lines = src[src.index(") {\n") + 4:src.rindex("\n}")].splitlines()
  out, depth, templates, i = [], 1, [], 0
  emit = lambda text: out.append("  " * depth + text)
  while i < len(lines):
    line = lines[i].strip()
    i += 1
    if m := re.fullmatch(r"int (\w+) = (.+);", line): emit(f"{m[1]} = {index(m[2])}")
    elif m := re.fullmatch(r"(?:half|float) (\w+) = data(\d+)\[(.+)\];", line): emit(f"{m[1]} = Load({m[2]}, {index(m[3])})")
    elif m := re.fullmatch(r"(half|float)(2|4|8) (\w+) = \(\*\(\(\1\2\*\)\(data(\d+)\+(.+)\)\)\);", line):   # n neighbours at once
      emit(f"{m[3]} = [Load({m[4]}, {index(m[5])} + e) for e in range({m[2]})]")
    elif m := re.fullmatch(r"\*\(\((float|half)(2|4)\*\)\(data(\d+)\+(.+)\)\) = make_\1\2\(([\w, ]+)\);", line):
      emit(f"for e, v in enumerate([{m[5]}]): store({m[3]}, {index(m[4])} + e, v)")
    elif m := re.fullmatch(r"float (acc\d+)\[(\d+)\];", line): emit(f"{m[1]} = [None] * {m[2]}")
    elif m := re.fullmatch(r"(acc\d+)\[(\d)\] = 0\.0f;", line): emit(f"{m[1]}[{m[2]}] = 0.0")
    elif m := re.fullmatch(r"float (\w+) = (acc\d+)\[(\d)\];", line): emit(f"{m[1]} = {m[2]}[{m[3]}]")
    elif m := re.fullmatch(r"(acc\d+)\[(\d)\] = (wmma\d+)\[(\d)\];", line): emit(f"{m[1]}[{m[2]}] = {m[3]}[{m[4]}]")
    elif m := re.fullmatch(r"data(\d+)\[(.+)\] = (\w+);", line): emit(f"store({m[1]}, {index(m[2])}, {m[3]})")
    elif m := re.fullmatch(r"for \(int (\w+) = 0; \1 < (\d+); \1\+\+\) \{", line):
      emit(f"for {m[1]} in range({m[2]}):")
      depth += 1
    elif line == "}": depth -= 1
    elif m := re.fullmatch(r"float (wmma\d+)\[4\];", line):
      # the mma block: the registers packed from halves, the template, the outputs, the inputs
      block = " ".join(lines[j].strip() for j in range(i, i + 4))
      i += 4
      name = m[1]
      packs = re.fullmatch(r"\{ const unsigned _r\[6\] = \{(.*)\}; "
                           r'asm volatile\("([^"]*)" : (.*) : (.*)\); \}', block)
      assert packs, f"an mma block this test can't read: {block}"
      # an element of a vector of halves: half2's .x and .y (a vector load of two neighbours) are its elements 0 and 1
      lane = lambda v: re.sub(r"^(\w+)\.([xy])$", lambda g: f"{g[1]}[{'xy'.index(g[2])}]", v)
      pairs = [(lane(x), lane(y)) for x, y in re.findall(r"uopc_pack\(([\w.]+), ([\w.]+)\)", packs[1])]
      assert len(pairs) == 6 and packs[1].count("uopc_pack") == 6, packs[1]
      templates.append(packs[2])
      outputs = re.findall(r'"=f"\((\w+)\[(\d)\]\)', packs[3])
      inputs = re.findall(r'"(r|f)"\(([^)]*)\)', packs[4])
      assert [o[0] for o in outputs] == [name] * 4 and len(inputs) == 10, block
      regs = []
      for kind, arg in inputs:
        if kind == "r":
          r = re.fullmatch(r"_r\[(\d)\]", arg)
          assert r, arg
          regs.append("({}, {})".format(*pairs[int(r[1])]))     # a 32-bit register: (low half, high half)
        else: regs.append(arg)
      emit(f"{name} = mma({packs[2]!r}, {[int(o[1]) for o in outputs]}, [{', '.join(regs)}])")
    else: raise AssertionError(f"a line of the rendered kernel this test can't read: {line!r}")
  return "def thread(bx, tx):\n" + "\n".join(out) + "\n", templates


def run_rendered(src: str, blocks: int, threads: int):
  """Every thread of the grid through the rendered source: for each (block, thread), its mma.sync calls in order (the
  template, the order of the D outputs, the 10 input operands) and what it stored where."""
  code, _ = to_python(src)
  calls, stores = defaultdict(list), {}
  def mma(template, outs, operands):
    mine = calls[(bx_now[0], tx_now[0])]
    mine.append((template, outs, operands))
    # D's element e is asm operand operand_groups(template)[0][e], the output constraint that writes wmmaN[outs[that]]
    d = [None] * 4
    for e, number in enumerate(operand_groups(template)[0]): d[outs[number]] = Out(len(mine) - 1, e)
    return d
  def store(slot, at, value):
    assert (slot, at) not in stores, f"element {at} of data{slot} is stored twice"
    stores[(slot, at)] = (bx_now[0], tx_now[0], value)
  bx_now, tx_now = [0], [0]
  scope = {"Load": Load, "mma": mma, "store": store}
  exec(code, scope)
  for bx in range(blocks):
    for tx in range(threads):
      bx_now[0], tx_now[0] = bx, tx
      scope["thread"](bx, tx)
  return calls, stores


def render(m: int, n: int, k: int, opts: Opts) -> tuple[str, int, int]:
  """The CUDA source of an f16 GEMM (m x k by k x n, summed in f32) on tensor cores, and its grid (blocks, threads)."""
  a = buf(0, m * k, dtypes.f16).cast(dtypes.f32).reshape((m, 1, k)).expand((m, n, k))
  b = buf(1, k * n, dtypes.f16).cast(dtypes.f32).reshape((k, n)).permute((1, 0)).reshape((1, n, k)).expand((m, n, k))
  sink = lower((a * b).reduce(Ops.ADD, 1), buf(2, m * n), Ctx(opts=opts))
  lin = tuple(linearize(vectorized(sink, get_backend("CUDA"))))
  grid = {kind: 1 for kind in ("GLOBAL", "LOCAL")}
  for u in lin:
    if u.op is Ops.RANGE and u.arg.kind.name in grid: grid[u.arg.kind.name] *= int(u.src[0].arg)
  return CUDARenderer().render(LinearProgram("k", lin, tuple(program_buffers(lin)))), grid["GLOBAL"], grid["LOCAL"]


# ---- the checks ------------------------------------------------------------------------------------------------------

OPERANDS = re.compile(r"\{(%\d+(?:,%\d+)*)\}, \{(%\d+(?:,%\d+)*)\}, \{(%\d+(?:,%\d+)*)\}, \{(%\d+(?:,%\d+)*)\};")


def operand_groups(template: str) -> list[list[int]]:
  """The asm operand numbers of D, A, B and C in an mma.sync template, in the order the instruction takes them."""
  assert template.startswith(MMA + " "), template
  m = OPERANDS.fullmatch(template[len(MMA) + 1:])
  assert m, template
  return [[int(x[1:]) for x in group.split(",")] for group in m.groups()]


def fragments(call, lane: int):
  """One lane's view of one mma.sync: A's 8 and B's 4 elements (each a Load; element e is the low half of register e // 2
  when e is even, its high half when odd) and C's 4 inputs (asm operands %0..%3 are the outputs, %4.. the inputs)."""
  template, outs, inputs = call
  d, a, b, c = operand_groups(template)
  assert (len(d), len(a), len(b), len(c)) == (4, 4, 2, 4) and sorted(d) == [0, 1, 2, 3]
  operand = lambda number: inputs[number - 4]
  a_el = [half for reg in a for half in operand(reg)]
  b_el = [half for reg in b for half in operand(reg)]
  assert all(isinstance(x, Load) for x in a_el + b_el), f"lane {lane}: A or B takes something that is not a loaded element"
  return a_el, b_el, [operand(x) for x in c]


def check(src: str, blocks: int, threads: int, m: int, n: int, k: int) -> int:
  """Map every register of every mma.sync of every warp back to the cells of A (data0, m x k), B (data1, k x n) and
  C/D (data2, m x n) and compare them with the ISA's figures. Returns how many warp-wide mma.sync were checked."""
  calls, stores = run_rendered(src, blocks, threads)
  assert threads % 32 == 0
  checked = 0
  for bx in range(blocks):
    for warp in range(threads // 32):
      lanes = [calls[(bx, warp * 32 + lane)] for lane in range(32)]
      assert len({len(c) for c in lanes}) == 1, "the lanes of a warp issue different numbers of mma.sync"
      for j in range(len(lanes[0])):
        a_origin, b_origin = set(), set()
        for lane in range(32):
          a_el, b_el, c_in = fragments(lanes[lane][j], lane)
          for e, x in enumerate(a_el):
            assert x.slot == 0, f"lane {lane}: A's element {e} comes from data{x.slot}"
            row, col = divmod(x.at, k)
            fr, fc = A_AT[(lane, e)]
            a_origin.add((row - fr, col - fc))
          for e, x in enumerate(b_el):
            assert x.slot == 1, f"lane {lane}: B's element {e} comes from data{x.slot}"
            row, col = divmod(x.at, n)
            fr, fc = B_AT[(lane, e)]
            b_origin.add((row - fr, col - fc))
          # C's element e is this accumulator's element e: zero at the first step, else D's element e of the last one
          for e, x in enumerate(c_in):
            assert x == 0.0 or (isinstance(x, Out) and x.element == e), f"lane {lane}: C's element {e} is not the accumulator's"
        # one 16x16 tile of A and one 16x8 of B, at the same step along k, each element where the figures put it
        assert len(a_origin) == 1 and len(b_origin) == 1, (bx, warp, j, sorted(a_origin)[:4], sorted(b_origin)[:4])
        (ar, ak), (bk, bc) = a_origin.pop(), b_origin.pop()
        assert ar % 16 == 0 and ak % 16 == 0 and bk == ak and bc % 8 == 0, (ar, ak, bk, bc)
        for lane in range(32): calls[(bx, warp * 32 + lane)][j] += ((ar, bc),)
        checked += 1
  # D: each stored output is element e of some mma.sync's D, at the cell of the C figure, from that call's tile origin
  assert {at for slot, at in stores} == set(range(m * n)) and {slot for slot, _ in stores} == {2}
  for (slot, at), (bx, tx, value) in stores.items():
    assert isinstance(value, Out), f"element {at} of the output is not an mma.sync's result"
    origin_row, origin_col = calls[(bx, tx)][value.call][3]
    row, col = C_AT[(tx % 32, value.element)]
    assert divmod(at, n) == (origin_row + row, origin_col + col), (bx, tx, value.element, divmod(at, n))
  return checked


def test_the_figures_are_the_isas_layout_as_a_formula_states_it():
  # the ISA's text beside its figures: groupID = lane >> 2, threadID_in_group = lane % 4 ...
  for lane in range(32):
    g, t = lane >> 2, lane % 4
    for i in range(8): assert A_AT[(lane, i)] == (g + 8 * (i in (2, 3, 6, 7)), t * 2 + (i & 1) + 8 * (i >= 4))
    for i in range(4): assert B_AT[(lane, i)] == (t * 2 + (i & 1) + 8 * (i >= 2), g)
    for i in range(4): assert C_AT[(lane, i)] == (g + 8 * (i >= 2), t * 2 + (i & 1))


def test_one_warps_mma_registers_hold_the_cells_the_ptx_isa_says():
  src, blocks, threads = render(16, 8, 16, Opts(gpu=True, tc=True))
  assert (blocks, threads) == (1, 32)
  assert check(src, blocks, threads, 16, 8, 16) == 1


@pytest.mark.parametrize("m, n, k, opts", [
  (128, 64, 32, Opts(gpu=True, tc=True, local={0: 2, 1: 2}, upcast={0: 2, 1: 2})),     # 4 blocks of 4 warps, 2x2 tiles, 2 steps
  (64, 128, 48, Opts(gpu=True, tc=True, local={1: 2}, upcast={0: 2, 1: 1})),
], ids=["2x2-warps-2x2-tiles", "1x2-warps-2x1-tiles"])
def test_every_mma_of_a_multi_block_multi_warp_gemm_holds_the_cells_the_ptx_isa_says(m, n, k, opts):
  src, blocks, threads = render(m, n, k, opts)
  assert blocks > 1 and threads > 32
  assert check(src, blocks, threads, m, n, k) == blocks * threads // 32 * (k // 16) * dict(opts.upcast).get(0, 1) * dict(opts.upcast).get(1, 1)


def test_a_renderer_that_swaps_bs_halves_is_caught(monkeypatch):
  """The mutation the emulator can't see: B's registers packed high half first. Its cubin is valid; its products are not."""
  original = CUDARenderer.render_wmma
  def swapped(self, body, u):
    original(self, body, u)
    line = next(i for i in range(len(body.lines) - 1, -1, -1) if "const unsigned _r[6]" in body.lines[i])
    packs = re.findall(r"uopc_pack\(([\w.]+), ([\w.]+)\)", body.lines[line])
    for lo, hi in packs[4:]: body.lines[line] = body.lines[line].replace(f"uopc_pack({lo}, {hi})", f"uopc_pack({hi}, {lo})")
  monkeypatch.setattr(CUDARenderer, "render_wmma", swapped)
  src, blocks, threads = render(16, 8, 16, Opts(gpu=True, tc=True))
  with pytest.raises(AssertionError, match=r"\(0, 0, 0, \["): check(src, blocks, threads, 16, 8, 16)
