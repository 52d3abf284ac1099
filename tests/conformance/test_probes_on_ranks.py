"""The controllers never touch a device: the device-touching probes (symmetric memory, bf16) run on a
rank, with the rank's settings, and the session reads rank 0's answers."""

from __future__ import annotations

import yaml

from conformance.descriptors import packaged_backends_dir
from conformance.session import ConformanceSession, RunOptions


def test_the_device_probes_run_on_a_rank_not_in_the_controller(tmp_path):
    descriptor = yaml.safe_load((packaged_backends_dir() / "cpu.yaml").read_text())
    descriptor["setup_modules"] = ["tests.conformance.rank_only_patch"]  # patches torch in rank processes only
    (tmp_path / "cpu.yaml").write_text(yaml.safe_dump(descriptor))
    session = ConformanceSession.create(RunOptions(backend="cpu", backends_dir=str(tmp_path)))
    try:
        probe = session.capabilities.probes["symmetric_memory"]
        assert (probe.available, probe.reason) == (False, "probed on a rank, on device cpu")
        assert session.capabilities.probes["put_signal"].reason == "needs symmetric memory: probed on a rank, on device cpu"
        assert session.capabilities.probes["bf16"].available
        assert session.pools[2].started  # the default pool's ranks answered, as they start
    finally:
        session.close()
