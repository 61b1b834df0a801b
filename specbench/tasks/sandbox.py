"""Run untrusted generated code in an isolated, resource-limited process, and judge it from outside.

Isolation (bubblewrap, `bwrap`, Debian package `bubblewrap`): the program runs in new PID,
network, IPC and UTS namespaces, on a read-only view built from an allow-list (sandbox_view.py:
the real interpreter, the shared libraries it loads, the standard library with its site-packages
hidden; no installed package, venv, project, data or home directory), with a private tmpfs at /tmp,
a fresh /proc and /dev, no capabilities, an empty environment and `--die-with-parent`. It sees no
process of the harness (cannot signal it or read its environment or memory), cannot reach the
network and cannot write anywhere that outlives the call; when the sandbox's first process ends,
the kernel kills everything left in its PID namespace (a `setsid()` grandchild included).

Fails closed: without a usable bwrap nothing runs (SpecBenchError, one line) unless the caller
opts in to unisolated execution (`isolate=False`, HumanEval's `task.allow_unisolated=true`); that
mode guards against accidents only (loops, memory, stray children), never against hostile code.

Judging (sandbox_child.py): the program runs in one process that only answers calls of its entry
point over a pipe (plain data in and out); the trusted check code runs in a separate judge process
that calls it through a proxy and writes its verdict to a descriptor the program never holds. A
pass therefore needs the checks to have run to their end on plain-data results: no token to read
or print, no always-equal object, no exit status (`os._exit(0)`) counts. `run_python` (a program
alone, no checks) can only take the program's word that it ran to its end: use it for
convenience, never to judge hostile code.

Both modes: address-space, CPU-time, file-size and core limits on both processes; a wall-clock
timeout; output read with a cap (a program that prints more is stopped).
"""

from __future__ import annotations

import functools
import json
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
from pathlib import Path

from specbench.core.errors import SpecBenchError
from specbench.tasks.sandbox_view import host_view, interpreter

MAX_OUTPUT_CHARS = 4000  # the tail of the output kept in the result
OUTPUT_CAP = 1 << 20  # bytes read at most; a program printing more is stopped
ENV_MARK = "SPECBENCH_SANDBOX"  # set in the unisolated program's environment, to find strays to kill
CHILD = (Path(__file__).parent / "sandbox_child.py").read_text()
INSTALL = ("install bubblewrap (apt-get install bubblewrap; dnf install bubblewrap) and make sure it can create "
           "user namespaces")


@dataclass
class SandboxResult:
    passed: bool
    # 'passed' | 'failed' (raised, or the checks did not finish) | 'timeout' | 'error' (killed by a
    # signal, out of memory, output over the cap, or the program could not be started at all)
    status: str
    output: str  # the tail of the program's and the checks' output
    started: bool = True  # False: the sandboxed python never started (the harness's problem, not the program's)


@functools.lru_cache(maxsize=None)
def bwrap_usable() -> str | None:
    """Path of a bwrap that can create the namespaces we need here, else None."""
    exe = shutil.which("bwrap")
    if exe is None:
        return None
    try:
        # the namespaces only (what the sandbox shows is tested by the task's self-test)
        r = subprocess.run(_bwrap_argv(exe, ["--ro-bind", "/", "/"]) + [interpreter(), "-I", "-S", "-c", ""], input=b"",
                           capture_output=True, timeout=30,
                           env={"PATH": os.defpath})
    except (OSError, subprocess.TimeoutExpired):
        return None
    return exe if r.returncode == 0 else None


def require_isolation(opt_in: str) -> None:
    """One line, before anything runs, when there is no working isolation."""
    if bwrap_usable() is None:
        raise SpecBenchError(f"generated code runs only in an isolated sandbox, and bubblewrap (bwrap) is missing or "
                             f"cannot create namespaces here: {INSTALL}, or set {opt_in} to run it WITHOUT isolation")


def _host_view() -> list[str]:
    return host_view().args()


def _bwrap_argv(exe: str, view: list[str] | None = None) -> list[str]:
    return [
        exe, *(_host_view() if view is None else view), "--dev", "/dev", "--proc", "/proc",
        "--unshare-pid", "--unshare-net", "--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try",
        "--die-with-parent", "--new-session", "--cap-drop", "ALL",
        "--clearenv", "--setenv", "PATH", "/usr/local/bin:/usr/bin:/bin", "--setenv", "HOME", "/tmp",
        "--chdir", "/tmp", "--",
    ]


@functools.lru_cache(maxsize=None)
def _warn_unisolated() -> None:
    print("specbench: WARNING: generated code runs in a plain subprocess WITHOUT isolation, as opted in (it can "
          "read your files and environment, use the network, signal other processes, and forge its own pass)",
          file=sys.stderr)


def _limits(memory_mb: int, cpu_s: int):
    def apply():  # runs in the child between fork and exec
        mem = memory_mb * 1024 * 1024
        resource.setrlimit(resource.RLIMIT_AS, (mem, mem))
        resource.setrlimit(resource.RLIMIT_CPU, (cpu_s, cpu_s))
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
        resource.setrlimit(resource.RLIMIT_FSIZE, (64 << 20, 64 << 20))

    return apply


def check_limits(timeout_s, memory_mb) -> None:
    if isinstance(timeout_s, bool) or not isinstance(timeout_s, (int, float)) or not 0 < timeout_s <= 86400:
        raise SpecBenchError(f"sandbox timeout_s={timeout_s!r} is not allowed; expected a number > 0 and <= 86400")
    if isinstance(memory_mb, bool) or not isinstance(memory_mb, int) or not 1 <= memory_mb <= 1 << 24:
        raise SpecBenchError(f"sandbox memory_mb={memory_mb!r} is not allowed; expected an integer from 1 to {1 << 24}")


def run_python(code: str, timeout_s: float = 10, memory_mb: int = 1024, isolate: bool | None = None) -> SandboxResult:
    """Run a program alone; passed iff it ran to its end (its own word: see the module docstring)."""
    return run_judged([code], None, None, timeout_s=timeout_s, memory_mb=memory_mb, isolate=isolate)


def run_judged(sources: list[str], entry_point: str | None, check_code: str | None, check: str = "check",
               timeout_s: float = 10, memory_mb: int = 1024, isolate: bool | None = None) -> SandboxResult:
    """Run the first of `sources` that compiles (in the sandbox), then the trusted `check_code` in a
    judge process, which calls `check(proxy of entry_point)`; passed iff that returned.

    `isolate`: None or True require bwrap (SpecBenchError without it); False runs unisolated (opt-in).
    """
    check_limits(timeout_s, memory_mb)
    exe = None
    if isolate is not False:
        require_isolation("isolate=False")
        exe = bwrap_usable()
    else:
        _warn_unisolated()
    mark = secrets.token_hex(16)
    limits = _limits(memory_mb, math.ceil(timeout_s) + 1)
    server = [host_view().python if exe else sys.executable, "-I", "-c", CHILD, "server"]
    with tempfile.TemporaryDirectory(prefix="specbench-sandbox-") as tmp:
        spec = Path(tmp) / "spec.json"
        spec.write_text(json.dumps({"sources": list(sources), "entry_point": entry_point, "check_code": check_code,
                                    "check": check}))
        req_r, req_w = os.pipe()
        rep_r, rep_w = os.pipe()
        out_r, out_w = os.pipe()
        ver_r, ver_w = os.pipe()
        procs = []
        try:
            if exe:
                argv, env = _bwrap_argv(exe) + server, {"PATH": os.defpath}
            else:
                argv, env = server, {"PATH": os.environ.get("PATH", ""), "CUDA_VISIBLE_DEVICES": "", "HOME": tmp,
                                     ENV_MARK: mark}
            procs.append(subprocess.Popen(argv, env=env, cwd=tmp, stdin=req_r, stdout=rep_w, stderr=out_w,
                                          preexec_fn=limits, start_new_session=True))
            procs.append(subprocess.Popen(
                [sys.executable, "-I", "-c", CHILD, "judge", str(req_w), str(ver_w), str(spec)],
                env={"PATH": os.defpath}, cwd=tmp, stdin=rep_r, stdout=out_w, stderr=out_w, pass_fds=(req_w, ver_w),
                preexec_fn=limits, start_new_session=True))
        except OSError as e:
            for p in procs:
                _kill_all(p, None)
            return SandboxResult(False, "error", f"could not start python: {e}", started=False)
        finally:
            for fd in (req_r, req_w, rep_r, rep_w, out_w, ver_w):
                os.close(fd)
        server_proc, judge_proc = procs
        out, verdict, outcome, server_rc, judge_rc = b"", b"", "error", None, None
        try:
            out, verdict, outcome = _collect(out_r, ver_r, timeout_s)
            judge_rc = _exit_status(judge_proc) if outcome == "done" else None
            server_rc = server_proc.poll()  # before we kill it: did it die on its own, and how?
        finally:
            _kill_all(server_proc, None if exe else mark)
            _kill_all(judge_proc, None)
            out += _drain(out_r, OUTPUT_CAP - len(out))
            os.close(out_r)
            os.close(ver_r)
    return _classify(out.decode("utf-8", errors="replace"), verdict, outcome, server_rc, judge_rc)


def _classify(text: str, verdict: bytes, outcome: str, server_rc, judge_rc) -> SandboxResult:
    text = text.rstrip()[-MAX_OUTPUT_CHARS:]
    try:
        v = json.loads(verdict.decode())
    except (UnicodeDecodeError, ValueError):
        v = {}
    said, reason = v.get("verdict"), v.get("reason", "")
    if outcome == "timeout" or -signal.SIGXCPU in (server_rc, judge_rc):
        return SandboxResult(False, "timeout", text)
    if outcome == "overflow":
        return SandboxResult(False, "error", text + f"\n[output over {OUTPUT_CAP} bytes: stopped]")
    if said == "passed" and judge_rc == 0:
        return SandboxResult(True, "passed", text)
    if said == "nostart":
        return SandboxResult(False, "error", text + f"\n[{reason}]", started=False)
    if said is None:
        return SandboxResult(False, "error", text + "\n[the judge gave no verdict]")
    if reason == "MemoryError" or (server_rc is not None and server_rc < 0) or (judge_rc is not None and judge_rc < 0):
        return SandboxResult(False, "error", text)
    return SandboxResult(False, "failed", text)


def _collect(out_fd: int, verdict_fd: int, timeout_s: float) -> tuple[bytes, bytes, str]:
    """Read the output (at most OUTPUT_CAP bytes) until the judge closes its verdict descriptor;
    (output, verdict, 'done' | 'timeout' | 'overflow')."""
    deadline = time.monotonic() + timeout_s
    out, verdict, fds = bytearray(), bytearray(), [out_fd, verdict_fd]
    while verdict_fd in fds:
        left = deadline - time.monotonic()
        if left <= 0:
            return bytes(out), bytes(verdict), "timeout"
        ready, _, _ = select.select(fds, [], [], left)
        for fd in ready:
            chunk = os.read(fd, 65536)
            if not chunk:
                fds.remove(fd)
            elif fd == out_fd:
                out += chunk
                if len(out) > OUTPUT_CAP:
                    return bytes(out[:OUTPUT_CAP]), bytes(verdict), "overflow"
            elif len(verdict) < 4096:
                verdict += chunk
    return bytes(out), bytes(verdict), "done"


def _exit_status(proc: subprocess.Popen) -> int | None:
    """The judge's exit status: it closed its verdict descriptor, so it is ending (None: it did not)."""
    try:
        return proc.wait(timeout=5)
    except subprocess.TimeoutExpired:
        return None


def _drain(fd: int, cap: int) -> bytes:
    """What is left in the output pipe once every writer is dead (bounded)."""
    chunks, size = [], 0
    while size < cap and select.select([fd], [], [], 0.5)[0]:
        chunk = os.read(fd, 65536)
        if not chunk:
            break
        chunks.append(chunk)
        size += len(chunk)
    return b"".join(chunks)[:max(0, cap)]


def _kill_all(proc: subprocess.Popen, mark: str | None) -> None:
    """Kill the process group (under bwrap its PID namespace dies with it); unisolated, also every
    process still carrying this call's environment mark (children that left the group)."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    proc.wait()
    if mark:
        needle = f"{ENV_MARK}={mark}".encode()
        for pid in filter(str.isdigit, os.listdir("/proc")):
            try:
                with open(f"/proc/{pid}/environ", "rb") as f:
                    if needle in f.read().split(b"\0"):
                        os.kill(int(pid), signal.SIGKILL)
            except (OSError, ProcessLookupError):
                continue
