"""REST's datastore built ahead of a run (the datastore itself, its cache and corpus formats:
specbench/methods/datastore.py, whose docstring is this command's --help)."""

from __future__ import annotations

import argparse
import os
import sys

from specbench.core.errors import SpecBenchError
from specbench.methods import datastore


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m specbench.tools.datastore", description=datastore.__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="smollm2-135m", help="a conf/model/<name>.yaml (its tokenizer is used)")
    ap.add_argument("--corpus", nargs="+", required=True, help="path.jsonl:field[,field] or text files")
    ap.add_argument("--data-dir", default=os.environ.get("SPECBENCH_DATA_DIR"))
    args = ap.parse_args(argv)
    from specbench.config.settings import CONF_DIR, shipped
    from specbench.models import load_model

    try:
        conf = CONF_DIR / "model" / f"{args.model}.yaml"
        if not conf.is_file():
            names = sorted(p.stem for p in (CONF_DIR / "model").glob("*.yaml"))
            raise SpecBenchError(f"unknown model {args.model!r}; allowed: {', '.join(names)}")
        specs = [datastore.parse_spec(c, args.data_dir) for c in args.corpus]  # bad paths fail before the model loads
        del specs
        target = load_model(shipped("model", args.model))
        ds, path = datastore.load_or_build(args.model, target.tokenizer, args.corpus, args.data_dir)
    except SpecBenchError as e:
        print(f"specbench: error: {e}", file=sys.stderr)
        return 2
    print(f"{path}: {len(ds)} tokens from {ds.meta['entries']} entries")
    return 0


if __name__ == "__main__":
    sys.exit(main())
