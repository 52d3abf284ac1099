"""Backend descriptors: the packaged files, validation errors, overrides, detection and probes."""

from __future__ import annotations

import shutil
import textwrap
from pathlib import Path

import pytest
import yaml

from conformance.capabilities import probe_capabilities
from conformance.descriptors import (CAPABILITIES, DescriptorError, load_descriptor, load_descriptors,
                                     packaged_backends_dir, torch_in_bound)
from conformance.detect import (absent_accelerator_note, build_accelerator, detect_backend, local_accelerator,
                                resolve_backend)

BACKENDS = packaged_backends_dir()
VALID = {
    "name": "mine",
    "device_type": "cpu",
    "detect": {"accelerator": "none"},
    "distributed_backend": "gloo",
    "capabilities": {c: False for c in CAPABILITIES},
}


def write(directory: Path, name: str, data) -> Path:
    path = directory / f"{name}.yaml"
    path.write_text(data if isinstance(data, str) else yaml.safe_dump(data))
    return path


def test_packaged_descriptors_cover_the_main_backends():
    descriptors = load_descriptors()
    assert {"cpu", "cuda", "rocm", "xpu"} <= set(descriptors)
    assert descriptors["rocm"].detect.torch_version == {"hip": True}
    assert descriptors["cuda"].detect.torch_version == {"hip": False}
    assert descriptors["cpu"].distributed_backend == "gloo"
    assert descriptors["xpu"].distributed_backend == "xccl"


def test_tolerances_are_read_per_dtype_and_absent_by_default(tmp_path):
    path = write(tmp_path, "mine", {**VALID, "tolerances": {"float32": {"rtol": 1e-5, "atol": 1e-6}}})
    descriptor = load_descriptor(path)
    assert (descriptor.tolerances["float32"].rtol, descriptor.tolerances["float32"].atol) == (1e-5, 1e-6)
    assert "bfloat16" not in descriptor.tolerances
    assert load_descriptor(write(tmp_path, "plain", {**VALID, "name": "plain"})).tolerances == {}


def test_privateuse1_template_is_a_valid_descriptor(tmp_path):
    shutil.copy(BACKENDS / "privateuse1.yaml.template", tmp_path / "npu.yaml")
    descriptor = load_descriptor(tmp_path / "npu.yaml")
    assert descriptor.setup_modules == ("torch_npu",)
    assert descriptor.distributed_backend == "hccl"
    assert descriptor.relay_label == "ciflow/crcr/npu"


@pytest.mark.parametrize("change, expected", [
    ({"capabilities": {**VALID["capabilities"], "warp_drive": True}},
     "capabilities: unknown capability 'warp_drive'; allowed: collectives, dtensor"),
    ({"capabilities": {"collectives": True}},
     "capability 'dtensor', 'compile', 'aot_compile', 'symmetric_memory', 'put_signal', 'bf16', 'parallelisms' not "
     "declared"),
    ({"tolerances": {"float16": {"rtol": 0.1, "atol": 0.1}}},
     "tolerances: unknown dtype 'float16'; allowed: float32, bfloat16"),
    ({"tolerances": {"float32": {"rtol": -1, "atol": 0}}},
     "tolerances.float32.rtol: Input should be greater than or equal to 0"),
    ({"world_size": 0}, "world_size: Input should be greater than or equal to 1"),
    ({"colour": "red"}, "colour: Extra inputs are not permitted -> remove 'colour'"),
    ({"detect": {}}, "detect.accelerator: Field required -> add 'detect.accelerator'"),
    ({"known_failures": [{"match": "test_x", "reason": "r", "link": "l"}]},
     "known_failures.0.match: pattern 'test_x' must look like '<suite>::<test name>'"),
    ({"known_failures": [{"match": "s::t", "reason": "r", "link": "l", "mode": "maybe"}]},
     "known_failures.0.mode: Input should be 'xfail' or 'skip'"),
    ({"known_failures": [{"match": "s::t", "reason": "r", "link": "l", "min_world_size": 0}]},
     "known_failures.0.min_world_size: Input should be greater than or equal to 1"),
    ({"known_failures": [{"match": "s::t", "reason": "r", "link": "l", "torch": "before 2.15"}]},
     "known_failures.0.torch: 'before 2.15' is not a PEP 440 version specifier -> write e.g. \"<2.15\""),
    ({"known_failures": [{"match": "s::t", "reason": "r", "link": "l", "torch": ""}]},
     "known_failures.0.torch: '' is empty -> remove 'torch' to apply the entry to every version"),
    ({"relay": {"repository": "not a repo"}}, "relay.repository: 'not a repo' is not 'owner/name'"),
    ({"relay": {"repository": "o/r", "level": "L5"}}, "relay.level: Input should be 'L1', 'L2', 'L3' or 'L4'"),
    ({"capabilities": {**VALID["capabilities"], "put_signal": True}},
     "put_signal is true but symmetric_memory is false"),
])
def test_invalid_descriptor_names_file_field_and_fix(tmp_path, change, expected):
    path = write(tmp_path, "mine", {**VALID, **change})
    with pytest.raises(DescriptorError) as info:
        load_descriptor(path)
    assert str(path) in str(info.value)
    assert expected in str(info.value)


def test_name_must_match_file(tmp_path):
    path = write(tmp_path, "other", VALID)
    with pytest.raises(DescriptorError, match="name: 'mine' does not match the file name -> rename the file"):
        load_descriptor(path)


def test_broken_yaml_and_non_mapping(tmp_path):
    with pytest.raises(DescriptorError, match="not valid YAML"):
        load_descriptor(write(tmp_path, "a", "name: [unclosed"))
    with pytest.raises(DescriptorError, match="a descriptor is a YAML mapping, got list"):
        load_descriptor(write(tmp_path, "b", "- 1\n- 2\n"))


def test_user_directory_overrides_packaged(tmp_path, monkeypatch):
    write(tmp_path, "cpu", {**VALID, "name": "cpu", "world_size": 3})
    write(tmp_path, "mine", VALID)
    descriptors = load_descriptors(tmp_path)
    assert descriptors["cpu"].world_size == 3 and descriptors["cpu"].source == str(tmp_path / "cpu.yaml")
    assert "mine" in descriptors and "cuda" in descriptors
    monkeypatch.setenv("CONFORMANCE_BACKENDS_DIR", str(tmp_path))
    assert load_descriptors()["cpu"].world_size == 3
    monkeypatch.setenv("CONFORMANCE_BACKENDS_DIR", str(tmp_path / "missing"))
    with pytest.raises(DescriptorError, match="CONFORMANCE_BACKENDS_DIR: .* is not a directory"):
        load_descriptors()


def test_known_failure_patterns_treat_brackets_literally():
    descriptor = load_descriptors()["cpu"]
    assert descriptor.known_failure_for("collectives::test_all_reduce[PREMUL_SUM-float32]") is not None
    assert descriptor.known_failure_for("collectives::test_all_reduce[AVG-int64]") is not None
    assert descriptor.known_failure_for("collectives::test_all_reduce[AVG-float32]") is None
    assert descriptor.known_failure_for("collectives::test_all_reduce[S]") is None


def test_a_known_failure_that_needs_several_ranks_applies_only_at_that_world_size(tmp_path):
    entry = {"match": "collectives::test_all_reduce_nonfinite[*-MIN]", "reason": "r", "link": "l",
             "min_world_size": 2}
    descriptor = load_descriptor(write(tmp_path, "mine", {**VALID, "known_failures": [entry]}))
    test_id = "collectives::test_all_reduce_nonfinite[float32-MIN]"
    assert descriptor.known_failure_for(test_id, world_size=1) is None
    assert descriptor.known_failure_for(test_id, world_size=2).min_world_size == 2
    assert descriptor.known_failure_for(test_id, world_size=4) is not None
    assert descriptor.known_failure_for(test_id) is not None  # no run size: every entry that matches


# Each form a torch version takes: a release, a local build, a release candidate, a nightly, a build from main.
@pytest.mark.parametrize("version, bound, within", [
    ("2.13.0", "<2.15", True),
    ("2.15.0", "<2.15", False),
    ("2.15.0", ">=2.15", True),
    ("2.14.1+cu130", "<2.15", True),          # the local label is ignored
    ("2.14.1+cu130", "==2.14.1", True),
    ("2.15.0+cpu", ">=2.15,<2.16", True),
    ("2.15.0rc3", "<2.15", True),             # a release candidate of 2.15 does not have all of 2.15 yet
    ("2.15.0rc3", ">=2.15", False),
    ("2.15.0rc3", ">=2.14", True),
    ("2.16.0a0+git1234", "<2.16", True),      # a build from main: after 2.15, before 2.16
    ("2.16.0a0+git1234", ">=2.15", True),
    ("2.16.0a0+git1234", ">=2.15,<2.16", True),
    ("2.16.0a0+git1234", "<=2.15", False),
    ("2.16.0a0+git1234", ">=2.16", False),
    ("2.16.0a0+git1234", "<2.16.0a0", False),  # how to exclude every main build of 2.16
    ("2.16.0.dev20260101+cpu", "<2.16", True),  # a nightly: likewise
    ("2.16.0.dev20260101+cpu", "<2.16.0a0", True),
    ("2.16.0.dev20260101+cpu", "<2.16.0.dev20260101", False),
    ("2.16.0", "<2.16", False),
    ("2.16.0", "!=2.16.*", False),
])
def test_torch_bounds_compare_main_local_and_pre_release_builds(version, bound, within):
    assert torch_in_bound(bound, version) is within


def test_a_known_failure_bounded_by_torch_version_applies_only_within_its_bound(tmp_path):
    fixed = {"match": "dtensor::test_x[*]", "reason": "fixed in 2.15", "link": "l", "torch": "<2.15"}
    later = {"match": "dtensor::test_x[b]", "reason": "broke again in 2.16", "link": "l", "torch": ">=2.16.0a0"}
    descriptor = load_descriptor(write(tmp_path, "mine", {**VALID, "known_failures": [fixed, later]}))
    assert descriptor.known_failure_for("dtensor::test_x[a]", torch_version="2.14.1+cu130").reason == "fixed in 2.15"
    assert descriptor.known_failure_for("dtensor::test_x[a]", torch_version="2.15.0") is None
    # The first entry out of its bound, the next one that matches applies.
    assert descriptor.known_failure_for("dtensor::test_x[b]", torch_version="2.16.0a0+git1234").reason == \
        "broke again in 2.16"
    assert descriptor.known_failure_for("dtensor::test_x[b]", torch_version="2.15.0") is None
    assert descriptor.known_failure_for("dtensor::test_x[a]").reason == "fixed in 2.15"  # no version: any


def test_detection_on_this_cpu_machine_picks_cpu():
    assert detect_backend(load_descriptors()).name == "cpu"
    assert resolve_backend("auto", load_descriptors()).name == "cpu"


@pytest.mark.skipif(build_accelerator() == "none" or local_accelerator() != "none",
                    reason="needs a torch built for an accelerator on a machine without one (e.g. the default wheel on CPU)")
def test_an_accelerator_build_without_its_devices_runs_cpu_and_says_so():
    import torch

    from conformance.session import ConformanceSession, RunOptions

    session = ConformanceSession.create(RunOptions())
    assert session.descriptor.name == "cpu"
    assert session.header_lines()[1] == (
        f"conformance: torch {torch.__version__} is a {build_accelerator()} build, but this machine has no "
        f"{build_accelerator()} device: detection follows the devices present, so it runs cpu over gloo")


def test_detection_on_a_cpu_build_says_nothing_about_devices():
    if build_accelerator() != "none":
        pytest.skip(f"torch is built for {build_accelerator()}")
    from conformance.session import ConformanceSession, RunOptions

    assert ConformanceSession.create(RunOptions()).detection_note is None
    assert absent_accelerator_note() is None


def test_unknown_backend_and_missing_setup_module(tmp_path):
    with pytest.raises(DescriptorError, match="unknown backend 'tpu'; known: cpu, cuda, rocm, xpu or auto"):
        resolve_backend("tpu", load_descriptors())
    write(tmp_path, "oot", {**VALID, "name": "oot", "setup_modules": ["no_such_vendor_module"]})
    with pytest.raises(DescriptorError, match="setup_modules: cannot import 'no_such_vendor_module'"):
        resolve_backend("oot", load_descriptors(tmp_path))


def test_registered_out_of_tree_backend_is_probed_available(tmp_path):
    write(tmp_path, "oot", {**VALID, "name": "oot", "distributed_backend": "conformance_loopback",
                            "setup_modules": ["tests.conformance.oot_backend"]})
    descriptor = resolve_backend("oot", load_descriptors(tmp_path))
    assert probe_capabilities(descriptor).probes["collectives"].available


def test_unregistered_backend_fails_the_probe_with_the_fix(tmp_path):
    write(tmp_path, "oot", {**VALID, "name": "oot", "distributed_backend": "nosuchccl"})
    probe = probe_capabilities(load_descriptors(tmp_path)["oot"]).probes["collectives"]
    assert not probe.available
    assert "distributed backend 'nosuchccl' is not registered (import the module" in probe.reason
    parallelisms = probe_capabilities(load_descriptors(tmp_path)["oot"]).probes["parallelisms"]
    assert not parallelisms.available
    assert parallelisms.reason.startswith("needs collectives: distributed backend 'nosuchccl' is not registered")


def test_probes_on_cpu_record_torch_reasons_verbatim():
    report = probe_capabilities(load_descriptors()["cpu"])
    assert report.probes["symmetric_memory"].reason == "SymmetricMemory does not support device type cpu"
    assert report.probes["put_signal"].reason.startswith("needs symmetric memory: SymmetricMemory does not")
    assert report.probes["collectives"].available and report.probes["bf16"].available
    assert report.probes["parallelisms"].available
    assert report.mismatches() == []


def test_declared_but_not_probed_is_a_mismatch_with_the_probe_reason(tmp_path):
    caps = {c: True for c in CAPABILITIES}
    write(tmp_path, "cpu", {**VALID, "name": "cpu", "capabilities": caps})
    report = probe_capabilities(load_descriptors(tmp_path)["cpu"])
    assert "symmetric_memory: declared true but the probe fails: SymmetricMemory does not support device type cpu" \
        in report.mismatches()
    ok, why = report.usable("symmetric_memory")
    assert not ok and why == "symmetric_memory unavailable on cpu: SymmetricMemory does not support device type cpu"


def test_declared_false_but_available_is_reported(tmp_path):
    write(tmp_path, "cpu", {**VALID, "name": "cpu"})
    report = probe_capabilities(load_descriptors(tmp_path)["cpu"])
    assert "collectives: declared false but the probe finds it available" in report.mismatches()
    ok, why = report.usable("collectives")
    assert not ok and "declares collectives: false" in why and "consider declaring it" in why


def test_descriptor_module_is_torch_free():
    import subprocess
    import sys

    code = textwrap.dedent("""
        import sys
        import conformance, conformance.descriptors, conformance.report
        conformance.descriptors.load_descriptors()
        assert "torch" not in sys.modules, sorted(m for m in sys.modules if m.startswith("torch"))
    """)
    subprocess.run([sys.executable, "-c", code], check=True)
