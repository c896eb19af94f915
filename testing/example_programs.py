"""Example programs shared by the packages' test suites: the lowered rowsum listing, the movement-op GEMM,
the syllabus program (.uir text), and small shaped programs (row sums, sub-max, neighbours, conv1d) over BUFFERs."""
from uopc.uop import UOp, Ops, buf

# seed 6.7: the row sum of a 3x4 matrix, already lowered: data1[i] = sum_j data0[i*4 + j]
ROWSUM_UIR = """%0 = buffer 3 : dtype=f32 slot=1
%1 = range 3 : idx=0 kind=loop
%2 = index %0, %1
%3 = alloc 1 : dtype=f32 slot=0
%4 = after %3, %1
%5 = index %4, 0
%6 = store %5, 0.0
%7 = range 4 : idx=1 kind=reduce
%8 = after %4, %6, %7
%9 = index %8, 0
%10 = load %9
%11 = buffer 12 : dtype=f32 slot=0
%12 = mul %1, 4
%13 = add %12, %7
%14 = index %11, %13
%15 = load %14
%16 = add %10, %15
%17 = store %9, %16
%18 = end %17, %7
%19 = after %4, %18
%20 = index %19, 0
%21 = load %20
%22 = store %2, %21
%23 = end %22, %1
%24 = sink %23
"""


def gemm_uir(n: int) -> str:
  """C = A @ B for row-major A, B: A as (n, 1, n), B transposed as (1, n, n), multiplied, the last axis summed."""
  return f"""
%0 = buffer {n*n} : dtype=f32 slot=0
%1 = buffer {n*n} : dtype=f32 slot=1
%2 = reshape %0, ({n}, 1, {n})
%3 = reshape %1, ({n}, {n})
%4 = permute %3, (1, 0)
%5 = reshape %4, (1, {n}, {n})
%6 = mul %2, %5
%7 = reduce %6 : op=add pop=1
"""


def syllabus_uir(n: int) -> str:
  """The syllabus' gemm_NxN.uir, which computes A * rowsum(B), not a GEMM."""
  return f"""# gemm_{n}x{n}.uir
%0 = buffer {n*n} : dtype=f32 slot=0
%1 = buffer {n*n} : dtype=f32 slot=1
%2 = reshape %0, ({n}, {n}, 1)
%3 = reshape %1, ({n}, 1, {n})
%4 = mul %2, %3
%5 = reduce %4 : op=add pop=1
"""



def view_chain() -> UOp:
  """rows 1..2 of a (3, 4) matrix's transpose, times a broadcast length-3 vector (BUFFERs 0 and 1)."""
  m = buf(0, 12).reshape((3, 4))
  rows = m.permute((1, 0)).shrink(((1, 3), (0, 3)))                         # (2, 3)
  return rows * buf(1, 3).reshape((1, 3)).expand((2, 3))


def row_max(m: UOp) -> UOp:
  """The max of each row of a 2-D m, broadcast back over the row."""
  rows, cols = m.shape
  return m.reduce(Ops.MAX, 1).reshape((rows, 1)).expand((rows, cols))


def sub_max() -> UOp:
  """x - max(x, axis=1) on a (3, 4) BUFFER 0: the first half of a softmax."""
  m = buf(0, 12).reshape((3, 4))
  return m - row_max(m)


def sub_max_through_a_flatten() -> UOp:
  """sub_max on a (4, 4) matrix, flattened and unflattened afterwards: the index reaching the reduce is
  ((i*4 + j) // 4) % 4, which mentions j but is i (simplify must see that, or the reduce is recomputed per j)."""
  m = buf(0, 16).reshape((4, 4))
  return (m - row_max(m)).reshape((16,)).reshape((4, 4))


def neighbors() -> UOp:
  """s[i] + s[i+1] for the row sums s of a (4, 5) matrix: two shifted views of one reduce."""
  sums = buf(0, 20).reshape((4, 5)).reduce(Ops.ADD, 1)
  return sums.shrink(((0, 3),)) + sums.shrink(((1, 4),))


def conv1d(length: int = 8, k: int = 3) -> UOp:
  """A valid 1-D cross-correlation of BUFFER 0 (length) with BUFFER 1 (k): a STACK of k shifted windows, transposed
  to (out, k), times the broadcast kernel, summed."""
  out = length - k + 1
  x = buf(0, length)
  windows = UOp(Ops.STACK, tuple(x.shrink(((s, s + out),)) for s in range(k))).permute((1, 0))
  return (windows * buf(1, k).reshape((1, k)).expand((out, k))).reduce(Ops.ADD, 1)
