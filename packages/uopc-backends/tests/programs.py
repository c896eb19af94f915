"""The seed's programs that several test files run: the lowered rowsum listing, the movement-op GEMM, the syllabus program."""

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
