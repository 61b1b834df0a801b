"""The commands that build, check and publish (`python -m specbench.tools.<name>`): the skip search
and the REST datastore ahead of a run, calibration, the doctor, the GPU regimes and sync counts, and
publishing trained parts. The top of the graph beside cli.py: nothing imports tools/."""
