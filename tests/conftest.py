import os
from pathlib import Path

import pytest
import torch

# tiny models: one thread is faster than two oversubscribed ones on a loaded 2-core machine
torch.set_num_threads(1)

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="session")
def data_dir() -> Path:
    """The shared evaluation data (../shared/data beside the repo, or SPECBENCH_DATA_DIR)."""
    d = Path(os.environ.get("SPECBENCH_DATA_DIR", REPO.parent / "shared" / "data"))
    if not d.is_dir():
        pytest.fail(f"evaluation data not found at {d}; set SPECBENCH_DATA_DIR")
    return d


@pytest.fixture(autouse=True)
def _private_cache(tmp_path_factory, monkeypatch):
    """Every test starts with an empty artifact cache of its own (never the user's ~/.cache)."""
    monkeypatch.setenv("SPECBENCH_CACHE_DIR", str(tmp_path_factory.mktemp("cache")))
