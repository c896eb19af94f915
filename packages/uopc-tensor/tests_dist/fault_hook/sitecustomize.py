"""Put on PYTHONPATH by test_distributed.py: the rank named by UOPC_TEST_FAIL_RANK fails in its UOPC_TEST_FAIL_AT-th
allreduce, raising (UOPC_TEST_FAIL_HOW=raise) or killed by SIGKILL (kill), the way a real fault would strike mid-step."""
import os
if os.environ.get("UOPC_TEST_FAIL_AT") and os.environ.get("PMI_RANK") == os.environ.get("UOPC_TEST_FAIL_RANK"):
  import signal, time
  import uopc.distributed as dist
  _allreduce, _calls, _at = dist.allreduce, [0], int(os.environ["UOPC_TEST_FAIL_AT"])
  def failing(*args, **kwargs):
    _calls[0] += 1
    if _calls[0] == _at:
      if stamp := os.environ.get("UOPC_TEST_FAIL_STAMP"):    # when it struck, for the test to time the job's end
        with open(stamp, "w") as f: f.write(repr(time.time()))
      if os.environ.get("UOPC_TEST_FAIL_HOW") == "kill": os.kill(os.getpid(), signal.SIGKILL)
      raise RuntimeError("injected fault")
    return _allreduce(*args, **kwargs)
  dist.allreduce = failing
