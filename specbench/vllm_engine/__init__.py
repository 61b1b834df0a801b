"""vLLM as a second engine (`python -m specbench engine=vllm method=<ngram|suffix|...>`, docs/vllm.md).

vLLM pins its own torch and transformers, so it lives in its own environment (`make vllm-env`,
.venv-vllm). This package runs in the project's environment and never imports vllm:

  settings.py  the JSON spec the worker receives (vLLM's speculative_config from conf/method/vllm)
  convert.py   the embedded GGUF saved once as a Hugging Face directory vLLM can load (cached)
  worker.py    the worker, run by the vLLM environment's Python: stdlib + vllm only
  run.py       validation, the worker's process, the run directory (same rules as the native engine)
  summary.py   per batch size: throughput, speedup, TTFT/TPOT, acceptance; the crossover batch
  report.py    the throughput-vs-batch table and plot
"""
