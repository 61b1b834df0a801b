"""transformers' own assisted generation, run through the same harness as a reference.

`mode: assistant` calls `generate(assistant_model=...)` with the same draft model vanilla SD
builds (same `draft` config) and a constant K; `mode: prompt_lookup` calls
`generate(prompt_lookup_num_tokens=K)`. This is what a user would otherwise pick, so it is the
honest reference for our own implementations. transformers does not expose per-step
acceptance, so only token counts, wall time and losslessness are reported for it.
"""

from __future__ import annotations

import torch

from specbench.engine.timer import PhaseTimer
from specbench.core.errors import SpecBenchError
from specbench.methods.base import Generation, Method, register_method
from specbench.methods.vanilla_sd import build_draft


@register_method
class HFAssisted(Method):
    name = "hf_assisted"
    external_loop = True  # transformers' generate() drafts, verifies and keeps its own cache

    def __init__(self, target, cfg, sampling, run):
        super().__init__(target, cfg, sampling, run)
        if target.execution == "graphs":
            raise SpecBenchError("method=hf_assisted runs transformers' own generate(), which model.execution=graphs "
                                 "does not reach; use model.execution=eager")
        self.mode = cfg.mode
        self.k = int(cfg.k)
        if self.k < 1:
            raise SpecBenchError(f"K must be >= 1, got {self.k}")
        self.draft_info = {}
        if self.mode == "assistant":

            self.draft, self.draft_info = build_draft(target, cfg.draft)
            self.draft.model.generation_config.num_assistant_tokens = self.k
            self.draft.model.generation_config.num_assistant_tokens_schedule = "constant"
            # transformers >= 4.45 also stops drafting on low confidence; disable for fixed K
            self.draft.model.generation_config.assistant_confidence_threshold = 0.0
        elif self.mode != "prompt_lookup":
            raise SpecBenchError(f"unknown hf_assisted.mode {self.mode!r}; allowed: assistant, prompt_lookup")

    def describe(self) -> dict:
        return super().describe() | {"mode": self.mode, "k": self.k} | self.draft_info

    def generate(self, prompt, max_new_tokens, eos_ids, seed) -> Generation:
        self.timer.totals = {}
        eos = sorted(eos_ids)
        kwargs = dict(max_new_tokens=max_new_tokens, eos_token_id=eos or None, pad_token_id=eos[0] if eos else 0)
        if self.sampling.greedy:
            kwargs.update(do_sample=False, temperature=None, top_p=None, top_k=None)
        else:
            kwargs.update(do_sample=True, temperature=self.sampling.temperature, top_p=self.sampling.top_p, top_k=self.sampling.top_k or None)
        if self.mode == "assistant":
            kwargs["assistant_model"] = self.draft.model
        else:
            kwargs["prompt_lookup_num_tokens"] = self.k

        self.timer = PhaseTimer(self.target.device, self.timing, getattr(self.target, "devices", ()))
        torch.manual_seed(int(seed))
        ids = torch.tensor([prompt], device=self.target.device)
        self.timer.start()
        with self.timer.phase("hf_generate"), torch.no_grad():
            out = self.target.model.generate(ids, attention_mask=torch.ones_like(ids), **kwargs)
        times = self.timer.stop()
        return Generation(out[0, len(prompt) :].tolist(), times=times)
