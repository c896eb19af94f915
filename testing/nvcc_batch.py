"""One nvcc run over many CUDA kernels: the compile checks of the GPU tests (tests_gpu, uopc-backends' test_gpu.py).

nvcc's fixed cost (its driver, the front end and ptxas started anew) is most of a small kernel's compile here: 0.6-0.7 s
a kernel, so a GPT step's 99 kernels took 61 s one run each, and the same 99 in one translation unit take a few
seconds. Each source goes in a namespace of its own with its kernel renamed (extern "C" names share one namespace
whatever C++ namespace declares them), its #include lines before them all."""
from __future__ import annotations
import re
import subprocess
from pathlib import Path
from uopc.backends.cuda import _run_nvcc

_KERNEL = re.compile(r"(__global__ void (?:__launch_bounds__\(\d+\) )?)(\w+)\(")


def together(sources: list[tuple[str, str]]) -> tuple[str, list[str]]:
  """The translation unit of every (CUDA source, kernel name), and the kernels' names in it (NAME_kI)."""
  includes: list[str] = []
  parts, names = [], []
  for i, (src, name) in enumerate(sources):
    lines = src.splitlines()
    includes += [line for line in lines if line.startswith("#include") and line not in includes]
    body, n = _KERNEL.subn(lambda m: f"{m.group(1)}{m.group(2)}_k{i}(", "\n".join(line for line in lines if not line.startswith("#include")),
                           count=1)
    if n != 1 or f" {name}(" not in src: raise ValueError(f"{name}: no kernel signature found in its source")
    names.append(f"{name}_k{i}")
    parts.append(f"namespace uopc_k{i} {{\n{body}\n}}")
  return "\n".join(includes + parts), names


def nvcc_all(sources: list[tuple[str, str]], arch: str, workdir: Path) -> tuple[subprocess.CompletedProcess, bytes, list[str]]:
  """nvcc as the CUDA backend runs it (uopc.backends.cuda._run_nvcc) over together(sources) in `workdir`: the finished
  process, the cubin (b"" on failure) and the kernels' names in it."""
  src, names = together(sources)
  return (*_run_nvcc(src, arch, workdir), names)
