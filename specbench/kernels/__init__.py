"""The CPU kernels and their bindings: the ggml / ggml_q8 linear layers and the batch-invariant
attention (C sources compiled on first use) and `model.backend`, which puts them in a model's
linear layers. Below models/: imports only core/."""
