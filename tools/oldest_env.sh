#!/bin/sh
# .venv-oldest: this Python's packages ($PY, as `make setup` installed them), except transformers (and what
# it pins), which is the oldest release pyproject.toml allows. CI runs the model-facing tests in it (.ci/run).
# A .pth adds $PY's site directories after the venv's own, so this works whether $PY is a system Python
# or itself a venv (`--system-site-packages` would show a venv's base instead, not its packages).
set -eu
PY=${PY:-python}
DIR=${1:-.venv-oldest}
floor=$("$PY" -c 'import re; print(re.search(r"\"transformers\s*>=\s*([\w.]+)", open("pyproject.toml").read()).group(1))')
if "$DIR/bin/python" -c "import sys, transformers; from packaging.version import Version as V
sys.exit(V(transformers.__version__) != V('$floor'))" 2>/dev/null; then
    echo "$DIR: transformers $floor (already there)"
    exit 0
fi
rm -rf "$DIR"
"$PY" -m venv "$DIR"
site_dir=$("$DIR/bin/python" -c 'import sysconfig; print(sysconfig.get_path("purelib"))')
"$PY" -c 'import site, sysconfig
dirs = list(dict.fromkeys(site.getsitepackages() + [sysconfig.get_path("purelib"), sysconfig.get_path("platlib")]))
print(f"import site; list(map(site.addsitedir, {dirs!r}))")' >"$site_dir/outer_site.pth"
"$DIR/bin/python" -m pip install -q --no-cache-dir --disable-pip-version-check "transformers==$floor"
echo "$DIR: transformers $("$DIR/bin/python" -c 'import transformers; print(transformers.__version__)'), the rest from $PY"
