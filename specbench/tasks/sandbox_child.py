"""The two child processes of the sandbox (sandbox.py runs this file's text with `python -I -c`;
standard library only: the sandbox sees no project files).

- `server` runs the untrusted program, inside the sandbox. fd 0 brings requests, fd 1 takes
  replies; the program's own output (fds 1 and 2 after the switch) goes to the output pipe. It
  says `started` before it reads anything (so a silent death before that is the harness's fault,
  not the program's), runs the first of the given sources that compiles (the choice is made here,
  so untrusted text is never compiled in the harness), says whether the program ran to its end,
  then answers calls of its entry point: arguments in, the result out, both as plain data.
- `judge` runs the dataset's trusted check code, outside the sandbox, in its own process. The
  check code gets a proxy for the candidate function whose results are rebuilt from plain data,
  so no object the program made (an always-equal `__eq__`) reaches a comparison. The judge
  writes its verdict to a descriptor the program never holds; the harness believes nothing else.

Wire format: one JSON object per line; tuples, dicts (any keys), sets, bytes and complex numbers
are tagged, so data round-trips exactly and decoding only ever builds plain data.
"""

import json
import os
import sys
import traceback

REPLY_CAP = 8 << 20  # bytes of one reply the judge reads at most
MAX_DEPTH = 200  # nesting of data accepted on the wire


def encode(x, depth=0):
    """Plain data -> JSON-able tree; anything else raises TypeError."""
    if depth > MAX_DEPTH:
        raise ValueError("data nested too deeply")
    d = depth + 1
    if x is None or isinstance(x, bool):  # bool before int (a bool is an int); bool has no subclasses
        return x
    if isinstance(x, str):
        return str(x)
    if isinstance(x, int):
        return int(x)
    if isinstance(x, float):
        return float(x)
    if isinstance(x, list):
        return [encode(v, d) for v in x]
    if isinstance(x, tuple):
        return {"t": [encode(v, d) for v in x]}
    if isinstance(x, dict):
        return {"d": [[encode(k, d), encode(v, d)] for k, v in x.items()]}
    if isinstance(x, (set, frozenset)):
        return {"f" if isinstance(x, frozenset) else "s": [encode(v, d) for v in x]}
    if isinstance(x, (bytes, bytearray)):
        return {"b": bytes(x).hex()}
    if isinstance(x, complex):
        return {"c": [x.real, x.imag]}
    raise TypeError(f"cannot pass a {type(x).__name__} across the sandbox (plain data only)")


def decode(x, depth=0):
    """The inverse of encode, building only plain data; anything malformed raises ValueError."""
    if depth > MAX_DEPTH:
        raise ValueError("data nested too deeply")
    d = depth + 1
    if x is None or type(x) in (bool, int, float, str):
        return x
    if type(x) is list:
        return [decode(v, d) for v in x]
    if type(x) is dict and len(x) == 1:
        (tag, v), = x.items()
        if tag == "t" and type(v) is list:
            return tuple(decode(i, d) for i in v)
        if tag == "d" and type(v) is list and all(type(p) is list and len(p) == 2 for p in v):
            return {decode(k, d): decode(val, d) for k, val in v}
        if tag in ("s", "f") and type(v) is list:
            return (set if tag == "s" else frozenset)(decode(i, d) for i in v)
        if tag == "b" and type(v) is str:
            return bytes.fromhex(v)
        if tag == "c" and type(v) is list and len(v) == 2 and all(type(i) in (int, float) for i in v):
            return complex(*v)
    raise ValueError("malformed data from the sandbox")


def send(f, obj):
    f.write(json.dumps(obj).encode() + b"\n")
    f.flush()


def serve():
    requests, replies = os.fdopen(os.dup(0), "rb"), os.fdopen(os.dup(1), "wb")
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.dup2(2, 1)  # the program's prints go to the output, not into the replies
    send(replies, {"started": True})
    job = json.loads(requests.readline())
    code = None
    for source in job["sources"]:
        try:
            code = compile(source, "program.py", "exec")
            break
        except (SyntaxError, ValueError, RecursionError, MemoryError):
            continue
    scope = {"__name__": "__main__", "__builtins__": __builtins__}
    try:
        if code is None:  # none compiles: compile the last again to show why
            compile(job["sources"][-1], "program.py", "exec")
        exec(code, scope)
        sys.stdout.flush()
    except BaseException as e:  # noqa: BLE001 - the program's own failure, reported to the judge
        traceback.print_exc()
        send(replies, {"ready": False, "error": type(e).__name__})
        return
    send(replies, {"ready": True})
    fn = scope.get(job.get("entry_point") or "", None)
    for line in requests:
        try:
            args, kwargs = decode(json.loads(line))
            reply = {"ok": encode(fn(*args, **kwargs))}
        except BaseException as e:  # noqa: BLE001 - raised in the candidate: re-raised in the judge
            reply = {"raised": type(e).__name__, "message": str(e)[:300]}
        sys.stdout.flush()
        send(replies, reply)


class CandidateError(Exception):
    """The candidate raised something that is not a builtin exception."""


def _exception(name, message):
    import builtins

    cls = getattr(builtins, str(name), None)
    if isinstance(cls, type) and issubclass(cls, Exception):
        return cls(message)
    return CandidateError(f"{name}: {message}")


class Proxy:
    """Calls the candidate in the sandbox; returns rebuilt plain data, or raises."""

    def __init__(self, requests, replies, name):
        self.requests, self.replies, self.__name__ = requests, replies, name

    def __call__(self, *args, **kwargs):
        send(self.requests, [encode(list(args)), encode(kwargs)])
        reply = receive(self.replies)
        if reply is None:
            raise CandidateError("the program died during a call")
        if type(reply) is dict and "ok" in reply:
            return decode(reply["ok"])
        if type(reply) is dict and "raised" in reply:
            raise _exception(reply["raised"], reply.get("message", ""))
        raise ValueError("malformed reply from the sandbox")


def receive(f):
    line = f.readline(REPLY_CAP)
    if not line:
        return None
    if not line.endswith(b"\n"):
        raise ValueError("a reply over the size cap")
    return json.loads(line)


def judge(requests_fd, verdict_fd, spec_path):
    requests, replies = os.fdopen(requests_fd, "wb"), os.fdopen(0, "rb")
    verdict = os.fdopen(verdict_fd, "w")
    with open(spec_path) as f:
        spec = json.load(f)

    def say(outcome, reason=""):
        verdict.write(json.dumps({"verdict": outcome, "reason": str(reason)[:200]}) + "\n")
        verdict.flush()

    try:
        hello = receive(replies)
    except ValueError:
        hello = None
    if hello != {"started": True}:
        return say("nostart", "the sandboxed python did not start")
    try:
        send(requests, {"sources": spec["sources"], "entry_point": spec["entry_point"]})
        ready = receive(replies)
        if type(ready) is not dict or ready.get("ready") is not True:
            return say("failed", ready.get("error", "") if type(ready) is dict else "the program died")
        if spec["check_code"] is not None:
            scope = {"__name__": "__main__"}
            exec(compile(spec["check_code"], "check.py", "exec"), scope)
            proxy = Proxy(requests, replies, spec["entry_point"])
            scope[spec["entry_point"]] = proxy
            scope[spec["check"]](proxy)
    except BaseException as e:  # noqa: BLE001 - any failure of the checks is a fail
        traceback.print_exc()
        return say("failed", type(e).__name__)
    say("passed")


if __name__ == "__main__":
    if sys.argv[1] == "server":
        serve()
    else:
        judge(int(sys.argv[2]), int(sys.argv[3]), sys.argv[4])
