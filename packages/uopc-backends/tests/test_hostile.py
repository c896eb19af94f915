"""The hostile-input catalogue of uopc-backends: the runtime (Buffers, Programs, run_schedule), the backend registry,
the C backend (render_c, run_c, the compiler), the test helper run_shaped, and the `uopc` command, given the malformed
inputs a user can produce. Each gives a correct answer or a one-line error of the project's own exception types
(BackendError and its CompileError/UnsafeKernelError, CLIError); no AttributeError, TypeError, ValueError, MemoryError
or raw OSError escapes, and the command never reads a device until memory runs out."""
import numpy as np
import pytest
import uopc.cli as cli
from uopc.dtype import dtypes
from uopc.uop import UOp, buf, sink
from uopc.rangeify import lower
from uopc.kernelize import make_kernel
from uopc.backends import BackendError, get_backend, register_backend
from uopc.backends.c import CCompiler
from uopc.testing import run_c, render_c
from uopc.runtime import Buffer, compile_kernel, compile_program, run_schedule
from uopc.testing import run_shaped
from example_programs import ROWSUM_UIR


@pytest.fixture(autouse=True)
def own_cache(tmp_path, monkeypatch):
  monkeypatch.setenv("UOPC_CACHE_DIR", str(tmp_path / "cache"))


C = get_backend("C")
TWICE = lower(buf(0, 4) * 2.0, buf(1, 4))
f32 = lambda n: np.zeros(n, np.float32)


def broken_factory(): raise ZeroDivisionError("the driver is missing")


BAD = {
  "run_c without an output array": (lambda: run_c(TWICE, {0: f32(4)}), "no array for buffer slot 1"),
  "run_c with a list for an array": (lambda: run_c(TWICE, {0: [1, 2, 3, 4], 1: f32(4)}), "expected a numpy array"),
  "run_c with float64": (lambda: run_c(TWICE, {0: np.zeros(4), 1: f32(4)}), "expected dtype float32"),
  "run_c with a short array": (lambda: run_c(TWICE, {0: f32(2), 1: f32(4)}), "the kernel uses 4 elements, the array has 2"),
  "run_c into a read-only array": (lambda: run_c(TWICE, {0: f32(4), 1: np.frombuffer(bytes(16), np.float32)}), "read-only"),
  "run_c with overlapping arrays": (lambda: (lambda a: run_c(TWICE, {0: a, 1: a}))(f32(4)), "overlap"),
  "run_c with a strided array": (lambda: run_c(TWICE, {0: f32(8)[::2], 1: f32(4)}), "C-contiguous"),
  "run_c of a value": (lambda: run_c(buf(0, 4), {}), "the SINK that lower() returns"),
  "run_c with a list of arrays": (lambda: run_c(TWICE, [f32(4), f32(4)]), "a dict {slot: numpy array}"),
  "render_c of an int": (lambda: render_c(3), "the SINK that lower() returns"),
  "render_c of an out-of-bounds store": (lambda: render_c(sink(buf(0, 4).index(UOp.const(9)).store(UOp.const(1.0)))), "outside 0..3"),
  "a C compile error": (lambda: CCompiler().compile("int main( {", "main"), "gcc failed"),
  "a source without the function": (lambda: CCompiler().compile("void f(void) {}\n", "g"), "has no function 'g'"),
  "compile_program of an int": (lambda: compile_program(3, C), "takes a lowered SINK"),
  "compile_kernel of an int": (lambda: compile_kernel(3, C), "takes a uopc.kernelize.Kernel"),
  "a Buffer of -1 elements": (lambda: Buffer(C, -1, dtypes.f32), "non-negative number of elements"),
  "a Buffer of 1.5 elements": (lambda: Buffer(C, 1.5, dtypes.f32), "non-negative number of elements"),
  "a Buffer of void": (lambda: Buffer(C, 1, dtypes.void), "no NumPy dtype"),
  "a Buffer of a string dtype": (lambda: Buffer(C, 1, "f32"), "a uopc DType"),
  "a Buffer on no backend": (lambda: Buffer(3, 1, dtypes.f32), "lives on a backend"),
  "a Buffer of 36 TiB": (lambda: Buffer(C, 10**13, dtypes.f32), "out of memory"),
  "a Buffer of object data": (lambda: Buffer.from_numpy(np.array([{}]), C), "no uopc dtype holds"),
  "strings into a Buffer": (lambda: Buffer(C, 2, dtypes.f32).copyin(["a", "b"]), "can't go into a f32 buffer"),
  "a backend named by an int": (lambda: get_backend(3), "unknown backend 3"),
  "an unknown backend": (lambda: get_backend("NOPE"), "available: "),
  "a backend with no name": (lambda: register_backend(" ", lambda: None), "non-empty name"),
  "a backend whose factory fails": (lambda: (register_backend("BROKEN", broken_factory), get_backend("BROKEN")), "its factory failed"),
  "run_shaped without its inputs": (lambda: run_shaped(buf(0, 4) * 2.0, []), "reads BUFFER slots [0]"),
  "run_shaped of a short input": (lambda: run_shaped(buf(0, 4) * 2.0, [np.zeros(2)]), "must be f32[4]"),
  "run_shaped of text": (lambda: run_shaped(buf(0, 4) * 2.0, ["abcd"]), "can't be read as the numbers"),
  "run_schedule of an int": (lambda: run_schedule(3, C, {}), "a list of Kernels"),
  "run_schedule without its input": (lambda: run_schedule([make_kernel(buf(0, 4) * 2.0, buf(1, 4))], C, {}), "holds no data"),
  "a Program launched on ints": (lambda: compile_program(TWICE, C)([1, 2]), "must be a Buffer"),
  "a Program launched on None": (lambda: compile_program(TWICE, C)(None), "a list of Buffers"),
}


@pytest.mark.parametrize("case", list(BAD))
def test_a_hostile_input_is_a_one_line_backend_error(case):
  fn, match = BAD[case]
  with pytest.raises(BackendError) as e: fn()
  msg = str(e.value)
  assert match in msg, msg
  if "gcc failed" not in msg: assert "\n" not in msg and len(msg) < 600, msg   # a compile error carries gcc's output and the source


def test_what_is_legal_at_the_edges_still_runs():
  out = f32(4)
  run_c(TWICE, {0: np.arange(8, dtype=np.float32), 1: out})                    # a larger array than the kernel reads
  np.testing.assert_array_equal(out, [0, 2, 4, 6])
  np.testing.assert_array_equal(run_shaped(buf(0, 4) * 2.0, [np.arange(4)]), [0, 2, 4, 6])   # int64 input read as f32
  assert get_backend("").name == "C" and get_backend(" c ").name == "C"         # empty means the default


# ---- the `uopc` command -------------------------------------------------------------------------------------------------

@pytest.fixture
def rowsum(tmp_path):
  (tmp_path / "rowsum.uir").write_text(ROWSUM_UIR)
  return str(tmp_path / "rowsum.uir")


def files(tmp_path):
  np.save(tmp_path / "x12.npy", np.arange(12, dtype=np.float32))
  np.save(tmp_path / "obj.npy", np.array([{}], dtype=object), allow_pickle=True)
  np.savez(tmp_path / "z.npz", a=np.zeros(12, np.float32))
  (tmp_path / "text.npy").write_text("hello, this is not an array\n")
  (tmp_path / "trunc.npy").write_bytes((tmp_path / "x12.npy").read_bytes()[:100])
  (tmp_path / "binary.uir").write_bytes(bytes(range(256)) * 4)
  (tmp_path / "nul.uir").write_bytes(b"%0 = const 1.0\x00\n")
  return tmp_path


CLI_ERRORS = {
  "a device file as the program": (["run", "/dev/zero"], "more than 64 MiB"),
  "a directory as the program": (["run", "{tmp}"], "is a directory"),
  "a binary file as the program": (["render", "{tmp}/binary.uir"], "not a text file"),
  "NUL bytes in the program": (["render", "{tmp}/nul.uir"], "not a text file"),
  "an .npz archive as --input": (["run", "{rowsum}", "--input", "0={tmp}/z.npz"], "is a .npz archive"),
  "a text file as --input": (["run", "{rowsum}", "--input", "0={tmp}/text.npy"], "is not a .npy file"),
  "a device file as --input": (["run", "{rowsum}", "--input", "0=/dev/zero"], "is not a .npy file"),
  "a directory as --input": (["run", "{rowsum}", "--input", "0={tmp}"], "is a directory"),
  "an object array as --input": (["run", "{rowsum}", "--input", "0={tmp}/obj.npy"], "damaged or unsupported .npy"),
  "a truncated .npy as --input": (["run", "{rowsum}", "--input", "0={tmp}/trunc.npy"], "damaged or unsupported .npy"),
  "--save into a missing directory": (["run", "{rowsum}", "--input", "0={tmp}/x12.npy", "--save", "{tmp}/no/such/dir/o.npy"], "no such file"),
  "-o into a missing directory": (["graph", "{rowsum}", "-o", "{tmp}/no/such/dir/g.dot"], "no such file"),
}


@pytest.mark.parametrize("case", list(CLI_ERRORS))
def test_a_hostile_command_line_is_one_line_on_stderr_and_status_1(case, rowsum, tmp_path, capsys):
  argv, match = CLI_ERRORS[case]
  files(tmp_path)
  assert cli.main([a.format(tmp=tmp_path, rowsum=rowsum) for a in argv]) == 1
  out, err = capsys.readouterr()
  assert err.startswith("uopc: error: ") and err.count("\n") == 1 and match in err, err
  assert "Traceback" not in out + err


@pytest.mark.parametrize("seed", ["-5", "x", "1.5"])
def test_a_bad_seed_names_the_option(seed, rowsum, capsys):
  with pytest.raises(SystemExit) as e: cli.main(["run", rowsum, "--seed", seed])
  assert e.value.code == 2
  assert f"argument --seed: expected a non-negative integer, got '{seed}'" in capsys.readouterr().err


TWO_OUTPUTS = """# two rows of 4: data1 gets each row's sum, data2 each row's max
%0 = buffer 8 : dtype=f32 slot=0
%1 = buffer 2 : dtype=f32 slot=1
%2 = buffer 2 : dtype=f32 slot=2
%3 = range 2 : idx=0 kind=loop
%4 = mul %3, 4
%5 = index %0, %4
%6 = load %5
%7 = add %4, 1
%8 = index %0, %7
%9 = load %8
%10 = add %6, %9
%11 = max %6, %9
%12 = index %1, %3
%13 = store %12, %10
%14 = index %2, %3
%15 = store %14, %11
%16 = sink %13, %15
%17 = end %16, %3
%18 = sink %17
"""


def test_save_keeps_every_output_of_a_program_with_several(tmp_path, capsys):
  prog = tmp_path / "two.uir"
  prog.write_text(TWO_OUTPUTS)
  np.save(tmp_path / "x.npy", np.array([1, 5, 0, 0, 2, -3, 0, 0], np.float32))
  args = ["run", str(prog), "--input", f"0={tmp_path / 'x.npy'}"]
  assert cli.main(args + ["--save", str(tmp_path / "out.npy")]) == 1           # .npy holds one array: not silently the last
  assert "writes 2 buffers (slots 1, 2); give FILE.npz" in capsys.readouterr().err and not (tmp_path / "out.npy").exists()
  assert cli.main(args + ["--save", str(tmp_path / "out.npz")]) == 0
  saved = np.load(tmp_path / "out.npz")
  assert sorted(saved.files) == ["slot1", "slot2"]
  np.testing.assert_array_equal(saved["slot1"], [6, -1])
  np.testing.assert_array_equal(saved["slot2"], [5, 2])


def test_a_program_whose_buffers_dont_fit_in_memory_is_refused_before_allocating(tmp_path, monkeypatch, capsys):
  prog = tmp_path / "big.uir"
  prog.write_text("%0 = const 1.0\n%1 = reshape %0, (1,)\n%2 = expand %1, (100000,)\n")
  monkeypatch.setattr(cli, "available_memory", lambda: 1 << 20)   # as if 1 MiB were free: the output needs 3 x 400 KB
  assert cli.main(["run", str(prog)]) == 1
  assert "the program's buffers need 0.0 GiB, more than the 0.0 GiB of memory available" in capsys.readouterr().err
  monkeypatch.setattr(cli, "available_memory", lambda: None)       # where it can't be told, the program runs
  assert cli.main(["run", str(prog)]) == 0


def test_uopc_device_empty_means_the_default(rowsum, tmp_path, monkeypatch, capsys):
  monkeypatch.setenv("UOPC_DEVICE", "")
  np.save(tmp_path / "ones.npy", np.ones(12, np.float32))
  assert cli.main(["run", rowsum, "--input", f"0={tmp_path / 'ones.npy'}"]) == 0
  assert "[4. 4. 4.]" in capsys.readouterr().out
  assert cli.main(["render", rowsum, "--device", ""]) == 0 and "void rowsum(" in capsys.readouterr().out


# ---- deep expressions render in linear time and memory ---------------------------------------------------------------------

def chain(n: int):
  y = buf(0, 4)
  for i in range(n): y = y * (1.0 + (i % 7) * 1e-7)
  return y


@pytest.mark.parametrize("n", [20_000, 30_000])
def test_a_chain_of_tens_of_thousands_of_multiplies_renders_in_linear_memory(n):
  # rendering once pasted every prefix into the next expression: 20,000 multiplies took 4.2 GB and 13 s, 30,000 a MemoryError
  # (memory and source size are the checks, not seconds: pasting prefixes is quadratic in both)
  import tracemalloc
  sink = lower(chain(n), buf(1, 4))
  tracemalloc.start()
  src = render_c(sink, "chain")
  _, peak = tracemalloc.get_traced_memory()
  tracemalloc.stop()
  assert peak < 200 << 20, f"rendering took {peak >> 20} MiB"
  assert len(src) < 25 * n
  if n == 20_000:   # and the program runs (gcc takes a few seconds on it), with NumPy's answer
    a, out = np.arange(4, dtype=np.float32), f32(4)
    run_c(sink, {0: a, 1: out})
    ref = a.copy()
    for i in range(n): ref = ref * np.float32(1.0 + (i % 7) * 1e-7)
    np.testing.assert_array_equal(out, ref)
