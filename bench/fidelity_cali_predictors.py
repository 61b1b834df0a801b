"""Train two Cali-TS predictors next to the cached EESD exit layer on the same sequences: the fixed
pairing (draft state at t+i, trainers.cali_pair) and the old one (t+i-1). Accuracy measured on
decode-time (fixed) pairs of held-out sequences. Args: n_train n_held out_dir, then Hydra overrides;
writes out_dir/cali_new.pt and out_dir/cali_old.pt (use with control.predictor=...)."""
import os
import random
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout

import torch
from hydra import compose, initialize_config_dir

from specbench.cli import CONF_DIR
from specbench.control.cali_ts import CaliPredictor
from specbench.methods.eesd import load_early_exit
from specbench.models import load_model
from specbench.config.settings import of
from specbench.train import loop, trainers
from specbench.models.distill import build_sequences

n_train, n_held, out_dir = int(sys.argv[1]), int(sys.argv[2]), Path(sys.argv[3])
with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
    cfg = of(compose("config", overrides=["method=eesd", "model=smollm2-135m", *sys.argv[4:]]))
torch.set_grad_enabled(False)
torch.set_num_threads(1)
target = load_model(cfg.model)
exit_, _ = load_early_exit(target, cfg.method)
exit_.eval()
seqs = build_sequences(target, cfg.train.data, os.environ["SPECBENCH_DATA_DIR"], int(cfg.train.seed))
seqs = seqs[: int(cfg.train.max_sequences)]
train, held = loop.split_held_out(seqs, cfg.train)
c = cfg.train.cali_predictor


def old_pair(feats, t, i):
    th, dh, tt, dt = feats
    j = t + i - 1
    return th[t], dh[j], i, float(dt[j] == tt[j])


def examples(seqs, pair, seed):
    rng = random.Random(seed)
    out = [[], [], [], []]
    for feats, start, T in seqs:
        for _ in range(int(c.pairs_per_sequence)):
            t = rng.randrange(max(0, start - 1), T - 1)
            i = rng.randint(1, int(c.max_i))
            if t + i >= T:
                continue
            for lst, v in zip(out, pair(feats, t, i)):
                lst.append(v)
    return torch.stack(out[0]).float(), torch.stack(out[1]).float(), torch.tensor(out[2]), torch.tensor(out[3])


feats_tr = [(trainers.cali_features(target, exit_, s), st, len(s)) for s, st, *_ in train[:n_train]]
feats_he = [(trainers.cali_features(target, exit_, s), st, len(s)) for s, st, *_ in held[:n_held]]
hx = examples(feats_he, trainers.cali_pair, 1)
base = float(hx[3].mean())
for name, pair in (("new", trainers.cali_pair), ("old", old_pair)):
    ex = examples(feats_tr, pair, 0)
    pred = CaliPredictor(target.hidden_size, int(c.max_i))
    with torch.enable_grad():
        pred.train_on(ex, epochs=int(c.epochs), lr=float(c.lr), batch_size=int(c.batch_size), seed=0)
    with torch.no_grad():
        acc = float(((pred(hx[0], hx[1], hx[2]) > 0.5).float() == hx[3]).float().mean())
    print(f"{name}-pairing predictor: {len(ex[3])} train examples (positive rate {float(ex[3].mean()):.3f}); "
          f"accuracy on {len(hx[3])} held-out decode-time pairs {acc:.3f} (majority {max(base, 1 - base):.3f})")
    pred.save(out_dir / f"cali_{name}.pt")
