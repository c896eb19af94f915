"""The `uopc` command: render, run and graph on .uir files, its one-line errors, and subcommands from plugins.
main(argv) is called in-process (capsys sees its output); one test starts the real module as a child process."""
import os, re, shutil, subprocess, sys
from pathlib import Path
import numpy as np
import pytest
import uopc.backends.c as C
import uopc.cli as cli
import uopc.rangeify, uopc.uop
from uopc.uir import parse, ParseError
from example_programs import ROWSUM_UIR, syllabus_uir

GEMM_UIR = syllabus_uir(256)



@pytest.fixture(autouse=True)
def own_cache(tmp_path, monkeypatch):
  monkeypatch.setenv("UOPC_CACHE_DIR", str(tmp_path / "cache"))


@pytest.fixture
def gemm_file(tmp_path) -> Path:
  (tmp_path / "gemm_256x256.uir").write_text(GEMM_UIR)
  return tmp_path / "gemm_256x256.uir"


def loop_nest(src: str) -> list[tuple[tuple[str, ...], str]]:
  """Each statement of the kernel with the loop sizes open around it, outermost first."""
  body = src[re.search(r"^void ", src, re.M).start():].splitlines()[1:-1]     # the function, after the prelude it may have
  out, open_ = [], []
  for line in (l.strip() for l in body):
    if line == "}": open_.pop(); continue
    out.append((tuple(open_), line))
    if m := re.match(r"for \(int ridx\d+ = 0; ridx\d+ < (\d+);", line): open_.append(m.group(1))
  return out


def test_render_prints_the_syllabus_program_as_three_loops_with_a_hoisted_load(gemm_file, capsys):
  assert cli.main(["render", str(gemm_file)]) == 0
  src = capsys.readouterr().out
  assert "void gemm_256x256(float* restrict data0, float* restrict data1, float* restrict data2) {" in src
  nest = loop_nest(src)
  assert [n for n, l in nest if l.startswith("for ")] == [(), ("256",), ("256", "256")]
  where = lambda pattern: [n for n, l in nest if re.search(pattern, l)]
  assert where(r"^float acc\d+;") == [("256", "256")]                     # one accumulator per output element
  assert where(r"data0\[") == [("256", "256")]                            # A[i, j] is loaded outside the k loop...
  assert where(r"data1\[") == [("256", "256", "256")]                     # ...only B's row is summed: A * rowsum(B)
  assert where(r"^data2\[") == [("256", "256")]


def test_render_takes_the_function_name_from_the_option(gemm_file, capsys):
  assert cli.main(["render", str(gemm_file), "--name", "syllabus"]) == 0
  assert "void syllabus(" in capsys.readouterr().out


def test_run_with_inputs_from_files_saves_a_times_the_row_sums_of_b(gemm_file, tmp_path, capsys):
  rng = np.random.default_rng(7)
  a, b = rng.standard_normal((256, 256)).astype(np.float32), rng.standard_normal((256, 256)).astype(np.float32)
  np.save(tmp_path / "a.npy", a)
  np.save(tmp_path / "b.npy", b)
  argv = ["run", str(gemm_file), "--input", f"0={tmp_path / 'a.npy'}", "--input", f"1={tmp_path / 'b.npy'}", "--save", str(tmp_path / "out.npy")]
  assert cli.main(argv) == 0
  printed = capsys.readouterr().out
  out = np.load(tmp_path / "out.npy")
  want = a.astype(np.float64) * b.astype(np.float64).sum(1, keepdims=True)
  # the kernel sums the 256 products a[i, j] * b[i, k] one by one in f32: the classic bound of a running sum
  error_bound = 257 * np.finfo(np.float32).eps * np.abs(a).astype(np.float64) * np.abs(b).astype(np.float64).sum(1, keepdims=True)
  assert out.shape == (256, 256) and out.dtype == np.float32
  assert np.all(np.abs(out - want) <= error_bound)
  assert "output 2: shape (256, 256) float32" in printed and "random" not in printed
  assert f"min {out.min():.6g}, max {out.max():.6g}" in printed


SUM_OF_ONES_UIR = """# 2**25 ones, summed
%0 = reshape 1.0, (1,)
%1 = expand %0, (33554432,)
%2 = reduce %1 : op=add pop=1
"""


@pytest.mark.parametrize("opt", [[], ["--opt"]], ids=["plain", "opt"])
def test_run_of_a_sum_of_2_25_ones_prints_2_25_with_or_without_opt(opt, tmp_path, capsys):
  # without --opt the plain loops added every one into a single f32 accumulator, which stops growing at 2**24: the
  # command printed 16777216. A long float sum adds partial sums over chunks now, on every road
  (tmp_path / "ones.uir").write_text(SUM_OF_ONES_UIR)
  assert cli.main(["run", str(tmp_path / "ones.uir"), *opt, "--save", str(tmp_path / "sum.npy")]) == 0
  printed = capsys.readouterr().out
  assert np.load(tmp_path / "sum.npy").item() == 2**25
  assert "output 0: shape () float32, min 3.35544e+07" in printed and printed.strip().splitlines()[-1] == "3.3554432e+07"


def test_run_with_random_inputs_prints_their_summary_and_the_output(gemm_file, tmp_path, capsys):
  saves = []
  for seed in (3, 3, 4):
    saves.append(tmp_path / f"out{len(saves)}.npy")
    assert cli.main(["run", str(gemm_file), "--seed", str(seed), "--save", str(saves[-1])]) == 0
    printed = capsys.readouterr().out
    assert printed.count(f"(random, seed {seed}): shape (65536,) float32") == 2
    out = np.load(saves[-1])
    summary = f"output 2: shape (256, 256) float32, min {out.min():.6g}, max {out.max():.6g}, mean {out.astype(np.float64).mean():.6g}"
    assert summary in printed
    assert str(out).splitlines()[0] in printed                            # the array itself, as NumPy prints it
  assert np.array_equal(np.load(saves[0]), np.load(saves[1])) and not np.array_equal(np.load(saves[0]), np.load(saves[2]))


def test_run_runs_a_program_that_is_already_lowered(tmp_path, capsys):
  (tmp_path / "rowsum.uir").write_text(ROWSUM_UIR)
  x = np.random.default_rng(1).standard_normal(12).astype(np.float32)
  np.save(tmp_path / "x.npy", x)
  assert cli.main(["run", str(tmp_path / "rowsum.uir"), "--input", f"0={tmp_path / 'x.npy'}", "--save", str(tmp_path / "s.npy")]) == 0
  assert "output 1: shape (3,) float32" in capsys.readouterr().out
  np.testing.assert_allclose(np.load(tmp_path / "s.npy"), x.reshape(3, 4).sum(1), rtol=1e-6)


def test_run_of_a_program_with_no_elements_prints_an_empty_result(tmp_path, capsys):
  (tmp_path / "empty.uir").write_text("%0 = buffer 4 : dtype=f32 slot=0\n%1 = shrink %0, ((2, 2),)\n")
  assert cli.main(["run", str(tmp_path / "empty.uir"), "--save", str(tmp_path / "e.npy")]) == 0
  assert "output 1: shape (0,) float32" in capsys.readouterr().out
  empty = np.load(tmp_path / "e.npy")
  assert empty.shape == np.zeros(4, np.float32)[2:2].shape and empty.dtype == np.float32


# ---- --device ------------------------------------------------------------------------------------------------------------

class Interpreted(C.CBackend):
  """A backend that renders no source: `uopc render` shows its linearized program instead."""
  name = "LISTING"
  renderer = None
  def compile(self, program, name): return program
  def launch(self, program, handles, global_size=None, local_size=None):
    from uopc.interpret import run_linear
    mem = {p.arg.slot: h.tolist() for p, h in zip(program.params, handles)}
    run_linear(list(program.uops), mem)
    for p, h in zip(program.params, handles): h[:] = mem[p.arg.slot]


@pytest.fixture
def listing_backend(monkeypatch):
  import uopc.backends as backends
  monkeypatch.setattr(backends, "_registered", {})
  monkeypatch.setattr(backends, "_instances", {})
  backends.register_backend("LISTING", Interpreted)


def test_device_picks_the_backend_of_render_and_run(tmp_path, capsys, listing_backend):
  (tmp_path / "rowsum.uir").write_text(ROWSUM_UIR)
  assert cli.main(["render", str(tmp_path / "rowsum.uir"), "--device", "c"]) == 0
  assert "void rowsum(float* restrict data0, float* restrict data1) {" in capsys.readouterr().out
  assert cli.main(["render", str(tmp_path / "rowsum.uir"), "--device", "listing"]) == 0
  listing = capsys.readouterr().out
  assert "void rowsum" not in listing and re.search(r"^\s+\d+\s+RANGE\s+i32", listing, re.M)
  x = np.arange(12, dtype=np.float32)
  np.save(tmp_path / "x.npy", x)
  argv = ["run", str(tmp_path / "rowsum.uir"), "--device", "LISTING", "--input", f"0={tmp_path / 'x.npy'}", "--save", str(tmp_path / "s.npy")]
  assert cli.main(argv) == 0
  np.testing.assert_array_equal(np.load(tmp_path / "s.npy"), x.reshape(3, 4).sum(1))


def test_device_defaults_to_uopc_device_and_empty_means_c(gemm_file, monkeypatch, capsys, listing_backend):
  monkeypatch.setenv("UOPC_DEVICE", "listing")
  assert cli.main(["render", str(gemm_file)]) == 0
  assert "void gemm" not in capsys.readouterr().out
  monkeypatch.setenv("UOPC_DEVICE", "")
  assert cli.main(["render", str(gemm_file)]) == 0
  assert "void gemm_256x256(" in capsys.readouterr().out


def test_an_unknown_device_is_one_line_listing_the_available_ones(gemm_file, capsys, listing_backend):
  for argv in (["render", str(gemm_file), "--device", "TPU9"], ["run", str(gemm_file), "--device", "TPU9"]):
    assert cli.main(argv) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("uopc: error: unknown backend 'TPU9'; available: ") and "C" in err and "LISTING" in err


# ---- graph ----------------------------------------------------------------------------------------------------------

def test_graph_writes_dot_with_one_node_per_uop_and_one_edge_per_source(gemm_file, tmp_path):
  assert cli.main(["graph", str(gemm_file), "-o", str(tmp_path / "g.dot")]) == 0
  dot = (tmp_path / "g.dot").read_text()
  nodes = parse(GEMM_UIR).toposort()
  assert dot.startswith("digraph uopc {\n") and dot.rstrip().endswith("}")
  declared = re.findall(r'^  (n\d+) \[label="((?:[^"\\]|\\.)*)", fillcolor="#[0-9a-f]{6}"\];$', dot, re.M)
  edges = re.findall(r"^  (n\d+) -> (n\d+)(?: \[label=\"\d+\"\])?;$", dot, re.M)
  assert len(declared) == len(nodes) == len({n for n, _ in declared})
  assert sorted(label.split("\\n")[0] for _, label in declared) == sorted(u.op.name.lower() for u in nodes)
  assert len(edges) == sum(len(u.src) for u in nodes) and {x for e in edges for x in e} <= {n for n, _ in declared}
  body = dot.splitlines()[1:-1]
  assert len(body) == 1 + len(declared) + len(edges)                     # nothing else: the node style, nodes, edges


def test_graph_to_svg_without_graphviz_is_a_one_line_error(gemm_file, tmp_path, monkeypatch, capsys):
  monkeypatch.setattr(cli.shutil, "which", lambda name: None)
  assert cli.main(["graph", str(gemm_file), "-o", str(tmp_path / "g.svg")]) == 1
  err = capsys.readouterr().err
  assert err.startswith("uopc: error:") and err.count("\n") == 1 and "dot" in err
  assert not (tmp_path / "g.svg").exists()


@pytest.mark.skipif(shutil.which("dot") is None, reason="Graphviz's `dot` is not installed here, so an SVG can't be drawn")
def test_graph_to_svg_with_graphviz_draws_an_svg(gemm_file, tmp_path):
  assert cli.main(["graph", str(gemm_file), "-o", str(tmp_path / "g.svg")]) == 0
  assert "<svg" in (tmp_path / "g.svg").read_text()


# ---- errors ---------------------------------------------------------------------------------------------------------

def bad_inputs(tmp_path: Path, gemm_file: Path) -> dict[str, list[str]]:
  np.save(tmp_path / "small.npy", np.zeros(10, np.float32))
  np.save(tmp_path / "full.npy", np.zeros(65536, np.float32))
  (tmp_path / "broken.uir").write_text("%0 = buffer 4 : dtype=f32 slot=0\n%1 = frobnicate %0\n")
  return {
    "missing file": ["render", str(tmp_path / "nope.uir")],
    "parse error": ["render", str(tmp_path / "broken.uir")],
    "malformed --input": ["run", str(gemm_file), "--input", "a.npy"],
    "--input of the wrong size": ["run", str(gemm_file), "--input", f"0={tmp_path / 'small.npy'}"],
    "--input for an unknown slot": ["run", str(gemm_file), "--input", f"7={tmp_path / 'full.npy'}"],
    "--input file missing": ["run", str(gemm_file), "--input", f"0={tmp_path / 'gone.npy'}"],
    "unknown graph format": ["graph", str(gemm_file), "-o", str(tmp_path / "g.txt")],
  }


ERROR_CASES = ["missing file", "parse error", "malformed --input", "--input of the wrong size", "--input for an unknown slot",
               "--input file missing", "unknown graph format"]


@pytest.mark.parametrize("case", ERROR_CASES)
def test_a_mistake_is_one_line_on_stderr_and_exit_status_1(case, gemm_file, tmp_path, capsys):
  assert cli.main(bad_inputs(tmp_path, gemm_file)[case]) == 1
  out, err = capsys.readouterr()
  assert err.startswith("uopc: error: ") and err.count("\n") == 1, err
  assert "Traceback" not in out + err and out == ""


def test_the_error_messages_say_what_was_wrong(gemm_file, tmp_path, capsys):
  argvs = bad_inputs(tmp_path, gemm_file)
  expected = {"missing file": "nope.uir", "parse error": "line 2", "malformed --input": "SLOT=FILE.npy",
              "--input of the wrong size": "65536 elements", "--input for an unknown slot": "slot 7"}
  for case, words in expected.items():
    cli.main(argvs[case])
    assert words in capsys.readouterr().err, case


@pytest.mark.parametrize("case, exc", [("missing file", cli.CLIError), ("parse error", ParseError), ("malformed --input", cli.CLIError)])
def test_debug_raises_the_exception_instead(case, exc, gemm_file, tmp_path):
  with pytest.raises(exc): cli.main(["--debug", *bad_inputs(tmp_path, gemm_file)[case]])


# ---- plugins and the real entry point --------------------------------------------------------------------------------

class FakeEntryPoint:
  def __init__(self, name, target): self.name, self.target = name, target
  def load(self): return self.target()


def with_plugins(monkeypatch, *eps) -> None:
  real = cli.importlib.metadata.entry_points
  monkeypatch.setattr(cli.importlib.metadata, "entry_points", lambda **kw: list(eps) if kw.get("group") == "uopc.commands" else real(**kw))


def test_a_subcommand_registered_under_uopc_commands_is_available(monkeypatch, capsys):
  def register(subparsers):
    p = subparsers.add_parser("hello", help="say hello")
    p.add_argument("who")
    p.set_defaults(func=lambda args: print(f"hello, {args.who}") or 7)
  with_plugins(monkeypatch, FakeEntryPoint("hello", lambda: register))
  assert cli.main(["hello", "world"]) == 7
  assert capsys.readouterr().out == "hello, world\n"


def test_a_broken_plugin_is_a_warning_and_the_builtin_commands_still_work(monkeypatch, gemm_file, capsys):
  def broken(): raise ImportError("no module named uopc_missing")
  with_plugins(monkeypatch, FakeEntryPoint("broken", broken))
  assert cli.main(["render", str(gemm_file)]) == 0
  out, err = capsys.readouterr()
  assert "void gemm_256x256(" in out and "uopc: warning:" in err and "'broken'" in err


def test_python_dash_m_uopc_cli_renders_a_file(gemm_file, tmp_path):
  roots = {str(Path(m.__file__).resolve().parents[1]) for m in (uopc.uop, uopc.rangeify)} | {str(Path(C.__file__).resolve().parents[2])}
  inherited = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
  env = {**os.environ, "PYTHONPATH": os.pathsep.join(sorted(roots) + inherited), "UOPC_CACHE_DIR": str(tmp_path / "cache")}
  proc = subprocess.run([sys.executable, "-m", "uopc.cli", "render", str(gemm_file)], env=env, capture_output=True, text=True, timeout=120)
  assert proc.returncode == 0, proc.stderr
  assert "void gemm_256x256(float* restrict data0, float* restrict data1, float* restrict data2) {" in proc.stdout


def test_a_reader_that_stops_early_is_not_an_error(gemm_file, tmp_path):
  """`uopc run prog.uir | head -1`: the closed pipe ends the command quietly."""
  roots = {str(Path(m.__file__).resolve().parents[1]) for m in (uopc.uop, uopc.rangeify)} | {str(Path(C.__file__).resolve().parents[2])}
  inherited = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
  env = {**os.environ, "PYTHONPATH": os.pathsep.join(sorted(roots) + inherited), "UOPC_CACHE_DIR": str(tmp_path / "cache")}
  proc = subprocess.Popen([sys.executable, "-m", "uopc.cli", "run", str(gemm_file)], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
  proc.stdout.close()   # closed before the command writes anything: every write of it hits a closed pipe
  err = proc.stderr.read().decode()
  assert proc.wait(timeout=120) == 0 and err == ""


EXAMPLES = Path(__file__).resolve().parents[3] / "examples" / "uir"


@pytest.mark.parametrize("name", ["matmul", "softmax", "rowsum"])
def test_the_example_programs_the_readme_uses_render_and_run(name, tmp_path, capsys):
  path = EXAMPLES / f"{name}.uir"
  assert cli.main(["render", str(path)]) == 0
  assert f"void {name}(" in capsys.readouterr().out
  assert cli.main(["run", str(path), "--save", str(tmp_path / "out.npy")]) == 0
  printed = capsys.readouterr().out
  rng = np.random.default_rng(0)   # the command's random inputs: seed 0, one standard normal array per input slot in order
  if name == "matmul":
    a, b = (rng.standard_normal(4096).astype(np.float32).reshape(64, 64) for _ in range(2))
    np.testing.assert_allclose(np.load(tmp_path / "out.npy"), a @ b, rtol=1e-4, atol=1e-4)
  elif name == "softmax":
    x = rng.standard_normal(128).astype(np.float32).reshape(8, 16)
    e = np.exp(x - x.max(1, keepdims=True))
    np.testing.assert_allclose(np.load(tmp_path / "out.npy"), e / e.sum(1, keepdims=True), rtol=1e-5)
  else:
    x = rng.standard_normal(12).astype(np.float32)
    np.testing.assert_allclose(np.load(tmp_path / "out.npy"), x.reshape(3, 4).sum(1), rtol=1e-6)
  assert "output" in printed


def test_a_failed_save_leaves_the_old_file_whole_and_no_temporary(tmp_path, monkeypatch, capsys):
  (tmp_path / "rowsum.uir").write_text(ROWSUM_UIR)
  np.save(tmp_path / "x.npy", np.ones(12, np.float32))
  out = tmp_path / "s.npy"
  np.save(out, np.arange(5))
  def full_disk(*a, **k): raise OSError(28, "No space left on device")
  monkeypatch.setattr(np, "save", full_disk)
  assert cli.main(["run", str(tmp_path / "rowsum.uir"), "--input", f"0={tmp_path / 'x.npy'}", "--save", str(out)]) != 0
  assert "No space left on device" in capsys.readouterr().err
  monkeypatch.undo()
  assert np.load(out).tolist() == list(range(5))                          # written beside and renamed: the old file stands
  assert not [p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp")]
