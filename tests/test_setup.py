"""`make setup`'s helpers: pip runs only for what is missing; system packages are named in one line."""

import os
import shutil
import subprocess
import sys

from tests.conftest import REPO

CHECK = REPO / "tools" / "missing_requirements.py"


def check(tmp_path, deps, extras=None, extra_arg=""):
    lines = ['name = "pytest"', "dependencies = [" + ", ".join(f'"{d}"' for d in deps) + "]"]
    if extras:
        lines += ["[project.optional-dependencies]"] + [f'{k} = ["{v}"]' for k, v in extras.items()]
    (tmp_path / "pyproject.toml").write_text("[project]\n" + "\n".join(lines) + "\n")
    return subprocess.run([sys.executable, str(CHECK), extra_arg, str(tmp_path / "pyproject.toml")],
                          capture_output=True, text=True, timeout=60)


def test_nothing_missing_means_no_pip(tmp_path):
    r = check(tmp_path, ["pytest>=1", "omegaconf"], {"x": "hydra-core>=1.0"}, "x")
    assert (r.returncode, r.stdout) == (0, "")


def test_missing_and_too_old_requirements_are_named(tmp_path):
    r = check(tmp_path, ["pytest>=1", "pytest>=9999", "no-such-package-xyz>=1"], {"x": "another-missing-one"}, "x")
    assert r.returncode == 1
    assert r.stdout.splitlines() == ["missing: pytest>=9999 (installed: " + __import__("pytest").__version__ + ")",
                                     "missing: no-such-package-xyz>=1", "missing: another-missing-one"]
    assert check(tmp_path, ["pytest"], {"x": "another-missing-one"}).returncode == 0  # an extra not asked for


def test_system_deps_name_what_to_install_in_one_line(tmp_path):
    """Not root, and neither bwrap nor a compiler on PATH: nothing installed, one line saying what and why."""
    bin_ = tmp_path / "bin"
    bin_.mkdir()
    (bin_ / "id").write_text("#!/bin/sh\necho 1000\n")
    (bin_ / "apt-get").write_text("#!/bin/sh\necho called >> %s\n" % (tmp_path / "apt.log"))
    for f in bin_.iterdir():
        f.chmod(0o755)
    r = subprocess.run(["/bin/sh", str(REPO / "tools" / "system_deps.sh")], capture_output=True, text=True,
                       env={**os.environ, "PATH": str(bin_)}, timeout=60)
    assert r.returncode == 0 and r.stdout == ""
    line, = r.stderr.splitlines()
    assert line.startswith("specbench setup: WARNING: please install bubblewrap")
    assert "gcc" in line and "model.backend=hybrid" in line and "test_sandbox" in line
    assert not (tmp_path / "apt.log").exists()  # not root: never tries to install


def test_system_deps_quiet_when_present(tmp_path):
    bin_ = tmp_path / "bin"
    bin_.mkdir()
    for name in ("cc", "bwrap"):
        (bin_ / name).write_text("#!/bin/sh\nexit 0\n")
        (bin_ / name).chmod(0o755)
    r = subprocess.run(["/bin/sh", str(REPO / "tools" / "system_deps.sh")], capture_output=True, text=True,
                       env={**os.environ, "PATH": str(bin_)}, timeout=60)
    assert (r.returncode, r.stdout, r.stderr) == (0, "", "")


def test_system_deps_installed_as_root(tmp_path):
    """Root with apt-get: what is missing is installed (here a stand-in apt-get that puts the tools on
    PATH), one line says so, and no warning follows."""
    bin_ = tmp_path / "bin"
    bin_.mkdir()
    (bin_ / "id").write_text("#!/bin/sh\necho 0\n")
    tool = "#!/bin/sh\nexit 0\n"
    (bin_ / "apt-get").write_text(f"#!/bin/sh\necho \"$@\" >> {tmp_path / 'apt.log'}\n"
                                  f"[ \"$1\" = install ] && for t in bwrap cc; do printf '{tool}' > {bin_}/$t; chmod 755 {bin_}/$t; done\n"
                                  "exit 0\n")
    for f in bin_.iterdir():
        f.chmod(0o755)
    (bin_ / "chmod").symlink_to(shutil.which("chmod"))  # PATH is bin_ alone: the host's bwrap and cc stay hidden
    r = subprocess.run(["/bin/sh", str(REPO / "tools" / "system_deps.sh")], capture_output=True, text=True,
                       env={**os.environ, "PATH": str(bin_)}, timeout=60)
    assert (r.returncode, r.stdout) == (0, "")
    assert r.stderr.splitlines() == ["specbench setup: apt-get install bubblewrap gcc"]
    assert "install -y -qq bubblewrap gcc" in (tmp_path / "apt.log").read_text()
