"""A run prints nothing a user must ignore (issue 29): no library warnings, no library progress bars.

stderr of a run is the run's own progress bar and, on bad input, one `specbench: error:` line.
"""

import os
import re

import pytest
import transformers
from tqdm.auto import tqdm
from transformers.utils import logging as hf_logging

from helpers import run_cli
from specbench.core.errors import SpecBenchError
from specbench.models import MODEL_LOADERS
from specbench.config.settings import shipped


def test_gguf_loading_hides_transformers_progress_bars(tmp_path, monkeypatch, capsys):
    """The embedded model's load drew two transformers bars (de-quantizing, "Loading weights")."""
    seen = []

    def fake_from_pretrained(*args, **kwargs):
        seen.append(hf_logging.is_progress_bar_enabled())
        for _ in tqdm(range(3), desc="GGUF reader chatter"):  # as transformers' GGUF reader: a plain tqdm
            pass
        raise ValueError("stop before reading the file")

    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", fake_from_pretrained)
    for var in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE"):  # the loader sets them when unset
        monkeypatch.setenv(var, os.environ.get(var, "1"))
    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"GGUF")
    was = hf_logging.is_progress_bar_enabled()
    hf_logging.enable_progress_bar()
    try:
        with pytest.raises(SpecBenchError, match="cannot read GGUF model"):
            MODEL_LOADERS["gguf"](shipped("model", "smollm2-135m", {"name": "m", "path": str(gguf)}))
    finally:
        (hf_logging.enable_progress_bar if was else hf_logging.disable_progress_bar)()
    assert seen == [False]
    assert "chatter" not in capsys.readouterr().err


def test_a_default_run_writes_only_its_progress_bar_to_stderr(tmp_path, data_dir):
    """Progress on (the default), the forward-cost profile on: every stderr line is the run's bar.

    Bites on a library warning from our own calls (transformers' `past_key_values` FutureWarning
    from the adapter's layer calls was one), a library's progress bar or log line."""
    r = run_cli(["model=tiny-llama", "method=pld", "task=gsm8k", "task.num_samples=1", "max_new_tokens=16",
                 "threads=1", "profile.reps=1", "profile.context=20", f"run_dir={tmp_path / 'run'}"], data_dir,
                timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "outputs identical to AR: 1/1" in r.stdout
    lines = [s.strip() for s in re.split(r"[\r\n]+", r.stderr) if s.strip()]
    assert lines, "no progress bar at all"
    noise = [s for s in lines if not s.startswith("pld vs ar on gsm8k")]
    assert noise == [], noise[:5]
