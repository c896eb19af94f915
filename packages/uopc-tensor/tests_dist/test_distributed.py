"""uopc.distributed and `uopc gpt train` under MPI, on loopback with 2 and 3 processes (mpiexec from the mpich wheel):
the collectives against NumPy, training on N ranks against one process, faults, resuming on another world size.
Needs uopc-tensor[dist] (the `distributed` nox session installs it)."""
import json, os, re, shutil, subprocess, sys, time
from pathlib import Path
import numpy as np
import pytest
from uopc import nn

try: import mpi4py  # noqa: F401
except ImportError: raise ImportError("tests_dist needs mpi4py and mpiexec: pip install 'uopc-tensor[dist]'") from None
MPIEXEC = shutil.which("mpiexec", path=os.pathsep.join([os.path.dirname(sys.executable), os.environ.get("PATH", "")]))
HERE = Path(__file__).parent
TINY = ["--digits", "1", "--width", "16", "--heads", "2", "--layers", "1", "--lr", "1e-2", "--seed", "3"]


@pytest.fixture(scope="module")
def env(tmp_path_factory):
  """One compile cache for every process of this module (the session's, when it gives one), one thread per rank (2
  cores, up to 3 ranks)."""
  return {**os.environ, "UOPC_CACHE_DIR": os.environ.get("UOPC_CACHE_DIR") or str(tmp_path_factory.mktemp("cache")), "OMP_NUM_THREADS": "1"}


def mpirun(n: int, args: list, env: dict, timeout: float = 240) -> subprocess.CompletedProcess:
  """`mpiexec -n N python ARGS` (a script, or -m uopc.cli ...), its output captured."""
  return subprocess.run([MPIEXEC, "-n", str(n), sys.executable, *map(str, args)], env=env, capture_output=True, text=True, timeout=timeout)


def train(args: list, env: dict, n: int | None = None) -> subprocess.CompletedProcess:
  """`uopc gpt train ARGS`: in one process, or under `mpiexec -n N`."""
  cmd = ["-m", "uopc.cli", "gpt", "train", *TINY, *args]
  r = mpirun(n, cmd, env) if n else subprocess.run([sys.executable, *map(str, cmd)], env=env, capture_output=True, text=True, timeout=240)
  return r


def weights(run_dir: Path) -> dict:
  return {k: v.numpy() for k, v in nn.safe_load(run_dir / "model.safetensors").items()}


def assert_same_model(a: dict, b: dict) -> None:
  """The same weights to f32 rounding, but for the key projection's bias: adding a constant to every score of a query
  leaves its softmax alone, so the loss doesn't depend on it and its gradient is rounding noise, which AdamW scales to
  full-size steps; any two orders of summation move it differently (one process against another too)."""
  for k in a:
    keep = np.ones(a[k].shape, bool)
    if k.endswith("attn.bias"): keep[a[k].shape[0] // 3: 2 * a[k].shape[0] // 3] = False
    np.testing.assert_allclose(b[k][keep], a[k][keep], rtol=1e-4, atol=1e-5, err_msg=k)


def final_loss(run_dir: Path) -> float:
  """The last step's training loss as the run computed it (the checkpoint's history; the printed one is rounded)."""
  return json.loads(nn.safe_load(run_dir / "model.safetensors", with_metadata=True)[1]["history"])[-1][1]


@pytest.mark.parametrize("n", [2, 3])
def test_every_collective_on_every_rank_matches_numpy(n, env):
  r = mpirun(n, [HERE / "collectives.py"], env, timeout=120)
  assert r.returncode == 0, r.stderr[-3000:]
  assert all(r.stdout.count(f"rank {k} of {n}: ok") == 1 for k in range(n)), r.stdout   # the ranks' lines may interleave


def test_training_on_n_ranks_matches_one_process_with_the_whole_batch(env, tmp_path):
  """--batch is the global batch: each rank takes its rows of the batch every rank draws, weighted by its share of the
  predicted targets (1-digit additions predict answers of one or two digits), so N ranks train the model one process
  would: the same losses and weights (to f32 rounding). 2 ranks x 6 through --nproc (it runs mpiexec) against one
  process x 12, 3 ranks x 6 by mpiexec against one process x 18 (shards of one size: 3 ranks don't compile anew)."""
  for n, batch in ((2, 12), (3, 18)):
    one, many = tmp_path / f"one{batch}", tmp_path / f"ranks{n}"
    r = train(["--steps", "8", "--batch", batch, "--out", one], env)
    assert r.returncode == 0, r.stderr[-3000:]
    r = train(["--steps", "8", "--batch", batch, "--out", many, "--nproc", "2"], env) if n == 2 else \
      train(["--steps", "8", "--batch", batch, "--out", many], env, n)
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.count("final loss") == 1 and r.stdout.count("saved") == 1   # rank 0 alone reports and writes
    assert final_loss(many) == pytest.approx(final_loss(one), rel=1e-5), n
    assert_same_model(weights(one), weights(many))


def test_a_batch_that_does_not_split_across_the_ranks_is_one_clear_error(env, tmp_path):
  r = train(["--steps", "2", "--batch", "5", "--out", tmp_path], env, 2)
  assert r.returncode != 0
  assert r.stderr.count("--batch 5 does not split across 2 processes: give a multiple of 2") == 1, r.stderr


@pytest.mark.parametrize("how", ["raise", "kill"])
def test_a_rank_that_fails_mid_step_stops_every_rank_and_leaves_the_checkpoint_whole(how, env, tmp_path):
  """Rank 1 fails in its third allreduce (an exception, or SIGKILL). Rank 0 would wait for it forever: the job must
  end within seconds, non-zero, naming the failed rank (an exception's own line; for a killed one, --nproc watches
  which rank's process is gone first, beside mpiexec's report of a pid), and the checkpoint the run resumed from stays
  as it was."""
  first = train(["--steps", "2", "--batch", "12", "--out", tmp_path], env)
  assert first.returncode == 0, first.stderr[-3000:]
  before = (tmp_path / "model.safetensors").read_bytes()
  faulty = {**env, "PYTHONPATH": os.pathsep.join([str(HERE / "fault_hook"), env.get("PYTHONPATH", "")]),
            "UOPC_TEST_FAIL_RANK": "1", "UOPC_TEST_FAIL_AT": "3", "UOPC_TEST_FAIL_HOW": how, "UOPC_TEST_FAIL_STAMP": str(tmp_path / "struck")}
  if how == "raise": r = train(["--steps", "200", "--batch", "12", "--resume", tmp_path], faulty, 2)
  else: r = train(["--steps", "200", "--batch", "12", "--resume", tmp_path, "--nproc", "2"], faulty)   # --nproc names it
  assert r.returncode != 0 and time.time() - float((tmp_path / "struck").read_text()) < 30   # every rank gone within 30 s
  if how == "raise": assert r.stderr.count("uopc: error: rank 1 of 2 failed: injected fault") == 1, r.stderr[-3000:]
  else:
    assert "BAD TERMINATION" in r.stdout and "EXIT CODE: 9" in r.stdout, r.stdout[-3000:]   # mpiexec's report, by pid
    # named by the rank seen gone first (mpiexec may report a rank it stopped itself: then the code is not known)
    assert len(re.findall(r"uopc: error: rank 1 of 2 \(pid \d+\) ended (with exit code 9|first) \(killed", r.stderr)) == 1, r.stderr[-3000:]
    assert "rank 0 of 2" not in r.stderr, r.stderr[-3000:]
  assert "Traceback" not in r.stderr
  assert (tmp_path / "model.safetensors").read_bytes() == before
  assert weights(tmp_path)                       # and it still loads


def test_a_checkpoint_resumes_on_another_number_of_ranks(env, tmp_path):
  """The optimizer state is the same on every rank, so a run saved by 2 ranks resumes on 3, or on one process, alike."""
  r = train(["--steps", "4", "--batch", "12", "--out", tmp_path / "two"], env, 2)
  assert r.returncode == 0, r.stderr[-3000:]
  for d in ("three", "one"): shutil.copytree(tmp_path / "two", tmp_path / d)
  three = train(["--steps", "2", "--batch", "18", "--resume", tmp_path / "three"], env, 3)
  one = train(["--steps", "2", "--batch", "18", "--resume", tmp_path / "one"], env)
  assert three.returncode == 0 and one.returncode == 0, (three.stderr + one.stderr)[-3000:]
  assert final_loss(tmp_path / "three") == pytest.approx(final_loss(tmp_path / "one"), rel=1e-5)
  assert_same_model(weights(tmp_path / "one"), weights(tmp_path / "three"))


def test_the_launcher_names_the_rank_gone_first_not_the_one_mpiexec_stopped_after_it(tmp_path):
  """mpiexec reports one ended process, the first it finds: once (CI, a loaded machine) that was rank 0, which it had
  stopped itself with SIGKILL after rank 1 was killed, and the launcher named rank 0. Its watcher sees which rank's
  process is gone first: here rank 1, killed 0.3 s before rank 0."""
  import signal, threading
  from uopc.gpt.cli import _watch_ranks
  procs = {r: subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"]) for r in ("0", "1")}
  try:
    for r, p in procs.items(): (tmp_path / r).write_text(str(p.pid))
    gone, stop = [], threading.Event()
    watcher = threading.Thread(target=_watch_ranks, args=(str(tmp_path), 2, gone, stop))
    watcher.start()
    time.sleep(0.2)
    procs["1"].send_signal(signal.SIGKILL); procs["1"].wait()
    time.sleep(0.3)
    procs["0"].send_signal(signal.SIGKILL); procs["0"].wait()
    stop.set(); watcher.join(5)
    assert gone == [{"1"}]
  finally:
    for p in procs.values():
      if p.poll() is None: p.kill()
