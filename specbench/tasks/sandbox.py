"""Run untrusted generated code in an isolated, resource-limited Python process.

Isolation: with bubblewrap (`bwrap`, Debian package `bubblewrap`) the code runs in new PID,
network, IPC and UTS namespaces, on a read-only view of the filesystem with a private tmpfs at
/tmp, a fresh /proc and /dev, no capabilities, an empty environment, and `--die-with-parent`;
of the host it sees only the system directories and this Python's installation (not the
project, the data, or home directories).
It sees none of the harness's processes (so it cannot signal the harness or read its
environment), cannot reach the network and cannot write anywhere that outlives the call; when
the sandbox's first process ends the kernel kills everything left in its PID namespace (a
`setsid()` grandchild included). Without a usable bwrap the code runs in a plain subprocess, and
a loud warning says so: that fallback only guards against accidents (loops, memory, stray
children), not against hostile code.

Both ways: address-space, CPU-time, file-size and core limits; a wall-clock timeout; output read
with a cap (a program that prints more is stopped); and a pass needs positive evidence: a random
token, handed over on stdin, printed by the wrapper only after the program (the unit tests
included) ran to its end. Exit status 0 alone (`os._exit(0)` before the checks) is a failure.
Forging the token would need code that deliberately reads the wrapper's frames.
"""

from __future__ import annotations

import functools
import math
import os
import resource
import secrets
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass

from specbench.errors import SpecBenchError

MAX_OUTPUT_CHARS = 4000  # the tail of the output kept in the result
OUTPUT_CAP = 1 << 20  # bytes read at most; a program printing more is stopped
ENV_MARK = "SPECBENCH_SANDBOX"  # set in the fallback's environment, to find strays to kill

# reads the token and the program from stdin; prints the token only if the program returned
WRAPPER = r"""
import sys
def _run(stdin=sys.stdin):
    token = stdin.readline().strip()
    source = stdin.read()
    stdin.close()
    exec(compile(source, "program.py", "exec"), {"__name__": "__main__", "__builtins__": __builtins__})
    sys.stdout.flush()
    sys.stdout.write("\n" + token + "\n")
    sys.stdout.flush()
_run()
"""


@dataclass
class SandboxResult:
    passed: bool
    status: str  # 'passed' | 'failed' (raised, or ended before the checks finished) | 'timeout' | 'error'
    output: str  # the tail of stdout+stderr (the token removed)


@functools.lru_cache(maxsize=None)
def bwrap_usable() -> str | None:
    """Path of a bwrap that can create the namespaces we need here, else None."""
    exe = shutil.which("bwrap")
    if exe is None:
        return None
    try:
        r = subprocess.run(_bwrap_argv(exe) + ["/bin/true"], input=b"", capture_output=True, timeout=30,
                           env={"PATH": os.defpath})
    except (OSError, subprocess.TimeoutExpired):
        return None
    return exe if r.returncode == 0 else None


# what the sandbox sees of the host, read-only: the system, and this Python's installation
SYSTEM_DIRS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64")
ETC_FILES = ("/etc/ld.so.cache", "/etc/ld.so.conf", "/etc/ld.so.conf.d", "/etc/localtime", "/etc/passwd",
             "/etc/group", "/etc/nsswitch.conf")


def _host_view() -> list[str]:
    args = []
    for p in SYSTEM_DIRS:
        if os.path.islink(p):  # merged /usr: /bin -> usr/bin
            args += ["--symlink", os.readlink(p), p]
        else:
            args += ["--ro-bind-try", p, p]
    for p in ETC_FILES + tuple(dict.fromkeys((sys.base_prefix, sys.prefix))):
        args += ["--ro-bind-try", p, p]
    return args


def _bwrap_argv(exe: str) -> list[str]:
    return [
        exe, *_host_view(), "--tmpfs", "/tmp", "--dev", "/dev", "--proc", "/proc",
        "--unshare-pid", "--unshare-net", "--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try",
        "--die-with-parent", "--new-session", "--cap-drop", "ALL",
        "--clearenv", "--setenv", "PATH", "/usr/local/bin:/usr/bin:/bin", "--setenv", "HOME", "/tmp",
        "--chdir", "/tmp", "--",
    ]


@functools.lru_cache(maxsize=None)
def _warn_unisolated() -> None:
    print(
        "specbench: WARNING: bubblewrap (bwrap) is missing or cannot create namespaces here: generated code "
        "runs in a plain subprocess WITHOUT isolation (it can read your files and environment, use the "
        "network, and signal other processes). Install it: apt-get install bubblewrap",
        file=sys.stderr,
    )


def _limits(memory_mb: int, cpu_s: int):
    def apply():  # runs in the child between fork and exec
        mem = memory_mb * 1024 * 1024
        resource.setrlimit(resource.RLIMIT_AS, (mem, mem))
        resource.setrlimit(resource.RLIMIT_CPU, (cpu_s, cpu_s))
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
        resource.setrlimit(resource.RLIMIT_FSIZE, (64 << 20, 64 << 20))

    return apply


def check_limits(timeout_s, memory_mb) -> None:
    if isinstance(timeout_s, bool) or not isinstance(timeout_s, (int, float)) or not timeout_s > 0:
        raise SpecBenchError(f"sandbox timeout_s={timeout_s!r} is not allowed; expected a number > 0")
    if isinstance(memory_mb, bool) or not isinstance(memory_mb, int) or memory_mb < 1:
        raise SpecBenchError(f"sandbox memory_mb={memory_mb!r} is not allowed; expected an integer >= 1")


def run_python(code: str, timeout_s: float = 10, memory_mb: int = 1024, isolate: bool | None = None) -> SandboxResult:
    """Run `code`; passed iff it ran to its end (the token came back) and exited with 0.

    `isolate`: None uses bwrap when usable (warning once when not), True requires it, False
    forces the plain subprocess. 'timeout': wall or CPU time exceeded; 'error': killed by a
    signal, out of memory, output over the cap, or could not start; 'failed': anything else.
    """
    check_limits(timeout_s, memory_mb)
    exe = bwrap_usable() if isolate is not False else None
    if isolate and exe is None:
        raise SpecBenchError("the sandbox needs bubblewrap (bwrap), which is missing or unusable here")
    if exe is None:
        _warn_unisolated()
    token = secrets.token_hex(16)
    python = [sys.executable, "-I", "-c", WRAPPER]
    with tempfile.TemporaryDirectory(prefix="specbench-sandbox-") as tmp:
        if exe:
            argv, env = _bwrap_argv(exe) + python, {"PATH": os.defpath}
        else:
            env = {"PATH": os.environ.get("PATH", ""), "CUDA_VISIBLE_DEVICES": "", "HOME": tmp, ENV_MARK: token}
            argv = python
        try:
            proc = subprocess.Popen(
                argv, env=env, cwd=tmp, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                preexec_fn=_limits(memory_mb, math.ceil(timeout_s) + 1),
                start_new_session=True,  # its own process group: killed as a whole
            )
        except OSError as e:
            return SandboxResult(False, "error", f"could not start python: {e}")
        try:
            out, outcome = _communicate(proc, f"{token}\n{code}".encode(), timeout_s)
        finally:
            _kill_all(proc, None if exe else token)
    text = out.decode("utf-8", errors="replace")
    evidence = text.rstrip().endswith(token)
    text = text.replace(token, "").rstrip()[-MAX_OUTPUT_CHARS:]
    rc = proc.returncode
    if outcome == "timeout" or rc == -signal.SIGXCPU:
        return SandboxResult(False, "timeout", text)
    if outcome == "overflow":
        return SandboxResult(False, "error", text + f"\n[output over {OUTPUT_CAP} bytes: stopped]")
    if rc == 0 and evidence:
        return SandboxResult(True, "passed", text)
    last_line = text.strip().splitlines()[-1] if text.strip() else ""
    if rc is not None and rc < 0 or last_line.startswith("MemoryError"):
        return SandboxResult(False, "error", text)
    return SandboxResult(False, "failed", text)


def _communicate(proc: subprocess.Popen, data: bytes, timeout_s: float) -> tuple[bytes, str]:
    """Send `data`, read at most OUTPUT_CAP bytes until EOF; ('done' | 'timeout' | 'overflow')."""
    try:
        proc.stdin.write(data)
    except BrokenPipeError:
        pass
    finally:
        try:
            proc.stdin.close()
        except BrokenPipeError:
            pass
    deadline = time.monotonic() + timeout_s
    chunks, size = [], 0
    fd = proc.stdout.fileno()
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            return b"".join(chunks), "timeout"
        ready, _, _ = select.select([fd], [], [], left)
        if not ready:
            continue
        chunk = os.read(fd, 65536)
        if not chunk:
            break
        chunks.append(chunk)
        size += len(chunk)
        if size > OUTPUT_CAP:
            return b"".join(chunks)[:OUTPUT_CAP], "overflow"
    try:
        proc.wait(timeout=max(0.0, deadline - time.monotonic()) + 1)
    except subprocess.TimeoutExpired:
        return b"".join(chunks), "timeout"
    return b"".join(chunks), "done"


def _kill_all(proc: subprocess.Popen, mark: str | None) -> None:
    """Kill the process group (under bwrap its PID namespace dies with it); in the fallback also
    every process still carrying this call's environment mark (children that left the group)."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    proc.wait()
    proc.stdout.close()
    if mark:
        needle = f"{ENV_MARK}={mark}".encode()
        for pid in filter(str.isdigit, os.listdir("/proc")):
            try:
                with open(f"/proc/{pid}/environ", "rb") as f:
                    if needle in f.read().split(b"\0"):
                        os.kill(int(pid), signal.SIGKILL)
            except (OSError, ProcessLookupError):
                continue
