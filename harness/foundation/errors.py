"""Errors the engine raises that the command line maps to exit codes, importable without torch."""
from __future__ import annotations


class ModelLoadError(ValueError):
    """A model folder or file that cannot be loaded (incomplete, truncated, refused pickles): the
    message names the file and what to do; `harness.cli.main` prints it as one line, exit 2."""


class NumericsError(RuntimeError):
    """Portable numerics were asked for and cannot hold in this process (torch already ran other kernels, or the
    OpenBLAS the portable products need cannot be loaded): the message says why and what to do; `harness.cli.main`
    prints it as one line, exit 2, before any work."""
