"""Real text available offline: the Python standard library's own source files.

The top-level ``*.py`` files of ``sysconfig.get_paths()["stdlib"]``, sorted by
name; every tenth file is held out.  Nothing is downloaded.  The selection is
deterministic; the bytes themselves depend on the Python version.
"""

from __future__ import annotations

import sysconfig
from pathlib import Path

import numpy as np


def corpus_files() -> list[Path]:
    """The top-level ``*.py`` files of this Python's standard library, sorted by name."""
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    files = sorted(stdlib.glob("*.py"), key=lambda p: p.name)
    if len(files) < 20:
        raise RuntimeError(f"expected the standard library's sources in {stdlib}")
    return files


def load_corpus() -> tuple[np.ndarray, np.ndarray]:
    """(training bytes, held-out bytes) as uint8 arrays; every tenth file is held out."""
    train: list[bytes] = []
    held_out: list[bytes] = []
    for i, path in enumerate(corpus_files()):
        (held_out if i % 10 == 9 else train).append(path.read_bytes())
    return (
        np.frombuffer(b"\n".join(train), dtype=np.uint8),
        np.frombuffer(b"\n".join(held_out), dtype=np.uint8),
    )


def windows(data: np.ndarray, starts: np.ndarray, length: int) -> np.ndarray:
    """(len(starts), length) int32 windows of `data` beginning at `starts`."""
    idx = np.asarray(starts)[:, None] + np.arange(length)[None, :]
    return data[idx].astype(np.int32)


def random_windows(
    data: np.ndarray, steps: int, batch: int, length: int, seed: int = 0
) -> np.ndarray:
    """(steps, batch, length) int32 windows at seeded random starts: a fixed data order."""
    rng = np.random.default_rng(seed)
    starts = rng.integers(0, len(data) - length, size=(steps, batch))
    return windows(data, starts.reshape(-1), length).reshape(steps, batch, length)
