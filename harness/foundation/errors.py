"""Errors the engine raises that the command line maps to exit codes, importable without torch."""
from __future__ import annotations


class ModelLoadError(ValueError):
    """A model folder or file that cannot be loaded (incomplete, truncated, refused pickles): the
    message names the file and what to do; `harness.cli.main` prints it as one line, exit 2."""
