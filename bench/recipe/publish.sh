#!/bin/bash
# Ship the EAGLE-3 draft and the EAGLE-2 head train.sh wrote (float16 + sha256 + the command) where `method=eagle3` finds it by default,
# and plot their held-out acceptance by depth against optimiser steps.
set -eu
cd "$(dirname "$0")/../.."
export PYTHONPATH=$PWD
CKPT=$(ls ~/.cache/specbench/eagle3/smollm2-135m-*.safetensors | grep -v resume | head -1)
CMD="python -m specbench.train method=eagle3 method.ttt_steps=5 $(sed -n '/^DATA=/,/"$/p' bench/recipe/train.sh | tr -d '\n' | sed 's/^DATA="//; s/"$//; s/  */ /g')"
python -m specbench.tools.publish "$CKPT" --command "$CMD"
E2=$(ls ~/.cache/specbench/eagle/smollm2-135m-*.safetensors | grep -v resume | head -1)
python -m specbench.tools.publish "$E2" --command "${CMD/method=eagle3 method.ttt_steps=5/method=eagle}"
python -m specbench.train.curves "${CKPT%.safetensors}.log.json" "${E2%.safetensors}.log.json" -o curves.png
