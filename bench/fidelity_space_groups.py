"""Teacher-forced SPACE candidate quality per mask group, group rule vs eq. 6 literal, on the
fine-tuned model's own greedy output (so every candidate up to c_g is what decoding would accept).
For pending position P and group g, mask j should predict seq[P+1+g+j]; we report the mean number
of leading correct masks (= candidates the next step would accept) per group."""
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout

import torch
from hydra import compose, initialize_config_dir

from specbench.cli import CONF_DIR
from specbench.engine.tree import space_indices, space_layout
from specbench.methods import build_method
from specbench.methods.space import MASK
from specbench.models import load_model
from specbench.config.settings import of, run_values
from specbench.engine.sampling import SamplingConfig
from specbench.models.distill import build_sequences

n_prompts, n_new = int(sys.argv[1]), int(sys.argv[2])
with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
    cfg = of(compose("config", overrides=["method=space", "model=smollm2-135m", *sys.argv[3:]]))
torch.set_grad_enabled(False)
torch.set_num_threads(1)
target = load_model(cfg.model)
m = build_method("space", target, cfg.method, SamplingConfig(), run_values(cfg))
k = m.k
seqs = build_sequences(target, cfg.train.data, os.environ["SPECBENCH_DATA_DIR"], int(cfg.train.seed))
rules = {r: space_layout(k, 1, r) for r in ("group", "eq6")}
stats = {r: [[0, 0] for _ in range(k + 1)] for r in rules}
for s, start, *_ in seqs[-n_prompts:]:  # original GSM8K train questions (last = not generated)
    prompt = s[:start]
    out = m.generate(prompt, n_new, frozenset(), 0).tokens
    seq = prompt + out
    m.cache = m.target.new_cache()
    m._forward(seq[: len(prompt)])
    for P in range(len(prompt), len(seq) - 2 * k - 2):
        L = m.cache.length()
        for r, (layout, mask, pos) in rules.items():
            ids = [seq[P] if kind == "x" else (seq[P + i] if kind == "c" else MASK) for kind, i in layout]
            logits, _ = m._forward(ids, positions=L + pos.to(m.target.device), tree_mask=mask.to(m.target.device))
            m.cache.crop(L)
            _, groups = space_indices(layout, k)
            for g in range(k + 1):
                pred = logits[groups[g]].argmax(-1).tolist()
                n = 0
                while n < k and pred[n] == seq[P + 2 + g + n]:
                    n += 1
                stats[r][g][0] += n
                stats[r][g][1] += 1
        m._forward([seq[P]])
print("| rule | " + " | ".join(f"group {g}" for g in range(k + 1)) + " | positions |")
print("|---|" + "---|" * (k + 2))
for r, st in stats.items():
    print(f"| {r} | " + " | ".join(f"{a / max(b, 1):.3f}" for a, b in st) + f" | {st[0][1]} |")
