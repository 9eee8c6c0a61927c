"""The errors of weight loading, shared by `loader.py` and `quantized_weights.py`."""

from __future__ import annotations

__all__ = ["ChecksumError", "WeightLoadError"]


class WeightLoadError(ValueError):
    """The checkpoint does not fit the model (missing, unexpected or mis-shaped tensors)."""


class ChecksumError(WeightLoadError):
    """A checkpoint file does not match its SHA-256 manifest entry (or is missing)."""

    def __init__(self, file: str, message: str) -> None:
        super().__init__(f"checkpoint file '{file}': {message}; refusing to load")
        self.file = file
