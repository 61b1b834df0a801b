"""The HumanEval sandbox against hostile programs (harmless markers only).

The isolated path needs bubblewrap (`apt-get install bubblewrap`; .ci/run installs it): without
it these tests FAIL, on purpose, rather than skip. Programs that attack the harness itself (kill
the parent, read its environment) run against a throw-away harness process, never pytest.
"""

from __future__ import annotations

import json
import os
import secrets
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from specbench.errors import SpecBenchError
from specbench.tasks import sandbox
from specbench.tasks.base import Sample
from specbench.tasks.humaneval import HumanEval
from specbench.tasks.sandbox import run_python

REPO = Path(__file__).resolve().parents[1]
MODES = [pytest.param(True, id="bwrap"), pytest.param(False, id="plain")]


@pytest.fixture
def isolated():
    assert sandbox.bwrap_usable(), "bubblewrap (bwrap) is missing or unusable: apt-get install bubblewrap"
    return True


# a throw-away harness: runs one program, reports the result and how much its own peak RSS grew
HARNESS = r"""
import json, resource, sys
from specbench.tasks.sandbox import run_python
code, isolate = sys.stdin.read(), json.loads(sys.argv[1])
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
r = run_python(code, timeout_s=20, memory_mb=1024, isolate=isolate)
print(json.dumps({"passed": r.passed, "status": r.status, "output": r.output,
                  "rss_growth_mb": (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024}))
print("harness survived")
"""


def in_harness(code: str, isolate, **env) -> tuple[dict | None, str]:
    proc = subprocess.run(
        [sys.executable, "-c", HARNESS, json.dumps(isolate)], input=code, capture_output=True, text=True,
        timeout=120, cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO), **env},
    )
    lines = proc.stdout.strip().splitlines()
    result = json.loads(lines[0]) if lines and lines[0].startswith("{") else None
    return result, proc.stdout + proc.stderr


def still_running(mark: str) -> list[int]:
    pids = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            if mark.encode() in Path(f"/proc/{pid}/cmdline").read_bytes():
                pids.append(int(pid))
        except OSError:
            pass
    return pids


@pytest.mark.parametrize("isolate", MODES)
def test_exit_zero_before_the_checks_is_not_a_pass(isolate, request):
    if isolate:
        request.getfixturevalue("isolated")
    wrong = "def add(a, b):\n    return a - b\nimport os\nos._exit(0)\nassert add(2, 2) == 4\n"
    r = run_python(wrong, isolate=isolate)
    assert (r.passed, r.status) == (False, "failed")
    assert not run_python("import sys\nsys.exit(0)\nassert False", isolate=isolate).passed
    assert run_python("def add(a, b):\n    return a + b\nassert add(2, 2) == 4\n", isolate=isolate).passed


def test_humaneval_score_needs_the_checks_to_finish():
    problem = {"task_id": "T/0", "prompt": "def add(a, b):\n    \"\"\"Sum.\"\"\"\n", "entry_point": "add",
               "test": "def check(f):\n    assert f(2, 2) == 4\n", "canonical_solution": "    return a + b\n"}
    s = Sample(id="T/0", turns=["x"], reference=problem)
    t = HumanEval({"timeout_s": 10, "memory_mb": 512})
    hostile = "```python\ndef add(a, b):\n    return 0\nimport os\nos._exit(0)\n```"
    assert t.score(s, [hostile]) == {"pass@1": 0.0}
    assert t.score(s, ["```python\ndef add(a, b):\n    return a + b\n```"]) == {"pass@1": 1.0}


@pytest.mark.parametrize("isolate", MODES)
def test_huge_output_is_capped_not_buffered(isolate, request):
    if isolate:
        request.getfixturevalue("isolated")
    result, log = in_harness("import sys\nfor _ in range(30):\n    sys.stdout.write('x' * 10_000_000)\n", isolate)
    assert result is not None, log[-2000:]
    assert not result["passed"] and result["status"] == "error"
    assert len(result["output"]) <= sandbox.MAX_OUTPUT_CHARS + 100
    assert result["rss_growth_mb"] < 50, result["rss_growth_mb"]  # the old harness held all 300 MB


def test_killing_the_parent_does_not_kill_the_harness(isolated):
    code = (
        "import os, signal\n"
        "for pid in [os.getppid()] + [int(p) for p in os.listdir('/proc') if p.isdigit()]:\n"
        "    if pid != os.getpid():\n"
        "        try:\n            os.kill(pid, signal.SIGKILL)\n"
        "        except OSError:\n            pass\n"
    )
    result, log = in_harness(code, True)
    assert "harness survived" in log, log[-2000:]


@pytest.mark.parametrize("isolate", MODES)
def test_setsid_grandchild_dies_when_the_call_returns(isolate, request):
    if isolate:
        request.getfixturevalue("isolated")
    mark = f"specbench-stray-{secrets.token_hex(6)}"
    code = (
        "import subprocess, sys\n"
        f"subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)', {mark!r}], start_new_session=True,\n"
        "                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)\n"
    )
    try:
        run_python(code, isolate=isolate)
        deadline = time.monotonic() + 5
        while still_running(mark) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert still_running(mark) == []
    finally:
        for pid in still_running(mark):
            os.kill(pid, 9)


def test_cannot_write_outside_its_tmpfs(isolated, tmp_path):
    targets = [REPO / f".sandbox-escape-{secrets.token_hex(6)}", tmp_path / "escape"]
    code = "".join(
        f"try:\n    open({str(p)!r}, 'w').write('escaped')\nexcept OSError as e:\n    print('refused', e)\n" for p in targets
    )
    try:
        r = run_python(code, isolate=True)
        assert r.passed, r.output
        assert not any(p.exists() for p in targets)
    finally:
        for p in targets:
            p.unlink(missing_ok=True)


def test_cannot_read_the_harness_environment(isolated):
    secret = f"s3cret-{secrets.token_hex(8)}"
    code = (
        "import os\n"
        "print(dict(os.environ))\n"
        "for pid in [str(os.getppid()), '1'] + [p for p in os.listdir('/proc') if p.isdigit()]:\n"
        "    try:\n        print(open(f'/proc/{pid}/environ', 'rb').read())\n"
        "    except OSError as e:\n        print('refused', e)\n"
    )
    result, log = in_harness(code, True, SPECBENCH_TEST_SECRET=secret)
    assert result is not None and result["passed"], log[-2000:]
    assert secret not in log


def test_no_network(isolated):
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    server.settimeout(0.5)
    port = server.getsockname()[1]
    code = (
        "import socket\n"
        f"try:\n    socket.create_connection(('127.0.0.1', {port}), timeout=2)\n    print('connected')\n"
        "except OSError as e:\n    print('refused', e)\n"
    )
    try:
        r = run_python(code, isolate=True)
        assert r.passed and "connected" not in r.output, r.output
        with pytest.raises(socket.timeout):
            server.accept()
    finally:
        server.close()


@pytest.mark.parametrize("timeout_s,memory_mb", [(0, 1024), (-1, 1024), (10, 0), (10, -1), (10, 1.5)])
def test_limits_must_be_positive(timeout_s, memory_mb):
    with pytest.raises(SpecBenchError, match="timeout_s|memory_mb"):
        run_python("pass", timeout_s=timeout_s, memory_mb=memory_mb)


def test_plain_fallback_warns_loudly(capfd):
    sandbox._warn_unisolated.cache_clear()
    assert run_python("pass", isolate=False).passed
    assert "WITHOUT isolation" in capfd.readouterr().err


def test_sees_no_project_or_home_files(isolated):
    targets = [REPO / "README.md", Path.home() / ".bashrc"]
    code = "".join(f"try:\n    open({str(p)!r}).read()\n    print('read', {str(p)!r})\nexcept OSError:\n    pass\n" for p in targets)
    r = run_python(code, isolate=True)
    assert r.passed and "read" not in r.output, r.output
