"""Helpers for the CLI tests: run ``kernforge.cli.main`` in-process, or the real entry point."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture
def cli(capsys):
    """``cli(*argv) -> (exit code, stdout, stderr)`` through :func:`kernforge.cli.main`."""
    from kernforge import cli as kcli

    def run(*argv):
        try:
            code = kcli.main(list(argv))
        except SystemExit as e:  # argparse: --help, usage errors
            code = e.code
        out = capsys.readouterr()
        return code, out.out, out.err

    return run


def run_process(*argv, **kw) -> subprocess.CompletedProcess:
    """``python -m kernforge.cli ARGV`` as a user runs it (stdin not a terminal)."""
    env = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""))
    return subprocess.run([sys.executable, "-m", "kernforge.cli", *argv], capture_output=True, text=True,
                          stdin=subprocess.DEVNULL, env=env, cwd=REPO, **kw)


def assert_one_line_error(code, err, *fragments):
    """A user error: exit 1, exactly one line on stderr naming ``fragments``, no traceback."""
    assert code == 1, err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert "Traceback" not in err
    for f in fragments:
        assert f in lines[0], lines[0]
