"""A five-minute tour of uopc's IR: build a graph, print it, parse it back, simplify index arithmetic, evaluate.

    python examples/ir_showcase.py
"""
from uopc.dtype import dtypes
from uopc.uop import UOp, Ops, ParamArg, CallArg, range_, stack
from uopc.uir import parse, to_uir
from uopc.symbolic import simplify, bounds
from uopc.evaluate import run, to_python
from uopc.composite import anti_eye, flip_axis, pad


def section(title: str): print(f"\n== {title} " + "=" * (70 - len(title)))


section("build: (x + 1.0) * (x + 1.0), hash consed")
x = UOp(Ops.PARAM, (), ParamArg(0, dtypes.f32))
e = (x + 1.0) * (x + 1.0)
print(to_uir(e), end="")
print("both factors are one node:", e.src[0] is e.src[1])

section("parse: the broadcasting and literal-typing sugar")
g = parse("""
%row = stack 1.0, 2.0, 3.0
%m   = stack %row, %row      # shape (2, 3)
%b   = stack 10.0, 20.0, 30.0
%s   = add %m, %b            # (2, 3) + (3,): broadcast
%t   = mul %s, 2             # a bare 2 next to an f32 is 2.0
""")
print(to_uir(g), end="")
print("shape", g.shape, "dtype", g.dtype, "| round trip parse(to_uir(g)) is g:", parse(to_uir(g)) is g)
print("value:", to_python(g))

section("simplify: unravel(ravel(i, j)) is (i, j)")
i, j = range_(4, 0), range_(6, 1)
flat = i * 6 + j
row, col = (flat // 6) % 4, flat % 6
print(f"row = {row.op.name}(...) -> {simplify(row) is i}, col -> {simplify(col) is j}")
split = (((i * 4 + range_(4, 2)) * 4 + range_(4, 3)) // 16) % 4
print("(((i*4 + j)*4 + k)//16) % 4 simplifies to i:", simplify(split) is i, "| bounds of i*6 + j:", bounds(flat))

section("evaluate: a CALL, an anti-identity, a flip and a pad")
p = UOp(Ops.PARAM, (), ParamArg(0, dtypes.i32))
sq = UOp(Ops.CALL, (p * p, UOp.const(7)), CallArg("sq"))
print(to_uir(sq), end="")
print("sq(7) =", to_python(sq))
print("anti_eye(4) =", to_python(anti_eye(4, dtypes.f32)))
v = stack(1, 2, 3, 4)
print("flip [1 2 3 4] =", to_python(flip_axis(v, 0)), "| pad by (1, 2) =", to_python(pad(v, ((1, 2),))))
print("run(3 // -2) =", run(UOp.const(3) // UOp.const(-2)).arg, "(floor division, as in Python)")
