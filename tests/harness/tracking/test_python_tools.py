"""Tests pass however the README's virtual-environment recipe is followed (issue 48, item 6): a tool a package
installs with the Python that runs the tests (``wandb``) is found next to ``sys.executable`` even when that
environment is not activated (`make test PYTHON=.venv/bin/python` puts nothing on PATH)."""
from __future__ import annotations

import os
import sys

from support_paths import python_tool  # tests/support


def _venv(tmp_path):
    bin_ = tmp_path / ".venv" / "bin"
    bin_.mkdir(parents=True)
    (bin_ / "python").symlink_to(sys.executable)  # a venv's python: a link to the base interpreter
    tool = bin_ / "wandb"
    tool.write_text("#!/bin/sh\necho venv-wandb\n")
    tool.chmod(0o755)
    return bin_


def test_a_tool_beside_a_venv_python_is_found_without_path(tmp_path, monkeypatch):
    bin_ = _venv(tmp_path)
    monkeypatch.setattr(sys, "executable", str(bin_ / "python"))
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    assert python_tool("wandb") == str(bin_ / "wandb")
    assert python_tool("no-such-tool-here") is None


def test_path_is_the_fallback(tmp_path, monkeypatch):
    bin_ = _venv(tmp_path)
    monkeypatch.setattr(sys, "executable", str(tmp_path / "elsewhere" / "python"))
    monkeypatch.setenv("PATH", os.pathsep.join([str(bin_), os.environ.get("PATH", "")]))
    assert python_tool("wandb") == str(bin_ / "wandb")
