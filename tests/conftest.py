import os
import sys
from pathlib import Path

import absl.logging
import pytest
import torch

import warnguard

# tiny models: one thread is faster than two oversubscribed ones on a loaded 2-core machine
torch.set_num_threads(1)

# absl.logging (imported by rouge_score, task=xsum) makes its handler at import, on the sys.stderr of that
# moment: pytest's capture file. Hydra's logging setup (dictConfig) closes every live handler, and absl's
# closes its stream unless it is the *current* sys.stderr, which under capsys it is not: pytest's capture
# file would be closed under it. sys.__stderr__ (fd 2, captured all the same) is never closed.
absl.logging.get_absl_handler().python_handler.setStream(sys.__stderr__)

REPO = Path(__file__).resolve().parents[1]
# a few records of each task, shipped with the tests (tests/data/README.md: sources, licenses):
# the tests need nothing outside the checkout, and read the same data on every machine
FIXTURES = REPO / "tests" / "data"
# code that finds its data through SPECBENCH_DATA_DIR (runs, training, CLI subprocesses) reads the
# fixtures too, whatever the caller's environment (the Makefile exports ../shared/data for runs);
# set at import, so module- and session-scoped fixtures see it as well
os.environ["SPECBENCH_DATA_DIR"] = str(FIXTURES)


@pytest.fixture(scope="session")
def data_dir() -> Path:
    return FIXTURES


@pytest.fixture(scope="session")
def _shared(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("shared-cache")


SHARED = ("kernels", "tokenizers", "models")


@pytest.fixture(autouse=True)
def _private_cache(tmp_path_factory, monkeypatch, _shared):
    """Every test starts with an empty artifact cache of its own (never the user's ~/.cache), but for what
    is keyed by all it is made from and written atomically, so that sharing it changes no result: the
    compiled C kernels (ggml.build: source, compiler, flags and CPU; a ~5 s compile spared in each test that
    builds its own flags), the embedded model's converted tokenizer (models/tokenizer.py) and its converted
    weights (models/converted.py), both keyed by the GGUF's sha256 and transformers' version (with the dtype
    for the weights): most of the ~20 s of each test that loads the model."""
    cache = tmp_path_factory.mktemp("cache")
    for name in SHARED:
        (_shared / name).mkdir(exist_ok=True)
        (cache / name).symlink_to(_shared / name, target_is_directory=True)
    monkeypatch.setenv("SPECBENCH_CACHE_DIR", str(cache))


# a transformers deprecation that specbench's own code sets off fails the test (tests/warnguard.py)
warnguard.install()


def _fail_on_our_deprecations():
    found, warnguard.offenders[:] = list(dict.fromkeys(warnguard.offenders)), []
    if found:
        pytest.fail("specbench calls a deprecated transformers API (a run prints this):\n" + "\n".join(found),
                    pytrace=False)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup(item):
    warnguard.offenders.clear()
    result = yield
    _fail_on_our_deprecations()
    return result


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item):
    warnguard.offenders.clear()
    result = yield
    _fail_on_our_deprecations()
    return result
