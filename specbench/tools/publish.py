"""python -m specbench.tools.publish <checkpoint.safetensors | skip-search result .json> --command "<the command that made it>"

Copies a trained checkpoint from the cache into the package (specbench/published_artifacts/<model
key>/<kind>/, artifacts.published_path), where `checkpoint: auto` finds it when the cache holds
none: floating tensors as float16 (the parts run in the target's dtype; float16 halves the file),
the same metadata (kind, model key, structure, training settings), and beside it `<name>.json`
with the file's sha256, its size and the exact command (tests/test_shipped_artifacts.py checks both). A
fine-tune's command reads `train.init=<file>`, a path on the machine that trained it: `--note` must say where
that file is kept (e.g. the `git show <commit>:<path>` that restores it), or the record could not be rerun.
A Self-SD skip-search result (JSON) ships the same way, to <model key>/self_sd/ (its record:
`<name>.sha256.json`), where `skip.source: auto` finds it when the cache holds none.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from safetensors.torch import save_file

from specbench.config.compose import fail
from specbench.core.errors import SpecBenchError
from specbench.models.artifacts import (_flatten, atomic_write, load_skip_result, manifest_path, published_path,
                                        published_skip_path, read_checkpoint, write_json)
from specbench.run.provenance import file_sha256


def reads_init(command: str) -> bool:
    """Does the command fine-tune from a file? (`train.init=null` starts from the target: no file to keep.)"""
    values = [a.split("=", 1)[1] for a in command.split() if a.lstrip("+").startswith("train.init=")]
    return any(v.strip("'\"").lower() not in ("null", "none", "~", "") for v in values)


TRAIN, SEARCH = "python -m specbench.train ", "python -m specbench.tools.skipsearch "


def _check_command(command: str, entry: str) -> None:
    """The record's command is what reruns it (tests/test_shipped_artifacts.py checks each): refuse another."""
    if not command.startswith(entry):
        raise SpecBenchError(f"--command {command[:60]!r} is not the command that made it; expected '{entry}...'")


def publish(src: Path, command: str, note: str | None = None) -> Path:
    _check_command(command, TRAIN)
    if reads_init(command) and not note:
        raise SpecBenchError("the command reads train.init=<file>, a path on this machine: give --note saying where "
                             "that file is kept (e.g. `git show <commit>:<path> > init.safetensors`)")
    if not Path(src).is_file():
        raise SpecBenchError(f"no checkpoint file {src}")
    ckpt = read_checkpoint(src, "python -m specbench.train ...")
    flat = {k: (v.half() if v.is_floating_point() else v) for k, v in _flatten(ckpt["state"]).items()}
    meta = {k: v for k, v in ckpt.items() if k != "state"}
    dest = published_path(meta["kind"], meta["model_key"], meta["structure"])
    atomic_write(dest, lambda p: save_file(flat, str(p), metadata={"specbench": json.dumps(meta, default=str)}))
    info = {"file": dest.name, "sha256": file_sha256(dest), "bytes": dest.stat().st_size,
            "dtype": "float16", "kind": meta["kind"], "model_key": meta["model_key"], "structure": meta["structure"],
            "command": command, "parameters": sum(v.numel() for v in flat.values() if v.is_floating_point())}
    if note:
        info["note"] = note
    manifest_path(dest).write_text(json.dumps(info, indent=1) + "\n")
    return dest


def publish_skip_set(src: Path, command: str) -> Path:
    """A Self-SD skip-search result (JSON, specbench/train/skipsearch.py) into the package, where
    `skip.source: auto|search` finds it when the cache holds none; its record is `<name>.sha256.json`."""
    _check_command(command, SEARCH)
    result = load_skip_result(src)
    if not result.get("model_key"):
        raise SpecBenchError(f"skip-search result {src} names no model_key; rerun the search")
    dest = published_skip_path(result["model_key"])
    write_json(dest, result | {"command": command})
    info = {"file": dest.name, "sha256": file_sha256(dest), "bytes": dest.stat().st_size, "kind": "self_sd_skip",
            "model_key": result["model_key"], "skip": result["skip"], "command": command}
    manifest_path(dest).write_text(json.dumps(info, indent=1) + "\n")
    return dest


def main(argv: list[str]) -> None:
    ap = argparse.ArgumentParser(prog="python -m specbench.tools.publish")
    ap.add_argument("checkpoint", type=Path)
    ap.add_argument("--command", required=True, help="the exact command that trained it")
    ap.add_argument("--note", help="how it was trained beyond the command (where its train.init file is kept)")
    args = ap.parse_args(argv)
    try:
        if args.checkpoint.suffix == ".json":
            print(publish_skip_set(args.checkpoint, args.command))
        else:
            print(publish(args.checkpoint, args.command, args.note))
    except SpecBenchError as e:
        fail(str(e))


if __name__ == "__main__":
    main(sys.argv[1:])
