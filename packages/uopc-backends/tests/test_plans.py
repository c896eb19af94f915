"""Plans on disk (uopc.runtime's _plan_path): what compile_kernel made for a kernel, read back by a later process so it
neither chooses Opts, lowers nor renders again. A plan must give the program the road would make, and never one the
road in this process would not make (another source, a mutated pass or renderer, other stored Opts, a damaged entry)."""
import subprocess, sys
import numpy as np
import pytest
from uopc import runtime
from uopc.uop import Ops, buf
from uopc.lowering import Opts
from uopc.kernelize import make_kernel
from uopc.backends import get_backend
from uopc.backends.c import CRenderer
from uopc.runtime import Buffer, compile_kernel, store_opts

C = get_backend("C")


@pytest.fixture(autouse=True)
def own_cache(tmp_path, monkeypatch):
  monkeypatch.setenv("UOPC_CACHE_DIR", str(tmp_path / "cache"))
  monkeypatch.setattr(runtime, "_programs", runtime.ProgramCache(64))


def kernel(rows=6, cols=40):
  return make_kernel((buf(0, rows * cols).reshape((rows, cols)) * 2.0).reduce(Ops.ADD, 1), buf(1, rows))


def new_process() -> None:
  """What a new process has: the disk, and no program in memory."""
  runtime._programs.clear()


def run(prog, rows=6, cols=40) -> np.ndarray:
  x = Buffer.from_numpy(np.arange(rows * cols, dtype=np.float32), C)
  out = Buffer(C, rows, x.dtype)
  prog([x, out])
  return out.numpy()


@pytest.mark.parametrize("opts", [None, Opts(unroll=2)], ids=["policy", "opts"])
def test_a_later_process_gets_the_same_program_from_its_plan_without_lowering(opts):
  made = compile_kernel(kernel(), C, opts)
  assert made.uops and len(list((runtime.cache_dir() / "plans").iterdir())) == 1
  new_process()
  planned = compile_kernel(kernel(), C, opts)
  assert planned is not made and planned.uops == ()          # nothing was linearized: the plan gave the source
  for field in ("name", "src", "opts", "params", "global_size", "local_size", "shape", "flops", "nbytes"):
    assert getattr(planned, field) == getattr(made, field), field
  np.testing.assert_array_equal(run(planned), run(made))
  np.testing.assert_array_equal(run(planned), (np.arange(240, dtype=np.float32).reshape(6, 40) * 2).sum(1))
  assert compile_kernel(kernel(), C, opts) is planned        # and it is the in-process program from then on


def test_a_mutated_renderer_reads_no_plan_made_without_it(monkeypatch):
  made = compile_kernel(kernel(), C)
  new_process()
  real = CRenderer.render
  monkeypatch.setattr(CRenderer, "render", lambda self, program: "// mutated\n" + real(self, program))
  mutated = compile_kernel(kernel(), C)
  assert mutated.src.startswith("// mutated") and mutated.uops and mutated.src != made.src
  monkeypatch.setattr(CRenderer, "render", real)              # the road as it was: its own plan again
  new_process()
  again = compile_kernel(kernel(), C)
  assert again.src == made.src and again.uops == ()


def test_a_mutated_pass_reads_no_plan_made_without_it(monkeypatch):
  compile_kernel(kernel(), C)
  new_process()
  calls = []
  real_lower = runtime.lower
  monkeypatch.setattr(runtime, "lower", lambda *a, **kw: calls.append(1) or real_lower(*a, **kw))
  assert compile_kernel(kernel(), C).uops and calls


def test_other_stored_opts_are_another_plan():
  made = compile_kernel(kernel(), C)
  store_opts(kernel(), C, Opts(unroll=4))                    # a search chose, in another process
  new_process()
  chosen = compile_kernel(kernel(), C)
  assert chosen.opts == Opts(unroll=4) and chosen.uops and chosen.opts != made.opts


def test_a_damaged_plan_is_removed_and_the_kernel_lowered_again():
  made = compile_kernel(kernel(), C)
  (plan,) = (runtime.cache_dir() / "plans").iterdir()
  plan.write_bytes(plan.read_bytes()[:-40] + b"x" * 40)
  new_process()
  again = compile_kernel(kernel(), C)
  assert again.uops and again.src == made.src and plan.exists()   # removed, then written afresh
  new_process()
  assert compile_kernel(kernel(), C).uops == ()


def test_a_plan_is_read_by_another_process(tmp_path):
  code = ("import sys; sys.path[:0] = sys.argv[1:2]; from uopc.runtime import compile_kernel; from uopc.backends import get_backend;"
          "from test_plans import kernel; p = compile_kernel(kernel(), get_backend('C')); print(len(p.uops) > 0)")
  env = {**__import__("os").environ, "UOPC_CACHE_DIR": str(runtime.cache_dir())}
  here = str(__import__("pathlib").Path(__file__).parent)
  first, second = (subprocess.run([sys.executable, "-c", code, here], env=env, capture_output=True, text=True, check=True).stdout.strip()
                   for _ in range(2))
  assert (first, second) == ("True", "False")
