"""The error the data path raises for bad input: a missing or unreadable source, a bad tokenizer, a damaged prepared
folder. A :class:`~attnres.config.ConfigError`, so every CLI command prints it as one line before any compute."""

from __future__ import annotations

from attnres.config import ConfigError


class DataError(ConfigError):
    """Bad training data; the message names the file (and line or column) and the fix."""
