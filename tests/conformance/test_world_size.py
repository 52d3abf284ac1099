"""World sizes the machine cannot hold are refused up front; world size 1 runs, and tests that need more
ranks skip saying so."""

from __future__ import annotations

import pytest

from conformance.descriptors import load_descriptors
from conformance.session import ConformanceSession, RunOptions, WorldSizeError, check_devices


def test_more_ranks_than_devices_is_refused_naming_both_numbers():
    cuda = load_descriptors()["cuda"]
    with pytest.raises(WorldSizeError, match=r"4 ranks on this machine need 4 cuda devices \(one rank per device "
                                             r"for nccl\), but it has 2: pass --world-size 2 or fewer"):
        check_devices(cuda, 4, 2)
    check_devices(cuda, 2, 2)
    check_devices(load_descriptors()["cpu"], 64, None)  # CPU ranks need no device each


def test_an_accelerator_backend_on_a_machine_without_its_devices_is_refused_saying_what_to_do():
    import torch

    with pytest.raises(WorldSizeError) as info:
        check_devices(load_descriptors()["cuda"], 2, 0)
    assert str(info.value) == (
        f"backend cuda runs one rank per cuda device, and this machine has 0 cuda devices (torch {torch.__version__}; "
        "torch.accelerator finds none): run it where cuda devices are present, or leave --backend out to test what "
        "this machine has (CPU over gloo when it has no accelerator)")
    assert "--world-size" not in str(info.value)


def test_a_launcher_world_size_wins_and_a_different_world_size_is_refused(monkeypatch):
    for key, value in {"RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "2",
                       "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29999"}.items():
        monkeypatch.setenv(key, value)
    with pytest.raises(WorldSizeError, match="--world-size 3 disagrees with the launcher's WORLD_SIZE 2"):
        ConformanceSession.create(RunOptions(backend="cpu", world_size=3))
    session = ConformanceSession.create(RunOptions(backend="cpu"))
    assert session.world_size == 2 and session.launcher.local_world_size == 2


def test_world_size_one_runs_and_two_rank_tests_skip_naming_why(pytester):
    pytester.makepyfile(test_one='''
        import torch
        import torch.distributed as dist
        from conformance import min_ranks

        def total(ctx):
            t = torch.ones(2, device=ctx.device)
            dist.all_reduce(t)
            return ctx.world_size, t.tolist()

        def test_one_rank(ranks):
            assert ranks.run(total) == [(1, [1.0, 1.0])]

        @min_ranks(2)
        def test_pair(ranks):
            raise AssertionError("must not run on one rank")
    ''')
    result = pytester.runpytest_subprocess("--backend", "cpu", "--world-size", "1", "-rs", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=1, skipped=1)
    result.stdout.fnmatch_lines(["*needs at least 2 ranks; this run has 1 (--world-size 2)*"])


def test_a_descriptor_world_size_of_devices_is_the_device_count():
    import torch

    from conformance.descriptors import load_descriptors
    from conformance.session import default_world_size

    cuda = load_descriptors()["cuda"]
    assert cuda.world_size == "devices"
    assert default_world_size(cuda) == max(torch.accelerator.device_count(), 1)
    assert default_world_size(load_descriptors()["cpu"]) == 2


def test_a_world_size_that_is_neither_a_count_nor_devices_is_refused(tmp_path):
    import yaml

    from conformance.descriptors import DescriptorError, load_descriptors, packaged_backends_dir

    for bad in ("all", True):
        data = yaml.safe_load((packaged_backends_dir() / "cpu.yaml").read_text())
        data["world_size"] = bad
        (tmp_path / "cpu.yaml").write_text(yaml.safe_dump(data))
        with pytest.raises(DescriptorError, match=f"world_size: must be a positive number of ranks, or \"devices\" "
                                                  f"for one rank per device; got {bad!r}"):
            load_descriptors(tmp_path)
