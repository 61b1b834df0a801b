"""Run untrusted generated code in a separate, resource-limited Python process.

This is a guard against accidents (infinite loops, runaway memory, stray files), not a security
boundary: the child runs as the same user with the same network access. Run untrusted models'
code inside a container if that matters.
"""

from __future__ import annotations

import math
import os
import resource
import signal
import subprocess
import sys
import tempfile
from dataclasses import dataclass

MAX_OUTPUT_CHARS = 4000


@dataclass
class SandboxResult:
    passed: bool
    status: str  # 'passed' | 'failed' (the code raised, e.g. a failed assert) | 'timeout' | 'error'
    output: str  # the tail of stdout+stderr


def _limits(memory_mb: int, cpu_s: int):
    def apply():  # runs in the child between fork and exec
        mem = memory_mb * 1024 * 1024
        resource.setrlimit(resource.RLIMIT_AS, (mem, mem))
        resource.setrlimit(resource.RLIMIT_CPU, (cpu_s, cpu_s))
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
        resource.setrlimit(resource.RLIMIT_FSIZE, (64 << 20, 64 << 20))

    return apply


def run_python(code: str, timeout_s: float = 10, memory_mb: int = 1024) -> SandboxResult:
    """Run `code` with `python -I` in a fresh temporary directory; passed iff it exits with 0.

    'timeout': wall time or CPU time exceeded; 'error': the process died abnormally (killed by a
    signal, out of memory) or could not start; 'failed': the code raised or exited non-zero.
    """
    with tempfile.TemporaryDirectory(prefix="specbench-sandbox-") as tmp:
        script = os.path.join(tmp, "program.py")
        with open(script, "w", encoding="utf-8") as f:
            f.write(code)
        # a minimal environment: no PYTHONPATH etc. leaking in (-I ignores most anyway), no GPUs
        env = {"PATH": os.environ.get("PATH", ""), "CUDA_VISIBLE_DEVICES": "", "HOME": tmp}
        try:
            proc = subprocess.Popen(
                [sys.executable, "-I", script],
                cwd=tmp,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                preexec_fn=_limits(memory_mb, math.ceil(timeout_s) + 1),
                start_new_session=True,  # its own process group, so children die with it
            )
        except OSError as e:
            return SandboxResult(False, "error", f"could not start python: {e}")
        try:
            out, _ = proc.communicate(timeout=timeout_s)
            timed_out = False
        except subprocess.TimeoutExpired:
            _kill_group(proc)
            out, _ = proc.communicate()
            timed_out = True
        finally:
            _kill_group(proc)  # leftovers the code may have spawned
    text = out.decode("utf-8", errors="replace")[-MAX_OUTPUT_CHARS:]
    rc = proc.returncode
    if timed_out or rc == -signal.SIGXCPU:
        return SandboxResult(False, "timeout", text)
    if rc == 0:
        return SandboxResult(True, "passed", text)
    last_line = text.strip().splitlines()[-1] if text.strip() else ""
    if rc < 0 or last_line.startswith("MemoryError"):
        return SandboxResult(False, "error", text)
    return SandboxResult(False, "failed", text)


def _kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
