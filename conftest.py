"""Test settings shared by every package's suite (pytest loads this file from the repository root).

Hypothesis draws the same examples on every run in CI (derandomized, seeded from each test): a red CI run is then the
change's fault, never the dice's. UOPC_FUZZ_ITERS=N (the fuzzers' long mode) draws at random instead, to find what the
fixed draws don't; a failure there prints its reproducer and becomes a regression test."""
import os
from hypothesis import settings

settings.register_profile("ci", derandomize=True)
settings.register_profile("explore", derandomize=False)
settings.load_profile("explore" if os.environ.get("UOPC_FUZZ_ITERS") else "ci")
