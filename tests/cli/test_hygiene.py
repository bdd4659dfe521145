"""CLI hygiene: one-line user errors (tracebacks only under --debug), help everywhere, progress
only on a terminal, and CUDA on a machine without a GPU explained in one line."""
from __future__ import annotations

import argparse
import io
import os
import re
import subprocess
import sys

import pytest
import torch

import kernforge
from kernforge import cli as kcli
from kernforge.backends import BackendError
from kernforge.kernels import registry
from tests.cli.conftest import REPO, assert_one_line_error, run_process


def test_an_unknown_arch_is_one_line_and_debug_shows_the_traceback(cli):
    code, out, err = cli("emit", "topk_bf16", "--backend", "cuda", "--arch", "sm_95")
    assert_one_line_error(code, err, "kernforge emit:", "unknown CUDA arch 'sm_95'", "sm_90a")
    for argv in (["--debug", "emit", "topk_bf16", "--backend", "cuda", "--arch", "sm_95"],
                 ["emit", "topk_bf16", "--backend", "cuda", "--arch", "sm_95", "--debug"]):
        code, out, err = cli(*argv)
        assert code == 1 and "Traceback" in err and "CudaRenderError" in err


def test_usage_errors_are_one_line_with_exit_code_1(cli):
    for argv, fragment in ((["explode"], "invalid choice: 'explode'"),
                           (["run"], "the following arguments are required: kernel"),
                           (["run", "topk_bf16", "--repeat", "x"], "invalid int value: 'x'"),
                           (["cache", "explode"], "invalid choice")):
        code, out, err = cli(*argv)
        assert_one_line_error(code, err, fragment)


def test_an_unexpected_error_names_its_type_and_points_to_debug(cli, monkeypatch):
    def broken():
        raise ZeroDivisionError("division by zero")

    monkeypatch.setattr(registry, "all_specs", broken)
    code, out, err = cli("list")
    assert_one_line_error(code, err, "ZeroDivisionError: division by zero", "--debug")


def _parsers(parser):
    yield parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                yield from _parsers(sub)


def test_every_option_and_command_has_help_text():
    parser = kcli.build_parser()
    seen = 0
    for p in _parsers(parser):
        for action in p._actions:
            if isinstance(action, argparse._SubParsersAction):
                assert all(a.help for a in action._choices_actions), p.prog
                continue
            seen += 1
            assert action.help, f"{p.prog}: {action.dest} has no help"
    assert seen > 40


def test_tables_have_json(cli):
    for command in ("list", "run", "demo", "build"):
        code, out, err = cli(command, "--help")
        assert code == 0 and "--json" in out, command


@pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU is present")
def test_cuda_without_a_gpu_says_what_works_in_one_line(cli):
    for argv in (["run", "topk_bf16", "--backend", "cuda"], ["run", "topk_bf16", "--backend", "cuda", "--arch", "sm_90a"]):
        code, out, err = cli(*argv)
        assert_one_line_error(code, err, "needs an NVIDIA GPU", "kernforge build", "compile_without_load", "cuda-emu")
        assert "pip install" not in err
    import kernforge.dsl as T

    @T.prim_func
    def copy(x: T.Tensor((4,), "float32"), y: T.Tensor((4,), "float32")):
        with T.Kernel(1, threads=4) as bx:
            for i in T.Parallel(4):
                y[i] = x[i]

    with pytest.raises(BackendError, match="emulate them .backend 'cuda-emu'") as info:
        kernforge.compile(copy, backend="cuda", arch="sm_90a")
    assert "pip" not in str(info.value) and "\n" not in str(info.value)
    code, out, err = cli("demo", "--backends", "cuda")
    assert_one_line_error(code, err, "needs an NVIDIA GPU")


def test_loading_cuda_suggests_the_cuda_extra_only_where_a_gpu_exists(monkeypatch):
    from kernforge.runtime import cuda_module
    from kernforge.runtime.errors import LoadError

    try:
        import cuda.bindings  # noqa: F401
        pytest.skip("cuda-bindings is installed")
    except ImportError:
        pass
    monkeypatch.setattr(cuda_module, "_has_gpu", lambda: False)
    with pytest.raises(LoadError) as info:
        cuda_module._driver()
    assert "no NVIDIA GPU" in str(info.value) and "cuda-emu" in str(info.value) and "pip" not in str(info.value)
    monkeypatch.setattr(cuda_module, "_has_gpu", lambda: True)
    with pytest.raises(LoadError, match=r"pip install 'kernforge\[cuda\]'"):
        cuda_module._driver()


class _Terminal(io.StringIO):
    def isatty(self):
        return True


def test_progress_is_drawn_on_a_terminal_and_nowhere_else():
    tty = _Terminal()
    with kcli._Status(tty) as status:
        status("building k for cuda-emu")
    assert "building k for cuda-emu... 0 s" in tty.getvalue() and tty.getvalue().endswith("\r\x1b[K")
    pipe = io.StringIO()
    with kcli._Status(pipe) as status:
        status("building k for cuda-emu")
    assert pipe.getvalue() == ""


@pytest.mark.skipif(not hasattr(os, "openpty"), reason="needs a pseudo-terminal")
def test_run_on_a_terminal_shows_progress_and_the_first_use_compile(tmp_path):
    """stderr on a pty (a user's terminal): the stages and the one-time compile notice appear
    there, the results stay on stdout; a second run hits the cache and says nothing of compiling."""
    def run_on_pty():
        master, slave = os.openpty()
        env = dict(os.environ, KERNFORGE_CACHE_DIR=str(tmp_path / "cache"),
                   PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""))
        proc = subprocess.Popen([sys.executable, "-m", "kernforge.cli", "run", "topk_bf16", "--backend", "cpu",
                                 "--problem", "small", "--repeat", "1"], stdout=subprocess.PIPE,
                                stderr=slave, stdin=subprocess.DEVNULL, env=env, cwd=REPO)
        os.close(slave)
        err = b""
        while True:
            try:
                chunk = os.read(master, 4096)
            except OSError:  # EIO: the child closed the terminal
                break
            if not chunk:
                break
            err += chunk
        out = proc.stdout.read().decode()
        proc.wait(timeout=300)
        os.close(master)
        return proc.returncode, out, err.decode()

    code, out, err = run_on_pty()
    assert code == 0, err
    assert "building topk_bf16 for cpu (small)" in err and "timing topk_bf16" in err
    assert re.search(r"kernforge: compiling \w*topk_select\w* \(cpu\) on first use; cached in ", err), err
    assert err.count("on first use") == 1
    assert out.startswith("kernel ") and "verified" in out and "\x1b" not in out
    code, out, err = run_on_pty()
    assert code == 0 and "on first use" not in err


def test_errors_from_a_real_process_are_one_line():
    proc = run_process("emit", "topk_bf16", "--backend", "cuda", "--arch", "sm_95")
    assert_one_line_error(proc.returncode, proc.stderr, "unknown CUDA arch 'sm_95'")
    assert proc.stdout == ""
