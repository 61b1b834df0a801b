"""specbench: a reproducible benchmark harness for speculative decoding."""

from omegaconf import OmegaConf

__version__ = "0.1.0"


def _fingerprint(*exclude: str, _root_) -> str:
    """`${fingerprint:}` in a config: 8 hex digits of the run's fingerprint (its config without
    run_name, run_dir and the keys a resumption may change); `${fingerprint:seed}` leaves the
    named keys out too. Registered here, so every entry point that composes a config
    (`python -m specbench`, a Hydra launcher's job, the tests) can resolve the default run name."""
    from specbench.config.identity import config_hash

    return config_hash(_root_, exclude)


if not OmegaConf.has_resolver("fingerprint"):
    OmegaConf.register_new_resolver("fingerprint", _fingerprint)
