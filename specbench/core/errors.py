"""User-facing errors: one clear line, no traceback (the CLI catches these)."""


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
    """Ctrl-C during a run: what was kept and how to go on, one line, exit code 130 (128 + SIGINT)."""

    exit_code = 130
