"""The training layer: scalers, the scale functions, `loss_scaled` and its pieces (ARCHITECTURE.md)."""
