"""The example programs of seed chapter 6, built once for this package's tests (each returns a shaped UOp over BUFFERs)."""
from uopc.uop import UOp, Ops, buf


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
  ((i*4 + j) // 4) % 4, which mentions j but is i (pitfall 2)."""
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
