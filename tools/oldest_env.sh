#!/bin/sh
# .venv-oldest: this Python's packages ($PY, as `make setup` installed them), except transformers (and what
# it pins), which is the oldest release pyproject.toml allows. CI runs the model-facing tests in it (.ci/run).
# A .pth adds $PY's site directories after the venv's own, so this works whether $PY is a system Python
# or itself a venv (`--system-site-packages` would show a venv's base instead, not its packages).
set -eu
PY=${PY:-python}
DIR=${1:-.venv-oldest}
floor=$("$PY" -c 'import re; print(re.search(r"\"transformers\s*>=\s*([\w.]+)", open("pyproject.toml").read()).group(1))')
# ready when it has that transformers and its modeling code imports (see `kernels` below)
if "$DIR/bin/python" -c "import sys, transformers; from packaging.version import Version as V
V(transformers.__version__) == V('$floor') or sys.exit(1)
import transformers.models.llama.modeling_llama" 2>/dev/null; then
    echo "$DIR: transformers $floor (already there)"
    exit 0
fi
rm -rf "$DIR"
"$PY" -m venv "$DIR"
site_dir=$("$DIR/bin/python" -c 'import sysconfig; print(sysconfig.get_path("purelib"))')
"$PY" -c 'import site, sysconfig
dirs = list(dict.fromkeys(site.getsitepackages() + [sysconfig.get_path("purelib"), sysconfig.get_path("platlib")]))
print(f"import site; list(map(site.addsitedir, {dirs!r}))")' >"$site_dir/outer_site.pth"
# and a `kernels` of its own, found before $PY's: transformers 5.0 imports any it finds, and 0.19 (what 5.25
# requires) fails that import, 0.10 (5.0's own extra) warns on it; 0.12.3 imports quietly (measured 2026-12-03)
"$DIR/bin/python" -m pip install -q --no-cache-dir --disable-pip-version-check "transformers==$floor" "kernels==0.12.3"
echo "$DIR: transformers $("$DIR/bin/python" -c 'import transformers; print(transformers.__version__)'), the rest from $PY"
