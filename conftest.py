"""Test settings shared by every package's suite (pytest loads this file from the repository root).

Hypothesis draws the same examples on every run in CI (derandomized, seeded from each test): a red CI run is then the
change's fault, never the dice's. UOPC_FUZZ_ITERS=N (the fuzzers' long mode) draws at random instead, to find what the
fixed draws don't; a failure there prints its reproducer and becomes a regression test."""
import os
from hypothesis import settings

settings.register_profile("ci", derandomize=True)
settings.register_profile("explore", derandomize=False)
settings.load_profile("explore" if os.environ.get("UOPC_FUZZ_ITERS") else "ci")


# ---- skips are read, not counted ---------------------------------------------------------------------------------------
# A skipped test checks nothing, so every skip is printed with its reason (the sessions run pytest with -rs), and under
# UOPC_STRICT_SKIPS=1 (the nox sessions) a skip whose reason isn't below fails the run: a test that starts skipping is a
# test that stopped running. Each reason is a fact about the machine, never about the code.
EXPECTED_SKIPS = (
  "Graphviz's `dot` is not installed",                 # test_cli: the SVG needs Debian's graphviz (not a pip install)
  "no CUDA device on this machine",                    # the GPU suite's device half, on a machine without a GPU
  "backend CUDA is not available here",                # the NumPy fuzzer's CUDA half, likewise
  "a CUDA device is present",                          # the no-device error tests, on a machine with a GPU
  "this process runs with the sanitizer runtime preloaded",   # the sanitize session runs the test of itself apart
  "no user and mount namespaces here",                 # the tiny-tmpfs full-disk test, where unshare -rm is refused
)


def pytest_sessionfinish(session, exitstatus):
  reporter = session.config.pluginmanager.get_plugin("terminalreporter")
  if reporter is None or not os.environ.get("UOPC_STRICT_SKIPS") or hasattr(session.config, "workerinput"): return
  # a session may expect more, naming why in noxfile.py (UOPC_EXPECTED_SKIPS: reasons separated by |)
  expected = EXPECTED_SKIPS + tuple(r for r in os.environ.get("UOPC_EXPECTED_SKIPS", "").split("|") if r)
  unexpected = []
  for report in reporter.stats.get("skipped", []):
    reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
    if not any(e in reason for e in expected): unexpected.append(f"{report.nodeid}: {reason}")
  if unexpected:
    reporter.write_line(f"{len(unexpected)} unexpected skip(s) (UOPC_STRICT_SKIPS; expected reasons are in conftest.py):", red=True)
    for line in unexpected: reporter.write_line(f"  {line}", red=True)
    session.exitstatus = 1
