"""The `uopc` command: look at and run .uir programs.

    uopc render PROGRAM.uir [--device NAME]                     the generated source (C by default)
    uopc run PROGRAM.uir [--input SLOT=F.npy] [--device NAME]   compile and run it (random inputs by default), print the result
    uopc graph PROGRAM.uir -o FILE                              draw the UOp graph: Graphviz DOT, or SVG/PNG when `dot` is installed
    uopc tune SCRIPT.py [ARGS...]                               run a script with a timed search of every new kernel's Opts

A program that is already lowered (its last statement is a SINK) is compiled as it is; a shaped program is one
kernel into a new output BUFFER in the first free slot, lowered plainly (one loop per axis, no Opts) or, with --opt, with the
Opts uopc.opt chooses (vectors, register tiles, threads). Both go through
uopc.runtime, like Tensor code. --device picks the backend (default: $UOPC_DEVICE, and C when that is empty).

Other distributions add subcommands through the entry point group "uopc.commands": each entry point is a function
that receives argparse's subparsers and adds its own parser with `set_defaults(func=...)`, where func(args)
returns an exit status. Errors print one line and exit
with status 1; --debug shows the traceback instead.
"""
from __future__ import annotations
import argparse, importlib.metadata, os, re, runpy, shutil, subprocess, sys
from pathlib import Path
import numpy as np
from uopc.uop import UOp, Ops, UOpError, buf, prod
from uopc.uir import parse, ParseError
from uopc.lowering import LowerError, Opts
from uopc.linearize import LinearizeError
from uopc.kernelize import KernelizeError, make_kernel
from uopc.evaluate import EvalError
from uopc.backends import BackendError, get_backend
from uopc.backends.c import sanitize_name
from uopc.runtime import Buffer, Program, compile_kernel, compile_program, np_dtype, format_linear
from uopc.compile_cache import write_file
from uopc import search

USER_ERRORS = (ParseError, UOpError, LowerError, LinearizeError, KernelizeError, EvalError, BackendError, OSError, ValueError)


class CLIError(Exception):
  """A mistake in the command line itself (a bad --input, an unknown output format)."""


MAX_PROGRAM_BYTES = 64 << 20   # a .uir program is text: /dev/zero or a disk image would be read until memory ran out


def _file_error(what: str, path: str, e: OSError) -> CLIError:
  why = {FileNotFoundError: "no such file", IsADirectoryError: "is a directory", PermissionError: "permission denied"}.get(type(e))
  return CLIError(f"{what}{path}: {why or e.strerror or e}")


def load_program(path: str) -> tuple[UOp, str]:
  p = Path(path)
  try:
    with open(p, "rb") as f: data = f.read(MAX_PROGRAM_BYTES + 1)
  except OSError as e: raise _file_error("", path, e) from None
  if len(data) > MAX_PROGRAM_BYTES: raise CLIError(f"{path}: more than {MAX_PROGRAM_BYTES >> 20} MiB; a .uir program is a text file")
  try: text = data.decode()
  except UnicodeDecodeError: raise CLIError(f"{path}: not a text file") from None
  if "\0" in text: raise CLIError(f"{path}: not a text file (it holds NUL bytes)")
  return parse(text), sanitize_name(p.stem)


def compile_file(root: UOp, name: str, device: str | None, optimize: bool = False) -> tuple[Program, list[UOp], UOp | None]:
  """(the Program, the program's BUFFERs in parameter order, the output BUFFER a shaped program was given or None when
  the program was already a lowered SINK)."""
  backend = get_backend(device if device is not None else os.environ.get("UOPC_DEVICE"))
  if root.op is Ops.SINK:
    prog = compile_program(root, backend, name)
    slots = {p.slot for p in prog.params}
    return prog, sorted((u for u in root.toposort() if u.op is Ops.BUFFER and u.arg.slot in slots), key=lambda b: b.arg.slot), None
  if root.dtype.fmt is None: raise CLIError(f"the program's value is {root.dtype}, which can't be stored")
  slots = [u.arg.slot for u in root.toposort() if u.op is Ops.BUFFER]
  kernel = make_kernel(root, buf(max(slots, default=-1) + 1, max(1, prod(root.shape)), root.dtype), canonical=False)
  # the plain lowering (one loop per axis) unless asked to optimize (then the Opts uopc.opt chooses, as for Tensor code)
  return compile_kernel(kernel, backend, None if optimize else Opts(), name=name), list(kernel.buffers), kernel.out


def cmd_render(args) -> int:
  root, name = load_program(args.program)
  prog, _, _ = compile_file(root, sanitize_name(args.name) if args.name else name, args.device, args.opt)
  sys.stdout.write(prog.src if prog.src is not None else format_linear(prog.uops) + "\n")
  return 0


def _random_input(b: UOp, rng: np.random.Generator) -> np.ndarray:
  n, d = b.shape[0], np_dtype(b.dtype)
  if d == np.bool_: return rng.random(n) < 0.5
  if d.kind == "i": return rng.integers(-10, 10, n).astype(d)
  return rng.standard_normal(n).astype(d)


def _load_npy(spec: str, path: str) -> np.ndarray:
  """The array in a .npy file, memory-mapped (a file larger than its buffer is refused before it is read), or a CLIError
  that says what the file is instead."""
  try:
    with open(path, "rb") as f: magic = f.read(6)
  except FileNotFoundError: raise CLIError(f"--input {spec}: no such file {path}") from None
  except OSError as e: raise _file_error(f"--input {spec}: ", path, e) from None
  if magic.startswith(b"PK"): raise CLIError(f"--input {spec}: {path} is a .npz archive; give one array as a .npy file (numpy.save)")
  if magic != b"\x93NUMPY": raise CLIError(f"--input {spec}: {path} is not a .npy file (numpy.save writes them)")
  try: arr = np.load(path, mmap_mode="r", allow_pickle=False)
  except (ValueError, EOFError, OSError) as e: raise CLIError(f"--input {spec}: {path} is a damaged or unsupported .npy file ({e})") from None
  if not isinstance(arr, np.ndarray) or arr.dtype.kind not in "biuf":
    raise CLIError(f"--input {spec}: {path} holds {getattr(arr, 'dtype', type(arr).__name__)} data, not numbers")
  return arr


def _parse_inputs(specs: list[str]) -> dict[int, np.ndarray]:
  out = {}
  for s in specs:
    m = re.fullmatch(r"(\d+)=(.+)", s)
    if m is None: raise CLIError(f"--input {s!r}: expected SLOT=FILE.npy, e.g. 0=x.npy")
    out[int(m.group(1))] = _load_npy(s, m.group(2))
  return out


def _check_memory(params: list[UOp], written: set[int]) -> None:
  """Refuse a program whose buffers don't fit in the memory this machine has free: allocating them would end in a
  MemoryError, or in the kernel's first writes getting the process killed (a 2e9-element output was). An input lives
  twice (the host array, the backend's copy), an output three times (and the copy read back)."""
  need = sum(b.shape[0] * b.dtype.itemsize * (3 if b.arg.slot in written else 2) for b in params)
  if (free := available_memory()) is not None and need > free:
    raise CLIError(f"the program's buffers need {need / 2**30:.1f} GiB, more than the {free / 2**30:.1f} GiB of memory available")


def available_memory() -> int | None:
  """The bytes of memory this machine can still give (MemAvailable), or None where that can't be read."""
  try:
    with open("/proc/meminfo") as f: return next(int(line.split()[1]) * 1024 for line in f if line.startswith("MemAvailable:"))
  except (OSError, StopIteration, ValueError, IndexError): return None


def _check_save(path: str | None, slots: list[int]) -> None:
  """--save FILE.npy holds one array: a program that writes several needs FILE.npz (said before anything runs)."""
  if path is not None and not path.endswith(".npz") and len(slots) > 1:
    raise CLIError(f"--save {path}: the program writes {len(slots)} buffers (slots {', '.join(map(str, slots))}); give FILE.npz to keep them all")


def _save(path: str, results: dict[int, np.ndarray]) -> None:
  """--save: one output as FILE.npy; several (or a FILE.npz) as a .npz archive with an array `slotN` per output, written
  with uopc.compile_cache.write_file, so a full disk or a kill never leaves a truncated file where the old one was."""
  if path.endswith(".npz"): write = lambda f: np.savez(f, **{f"slot{k}": a for k, a in results.items()})
  else: write = lambda f: np.save(f, next(iter(results.values()), np.zeros(0, np.float32)))
  try: write_file(path, write)
  except OSError as e: raise _file_error("--save ", path, e) from None


def _summary(name: str, a: np.ndarray) -> str:
  s = f"{name}: shape {a.shape} {a.dtype}"
  if a.size and a.dtype.kind in "fi": s += f", min {a.min():.6g}, max {a.max():.6g}, mean {a.mean(dtype=np.float64):.6g}"
  return s


def cmd_run(args) -> int:
  root, name = load_program(args.program)
  prog, params, out = compile_file(root, name, args.device, args.opt)
  written = {p.slot for p in prog.params if p.written}
  _check_save(args.save, [out.arg.slot] if out is not None else sorted(written))
  _check_memory(params, written)
  given = _parse_inputs(args.input)
  rng = np.random.default_rng(args.seed)
  arrays: dict[int, np.ndarray] = {}
  for b in params:
    slot, n = b.arg.slot, b.shape[0]
    if slot in given:
      a = given[slot]
      if a.size != n: raise CLIError(f"--input {slot}: the program's buffer {slot} has {n} elements, the file has {a.size} {a.shape}")
      try: arrays[slot] = np.ascontiguousarray(a.reshape(-1).astype(np_dtype(b.dtype), casting="same_kind"))
      except TypeError: raise CLIError(f"--input {slot}: can't use a {a.dtype} array as {b.dtype.name}") from None
    elif slot in written: arrays[slot] = np.zeros(n, np_dtype(b.dtype))
    else: arrays[slot] = _random_input(b, rng)
  if unknown := sorted(set(given) - set(arrays)): raise CLIError(f"--input: the program has no buffer slot {unknown[0]}")
  buffers = [Buffer.from_numpy(arrays[b.arg.slot], prog.backend, b.dtype) for b in params]
  prog(buffers)
  np.set_printoptions(threshold=64, edgeitems=3, linewidth=120)
  for slot in sorted(set(arrays) - written):
    if slot not in given: print(_summary(f"input {slot} (random, seed {args.seed})", arrays[slot]))
  results = {b.arg.slot: d.numpy() for b, d in zip(params, buffers) if b.arg.slot in written}
  if out is not None:   # a value with no elements lowers to a kernel that writes nothing
    flat = results.get(out.arg.slot, np.zeros(0, np_dtype(out.dtype)))
    results = {out.arg.slot: flat[:prod(root.shape)].reshape(root.shape)}
  for slot, a in results.items():
    print(_summary(f"output {slot}", a))
    print(a)
  if args.save: _save(args.save, results)
  return 0


def to_dot(root: UOp) -> str:
  """The graph in Graphviz DOT: one box per node (op and arg), edges from each source to its user."""
  colors = {Ops.BUFFER: "#ffd8a8", Ops.ALLOC: "#ffd8a8", Ops.LOAD: "#ffe8cc", Ops.STORE: "#ffe8cc", Ops.RANGE: "#d0ebff",
            Ops.END: "#d0ebff", Ops.CONST: "#e9ecef", Ops.REDUCE: "#d3f9d8", Ops.SINK: "#f3d9fa"}
  ids = {u: i for i, u in enumerate(root.toposort())}
  lines = ["digraph uopc {", '  node [shape=box, style="rounded,filled", fontname="monospace", fillcolor="#ffffff"];']
  for u, i in ids.items():
    label = u.op.name.lower()
    if u.arg is not None: label += "\\n" + str(u.arg).replace("\\", "\\\\").replace('"', '\\"')[:60]
    if u.shape: label += f"\\n{u.dtype.name}{list(u.shape)}"
    lines.append(f'  n{i} [label="{label}", fillcolor="{colors.get(u.op, "#ffffff")}"];')
    for k, s in enumerate(u.src): lines.append(f"  n{ids[s]} -> n{i}" + (f' [label="{k}"]' if len(u.src) > 1 else "") + ";")
  return "\n".join(lines + ["}"]) + "\n"


def cmd_graph(args) -> int:
  root, _ = load_program(args.program)
  out = Path(args.output)
  fmt = out.suffix.lower().lstrip(".")
  dot = to_dot(root)
  if fmt in ("dot", "gv"):
    try: out.write_text(dot)
    except OSError as e: raise _file_error("-o ", str(out), e) from None
    return 0
  if fmt not in ("svg", "png", "pdf"): raise CLIError(f"-o {out}: unknown format {out.suffix!r}; use .dot, .svg, .png or .pdf")
  if shutil.which("dot") is None: raise CLIError(f"-o {out}: drawing {fmt.upper()} needs Graphviz's `dot` program; install graphviz, or write .dot")
  proc = subprocess.run(["dot", f"-T{fmt}", "-o", str(out)], input=dot, text=True, capture_output=True)
  if proc.returncode != 0: raise CLIError(f"dot failed: {proc.stderr.strip()}")
  return 0


def cmd_tune(args) -> int:
  """Run SCRIPT as __main__ with UOPC_SEARCH=1: every kernel it runs for the first time (through Tensor, or run_schedule
  given uopc.search.policy_from_env()) is timed under candidate Opts and the winner stored on disk, where every later
  run finds it. Then print what the search found."""
  script = Path(args.script)
  if not script.is_file(): raise CLIError(f"{args.script}: no such file")
  os.environ["UOPC_SEARCH"] = "1"
  saved = sys.argv
  sys.argv = [str(script), *args.args]
  try: runpy.run_path(str(script), run_name="__main__")
  except SystemExit as e:
    if e.code not in (None, 0): raise CLIError(f"{args.script} exited with status {e.code}") from None
  finally: sys.argv = saved
  print(search.report())
  return 0


def _seed(text: str) -> int:
  """--seed: NumPy's generators take a non-negative integer (argparse names the option in its error)."""
  try: v = int(text)
  except ValueError: v = -1
  if v < 0: raise argparse.ArgumentTypeError(f"expected a non-negative integer, got {text!r}")
  return v


def build_parser() -> argparse.ArgumentParser:
  ap = argparse.ArgumentParser(prog="uopc", description="Render, run and draw uopc programs (.uir).")
  ap.add_argument("--debug", action="store_true", help="show the full traceback of an error")
  sub = ap.add_subparsers(dest="command", metavar="COMMAND")
  r = sub.add_parser("render", help="print the generated C of a program")
  r.add_argument("program", help="a .uir file")
  r.add_argument("--name", help="the function's name (default: the file's name)")
  r.add_argument("--device", help="the backend to render for (default: $UOPC_DEVICE, or C)")
  r.add_argument("--opt", action="store_true", help="lower a shaped program with the Opts uopc.opt chooses (default: the plain lowering)")
  r.set_defaults(func=cmd_render)
  x = sub.add_parser("run", help="compile and run a program, printing its result")
  x.add_argument("program", help="a .uir file")
  x.add_argument("--input", action="append", default=[], metavar="SLOT=FILE.npy", help="the array for a BUFFER slot (default: random)")
  x.add_argument("--seed", type=_seed, default=0, help="seed of the random inputs (default 0)")
  x.add_argument("--save", metavar="FILE.npy", help="also save the result as .npy")
  x.add_argument("--device", help="the backend to run on (default: $UOPC_DEVICE, or C)")
  x.add_argument("--opt", action="store_true", help="lower a shaped program with the Opts uopc.opt chooses (default: the plain lowering)")
  x.set_defaults(func=cmd_run)
  g = sub.add_parser("graph", help="draw the UOp graph of a program")
  g.add_argument("program", help="a .uir file")
  g.add_argument("-o", "--output", required=True, help="FILE.dot, or FILE.svg / FILE.png with Graphviz installed")
  g.set_defaults(func=cmd_graph)
  t = sub.add_parser("tune", help="run a Python script with a timed search of each new kernel's Opts, cached for later runs")
  t.add_argument("script", help="a .py file that runs uopc kernels (a training script, a benchmark)")
  t.add_argument("args", nargs=argparse.REMAINDER, help="arguments for the script")
  t.set_defaults(func=cmd_tune)
  try: eps = list(importlib.metadata.entry_points(group="uopc.commands"))
  except Exception: eps = []
  for ep in eps:
    try: ep.load()(sub)
    except Exception as e: print(f"uopc: warning: the subcommand plugin {ep.name!r} failed to load: {e}", file=sys.stderr)
  return ap


def main(argv: list[str] | None = None) -> int:
  ap = build_parser()
  args = ap.parse_args(argv)
  if not getattr(args, "func", None):
    ap.print_help()
    return 2
  try:
    status = args.func(args) or 0
    sys.stdout.flush()   # a closed pipe shows up here, where it can be handled, not in the interpreter's exit
    return status
  except BrokenPipeError:   # the reader went away (`uopc run prog.uir | head`): not an error of ours
    os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return 0
  except (CLIError, *USER_ERRORS, MemoryError) as e:
    if args.debug: raise
    msg = str(e).strip() or type(e).__name__
    if isinstance(e, MemoryError): msg = f"out of memory{': ' + msg if msg != 'MemoryError' else ''}"
    print(f"uopc: error: {msg}", file=sys.stderr)
    return 1


if __name__ == "__main__":
  sys.exit(main())
