"""The timed search (uopc.search): the fastest candidate wins only by a margin, within a budget; its choice is stored on
disk (atomically, checksummed: a damaged entry is searched again) and every later run uses it without timing. Timing is
injected here, so nothing depends on this machine's speed."""
import dataclasses, json, os, subprocess, sys
import numpy as np
import pytest
import uopc.search as search
import uopc.runtime as runtime
from uopc.uop import Ops, buf
from uopc.dtype import dtypes
from uopc.kernelize import kernelize
from uopc.backends import get_backend
from uopc.compile_cache import read_entry, seal
from uopc.lowering import Opts
from uopc.opt import Caps, candidates, choose_opts
from uopc.runtime import Buffer, compile_kernel, run_schedule, stored_opts, stored_opts_path, store_opts

C = get_backend("C")


@pytest.fixture(autouse=True)
def own_cache(tmp_path, monkeypatch):
  monkeypatch.setenv("UOPC_CACHE_DIR", str(tmp_path / "cache"))
  monkeypatch.setattr(runtime, "_programs", {})      # nothing compiled by another test counts as "seen"
  monkeypatch.setattr(search, "searched", [])


def gemm(n=64, slot=0):
  a = buf(slot, n * n).reshape((n, 1, n)).expand((n, n, n))
  b = buf(slot + 1, n * n).reshape((n, n)).permute((1, 0)).reshape((1, n, n)).expand((n, n, n))
  [k] = kernelize([((a * b).reduce(Ops.ADD, 1), buf(slot + 2, n * n))])
  inputs = [Buffer.from_numpy(np.random.default_rng(0).standard_normal(n * n).astype(np.float32), C) for _ in range(2)]
  return k, inputs


def another_wins(k):
  """A timer under which the first candidate other than the heuristics' choice runs twice as fast, and that candidate."""
  caps = runtime.backend_caps(C)
  heuristic = choose_opts(k, caps)
  other = next(o for o in candidates(k, caps, heuristic) if o != heuristic)
  return (lambda prog, buffers: 1.0 if prog.opts == other else 2.0), other


def test_the_fastest_candidate_is_cached_and_used_by_later_compiles():
  k, inputs = gemm()
  timer, other = another_wins(k)
  best = search.search_opts(k, C, inputs, timer=timer)
  assert best == other and stored_opts(k, C) == best
  entry = json.loads(read_entry(stored_opts_path(k, C)))
  assert entry["seconds"] == 1.0 and entry["heuristic_seconds"] == 2.0
  runtime._programs.clear()
  assert compile_kernel(k, C).opts == best                     # a later compile takes the cached choice


def test_a_candidate_must_beat_the_heuristic_by_the_margin():
  k, inputs = gemm()
  heuristic = compile_kernel(k, C).opts
  almost = lambda prog, bufs: 0.99 if prog.opts != heuristic else 1.0     # 1% faster: noise, not a win
  assert search.search_opts(k, C, inputs, timer=almost) == heuristic


def test_the_budget_bounds_the_candidates_timed():
  k, inputs = gemm()
  now = [0.0]
  def clock(): return now[0]
  def slow(prog, bufs):
    now[0] += 10.0
    return 1.0
  search.search_opts(k, C, inputs, budget=15.0, timer=slow, clock=clock)
  assert json.loads(read_entry(stored_opts_path(k, C)))["candidates"] == 2      # the heuristic and one more


def test_run_schedule_searches_a_new_kernel_once_and_later_runs_time_nothing(monkeypatch):
  k, inputs = gemm()
  timer, other = another_wins(k)
  monkeypatch.setenv("UOPC_SEARCH", "1")
  calls = []
  real = search.search_opts
  monkeypatch.setattr(search, "search_opts", lambda *a, **kw: calls.append(1) or real(*a, timer=timer, **kw))
  bufs = dict(zip(k.inputs, inputs))
  run_schedule([k], C, bufs, policy=search.policy_from_env())
  assert len(calls) == 1 and runtime._programs and compile_kernel(k, C).opts == other
  runtime._programs.clear()                                     # a new process: only the disk remembers
  run_schedule([k], C, dict(zip(k.inputs, inputs)), policy=search.policy_from_env())
  assert len(calls) == 1
  a, b = (x.numpy().reshape(64, 64) for x in inputs)
  np.testing.assert_allclose(bufs[k.out].numpy().reshape(64, 64), a @ b, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("damage", [b"", b"{not json", b'{"body": {"opts": {}}, "sha256": "0"}', seal(b"{not json"),
                                    seal(b'{"opts": {"upcast": [], "thread": 0}}'), seal(b'{"opts": {"stage": 16}}')])
def test_a_damaged_entry_is_ignored_and_searched_again(damage, monkeypatch):
  k, inputs = gemm()
  path = stored_opts_path(k, C)
  path.parent.mkdir(parents=True)
  path.write_bytes(damage)
  assert stored_opts(k, C) is None
  timer, other = another_wins(k)
  monkeypatch.setattr(search, "time_launches", timer)
  run_schedule([k], C, dict(zip(k.inputs, inputs)), policy=search.SEARCH)
  assert stored_opts(k, C) == other


GPU_OPTS = [Opts(gpu=True, local={0: 16, 1: 16}), Opts(gpu=True, group=32, fma=True),
            Opts(gpu=True, stage=16, local={0: 16, 1: 16}, upcast={0: 4, 1: 4}, fma=True),
            Opts(gpu=True, tc=True, local={0: 2, 1: 2}, upcast={0: 2, 1: 4})]


def test_a_stored_choice_keeps_every_field_of_every_candidate_and_of_gpu_opts():
  # the store once wrote 9 of Opts' 12 fields: a searched GPU choice came back without its group, stage or tc
  k, _ = gemm()
  caps = Caps(threads=4, vector_width=8, fma=True)
  every = candidates(k, caps, choose_opts(k, caps)) + GPU_OPTS
  assert len(every) > len(GPU_OPTS) + 1
  for o in every:
    store_opts(k, C, o, seconds=1.0)
    back = stored_opts(k, C)
    assert back == o and all(getattr(back, f.name) == getattr(o, f.name) for f in dataclasses.fields(Opts)), (o, back)


def test_an_unwritable_cache_costs_only_the_next_search(tmp_path, monkeypatch):
  blocker = tmp_path / "file"
  blocker.write_text("not a directory")
  monkeypatch.setenv("UOPC_CACHE_DIR", str(blocker))
  k, inputs = gemm()
  timer, other = another_wins(k)
  assert search.search_opts(k, C, inputs, timer=timer) == other and stored_opts(k, C) is None


def test_uopc_tune_runs_a_script_and_reports(tmp_path):
  script = tmp_path / "work.py"
  script.write_text(
    "import sys, numpy as np\n"
    "from uopc.uop import buf, Ops\nfrom uopc.kernelize import kernelize\nfrom uopc.backends import get_backend\n"
    "from uopc.runtime import Buffer, run_schedule\nfrom uopc.search import policy_from_env\n"
    "C = get_backend('C')\nx = buf(0, 4096)\n[k] = kernelize([((x.reshape((64, 64)) * 2.0).reduce(Ops.ADD, 1), buf(1, 64))])\n"
    "out = {k.inputs[0]: Buffer.from_numpy(np.ones(4096, np.float32), C)}\nrun_schedule([k], C, out, policy=policy_from_env())\n"
    "assert sys.argv[1:] == ['--flag'], sys.argv\nprint('sum', out[k.out].numpy()[0])\n")
  env = {**os.environ, "UOPC_CACHE_DIR": str(tmp_path / "cache"), "UOPC_SEARCH_BUDGET": "1"}
  argv = [sys.executable, "-m", "uopc.cli", "tune", str(script), "--flag"]
  proc = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=300)
  assert proc.returncode == 0, proc.stderr
  assert "sum 128.0" in proc.stdout and "uopc tune: searched 1 kernels" in proc.stdout and "r_64__64" in proc.stdout
  assert len(list((tmp_path / "cache" / "opts").glob("*.json"))) == 1


def test_a_gpu_search_times_gpu_candidates_and_stores_the_winner_with_its_gpu_fields():
  # candidates() gave a GPU kernel nothing but the heuristics' choice: a search on a GPU timed one Opts and stored it
  P = get_backend("PYTHON")
  a = buf(0, 64 * 64, dtypes.f16).cast(dtypes.f32).reshape((64, 1, 64)).expand((64, 64, 64))
  b = buf(1, 64 * 64, dtypes.f16).cast(dtypes.f32).reshape((64, 64)).permute((1, 0)).reshape((1, 64, 64)).expand((64, 64, 64))
  [k] = kernelize([((a * b).reduce(Ops.ADD, 1), buf(2, 64 * 64))])
  inputs = [Buffer.from_numpy(np.ones(64 * 64, np.float16), P, dtypes.f16) for _ in range(2)]
  assert choose_opts(k, P.caps).tc
  timed = []
  def staged_wins(prog, bufs):
    timed.append(prog.opts)
    return 1.0 if prog.opts.stage and not prog.opts.tc else 2.0   # the CUDA-core staged GEMM
  best = search.search_opts(k, P, inputs, timer=staged_wins, budget=1e9)
  assert len(timed) > 2 and all(o.gpu for o in timed) and any(o.tc for o in timed[1:])
  assert best.stage and not best.tc and best.fma
  runtime._programs.clear()
  assert stored_opts(k, P) == best and compile_kernel(k, P).opts == best
