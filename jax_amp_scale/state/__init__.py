"""The bottom layer: `ScaleState` and the checks every public entry point runs once.

Nothing here knows about backends, lowering or training.
"""
