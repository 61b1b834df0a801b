#!/bin/sh
# What the tests and the default run need beyond pip, installed with apt-get where we can (root):
# - bubblewrap: isolates the HumanEval sandbox; tests/test_sandbox.py fails (never skips) without it
# - a C compiler: builds model.backend=ggml's kernels (the embedded model's default)
# Otherwise ONE line says what to install and what will not work. Never fails `make setup`.

bwrap_ok() {  # present and able to create the namespaces the sandbox asks for
    command -v bwrap >/dev/null 2>&1 &&
        bwrap --ro-bind / / --dev /dev --proc /proc --unshare-pid --unshare-net --die-with-parent /bin/true >/dev/null 2>&1
}
cc_ok() { command -v cc >/dev/null 2>&1 || command -v gcc >/dev/null 2>&1; }

want=""
command -v bwrap >/dev/null 2>&1 || want="bubblewrap"
cc_ok || want="$want gcc"
if [ -n "$want" ] && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "specbench setup: apt-get install ${want# }" >&2
    { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $want; } >/dev/null 2>&1
fi

missing=""
if ! command -v bwrap >/dev/null 2>&1; then
    missing="bubblewrap (task=humaneval then stops unless task.allow_unisolated=true; tests/test_sandbox.py fails)"
elif ! bwrap_ok; then
    missing="a bwrap that can create namespaces (installed, but refused here, e.g. in an unprivileged container: tests/test_sandbox.py fails)"
fi
if ! cc_ok; then
    missing="${missing:+$missing; }a C compiler, e.g. gcc (model.backend=ggml is unavailable: run with model.backend=hybrid)"
fi
[ -z "$missing" ] || echo "specbench setup: WARNING: please install $missing" >&2
exit 0
