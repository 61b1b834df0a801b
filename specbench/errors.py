"""User-facing errors: one clear line, no traceback (the CLI catches these)."""


class SpecBenchError(Exception):
    """An error caused by bad input or missing resources, reported as one line."""


def choice_error(kind: str, value, allowed) -> SpecBenchError:
    allowed = ", ".join(sorted(str(a) for a in allowed))
    return SpecBenchError(f"unknown {kind} {value!r}; allowed: {allowed}")
