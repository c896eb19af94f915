"""uopc.distributed in a single process, with mpi4py absent (as in this suite's environment; hidden here where it is
installed): world size 1 needs no MPI, every collective leaves the values as they are, bad arguments are refused, and a
process that MPI launched as one of several without mpi4py is an error, not a world of one. The collectives across
ranks are tests_dist's (the `distributed` nox session)."""
import sys
import numpy as np
import pytest
from uopc.tensor import Tensor
from uopc import distributed as dist
from uopc.cli import main


@pytest.fixture
def no_mpi(monkeypatch):
  monkeypatch.setitem(sys.modules, "mpi4py", None)      # `import mpi4py` raises ImportError
  monkeypatch.setattr(dist, "_world", None)
  for name in dist._LAUNCHER_SIZE: monkeypatch.delenv(name, raising=False)


def test_one_process_is_a_world_of_one_and_every_collective_keeps_the_values(no_mpi):
  assert dist.init() == (0, 1) and dist.rank() == 0 and dist.world_size() == 1
  a, b = Tensor(np.arange(6, dtype=np.float32).reshape(2, 3)), Tensor(np.ones(4, np.int32)) * 3
  out = dist.allreduce([a, b], op="sum")
  assert out[0] is a and out[1] is b
  np.testing.assert_array_equal(a.numpy(), np.arange(6).reshape(2, 3))
  assert b.numpy().tolist() == [3] * 4
  assert dist.broadcast([a])[0] is a
  dist.barrier()
  assert dist.stats() == {"seconds": 0.0, "calls": 0, "bytes": 0}
  dist.fail(RuntimeError("x"))                          # returns: a single process reports its error as usual


@pytest.mark.parametrize("call, says", [
  (lambda: dist.allreduce([Tensor(np.ones(2, np.float32))], op="avg"), "op must be one of 'mean', 'sum', 'max', 'min', got 'avg'"),
  (lambda: dist.allreduce(Tensor(np.ones(2, np.float32))), "allreduce takes a list of Tensors, got Tensor"),
  (lambda: dist.allreduce([np.ones(2)]), "allreduce: item 0 is a ndarray, not a Tensor"),
  (lambda: dist.allreduce([Tensor(np.ones(2, np.float32))], bucket_bytes=0), "bucket_bytes must be an int >= 1, got 0"),
  (lambda: dist.broadcast([Tensor(np.ones(2, np.float32))], root=1), "root must be a rank in 0..0, got 1"),
  (lambda: dist.allreduce([Tensor(np.ones(2, np.float32)), Tensor(np.ones(2, np.int32))]), "the mean of i32 tensors is not one (use op='sum')"),
])
def test_bad_arguments_are_refused_naming_what_was_wrong(no_mpi, call, says):
  with pytest.raises(dist.DistributedError) as e: call()
  assert says in str(e.value)


def test_a_process_mpiexec_started_as_one_of_several_without_mpi4py_is_an_error(no_mpi, monkeypatch):
  monkeypatch.setenv("PMI_SIZE", "2")
  with pytest.raises(dist.DistributedError, match=r"one of 2 MPI processes, but mpi4py is not installed: pip install 'uopc-tensor\[dist\]'"):
    dist.init()


def test_nproc_without_mpi4py_says_which_extra_to_install(no_mpi, capsys, tmp_path):
  assert main(["gpt", "train", "--nproc", "2", "--steps", "1", "--out", str(tmp_path)]) == 1
  err = capsys.readouterr().err
  assert err.strip() == "uopc: error: --nproc 2 runs mpiexec, which needs mpi4py: pip install 'uopc-tensor[dist]' (mpi4py and the mpich wheel)"
  assert not (tmp_path / "model.safetensors").exists()


def test_a_collective_inside_a_jitted_function_is_refused_as_a_replay_would_skip_it(no_mpi):
  from uopc.jit import jit
  w = Tensor(np.ones(3, np.float32))
  @jit
  def step(x):
    g = x * w
    dist.allreduce([g])
    return g
  with pytest.raises(dist.DistributedError, match="allreduce inside a function uopc.jit is capturing"):
    step(Tensor(np.ones(3, np.float32)))                 # refused at the first call already


def test_the_rank_watcher_counts_a_process_whose_exit_has_begun_as_ended():
  # a killed rank tears itself down (closing its sockets) before it is a zombie, and the other rank, its allreduce
  # broken, could end first: CI saw rank 0 named for a killed rank 1 (1 run in 12 under load, 0 in 16 with this). The
  # kernel sets PF_EXITING (0x4) in the flags as the exit begins; the name may hold ") " itself
  from uopc.gpt.cli import _stat_ended
  line = lambda state, flags: f"1234 (python -m x) y) {state} 1 1234 1234 0 -1 {flags} 0 0 0 0 5 2 0 0 20 0 3".encode()
  assert not _stat_ended(line("R", 0x400000)) and not _stat_ended(line("S", 0x400140))
  assert _stat_ended(line("R", 0x400004)) and _stat_ended(line("D", 0x404044))    # exiting, not yet a zombie
  assert _stat_ended(line("Z", 0x400000)) and _stat_ended(line("X", 0))


def test_the_rank_watcher_sees_a_killed_process_ended_before_its_parent_collects_it():
  # --nproc names the rank whose process ended first; a rank killed outright is a zombie until mpiexec's proxy collects
  # it, and a signal 0 still reaches a zombie, so the watcher reads the process state: a killed, uncollected child has
  # ended, a live one has not, a collected one has
  import os, signal, subprocess, time
  from uopc.gpt.cli import _ended
  child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
  try:
    assert not _ended(child.pid)
    os.kill(child.pid, signal.SIGKILL)
    deadline = time.time() + 10
    while not _ended(child.pid) and time.time() < deadline: time.sleep(0.01)
    assert _ended(child.pid)
    if os.path.isdir("/proc/self"): assert os.path.exists(f"/proc/{child.pid}")    # still uncollected: a zombie
  finally:
    child.kill()
    child.wait()
  assert _ended(child.pid)
