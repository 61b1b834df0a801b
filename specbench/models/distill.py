"""Self-distillation data: text the target model itself generates, mixed with original text.

Prompts come only from the GSM8K *train* split (never an evaluated test item). To cover the
three kinds of text the benchmark tasks ask for, each train question is put in one of three
templates: solve it step by step (math), summarise it in one sentence (summarisation), or write
a Python function for it (code). Generation follows the hybrid strategy the EESD paper adopts
from LLM-QAT (Liu et al. 2023): a share of the sequences is fully greedy, the rest start with a
few greedy tokens and then sample. The original text (the train split's reference answers) is
mixed in, as the paper keeps open-source data beside the generated data.
Generation is batched through transformers' `generate` (left padding): several times faster on
CPU than one sequence at a time, and it does not touch the decoding code under test.
It lives beside the model rather than in train/ because a method reads it too: a draft
vocabulary (methods/draft_vocab.py) ranks tokens by the sequences the trainers learn from.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import re
import time
from pathlib import Path

import torch
from tqdm import tqdm

from specbench.config import settings
from specbench.config.identity import drop_unset_training_keys
from specbench.models.artifacts import cache_dir, read_json, write_json
from specbench.core.errors import SpecBenchError
from specbench.models import ModelAdapter
from specbench.models.general_data import general_prompts

TEMPLATES = (
    "Solve the following problem step by step, then give the final answer.\n\n{q}",
    "Summarize the following text in one sentence.\n\n{q}",
    "Write a Python function that solves the following problem. Reply with the code.\n\n{q}",
)


TEMPLATE_DOMAINS = ("gsm8k-math", "gsm8k-summary", "gsm8k-code")  # what each template's sequences are tagged


def domains_of(target: ModelAdapter, dcfg, seed: int) -> list[str] | None:
    """Each cached sequence's domain (TEMPLATE_DOMAINS, general_data.DOMAINS or gsm8k-original), in the
    order load_sequences returns them; None for data cached before domains were recorded."""
    path = sequences_path(target, dcfg, seed)
    return read_json(path, "self-distillation data", "delete it").get("domains") if path.is_file() else None


def read_train_split(data_dir: str | Path | None) -> list[dict]:
    if not data_dir:
        raise SpecBenchError("training needs the GSM8K train split: set SPECBENCH_DATA_DIR (or task.data_dir)")
    path = Path(data_dir) / "gsm8k" / "train.jsonl"
    if not path.is_file():
        raise SpecBenchError(f"GSM8K train split not found at {path}; set SPECBENCH_DATA_DIR (or task.data_dir) "
                             "to a data folder holding gsm8k/train.jsonl (docs/data.md)")
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def clean_answer(answer: str) -> str:
    answer = re.sub(r"<<[^>]*>>", "", answer)
    return re.sub(r"####\s*(.+)$", r"The answer is \1.", answer.strip())


DATA_FORMAT = 2  # 2: each generation batch seeded by (seed, batch), so a resumed generation continues exactly


def sequences_hash(sequences) -> str:
    return hashlib.sha256(json.dumps([[list(s[0]), s[1]] for s in sequences]).encode()).hexdigest()[:16]


def build_sequences(target: ModelAdapter, dcfg, data_dir, seed: int) -> list[tuple[list[int], int]]:
    """(token ids, index where the loss starts) per sequence; cached on disk."""
    return load_sequences(target, dcfg, data_dir, seed)[0]


def _desc(target: ModelAdapter, dcfg, seed: int) -> dict:
    caps = ("gen_minutes",)
    given = settings.record(dcfg)
    drop_unset_training_keys({"data": given})  # GSM8K only: the key the data had before general prompts existed
    return {"model": target.key, **{k: given[k] for k in sorted(given) if k not in caps}, "seed": seed,
            "format": DATA_FORMAT}


def sequences_path(target: ModelAdapter, dcfg, seed: int, finished: bool = True) -> Path:
    """Where load_sequences caches the data; finished=False: the journal of a generation not yet
    finished (stopped by a safety cap), which holds the sequences read meanwhile."""
    key = hashlib.sha1(json.dumps(_desc(target, dcfg, seed), sort_keys=True, default=str).encode()).hexdigest()[:12]
    path = cache_dir() / "distill" / f"{target.key}-{key}.json"
    return path if finished else path.with_name(path.stem + ".journal.jsonl")


def load_sequences(target: ModelAdapter, dcfg, data_dir, seed: int) -> tuple[list[tuple[list[int], int]], str | None]:
    """(sequences, the safety cap that cut generation short or None). The budget is the number of
    prompts and original answers (train.data.*); train.data.gen_minutes (null by default) is only a
    safety cap and is not part of the data's key. Generated sequences go to a journal as each batch
    finishes, so an interrupted generation (a crash, Ctrl-C, the cap) continues where it stopped."""
    desc = _desc(target, dcfg, seed)
    path = sequences_path(target, dcfg, seed)
    if path.is_file():
        print(f"self-distillation data: reusing {path}")
        return [tuple(s) for s in read_json(path, "self-distillation data", "delete it; training regenerates it")["sequences"]], None

    rows = read_train_split(data_dir)
    rng = random.Random(seed)
    order = rng.sample(range(len(rows)), min(len(rows), int(dcfg.num_prompts) + int(dcfg.num_original)))
    gen_rows, orig_rows = order[: int(dcfg.num_prompts)], order[int(dcfg.num_prompts) :]
    tok = target.tokenizer
    prompts = [tok.encode_chat([{"role": "user", "content": TEMPLATES[j % len(TEMPLATES)].format(q=rows[i]["question"])}])
               for j, i in enumerate(gen_rows)]
    domains = [TEMPLATE_DOMAINS[j % len(TEMPLATES)] for j in range(len(prompts))]
    general = None
    if dcfg.general_prompts:
        more, more_domains, general = general_prompts(int(dcfg.general_prompts), seed, data_dir, tok,
                                                      int(dcfg.general_max_prompt_tokens))
        print(f"self-distillation data: {len(more)} general-domain prompts, mix {general['mix']}, dropped {general['dropped']}")
        prompts, domains = prompts + more, domains + more_domains
    journal = sequences_path(target, dcfg, seed, finished=False)
    sequences, stopped = generate(target, prompts, dcfg, seed, journal=journal)
    eos = min(tok.eos_ids) if tok.eos_ids else None
    for i in orig_rows:
        p = tok.encode_chat([{"role": "user", "content": TEMPLATES[0].format(q=rows[i]["question"])}])
        a = tok.encode(clean_answer(rows[i]["answer"])) + ([eos] if eos is not None else [])
        sequences.append((p + a, len(p)))
    # by prompt: generation drops a sequence with no answer, so positions do not line up
    of_prompt = {tuple(p): d for p, d in zip(prompts, domains)}
    domains = [of_prompt.get(tuple(s[:st]), "gsm8k-original") for s, st in sequences]
    if not sequences:
        raise SpecBenchError("no self-distillation data: generation produced no sequence and train.data.num_original is 0")
    if stopped:  # not cached as finished: the journal keeps the batches, a rerun continues
        print(f"self-distillation data: generation stopped early by the safety cap train.data.{stopped}; training on "
              f"{len(sequences)} sequences (recorded in the artifact's settings); {journal} keeps the progress")
        return sequences, f"train.data.{stopped}"
    write_json(path, {"desc": desc, "sequences": sequences, "domains": domains} | ({"general": general} if general else {}))
    journal.unlink(missing_ok=True)
    print(f"self-distillation data: {len(sequences)} sequences, {sum(len(s) - st for s, st in sequences)} loss tokens -> {path}")
    return sequences, None


def read_journal(path: Path) -> list[list]:
    """The finished batches of a generation journal, in order; a torn last line (a crash while
    writing it) is cut off the file so the next batch is appended after whole lines only."""
    if not path.is_file():
        return []
    data, done, good = path.read_bytes(), [], 0
    for line in data.split(b"\n")[:-1]:  # a line without its newline was never finished
        try:
            rec = json.loads(line)
        except ValueError:
            break
        if not isinstance(rec, dict) or rec.get("batch") != len(done) or not isinstance(rec.get("sequences"), list):
            break
        done.append(rec["sequences"])
        good += len(line) + 1
    if good < len(data):
        with open(path, "r+b") as f:
            f.truncate(good)
    return done


def append_journal(path: Path, batch: int, sequences) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as f:
        f.write(json.dumps({"batch": batch, "sequences": sequences}) + "\n")
        f.flush()
        os.fsync(f.fileno())


@torch.no_grad()
def generate(target: ModelAdapter, prompts: list[list[int]], dcfg, seed: int, journal: Path | None = None):
    """(sequences, the cap that stopped generation or None). Batch b is seeded by (seed, b) alone."""
    tok = target.tokenizer
    eos_ids = sorted(tok.eos_ids)
    pad = eos_ids[0] if eos_ids else 0
    bs = int(dcfg.batch_size)
    cap = dcfg.gen_minutes
    deadline = time.monotonic() + 60 * float(cap) if cap is not None else None
    done = read_journal(journal) if journal else []
    out: list[tuple[list[int], int]] = [tuple(s) for batch in done for s in batch]
    starts = list(range(0, len(prompts), bs))
    if done:
        print(f"self-distillation data: resuming, {len(done)} of {len(starts)} batches done before ({journal})")
    bar = tqdm(starts, desc="self-distillation generate", unit="batch", initial=len(done), total=len(starts))
    stopped = None
    for b, start in enumerate(starts):
        if b < len(done):
            continue
        if deadline and time.monotonic() > deadline:
            stopped = "gen_minutes"
            break
        t0 = time.monotonic()
        new = generate_batch(target, prompts[start : start + bs], dcfg, (int(seed) * 1_000_003 + b) % 2**63,
                             b, eos_ids, pad)
        if journal:
            append_journal(journal, b, new)
        out += new
        if b == len(done):
            tqdm.write(f"self-distillation data: {len(prompts)} prompts in {len(starts)} batches of {bs}, up to "
                       f"{int(dcfg.max_new_tokens)} new tokens each; estimated ~{(len(starts) - b) * (time.monotonic() - t0) / 60:.1f} "
                       "min on this machine (an estimate, from the timed first batch)")
        bar.update(1)
        bar.set_postfix(sequences=len(out))
    bar.close()
    return out, stopped


def generate_batch(target: ModelAdapter, batch: list[list[int]], dcfg, batch_seed: int, b: int, eos_ids, pad):
    """One batch of the LLM-QAT hybrid: greedy, or a few greedy tokens then sampling."""
    model, tok = target.model, target.tokenizer
    torch.manual_seed(batch_seed)
    width = max(len(p) for p in batch)
    ids = torch.tensor([[pad] * (width - len(p)) + p for p in batch], device=target.device)
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in batch], device=target.device)
    common = dict(attention_mask=mask, eos_token_id=eos_ids or None, pad_token_id=pad)
    greedy = (b % 2 == 0) if dcfg.greedy_fraction == 0.5 else random.Random(batch_seed).random() < dcfg.greedy_fraction
    if greedy:
        gen = model.generate(ids, max_new_tokens=int(dcfg.max_new_tokens), do_sample=False, **common)
    else:  # LLM-QAT hybrid: a few greedy tokens, then sampling
        head = model.generate(ids, max_new_tokens=int(dcfg.greedy_prefix), do_sample=False, **common)
        mask2 = torch.cat([mask, torch.ones(len(batch), head.shape[1] - width, dtype=mask.dtype, device=mask.device)], 1)
        gen = model.generate(head, attention_mask=mask2, max_new_tokens=int(dcfg.max_new_tokens) - int(dcfg.greedy_prefix),
                             do_sample=True, temperature=float(dcfg.temperature), top_p=float(dcfg.top_p),
                             eos_token_id=eos_ids or None, pad_token_id=pad)
    out = []
    for row, p in zip(gen.tolist(), batch):
        new = row[width:]
        for j, t in enumerate(new):
            if t in tok.eos_ids:
                new = new[: j + 1]
                break
        if len(new) > 1:
            out.append((p + new, len(p)))
    return out


@torch.no_grad()
def teacher_labels(target: ModelAdapter, sequences: list[tuple[list[int], int]], batch_size: int = 4) -> list[list[int]]:
    """The target's own greedy next-token choice at every position of every sequence.

    Training a draft on these labels (`train.labels: target`) distils exactly what greedy
    speculative decoding has to match, on any text, at the cost of one batched forward per
    sequence; generating the same number of tokens costs one forward per token. Cached on disk
    next to the sequences."""
    desc = hashlib.sha1(json.dumps([target.key, [s for s, _ in sequences]]).encode()).hexdigest()[:12]
    path = cache_dir() / "distill" / f"{target.key}-labels-{desc}.json"
    if path.is_file():
        return read_json(path, "teacher labels", "delete it; training regenerates it")
    labels: list[list[int]] = []
    for i in tqdm(range(0, len(sequences), batch_size), desc="teacher labels", unit="batch"):
        batch = [s for s, _ in sequences[i : i + batch_size]]
        width = max(len(s) for s in batch)
        # right padding: causal attention keeps the real positions unaffected
        ids = torch.tensor([s + [s[-1]] * (width - len(s)) for s in batch], device=target.device)
        h = target.norm(target.run_layers(target.embed(ids), None))
        choice = torch.cat([target.lm_head(h[:, j : j + 128]).argmax(-1) for j in range(0, width, 128)], 1)
        labels += [choice[b, : len(s)].tolist() for b, s in enumerate(batch)]
    write_json(path, labels)
    return labels
