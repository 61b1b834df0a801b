"""The configuration: composing it (`compose`: Hydra, the one validation pass before disk), its typed
tables (`schema`) and the settings generated from them (`settings`), the bounds a model puts on sizes
(`bounds`, `modelinfo`), the help text, what the native code knows of other engines (`engines`) and a
run's identity from its config (`identity`). Imports only core/; every part above reads its settings
here."""
