"""uopc.runtime: Buffers, Programs whose parameters are fixed at compile time and checked at every launch,
compile_kernel's Opts and cache, run_schedule, and the C renderer as tables a GPU renderer can subclass."""
import re, threading, time
import numpy as np
import pytest
from uopc.dtype import dtypes, AddrSpace
from uopc.uop import UOp, Ops, AxisType, ParamArg, buf
from uopc.rangeify import Opts, Ctx, lower, LowerError
from uopc.linearize import linearize
from uopc.kernelize import kernelize, kernelize_cached, make_kernel, Schedule
from uopc import runtime
from uopc.backends import BackendError, LinearProgram, get_backend
from uopc.backends.c import CRenderer, MAX_INLINE
from uopc.testing import render_c
from uopc.runtime import Buffer, compile_kernel, compile_program, run_schedule, kernel_name, program_buffers
from uopc.testing import run_lowered


@pytest.fixture(autouse=True)
def own_cache(tmp_path, monkeypatch):
  monkeypatch.setenv("UOPC_CACHE_DIR", str(tmp_path / "cache"))


C = get_backend("C")


def rowsum_kernel(rows=3, cols=4):
  return make_kernel(buf(0, rows * cols).reshape((rows, cols)).reduce(Ops.ADD, 1), buf(1, rows))


# ---- Buffer ------------------------------------------------------------------------------------------------------------

def test_a_buffer_round_trips_through_numpy_and_copies_on_the_way_out():
  b = Buffer.from_numpy(np.arange(6, dtype=np.int32), C)
  assert (b.size, b.dtype, b.nbytes) == (6, dtypes.i32, 24)
  out = b.numpy()
  out[:] = 0
  np.testing.assert_array_equal(b.numpy(), np.arange(6))


def test_a_buffer_refuses_data_of_another_size():
  b = Buffer(C, 4, dtypes.f32)
  with pytest.raises(BackendError, match="5 values into a f32 buffer of 4"): b.copyin(np.zeros(5))
  with pytest.raises(BackendError, match="non-negative"): Buffer(C, -1, dtypes.f32)


def test_c_buffers_start_on_a_cache_line():
  assert all(Buffer(C, n, dtypes.f32).handle.ctypes.data % 64 == 0 for n in (1, 3, 17, 1000))


# ---- Program: one parameter list, checked at every launch ----------------------------------------------------------------

def test_a_program_launches_on_buffers_in_parameter_order():
  prog = compile_kernel(rowsum_kernel(), C)
  assert [(p.slot, p.dtype, p.size, p.written) for p in prog.params] == [(0, dtypes.f32, 12, False), (1, dtypes.f32, 3, True)]
  x = Buffer.from_numpy(np.arange(12, dtype=np.float32), C)
  out = Buffer(C, 3, dtypes.f32)
  prog([x, out])
  np.testing.assert_array_equal(out.numpy(), np.arange(12).reshape(3, 4).sum(1))


def test_a_native_launch_graph_reads_the_slots_each_call_says_vary():
  """A LaunchGraph gone native (C: one C function) takes a replay's `varying` slots, the only ones whose Buffers may be
  new: it finds its own among them once per list (a slot of another graph is skipped) and re-reads their pointers."""
  prog = compile_kernel(rowsum_kernel(), C)
  xs = [Buffer.from_numpy(np.arange(12, dtype=np.float32) * k, C) for k in range(1, 4)]
  outs = [Buffer(C, 3, dtypes.f32) for _ in range(2)]
  lg = runtime.LaunchGraph([(prog, [2, 0])])                          # slot 1 is another graph's: never read here
  table = [outs[0], None, xs[0]]
  for _ in range(lg.GRAPH_AFTER + 1): lg(table)
  assert lg.native is not None
  rows = lambda k: np.arange(12).reshape(3, 4).sum(1) * k
  np.testing.assert_array_equal(outs[0].numpy(), rows(1))
  varying = [1, 2]
  for k, x in ((2, xs[1]), (3, xs[2])):
    table[2] = x
    lg(table, varying)
    np.testing.assert_array_equal(outs[0].numpy(), rows(k))
  table[0] = outs[1]
  lg(table, [0, 1])                                                   # another list: the output's slot this time
  np.testing.assert_array_equal(outs[1].numpy(), rows(3))


@pytest.mark.parametrize("args, message", [
  (lambda x, o: [x], r"takes 2 buffers \(data0 f32\[12\], data1 f32\[3\]\), got 1"),
  (lambda x, o: [x, Buffer(C, 3, dtypes.i32)], r"argument 1 \(data1\) must be f32\[3\], got a buffer i32\[3\]"),
  (lambda x, o: [Buffer(C, 11, dtypes.f32), o], r"argument 0 \(data0\) must be f32\[12\], got a buffer f32\[11\]"),
  (lambda x, o: [x, np.zeros(3, np.float32)], r"argument 1 \(data1\) must be a Buffer, got ndarray"),
])
def test_a_launch_with_buffers_that_do_not_match_the_parameters_is_refused(args, message):
  prog = compile_kernel(rowsum_kernel(), C)
  x, o = Buffer.from_numpy(np.ones(12, np.float32), C), Buffer(C, 3, dtypes.f32)
  with pytest.raises(BackendError, match=message): prog(args(x, o))


def test_a_written_buffer_passed_twice_is_refused():
  prog = compile_kernel(make_kernel(buf(0, 4) + 1.0, buf(1, 4)), C)
  b = Buffer(C, 4, dtypes.f32)
  with pytest.raises(BackendError, match="written and also passed"): prog([b, b])


class OtherBackend(type(C)):
  name = "OTHER"


def test_a_buffer_of_another_backend_is_refused():
  prog = compile_kernel(rowsum_kernel(), C)
  with pytest.raises(BackendError, match="lives on backend OTHER, the program runs on C"):
    prog([Buffer(OtherBackend(), 12, dtypes.f32), Buffer(C, 3, dtypes.f32)])


def test_an_input_the_lowered_kernel_never_reads_stays_a_parameter():
  """The defect this road fixes: a sum over an empty axis reads nothing, and the output used to take the input's place."""
  x = buf(0, 1).shrink(((0, 0),)).reshape((4, 0))            # a (4, 0) view of a 1-element buffer, as Tensor.zeros(4, 0)
  k = make_kernel(x.reduce(Ops.ADD, 1), buf(1, 4))
  prog = compile_kernel(k, C)
  assert [(p.slot, p.size) for p in prog.params] == [(0, 1), (1, 4)]
  assert "void r_4__0(float* restrict data0, float* restrict data1) {" in prog.src   # the unread input stays in the signature
  guard = Buffer.from_numpy(np.full(1, 7.0, np.float32), C)
  out = Buffer.from_numpy(np.full(4, 9.0, np.float32), C)
  prog([guard, out])
  assert guard.numpy().tolist() == [7.0] and out.numpy().tolist() == [0.0] * 4


def test_a_buffer_the_program_uses_but_not_among_its_parameters_is_an_error():
  sink = lower(buf(0, 4) + buf(1, 4), buf(2, 4))
  with pytest.raises(BackendError, match=r"slots \[1\] that are not among its parameters"):
    compile_program(sink, C, "add", params=[buf(0, 4), buf(2, 4)])


# ---- compile_kernel: Opts, the cache, names --------------------------------------------------------------------------

def test_compile_kernel_caches_by_canonical_kernel_and_opts():
  k1 = make_kernel(buf(5, 12).reshape((3, 4)).reduce(Ops.ADD, 1), buf(9, 3))
  k2 = make_kernel(buf(7, 12).reshape((3, 4)).reduce(Ops.ADD, 1), buf(8, 3))     # the same structure over other buffers
  assert compile_kernel(k1, C) is compile_kernel(k2, C)
  assert compile_kernel(k1, C, Opts(unroll=2)) is compile_kernel(k2, C, Opts(unroll=2))
  assert compile_kernel(k1, C, Opts(unroll=2)) is not compile_kernel(k1, C)


def test_the_program_cache_keeps_the_most_recently_used_programs_and_compiles_an_evicted_one_again(monkeypatch):
  # the cache never evicted: every distinct kernel a process met stayed (about 26 KB each, its graph in the key)
  from uopc import runtime
  cache = runtime.ProgramCache(4)
  monkeypatch.setattr(runtime, "_programs", cache)
  compiles = []
  real_compile = C.compile
  monkeypatch.setattr(C, "compile", lambda src, name: compiles.append(name) or real_compile(src, name))
  kernels = [rowsum_kernel(rows, 4) for rows in range(1, 11)]             # ten distinct structures
  first = compile_kernel(kernels[0], C, Opts())
  programs = [first] + [compile_kernel(k, C, Opts()) for k in kernels[1:]]
  assert len(compiles) == 10 and len(cache) == 4                          # bounded, in entries
  assert compile_kernel(kernels[-1], C, Opts()) is programs[-1] and len(compiles) == 10   # a recent one is a hit
  again = compile_kernel(kernels[0], C, Opts())                           # evicted long ago: compiled again
  assert again is not first and len(compiles) == 11 and len(cache) == 4
  x = np.arange(4, dtype=np.float32)
  for prog in (again, first):                                             # and an evicted Program someone holds still runs
    out = Buffer(C, 1, dtypes.f32)
    prog([Buffer.from_numpy(x, C), out])
    np.testing.assert_array_equal(out.numpy(), [x.sum()])
  # least recently *used*, not first in: the oldest entry (kernels[-3]) is used, so the next newcomer evicts kernels[-2]
  assert compile_kernel(kernels[-3], C, Opts()) is programs[-3]
  compile_kernel(rowsum_kernel(11, 4), C, Opts())
  assert compile_kernel(kernels[-3], C, Opts()) is programs[-3] and len(compiles) == 12
  assert compile_kernel(kernels[-2], C, Opts()) is not programs[-2] and len(compiles) == 13


def test_opts_are_values():
  assert Opts(upcast={1: 4, 0: 2}) == Opts(upcast=((0, 2), (1, 4))) and hash(Opts(upcast={0: 2})) == hash(Opts(upcast={0: 2}))
  assert Opts(upcast={0: 1}) == Opts()                         # an upcast of 1 is no upcast: one kernel, one key
  with pytest.raises(AttributeError): Opts().unroll = 2


@pytest.mark.parametrize("opts, message", [
  (Opts(upcast={1: 3}), r"Opts.upcast: 3 does not divide axis 1 of size 4 \(kernel shape \(3, 4\)\)"),
  (Opts(upcast={2: 2}), r"Opts.upcast: there is no axis 2 \(kernel shape \(3, 4\)\)"),
  (Opts(unroll=0), r"Opts.unroll: must be at least 1"),
  (Opts(unroll=2), r"Opts.unroll: 2, but the kernel has no reduction"),
  (Opts(thread=5), r"Opts.thread: there is no axis 5"),
  (Opts(tile={0: 3}), r"Opts.tile: 3 must divide axis 0 of size 3 and lie strictly between 1 and it"),
  (Opts(local={0: 3}), r"Opts.local: threads per block need gpu=True"),
  (Opts(gpu=True), r"Opts.gpu: backend C is not a GPU"),
])
def test_invalid_opts_are_refused_naming_the_field_and_the_kernels_shape(opts, message):
  k = make_kernel(buf(0, 12).reshape((3, 4)) * 2.0, buf(1, 12))
  with pytest.raises(LowerError, match=message): compile_kernel(k, C, opts)


def test_unroll_must_divide_every_reduction():
  k = make_kernel(buf(0, 12).reshape((4, 3)).reduce(Ops.ADD, 1), buf(1, 4))
  with pytest.raises(LowerError, match="Opts.unroll: 2 does not divide the reduced axis of size 3"): compile_kernel(k, C, Opts(unroll=2))


def test_kernel_names_say_what_the_kernel_computes():
  assert kernel_name(make_kernel(buf(0, 12).reshape((3, 4)) * 2.0, buf(1, 12))) == "E_3_4"
  assert kernel_name(rowsum_kernel()) == "r_3__4"
  assert kernel_name(make_kernel(buf(0, 4).reduce(Ops.MAX, 1), buf(1, 1))) == "r_1__4"


# ---- run_schedule --------------------------------------------------------------------------------------------------

def test_run_schedule_runs_a_schedule_and_allocates_its_outputs():
  x = buf(0, 12).reshape((3, 4))
  m = x.reduce(Ops.MAX, 1).reshape((3, 1)).expand((3, 4))
  e = (x - m).reduce(Ops.ADD, 1)                                # softmax's shape: a reduction broadcast into another
  out = buf(1, 3)
  kernels = kernelize([(e, out)])
  assert len(kernels) == 2
  data = np.random.default_rng(0).standard_normal(12).astype(np.float32)
  bufs = {x.src[0]: Buffer.from_numpy(data, C)}
  launches = run_schedule(kernels, C, bufs)
  assert [p for p, _ in launches] == [compile_kernel(k, C) for k in kernels] and set(bufs) == {x.src[0], kernels[0].out, out}
  d = data.reshape(3, 4)
  np.testing.assert_allclose(bufs[out].numpy(), (d - d.max(1, keepdims=True)).sum(1), rtol=1e-6)


def test_run_schedule_names_an_input_with_no_data():
  with pytest.raises(BackendError, match=r"r_3__4: reads a buffer that holds no data \(f32\[12\]\)"): run_schedule([rowsum_kernel()], C, {})


def staged_chain(x: UOp, steps: int) -> UOp:
  """x * 2 + 1, `steps` times, each step a kernel of its own (a STAGE): a schedule of `steps` + 1 kernels."""
  for _ in range(steps): x = UOp(Ops.STAGE, (x * 2.0 + 1.0,))
  return x.reduce(Ops.ADD, 1)


def chain_ref(data: np.ndarray, steps: int) -> np.ndarray:
  for _ in range(steps): data = data * np.float32(2) + np.float32(1)
  return data.sum(1)


def planned_step(slot: int, steps: int, data: np.ndarray):
  """One 'training step': the same structure over new BUFFERs (kernelize_cached's hit), run on fresh Buffers."""
  slots = iter(range(slot + 10, slot + 10_000))
  x, out = buf(slot, data.size), buf(slot + 1, data.shape[0])
  kernels = kernelize_cached([(staged_chain(x.reshape(data.shape), steps), out)], lambda n, d: buf(next(slots), n, d))
  bufs = {x: Buffer.from_numpy(data, C)}
  return kernels, bufs, out


def test_a_schedule_kernelize_cached_gives_again_runs_as_one_native_graph_with_the_right_numbers(monkeypatch):
  """A training loop's schedule (kernelize_cached: the same Plan each step, new buffers) runs through one LaunchGraph:
  programs looked up once, from its 8th run (_PlannedGraph) one native call (PLANNED_NATIVE_MIN kernels or more), whose
  pointers follow each step's new buffers. Every step's answer is NumPy's; a schedule of one kernel never compiles a graph."""
  monkeypatch.setattr(runtime, "_programs", runtime.ProgramCache(2048))
  rng = np.random.default_rng(0)
  least = runtime.PLANNED_NATIVE_MIN                    # a chain of `steps` makes steps + 1 kernels
  for steps, native in ((least, True), (least - 1, True), (least - 2, False)):
    for i in range(runtime._PlannedGraph.GRAPH_AFTER + 3):
      data = rng.standard_normal((3, 4)).astype(np.float32)
      kernels, bufs, out = planned_step(1000 * (i + 1), steps, data)
      assert isinstance(kernels, Schedule) and len(kernels) == steps + 1
      read_first = i % 2 == 1   # kernels read before the run name their temporaries (in `table`)
      if read_first: list(kernels)
      named = [u for u in kernels.table if u is not None]
      launches = run_schedule(kernels, C, bufs)
      assert [p for p, _ in launches] == [compile_kernel(k, C) for k in kernels]
      # the temporaries, named or not, ran in Buffers of the run's own, never put into `bufs` (uopc.memory: they may
      # share one where their lifetimes allow); reading the kernels now names those not named yet
      assert [a for _, a in launches] == [[bufs.get(b) or launches.table[kernels.table.index(b)] for b in k.buffers] for k in kernels]
      assert len(bufs) == 2 and (read_first or i == 0 or steps == 0 or len(named) < len(kernels.table))
      assert len(launches) == len(kernels) and launches[-1] == launches[len(kernels) - 1]
      np.testing.assert_allclose(bufs[out].numpy(), chain_ref(data, steps), rtol=1e-5)
    (graph, *_), = [e for (plan, *_), e in runtime._programs.graphs.items() if plan is kernels.plan]
    assert graph.calls == runtime._PlannedGraph.GRAPH_AFTER + 3 and (graph.native is not None) == native


def test_a_planned_schedule_that_the_checks_would_refuse_takes_the_checked_road():
  """What the plan's table checks can't pass (an input with no data, a Buffer of another dtype, one Buffer under two
  BUFFERs a kernel writes) gets run_schedule's own errors, naming the kernel."""
  data = np.ones((3, 4), np.float32)
  kernels, bufs, out = planned_step(50_000, 2, data)
  x = kernels[0].inputs[0]
  with pytest.raises(BackendError, match=r"E_3_4: reads a buffer that holds no data \(f32\[12\]\)"): run_schedule(kernels, C, {})
  with pytest.raises(BackendError, match=r"must be f32\[12\], got a buffer i32\[12\]"):
    run_schedule(kernels, C, {x: Buffer.from_numpy(np.ones(12, np.int32), C)})
  shared = Buffer.from_numpy(data, C)
  with pytest.raises(BackendError, match="is written and also passed as another argument"):
    run_schedule(kernels, C, {x: shared, kernels[0].out: shared})


def test_threads_running_one_plan_at_once_each_get_their_own_answer():
  """A native graph has one pointer table: a second thread running the same plan meanwhile takes the checked road. (The
  kernels are long enough, 64 x 2048, that threads sharing the table would read each other's buffers.)"""
  import threading
  rng = np.random.default_rng(1)
  datas = [rng.standard_normal((64, 2048)).astype(np.float32) for _ in range(8)]
  results: dict[int, np.ndarray] = {}
  def work(t: int) -> None:
    for r in range(6):
      kernels, bufs, out = planned_step(100_000 * (t + 1) + 20_000 * r, runtime.PLANNED_NATIVE_MIN, datas[t])
      run_schedule(kernels, C, bufs)
      results[t * 10 + r] = bufs[out].numpy()
  threads = [threading.Thread(target=work, args=(t,)) for t in range(8)]
  for th in threads: th.start()
  for th in threads: th.join()
  for key, got in results.items(): np.testing.assert_allclose(got, chain_ref(datas[key // 10], runtime.PLANNED_NATIVE_MIN), rtol=1e-4)
  assert len(results) == 48


def test_compile_kernels_batches_what_was_planned_and_splits_the_rest_evenly_across_the_cpus(monkeypatch):
  """While Python plans, gcc gets what was planned so far (up to BATCH_SOURCE characters a run: _batch); what is left when planning
  ends goes to every worker at once in parts of about equal source (a cold GPT step's last 80 kernels were one run, the
  other CPU idle for seconds). Every kernel is compiled once, and runs to NumPy's answer."""
  calls: list[list[int]] = []
  real = C.compile_many
  def spy(items):
    calls.append([len(src) for src, _ in items])
    return real(items)
  monkeypatch.setattr(C, "compile_many", spy)
  one = C.compile
  def slow_one(src, name):           # a run of one kernel: the first; slow, so that the rest is planned meanwhile
    calls.append([len(src)])
    time.sleep(0.3)
    return one(src, name)
  monkeypatch.setattr(C, "compile", slow_one)
  monkeypatch.setattr(runtime, "_COMPILE_WORKERS", 2)
  x = buf(0, 64).reshape((8, 8))
  roots = []
  for n in range(1, 13):                       # twelve kernels, each a chain of n steps: sources of growing length
    y = x
    for i in range(n): y = y * float(i + 2) + 1.0
    roots.append(y)
  kernels = [make_kernel(r, buf(1, 64)) for r in roots]
  progs = runtime.compile_kernels(kernels, C)
  sizes = [n for call in calls for n in call]
  assert len(sizes) == 12 and sorted(sizes) == sorted(len(p.src) for p in progs)
  last = calls[-2:]
  assert len(last) == 2 and abs(sum(last[0]) - sum(last[1])) <= max(sizes)        # the rest: one part per worker, even
  data = np.linspace(-1, 1, 64, dtype=np.float32)
  for n, prog in enumerate(progs, 1):
    out = Buffer(C, 64, dtypes.f32)
    prog([Buffer.from_numpy(data, C), out])
    ref = data.copy()
    for i in range(n): ref = ref * np.float32(i + 2) + np.float32(1)
    np.testing.assert_allclose(out.numpy(), ref, rtol=1e-6)


def test_a_compile_that_ends_while_planning_goes_on_starts_the_next_itself(monkeypatch, tmp_path):
  """When a compiler run ends while Python is still lowering a kernel, the thread that ran it takes what was planned
  meanwhile and starts the next run at once, not when the planner next looks (gcc sat idle 13-21 ms a run of a cold GPT
  step). Here the planner stops before its fourth kernel until a second run has started: only the compiling thread can
  start it."""
  monkeypatch.setenv("UOPC_CACHE_DIR", str(tmp_path))    # (kernels no earlier run compiled or planned)
  started = threading.Event()
  real_many, real_one = C.compile_many, C.compile
  def many(items):
    started.set()
    return real_many(items)
  def slow_one(src, name):           # the first run, one kernel: slow, so that two more are planned meanwhile
    time.sleep(0.3)
    return real_one(src, name)
  monkeypatch.setattr(C, "compile_many", many)
  monkeypatch.setattr(C, "compile", slow_one)
  monkeypatch.setattr(runtime, "_COMPILE_WORKERS", 2)
  real_plan, planned = runtime._plan_kernel, []
  def plan(kernel, *a):
    if len(planned) == 3: planned.append(started.wait(10))   # (False if the run never started while the planner waited)
    planned.append(True)
    return real_plan(kernel, *a)
  monkeypatch.setattr(runtime, "_plan_kernel", plan)
  x = buf(0, 64)
  kernels = [make_kernel(x * float(k + 2) + float(k), buf(1, 64)) for k in range(6)]
  progs = runtime.compile_kernels(kernels, C)
  assert all(planned) and len(planned) == 7
  data = np.linspace(-1, 1, 64, dtype=np.float32)
  for k, prog in enumerate(progs):
    out = Buffer(C, 64, dtypes.f32)
    prog([Buffer.from_numpy(data, C), out])
    np.testing.assert_allclose(out.numpy(), data * np.float32(k + 2) + np.float32(k), rtol=1e-6)


def test_a_compiled_kernel_becomes_its_program_while_planning_goes_on(monkeypatch, tmp_path):
  """A kernel compiled while later kernels are planned becomes its Program (its facts counted, its plan written to the
  disk cache) when the planner next finds it compiled, not after the last compile: all of them at the end were 60-90 ms
  of a cold GPT step after its last gcc. Here the planner lowers its third kernel only once the first has compiled, and
  the first kernel's Program is made before the last kernel is planned; every Program runs to NumPy's answer."""
  monkeypatch.setenv("UOPC_CACHE_DIR", str(tmp_path))    # (kernels no earlier run compiled or planned)
  monkeypatch.setattr(runtime, "_COMPILE_WORKERS", 2)
  real_plan, real_finish, real_one, events = runtime._plan_kernel, runtime._Pending.finish, C.compile, []
  first_compiled = threading.Event()
  def one(src, name):
    try: return real_one(src, name)
    finally: first_compiled.set()
  monkeypatch.setattr(C, "compile", one)
  def plan(kernel, *a):
    if events.count("plan") == 2:
      assert first_compiled.wait(10)
      time.sleep(0.05)                   # (its thread hands the compiled kernel over right after)
    events.append("plan")
    return real_plan(kernel, *a)
  def finish(self, handle):
    events.append("finish")
    return real_finish(self, handle)
  monkeypatch.setattr(runtime, "_plan_kernel", plan)
  monkeypatch.setattr(runtime._Pending, "finish", finish)
  x = buf(0, 64)
  kernels = [make_kernel(x * float(k + 3) - float(k), buf(1, 64)) for k in range(4)]
  progs = runtime.compile_kernels(kernels, C)
  assert events.count("plan") == 4 and events.count("finish") == 4 and events.index("finish") < len(events) - 1 - events[::-1].index("plan")
  data = np.linspace(-1, 1, 64, dtype=np.float32)
  for k, prog in enumerate(progs):
    out = Buffer(C, 64, dtypes.f32)
    prog([Buffer.from_numpy(data, C), out])
    np.testing.assert_allclose(out.numpy(), data * np.float32(k + 3) - np.float32(k), rtol=1e-6)


@pytest.mark.parametrize("sizes, limit, taken", [([10, 10, 10], 25, 2), ([30, 1], 25, 1), ([5, 5], 100, 2), ([3, 30, 3], 25, 1)])
def test_a_run_during_planning_takes_source_up_to_its_limit_and_at_least_one_plan(monkeypatch, sizes, limit, taken):
  class Plan:
    def __init__(self, n): self.compilable = "x" * n
  monkeypatch.setattr(runtime, "BATCH_SOURCE", limit)
  assert runtime._batch([Plan(n) for n in sizes]) == taken


@pytest.mark.parametrize("sizes, parts", [([5, 1, 1, 1, 1, 1], 2), ([3, 3, 2, 2, 2], 2), ([7], 2), (list(range(1, 20)), 3)])
def test_balanced_parts_split_source_evenly_and_keep_order(sizes, parts):
  class Plan:
    def __init__(self, n): self.compilable = "x" * n
  plans = [Plan(n) for n in sizes]
  groups = runtime._balanced(plans, parts)
  assert sorted(id(p) for g in groups for p in g) == sorted(map(id, plans))          # each plan once
  assert all([plans.index(p) for p in g] == sorted(plans.index(p) for p in g) for g in groups)
  loads = [sum(len(p.compilable) for p in g) for g in groups]
  assert len(groups) == min(parts, len(plans)) and max(loads) - min(loads) <= max(sizes)


def test_run_lowered_copies_in_and_out_of_arrays():
  a, out = np.arange(12, dtype=np.float32), np.full(3, -1.0, np.float32)
  run_lowered(lower(buf(0, 12).reshape((3, 4)).reduce(Ops.ADD, 1), buf(1, 3)), {0: a, 1: out}, C, "rowsum")
  np.testing.assert_array_equal(out, a.reshape(3, 4).sum(1))


# ---- the renderer as tables --------------------------------------------------------------------------------------------

class GridRenderer(CRenderer):
  """What a GPU renderer overrides: the grid's index expressions, shared memory and the barrier."""
  barrier = "sync_block();"
  alloc_code = {**CRenderer.alloc_code, AddrSpace.SHARED: lambda ctype, name, n, offset: f"shared {ctype} {name}[{n}];"}
  def grid_index(self, kind, dim, sizes): return f"{'block' if kind is AxisType.GLOBAL else 'thread'}_id({dim})"


def test_a_subclass_renders_gpu_ranges_as_grid_indices_instead_of_loops():
  sink = lower(buf(0, 64).reshape((8, 8)) * 2.0, buf(1, 64), Ctx(opts=Opts(gpu=True, local={1: 4})))
  lin = tuple(linearize(sink))
  src = GridRenderer().render(LinearProgram("double", lin, tuple(program_buffers(lin))))
  assert "for (" not in src
  assert re.search(r"int ridx\d+ = block_id\(0\);", src) and re.search(r"int ridx\d+ = block_id\(1\);", src)
  assert re.search(r"int ridx\d+ = thread_id\(0\);", src)
  with pytest.raises(BackendError, match="no GPU grid for a GLOBAL range"):
    CRenderer().render(LinearProgram("double", lin, tuple(program_buffers(lin))))


def test_shared_memory_and_barriers_come_from_the_tables():
  smem = UOp(Ops.ALLOC, (), ParamArg(0, dtypes.f32, (4,), AddrSpace.SHARED))
  st = smem.index(0).store(buf(0, 4).index(1).load())
  rd = buf(1, 4).index(0).store(smem.after(UOp(Ops.BARRIER, (st,))).index(0).load())
  lin = tuple(linearize(UOp(Ops.SINK, (rd,))))
  prog = LinearProgram("k", lin, tuple(program_buffers(lin)))
  src = GridRenderer().render(prog)
  assert "shared float acc0[4];" in src and src.index("acc0[0] = ") < src.index("sync_block();") < src.index("data1[0] = ")
  assert "float acc0[4];" in CRenderer().render(prog) and "/* barrier" in CRenderer().render(prog)


def test_rendering_a_deep_expression_stays_linear():
  x = buf(0, 4)
  y = x
  for _ in range(20000): y = y * 1.0001
  src = render_c(lower(y, buf(1, 4)), "deep")
  assert len(src) < 100 * 20000 and max(len(line) for line in src.splitlines()) < MAX_INLINE + 100


def test_the_c_backend_reads_its_caches_from_sysfs_and_keeps_the_defaults_for_what_it_cant_read(tmp_path):
  """Caps.l1_bytes and l2_bytes decide which GEMMs split their rows across threads (B within half an L2) and which copies
  walk blocks of rows: they come from Linux's description of cpu0's caches (a 2 MiB L2 here, not Caps' 1 MiB default).
  The instruction cache and the L3 are not the per-core data caches; a directory that can't be read leaves the default."""
  from uopc.backends.c import _cache_bytes
  for i, (level, kind, size) in enumerate([("1", "Data", "48K"), ("1", "Instruction", "32K"), ("2", "Unified", "2048K"),
                                           ("3", "Unified", "300M")]):
    d = tmp_path / f"index{i}"
    d.mkdir()
    for name, text in (("level", level), ("type", kind), ("size", size)): (d / name).write_text(text + "\n")
  assert _cache_bytes(str(tmp_path)) == {"l1_bytes": 48 << 10, "l2_bytes": 2 << 20}
  (tmp_path / "index2" / "size").write_text("lots\n")
  assert _cache_bytes(str(tmp_path)) == {"l1_bytes": 48 << 10}
  assert _cache_bytes(str(tmp_path / "absent")) == {}
