"""What the suites read from a descriptor's ``semantics`` (where NCCL behaves unlike gloo) instead of
assuming the CPU reference's behaviour, and the device-index keys of precompile artifacts."""

from __future__ import annotations

import json
import sys

import pytest
import torch
import yaml

from conformance.descriptors import Semantics, packaged_backends_dir
from conformance.ranks import RankContext
from conformance.report import validate_report
from conformance.suites._evaluations import EVALUATIONS_AFTER_A_CRASH, evaluations_after_a_crash
from conformance.suites._precompile_bodies import builder_ranks
from conformance.suites._precompile_models import ModelSpec
from conformance.suites.test_collectives import async_completion_problem
from tests import forked_commands


def test_is_completed_right_after_wait_is_required_only_where_wait_blocks_the_host():
    raced = {"completed": False, "completed_after_sync": True}  # NCCL: the host ran ahead of the device
    assert async_completion_problem(0, raced, wait_blocks_host=True) == "rank 0: is_completed() is False after wait()"
    assert async_completion_problem(0, raced, wait_blocks_host=False) is None
    never = {"completed": False, "completed_after_sync": False}
    assert async_completion_problem(1, never, wait_blocks_host=False) == (
        "rank 1: is_completed() is False even after the device synchronized (wait() is stream-ordered here: "
        "semantics.wait_blocks_host is false)")


def test_a_watchdog_teardown_is_not_evaluated_again():
    assert evaluations_after_a_crash(Semantics()) == EVALUATIONS_AFTER_A_CRASH > 0
    assert evaluations_after_a_crash(Semantics(collective_timeout="aborts_process")) == 0


def _ctx(rank: int, device) -> RankContext:
    return RankContext(rank=rank, world_size=4, device=device, backend="nccl", descriptor="cuda", shared_dir="/x")


def test_precompile_artifacts_are_per_device_index_and_built_by_the_first_rank_on_each():
    spec = ModelSpec(name="mlp", build=None, example=None, dynamic_batch=False)
    assert spec.key(_ctx(0, torch.device("cpu"))) == "mlp"
    assert [spec.key(_ctx(r, torch.device("cuda", r % 2))) for r in range(4)] == \
        ["mlp-cuda0", "mlp-cuda1", "mlp-cuda0", "mlp-cuda1"]
    assert builder_ranks(["cpu", "cpu"]) == {0}
    assert builder_ranks(["cuda:0", "cuda:1", "cuda:0", "cuda:1"]) == {0, 1}  # node 1 loads node 0's builds


def test_cpu_ranks_under_nccl_semantics_skip_tag_matching_and_expect_a_teardown(tmp_path):
    """The same gloo ranks, described as NCCL describes itself: the tag test skips naming the source,
    and a missing rank that gloo answers with a host exception fails, saying the teardown did not come."""
    descriptor = yaml.safe_load((packaged_backends_dir() / "cpu.yaml").read_text())
    descriptor["semantics"] = {"p2p_tags": False, "collective_timeout": "aborts_process",
                               "sources": {"p2p_tags": "https://example.org/nccl-p2p"}}
    (tmp_path / "cpu.yaml").write_text(yaml.safe_dump(descriptor))
    done = forked_commands.run([sys.executable, "-m", "conformance", "run", "--backends-dir", str(tmp_path),
                                "--suite", "p2p", "--suite", "process_groups", "--report", "r.json", "--",
                                "-k", "test_isend_irecv_tags and 3 or test_missing_rank and skip"],
                               cwd=tmp_path, timeout=600)
    report = validate_report(json.loads((tmp_path / "r.json").read_text()))
    by_name = {t.nodeid.rsplit("::", 1)[1]: t for t in report.tests}
    assert sorted(by_name) == ["test_isend_irecv_tags[3]", "test_missing_rank[skip]"], done.stdout[-3000:]
    tags, missing = by_name["test_isend_irecv_tags[3]"], by_name["test_missing_rank[skip]"]
    assert tags.outcome == "skipped" and tags.message == (
        "cpu matches point-to-point messages by posting order, not by tag (semantics.p2p_tags: false; "
        "https://example.org/nccl-p2p)")
    assert missing.outcome == "failed" and (
        "cpu declares semantics.collective_timeout: aborts_process, but the ranks left waiting were not torn down: "
        "they raised on the host: rank 0: ") in missing.message, missing.message
    assert done.returncode == 1


def test_pending_work_must_be_failed_by_the_ending_only_where_the_descriptor_says_so():
    from conformance.suites.test_process_groups import pending_work_problems

    fresh = torch.full((3,), 3.0)
    left = {"wait": "RuntimeError: Operation timed out!", "wait_seconds": 2.0, "end": None, "end_seconds": 0.01,
            "completed_after_end": False, "fresh": fresh}
    records = [left, {"fresh": fresh}]
    assert pending_work_problems(records, "abort", Semantics()) == []  # gloo: the work is left to its timeout
    assert pending_work_problems(records, "abort", Semantics(ending_fails_pending_work=True)) == [
        "rank 0: the pending all_reduce is not completed after group.abort(), although the descriptor declares "
        "semantics.ending_fails_pending_work"]
    assert pending_work_problems([{**left, "completed_after_end": True}, {"fresh": fresh}], "abort",
                                 Semantics(ending_fails_pending_work=True)) == []


def test_a_nan_check_variable_must_be_an_environment_variable_name_and_cpu_declares_none(tmp_path):
    from conformance.descriptors import DescriptorError, load_descriptor

    assert load_descriptor(packaged_backends_dir() / "cpu.yaml").semantics.nan_check is None
    assert load_descriptor(packaged_backends_dir() / "cuda.yaml").semantics.nan_check == "TORCH_NCCL_NAN_CHECK"
    descriptor = yaml.safe_load((packaged_backends_dir() / "cpu.yaml").read_text())
    descriptor["semantics"] = {"nan_check": "torch nccl nan check=1"}
    (tmp_path / "cpu.yaml").write_text(yaml.safe_dump(descriptor))
    with pytest.raises(DescriptorError, match=r"(?s)cpu.yaml: invalid backend descriptor:.*semantics.nan_check: "
                                              r"'torch nccl nan check=1' is not an environment variable's name: "
                                              r"give the variable alone, in capitals"):
        load_descriptor(tmp_path / "cpu.yaml")
