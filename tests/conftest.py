"""Shared fixtures of the project's own tests."""

import functools
import os
import subprocess

import pytest

from tests import forked_commands

pytest_plugins = ["pytester"]


def pytest_configure(config):
    config.addinivalue_line("markers", "fresh_interpreter: pytester runs this test's commands in fresh "
                            "interpreters, not forked from the torch-imported server (tests/forked_commands.py)")


@pytest.fixture
def pytester(pytester, request):
    """pytester, its subprocess runs (``runpytest_subprocess``) forked from a server that has imported torch
    (tests/forked_commands.py: about 2 s of CPU less each) where the fork is what a fresh interpreter would
    be. A test that must prove a fresh one (that nothing imported torch, say) is marked ``fresh_interpreter``."""
    if request.node.get_closest_marker("fresh_interpreter") is None:
        pytester.popen = functools.partial(_forked_popen, pytester)
    return pytester


def _forked_popen(pytester, cmdargs, stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=pytest.Pytester.CLOSE_STDIN, **kw):
    """``Pytester.popen`` (the environment it gives: this one, the working directory leading PYTHONPATH) for
    output to files and no standard input, as ``runpytest_subprocess`` asks; anything else as pytester does."""
    if stdin is not pytest.Pytester.CLOSE_STDIN or kw or not hasattr(stdout, "fileno") or not hasattr(stderr, "fileno"):
        return type(pytester).popen(pytester, cmdargs, stdout=stdout, stderr=stderr, stdin=stdin, **kw)
    env = os.environ.copy()
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [os.getcwd(), env.get("PYTHONPATH", "")]))
    return forked_commands.popen([os.fspath(arg) for arg in cmdargs], env=env, cwd=os.getcwd(),
                                 stdout=stdout.fileno(), stderr=stderr.fileno())
