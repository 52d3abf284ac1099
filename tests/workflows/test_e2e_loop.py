"""What the end-to-end loop (``bench/e2e_loop.py``) reads without act: the installed torch's commit."""

from __future__ import annotations

from bench.e2e_loop import torch_git_version


def test_torch_git_version_read_from_its_file_is_the_imported_torchs():
    import torch

    assert torch_git_version() == torch.version.git_version != ""
