"""Training of every trainable part, behind one entry point: python -m specbench.train."""
