"""Vanilla SD with a real separate draft (`method.draft.source=hf`), end to end through the runner:
two tiny Hugging Face checkpoints on disk (save_pretrained), sharing one tokenizer, as a 68M
draft shares Vicuna-7B's."""

import json

import pytest
import torch
from hydra import compose, initialize_config_dir
from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

from helpers import CONF
from specbench.core.errors import SpecBenchError
from specbench.run.runner import run

SPECIAL = ["<s>", "</s>", "<pad>"]


def byte_tokenizer(extra: list[str] = ()) -> PreTrainedTokenizerFast:
    """A byte-level BPE without merges: every byte one token, no download."""
    vocab = {t: i for i, t in enumerate(SPECIAL + sorted(pre_tokenizers.ByteLevel.alphabet()) + list(extra))}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", pad_token="<pad>")


def save_model(path, layers: int, seed: int, tok: PreTrainedTokenizerFast):
    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=len(tok), hidden_size=64, intermediate_size=128, num_hidden_layers=layers,
                      num_attention_heads=4, num_key_value_heads=2, initializer_range=0.3, bos_token_id=0, eos_token_id=1,
                      pad_token_id=2, tie_word_embeddings=True)
    LlamaForCausalLM(cfg).to(torch.float64).save_pretrained(path)
    tok.save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def models_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("hf")
    tok = byte_tokenizer()
    save_model(d / "target", 4, 0, tok)
    save_model(d / "draft", 1, 1, tok)
    save_model(d / "other-vocab", 1, 1, byte_tokenizer(["<extra>"]))
    (d / "prompts.jsonl").write_text("".join(json.dumps({"prompt": p}) + "\n" for p in ("Hello there", "1 2 3 4", "abcabcabc")))
    return d


def cfg(d, draft: str, run_dir):
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        return compose("config", overrides=[
            "model=hf", f"model.id={d / 'target'}", "model.dtype=float64", "model.device=cpu",
            "method=vanilla_sd", "method.draft.source=hf", f"method.draft.id={d / draft}", "method.draft.dtype=float64",
            "method.draft.device=cpu", "task=jsonl", f"task.path={d / 'prompts.jsonl'}", "max_new_tokens=16",
            "control.k=4", "profile.enabled=false", "progress=false", "warmup_tokens=2", f"run_dir={run_dir}"])


def test_hf_draft_end_to_end(models_dir, tmp_path):
    before = torch.is_grad_enabled()
    s = run(cfg(models_dir, "draft", tmp_path / "run"))
    torch.set_grad_enabled(before)
    assert s["samples"] == 3 and s["matches_ar"] == 3  # lossless with a separate draft model
    settings = s["meta"]["method_settings"]
    assert settings["draft"] == str(models_dir / "draft") and s["meta"]["dtype"] == "float64"
    assert s["acceptance"]["drafted"] > 0 and s["method"]["times"]["draft"] > 0


def test_hf_draft_with_another_vocabulary_is_refused(models_dir, tmp_path):
    with pytest.raises(SpecBenchError, match=r"draft model '.*other-vocab' has a different tokenizer than the target"):
        run(cfg(models_dir, "other-vocab", tmp_path / "run"))
    assert not (tmp_path / "run" / "samples.jsonl").exists()
