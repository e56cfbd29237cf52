import os

# Tests that check bits compare against NumPy; keep JAX on the host CPU.
os.environ.setdefault("JAX_PLATFORMS", "cpu")
