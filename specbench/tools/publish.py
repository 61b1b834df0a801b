"""python -m specbench.tools.publish <checkpoint.safetensors> --command "<the command that trained it>"

Copies a trained checkpoint from the cache into the package (specbench/published_artifacts/<model
key>/<kind>/, artifacts.published_path), where `checkpoint: auto` finds it when the cache holds
none: floating tensors as float16 (the parts run in the target's dtype; float16 halves the file),
the same metadata (kind, model key, structure, training settings), and beside it `<name>.json`
with the file's sha256, its size and the exact command (tests/test_shipped_artifacts.py checks both).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from safetensors.torch import save_file

from specbench.models.artifacts import _flatten, atomic_write, published_path, read_checkpoint
from specbench.run.provenance import file_sha256


def publish(src: Path, command: str) -> Path:
    ckpt = read_checkpoint(src, "train it again")
    flat = {k: (v.half() if v.is_floating_point() else v) for k, v in _flatten(ckpt["state"]).items()}
    meta = {k: v for k, v in ckpt.items() if k != "state"}
    dest = published_path(meta["kind"], meta["model_key"], meta["structure"])
    atomic_write(dest, lambda p: save_file(flat, str(p), metadata={"specbench": json.dumps(meta, default=str)}))
    info = {"file": dest.name, "sha256": file_sha256(dest), "bytes": dest.stat().st_size,
            "dtype": "float16", "kind": meta["kind"], "model_key": meta["model_key"], "structure": meta["structure"],
            "command": command, "parameters": sum(v.numel() for v in flat.values() if v.is_floating_point())}
    dest.with_suffix(".json").write_text(json.dumps(info, indent=1) + "\n")
    return dest


def main(argv: list[str]) -> None:
    ap = argparse.ArgumentParser(prog="python -m specbench.tools.publish")
    ap.add_argument("checkpoint", type=Path)
    ap.add_argument("--command", required=True, help="the exact command that trained it")
    args = ap.parse_args(argv)
    print(publish(args.checkpoint, args.command))


if __name__ == "__main__":
    main(sys.argv[1:])
