"""User-facing errors: one clear line, no traceback (the CLI catches these)."""

import signal
import sys


class SpecBenchError(Exception):
    """An error caused by bad input or missing resources, reported as one line."""


def choice_error(kind: str, value, allowed) -> SpecBenchError:
    allowed = ", ".join(sorted(str(a) for a in allowed))
    return SpecBenchError(f"unknown {kind} {value!r}; allowed: {allowed}")


def show_value(v) -> str:
    """A value as the command line writes it (null, true), strings quoted."""
    if v is None:
        return "null"
    return str(v).lower() if isinstance(v, bool) else repr(v)


def bad_value(key: str, value, allowed: str) -> SpecBenchError:
    return SpecBenchError(f"{key}={show_value(value)} is not allowed; expected {allowed}")


def one_line(e: BaseException, lines: int = 2) -> str:
    """Hydra's and OmegaConf's errors span several lines; keep the first ones, joined."""
    parts = [ln.strip() for ln in str(e).splitlines() if ln.strip()]
    return "; ".join(parts[:lines]) or type(e).__name__


class Interrupted(SpecBenchError):
    """Ctrl-C (or SIGTERM) during a run: what was kept and how to go on, one line, exit code 128 + the signal."""


_STOPPED_BY = [signal.SIGINT]  # the signal that raised the KeyboardInterrupt being handled


def stop_on_sigterm() -> None:
    """SIGTERM (a scheduler's time limit, `docker stop`, `kill`) takes Ctrl-C's path: one line saying what was
    kept, and the vLLM worker killed (by default SIGTERM ends this process alone, with no line, and the worker,
    in its own session, runs on holding its GPU memory)."""
    def handler(signum, frame):
        _STOPPED_BY[0] = signum
        raise KeyboardInterrupt
    signal.signal(signal.SIGTERM, handler)


def interrupt_exit_code() -> int:
    """128 + the signal that stopped the process: 130 for Ctrl-C, 143 for SIGTERM, as a shell reports them."""
    return 128 + int(_STOPPED_BY[0])


def interrupted(message: str) -> None:
    """The one line an entry point stopped by Ctrl-C or SIGTERM prints (what was kept, how to go on), then exits."""
    print(f"specbench: interrupted: {message}", file=sys.stderr)
    raise SystemExit(interrupt_exit_code())


def check_output_file(path, flag: str) -> None:
    """An output file that can be written: not a directory, under a directory (or one that can be made)
    this user may write. Checked before the work whose result it holds (a skip search, a profile)."""
    import os
    from pathlib import Path

    p = Path(str(path)).expanduser()
    if p.is_dir():
        raise SpecBenchError(f"{flag} {str(path)!r} is a directory; give a file")
    parent = p.parent
    while not parent.exists() and parent != parent.parent:
        parent = parent.parent
    if not parent.is_dir():
        raise SpecBenchError(f"{flag} {str(path)!r}: {parent} is not a directory")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise SpecBenchError(f"{flag} {str(path)!r}: {parent} cannot be written")
