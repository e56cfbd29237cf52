"""The training layer: scalers, helpers, optax, Trainer, policies (ARCHITECTURE.md)."""
