"""The environment ``relay.testing.local_trial`` gives a job under act means to pip what its comments say.

pip reads the variable of a ``--no-*`` option as the value of the option it negates (``PIP_NO_BUILD_ISOLATION=0``
turns build isolation off), so a variable written the intuitive way does nothing. These tests read the options
back through pip's own parser, as the job's ``pip install`` does.
"""

from __future__ import annotations

import pytest

from relay.testing.local_trial import offline_job_env


@pytest.fixture
def install_options(monkeypatch, tmp_path):
    from pip._internal.commands import create_command  # pip's parser, which reads PIP_* as the job's pip does

    for key, value in offline_job_env(tmp_path).items():
        monkeypatch.setenv(key, value)
    options, _ = create_command("install").parse_args([])
    return options


def test_pip_in_the_job_uses_no_index_and_no_build_isolation(install_options):
    assert install_options.no_index
    assert not install_options.build_isolation


def test_pip_in_the_job_does_not_check_the_callers_whole_environment_for_conflicts(install_options):
    assert not install_options.warn_about_conflicts
