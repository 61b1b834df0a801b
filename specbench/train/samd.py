"""SAM-Decoding trains nothing of its own: its auxiliary drafter's parts (method.aux, e.g. the EAGLE-2
head) are trained on first use as that method's are, with the auxiliary's settings as the method
config its trainer reads (conf/method/<aux>.yaml with method.aux_settings over it)."""

from __future__ import annotations

from dataclasses import replace

from specbench.config import settings

from specbench.methods.samd import aux_config
from specbench.train.parts import FIRST_USE, first_use


@first_use("samd")
def aux_parts(cfg, target) -> list:
    aux = aux_config(cfg.method)
    parts_of = FIRST_USE.get(aux.name)
    if parts_of is None or not aux.train_if_missing:  # every auxiliary with parts has the key
        return []  # nothing trained, or not allowed: the auxiliary's loader says what is missing
    as_aux = settings.with_group(cfg, "method", aux)
    return [replace(p, method=aux) for p in parts_of(as_aux, target)]
