"""The .uir text format: `parse(text) -> UOp` and `to_uir(u) -> text`, an exact round trip.

One node per line, SSA style, `#` starts a comment:

    %name = opname operand, operand, ... : key=value key=value
    operand := %name | literal        literal := int | float | true | false | tuple

    %0 = buffer 65536 : dtype=f32 slot=0
    %1 = reshape %0, (256, 256, 1)
    %2 = reduce %1 : op=add pop=1

The last statement is the program. A literal in a source position is a CONST (`add %x, 1.0`, `range 10`);
a tuple literal is the arg of a movement op; BUFFER, ALLOC and CONST take their size or value as the first
operand. Two pieces of sugar make programs written by hand readable, and both expand into ordinary UOps:
binary ops broadcast like NumPy (missing leading axes are RESHAPEd in, size-1 axes EXPANDed), and a bare
literal next to a value adopts that value's dtype (`mul %f32, 2` means 2.0) in the ops whose operands
share a dtype (binary ops, WHERE's branches, STACK, STORE).

The printer writes every CONST inline, in a form that carries its own type (1, 1.0, true, -0.0, inf, nan),
so `parse(to_uir(g)) is g` for every graph: hash consing makes that one identity check compare every node,
arg and edge. Errors name the line: `ParseError: line 3: '%2 = add %0, %1': can't broadcast (2,) with (3,)`.
"""
from __future__ import annotations
import json, re
from typing import Any, Callable, NamedTuple
from uopc.uop import UOp, Ops, ParamArg, CallArg, RangeArg, AxisType, UOpError, BINARY, MOVEMENT
from uopc.dtype import AddrSpace, DType, dtypes


class ParseError(Exception):
  """A .uir program that can't be read; the message names the line."""


# ---- each op's arg, written once: how it is read from a statement and written back -----------------------------

def _int(k: str, v: str) -> int:
  if not _INT_RE.fullmatch(v): raise ParseError(f"{k} must be an integer, got {v!r}")
  return int(v)

def _enum(cls, k: str, v: str):
  if v.upper() not in cls.__members__: raise ParseError(f"{k} must be one of {', '.join(m.lower() for m in cls.__members__)}, got {v!r}")
  return cls[v.upper()]

def _reduce_op(k: str, v: str) -> Ops:
  if v not in ("add", "max"): raise ParseError(f"reduce op must be add or max, got {v!r}")
  return Ops[v.upper()]

def _tuple(k: str, v: str) -> tuple:
  t = _literal(v)
  if not isinstance(t, tuple): raise ParseError(f"{k} must be a tuple, got {v!r}")
  return t

def _dtype(k: str, v: str) -> DType:
  """A dtype by name: a scalar (f32) or a vector of one (f32x8)."""
  if m := re.fullmatch(r"([a-z]+\d*)x(\d+)", v): return dtypes.from_name(m.group(1)).vec(int(m.group(2)))
  return dtypes.from_name(v)

# attribute -> its value reader
_READ = {"dtype": _dtype, "slot": _int, "pop": _int, "idx": _int, "op": _reduce_op,
         "kind": lambda k, v: _enum(AxisType, k, v), "space": lambda k, v: _enum(AddrSpace, k, v), "shape": _tuple,
         "name": lambda k, v: json.loads(v) if v.startswith('"') else v, "arg": lambda k, v: _literal(v)}


class _ArgForm(NamedTuple):
  """How one op's arg appears in a statement. `literal` says where a positional literal sits ("first": the size of a
  buffer or the value of a const; "last": a movement op's tuple); `attrs` are the key=value attributes it takes;
  build(op, operands, literal, attrs) makes the node and write(node, operands) gives (operands, attributes) back."""
  literal: str | None
  attrs: tuple[str, ...]
  build: Callable[[Ops, tuple, Any, dict], UOp]
  write: Callable[[UOp, list[str]], tuple[list[str], list[str]]]


def _space(a) -> list[str]: return [f"space={a.addrspace.name.lower()}"] if a.addrspace is not None else []

def _build_memory(op, src, lit, attrs) -> UOp:
  if type(lit) is not int: raise ParseError(f"{op.name.lower()} size must be an integer, got {lit!r}")
  return UOp(op, (), ParamArg(attrs.get("slot", 0), attrs.get("dtype", dtypes.f32), (lit,), attrs.get("space")))

def _build_param(op, src, lit, attrs) -> UOp:
  if "slot" not in attrs: raise ParseError("param needs slot=")
  return UOp(op, (), ParamArg(attrs["slot"], attrs.get("dtype", dtypes.f32), tuple(attrs.get("shape", ())), attrs.get("space")))

def _build_const(op, src, lit, attrs) -> UOp:
  if src: raise ParseError("const takes only its value")
  return UOp.const(lit, attrs.get("dtype"))

def _build_cast(op, src, lit, attrs) -> UOp:
  if "dtype" not in attrs: raise ParseError("cast needs dtype=")
  return UOp(op, src, attrs["dtype"])

def _build_generic(op, src, lit, attrs) -> UOp:
  # the broadcasting sugar: binary ops and WHERE line their operands up like NumPy
  if (op in BINARY and len(src) == 2) or (op is Ops.WHERE and len(src) == 3): src = _broadcast(*src)
  return UOp(op, src, lit if op in MOVEMENT else attrs.get("arg"))

def _write_generic(u: UOp, ops: list[str]) -> tuple[list[str], list[str]]:
  if u.op in MOVEMENT: return ops + [_fmt_lit(u.arg)], []
  return ops, ([f"arg={_fmt_lit(u.arg)}"] if u.arg is not None else [])

_MEMORY = _ArgForm("first", ("dtype", "slot", "space"), _build_memory,
                   lambda u, ops: ([str(u.arg.shape[0])], [f"dtype={u.arg.dtype.name}", f"slot={u.arg.slot}"] + _space(u.arg)))
_FORMS: dict[Ops, _ArgForm] = {
  Ops.BUFFER: _MEMORY, Ops.ALLOC: _MEMORY,
  Ops.PARAM: _ArgForm(None, ("slot", "dtype", "shape", "space"), _build_param,
                      lambda u, ops: ([], [f"slot={u.arg.slot}", f"dtype={u.arg.dtype.name}"] +
                                      ([f"shape={_fmt_lit(u.arg.shape)}"] if u.arg.shape else []) + _space(u.arg))),
  Ops.CONST: _ArgForm("first", ("dtype",), _build_const, lambda u, ops: ([_fmt_lit(u.arg)], [])),
  Ops.CALL: _ArgForm(None, ("name",), lambda op, src, lit, a: UOp(op, src, CallArg(a.get("name", "f"))),
                     lambda u, ops: (ops, [f"name={_fmt_name(u.arg.name)}"])),
  Ops.CAST: _ArgForm(None, ("dtype",), _build_cast, lambda u, ops: (ops, [f"dtype={u.arg.name}"])),
  # a vector INDEX names its vector dtype (the n elements it reads or writes); a plain one has no attribute
  Ops.INDEX: _ArgForm(None, ("dtype",), lambda op, src, lit, a: UOp(op, src, a.get("dtype")),
                      lambda u, ops: (ops, [f"dtype={u.arg.name}"] if u.arg is not None else [])),
  Ops.RANGE: _ArgForm(None, ("idx", "kind"), lambda op, src, lit, a: UOp(op, src, RangeArg(a.get("idx", 0), a.get("kind", AxisType.LOOP))),
                      lambda u, ops: (ops, [f"idx={u.arg.idx}", f"kind={u.arg.kind.name.lower()}"])),
  Ops.REDUCE: _ArgForm(None, ("op", "pop"), lambda op, src, lit, a: UOp(op, src, (a.get("op", Ops.ADD), a.get("pop", 1))),
                       lambda u, ops: (ops, [f"op={u.arg[0].name.lower()}", f"pop={u.arg[1]}"])),
  **{op: _ArgForm("last", (), _build_generic, _write_generic) for op in MOVEMENT},
}
_GENERIC = _ArgForm(None, ("arg",), _build_generic, _write_generic)

_SAME_DTYPE = BINARY | {Ops.WHERE, Ops.STACK, Ops.STORE}  # ops whose bare literals adopt a neighbour's dtype
_STRING = r'"(?:[^"\\]|\\.)*"'
_ATTR_RE = re.compile(rf"\s*(\w+)=({_STRING}|\([^=]*?\)(?=\s|$)|\S+)")
_INT_RE = re.compile(r"[-+]?\d+")


# ---- parsing ---------------------------------------------------------------------------------------------------

def parse(text: str) -> UOp:
  """The graph a .uir program describes (its last statement)."""
  if not isinstance(text, str): raise ParseError(f"parse takes the program text (a str), got {type(text).__name__}")
  names: dict[str, UOp] = {}
  program = None
  for number, raw in enumerate(text.splitlines(), start=1):
    statement = _strip_comment(raw).strip()
    if not statement: continue
    try: program = _parse_statement(statement, names)
    except (ParseError, UOpError, KeyError, ValueError, TypeError, IndexError, SyntaxError) as e:
      # every mistake is reported with its line, whatever layer found it (the type checker, a bad literal, ...)
      raise ParseError(f"line {number}: {_clip(raw.strip())!r}: {_reason(e)}") from None
  if program is None: raise ParseError("empty program")
  return program


def _reason(e: Exception) -> str:
  return _clip(str(e), 300) if not isinstance(e, KeyError) else f"unknown name {_clip(str(e.args[0]))!r}"


def _clip(s: str, n: int = 120) -> str:
  """s cut to about n characters: an error names a line, it doesn't repeat 100,000 characters of it."""
  return s if len(s) <= n else s[:n] + f"... ({len(s)} characters)"


def _strip_comment(line: str) -> str:
  in_str = esc = False
  for i, ch in enumerate(line):
    if in_str:
      if esc: esc = False
      elif ch == "\\": esc = True
      elif ch == '"': in_str = False
    elif ch == '"': in_str = True
    elif ch == "#": return line[:i]
  return line


def _split_top(s: str, sep: str) -> list[str]:
  """Split at `sep` outside parentheses and strings."""
  parts, depth, cur, in_str, esc = [], 0, [], False, False
  for ch in s:
    if in_str:
      cur.append(ch)
      if esc: esc = False
      elif ch == "\\": esc = True
      elif ch == '"': in_str = False
      continue
    if ch == '"': in_str = True
    elif ch == "(": depth += 1
    elif ch == ")": depth -= 1
    if ch == sep and depth == 0: parts.append("".join(cur)); cur = []
    else: cur.append(ch)
  parts.append("".join(cur))
  return parts


def _parse_statement(line: str, env: dict[str, UOp]) -> UOp:
  lhs, eq, rhs = line.partition("=")
  lhs = lhs.strip()
  if not eq or not re.fullmatch(r"%\w+", lhs): raise ParseError("statement must start with %name =")
  if lhs[1:] in env: raise ParseError(f"{lhs} is defined twice")
  body, *attr_parts = _split_top(rhs, ":")
  if len(attr_parts) > 1: raise ParseError("more than one ':' before the attributes")
  # `add %0, 1.0`: the op's name, then its operands
  opname, ops_s = (body.strip().split(" ", 1) + [""])[:2]
  if not re.fullmatch(r"[a-z_0-9]+", opname) or opname.upper() not in Ops.__members__:
    raise ParseError(f"unknown op {opname!r}")
  op = Ops[opname.upper()]
  form = _FORMS.get(op, _GENERIC)
  attrs = _parse_attrs(op, form, attr_parts[0] if attr_parts else "")
  toks = [t.strip() for t in _split_top(ops_s, ",")] if ops_s.strip() else []
  if any(not t for t in toks): raise ParseError("empty operand")
  lit = None
  if form.literal == "first":
    if not toks: raise ParseError(f"{opname} needs its {'value' if op is Ops.CONST else 'size'} as the first operand")
    lit, toks = _literal(toks[0]), toks[1:]
  elif form.literal == "last":
    if not toks: raise ParseError(f"{opname} needs a tuple as its last operand")
    lit, toks = _literal(toks[-1]), toks[:-1]
  operands: list = []
  for t in toks:
    if not t.startswith("%"): operands.append(_literal(t)); continue
    name = t[1:]
    if name not in env: raise ParseError(f"undefined {t}")
    operands.append(env[name])
  node = env[lhs[1:]] = form.build(op, _operands(op, operands), lit, attrs)
  return node


def _parse_attrs(op: Ops, form: _ArgForm, s: str) -> dict:
  attrs, pos = {}, 0
  while pos < len(s.rstrip()):
    m = _ATTR_RE.match(s, pos)
    if m is None: raise ParseError(f"can't read the attributes {s[pos:].strip()!r} (expected key=value)")
    k, v = m.group(1), m.group(2)
    if k not in form.attrs:
      raise ParseError(f"{op.name.lower()} takes no attribute {k!r}" + (f" (it takes {', '.join(sorted(form.attrs))})" if form.attrs else ""))
    attrs[k] = _READ[k](k, v)
    pos = m.end()
  return attrs


def _literal(tok: str):
  tok = tok.strip()
  if tok.startswith("("): return _tuple_literal(tok)
  if tok == "true": return True
  if tok == "false": return False
  if _INT_RE.fullmatch(tok): return int(tok)
  if tok.startswith('"'): return json.loads(tok)
  if tok in ("inf", "+inf", "-inf", "nan"): return float(tok)
  if re.fullmatch(r"[-+]?(\d+\.\d*|\.\d+|\d+)([eE][-+]?\d+)?", tok): return float(tok)
  raise ParseError(f"bad literal {_clip(tok)!r}")


_TUPLE_TOKEN = re.compile(r'\s*(?:([(),])|("(?:[^"\\]|\\.)*")|([^\s(),"]+))')

def _tuple_literal(tok: str) -> tuple:
  """A tuple literal such as ((0, 2), (1, 3)), read with an explicit stack of the tuples still open: nesting is data, so
  a line of 50,000 parentheses is an error about the line, not a RecursionError."""
  open_tuples: list[list] = []
  result, pos, expect_item = None, 0, False
  while pos < len(tok.rstrip()):
    m = _TUPLE_TOKEN.match(tok, pos)
    if m is None or result is not None: raise ParseError(f"bad tuple literal {_clip(tok)!r}")
    pos = m.end()
    punct, item = m.group(1), m.group(2) or m.group(3)
    if punct == "(":
      if open_tuples and not expect_item: raise ParseError(f"missing ',' in tuple literal {_clip(tok)!r}")
      open_tuples.append([]); expect_item = True
    elif punct == ",":
      if not open_tuples or expect_item: raise ParseError(f"misplaced ',' in tuple literal {_clip(tok)!r}")
      expect_item = True
    elif punct == ")":
      if not open_tuples: raise ParseError(f"unbalanced ')' in tuple literal {_clip(tok)!r}")
      done = tuple(open_tuples.pop())
      if open_tuples: open_tuples[-1].append(done); expect_item = False
      else: result = done
    else:
      if not open_tuples or not expect_item: raise ParseError(f"missing ',' in tuple literal {_clip(tok)!r}")
      open_tuples[-1].append(_literal(item)); expect_item = False
  if open_tuples or result is None: raise ParseError(f"unclosed tuple {_clip(tok)!r}")
  return result


def _operands(op: Ops, src: list) -> tuple[UOp, ...]:
  """The operands of one statement as UOps: python literals become CONSTs. A bare literal adopts the dtype of a neighbour
  in ops whose operands share one; a WHERE's neighbours are its branches, never its bool condition
  (`where %c, 1, 0` is i32)."""
  neighbours = (src[1:] if op is Ops.WHERE else src) if op in _SAME_DTYPE else []
  like = next((s for s in neighbours if isinstance(s, UOp)), None)
  def constant(v) -> UOp:
    if isinstance(v, (tuple, str)): raise ParseError(f"a {type(v).__name__} literal can't be an operand of {op.name.lower()}")
    if like is None or isinstance(v, bool): return UOp.const(v)
    if isinstance(v, float) and not like.dtype.is_float:   # adopting would truncate: 1.5 next to an i32 is a mistake
      raise ParseError(f"float literal {v!r} next to a {like.dtype.name} operand")
    return UOp.const(v, like.dtype)
  return tuple(s if isinstance(s, UOp) else constant(s) for s in src)


def _broadcast(*xs: UOp) -> tuple[UOp, ...]:
  """NumPy broadcasting as sugar: missing leading axes are RESHAPEd in as 1s, then axes of size 1 are EXPANDed."""
  if all(x.shape == xs[0].shape for x in xs): return xs
  rank = max(len(x.shape) for x in xs)
  xs = tuple(x.reshape((1,) * (rank - len(x.shape)) + x.shape) if len(x.shape) < rank else x for x in xs)
  target = []
  for sizes in zip(*(x.shape for x in xs)):
    if len(set(sizes) - {1}) > 1: raise ParseError(f"can't broadcast {' with '.join(str(x.shape) for x in xs)}")
    target.append(max(sizes) if 0 not in sizes else 0)
  full = tuple(target)
  return tuple(x if x.shape == full else x.expand(full) for x in xs)


# ---- printing --------------------------------------------------------------------------------------------------

def _fmt_lit(v) -> str:
  if isinstance(v, bool): return "true" if v else "false"
  if isinstance(v, int): return str(v)
  if isinstance(v, float): return repr(v)            # shortest exact form: 0.1, -0.0, 1e+20, inf, -inf, nan
  if isinstance(v, tuple): return "(" + ", ".join(_fmt_lit(x) for x in v) + ("," if len(v) == 1 else "") + ")"
  if isinstance(v, str): return json.dumps(v)
  raise ValueError(f"to_uir can't write {v!r} ({type(v).__name__}) as a literal")


def _fmt_name(s: str) -> str: return s if re.fullmatch(r"[A-Za-z_][A-Za-z0-9_.]*", s) else json.dumps(s)


def to_uir(root: UOp) -> str:
  """The .uir text of the graph under root: one line per node (constants inline), numbered in toposort order."""
  if not isinstance(root, UOp): raise UOpError(f"to_uir prints a UOp, got {type(root).__name__}")
  names: dict[UOp, str] = {}
  lines = []
  for u in root.toposort():
    if u.op is Ops.CONST and u is not root: continue    # a constant is written where it is used (unless it is the program)
    names[u] = f"%{len(names)}"
    ops, attrs = _FORMS.get(u.op, _GENERIC).write(u, [names[s] if s.op is not Ops.CONST else _fmt_lit(s.arg) for s in u.src])
    line = f"{names[u]} = {u.op.name.lower()}"
    if ops: line += " " + ", ".join(ops)
    if attrs: line += " : " + " ".join(attrs)
    lines.append(line)
  return "\n".join(lines) + "\n"


__all__ = ["parse", "to_uir", "ParseError"]
