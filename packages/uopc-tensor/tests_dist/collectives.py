"""Run under mpiexec by test_distributed.py: every collective of uopc.distributed checked on this rank against what
NumPy says the ranks' values reduce to. Exits 0 when all hold (an AssertionError otherwise fails the job)."""
import numpy as np
from uopc.tensor import Tensor
from uopc import distributed as dist

rank, world = dist.init()
assert (dist.rank(), dist.world_size()) == (rank, world) and world > 1
values = lambda r, shape, seed: np.random.default_rng([seed, r]).standard_normal(shape).astype(np.float32)
shapes = [(3,), (4, 5), (1000,), (2, 3, 4)]

for op, reduce in (("mean", lambda a: a.mean(0)), ("sum", lambda a: a.sum(0)), ("max", lambda a: a.max(0)), ("min", lambda a: a.min(0))):
  # bucket_bytes 64: most tensors alone in a bucket (straight from buffer to buffer), the small ones packed together
  for bucket in (64, dist.BUCKET_BYTES):
    ts = [Tensor(values(rank, s, k)) for k, s in enumerate(shapes)]
    kept = ts[1].detach()                         # shares the old buffer: a collective gives ts[1] a new one
    out = dist.allreduce(ts + [ts[0]], op=op, bucket_bytes=bucket)   # a tensor given twice is reduced once
    assert out[0] is ts[0] and len(out) == len(ts) + 1
    for k, (t, s) in enumerate(zip(ts, shapes)):
      want = reduce(np.stack([values(r, s, k) for r in range(world)]))
      np.testing.assert_allclose(t.numpy(), want, rtol=1e-5, atol=1e-6, err_msg=f"{op} {s}")
    np.testing.assert_array_equal(kept.numpy(), values(rank, shapes[1], 1))

lazy = Tensor(values(rank, (8,), 9)) * 2           # realized by the collective
dist.allreduce([lazy], op="sum")
np.testing.assert_allclose(lazy.numpy(), 2 * sum(values(r, (8,), 9) for r in range(world)), rtol=1e-5)
ints = Tensor(np.full(5, rank + 1, np.int32))
dist.allreduce([ints], op="sum")
assert ints.numpy().tolist() == [world * (world + 1) // 2] * 5
try:
  dist.allreduce([Tensor(np.zeros(2, np.int32))])
  raise SystemExit("the mean of int tensors was not refused")
except dist.DistributedError as e: assert "op='sum'" in str(e)

# a backend whose memory MPI can't read in place (a GPU's) goes through host copies: the same values
host = dist._host
dist._host = lambda t: None
gs = [Tensor(values(rank, s, 30 + k)) for k, s in enumerate(shapes)]
dist.allreduce(gs, bucket_bytes=64)
for k, (g, s) in enumerate(zip(gs, shapes)):
  np.testing.assert_allclose(g.numpy(), np.mean([values(r, s, 30 + k) for r in range(world)], 0), rtol=1e-5, atol=1e-6)
dist._host = host

root = world - 1
ws = [Tensor(values(rank, s, 20 + k)) for k, s in enumerate(shapes)]
dist.broadcast(ws, root=root)
for k, (w, s) in enumerate(zip(ws, shapes)): np.testing.assert_array_equal(w.numpy(), values(root, s, 20 + k))
dist.barrier()
assert dist.stats()["calls"] > 0
print(f"rank {rank} of {world}: ok")
