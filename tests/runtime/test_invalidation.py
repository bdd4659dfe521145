"""Every part of the key invalidates: include closure, compiler, options, signature."""

import os

import numpy as np
import pytest

from kernforge import runtime
from rt_sources import VALUE


def run_value(module) -> int:
    out = np.full(1, -999, np.int64)
    fn = module.get_function("kf_value", argtypes=("ptr", "ptr"))
    assert fn(runtime.pack_pointers([out]), runtime.pack_dims([0])) == 0
    return int(out[0])


@pytest.fixture
def inc(tmp_path):
    d = tmp_path / "inc"
    (d / "kf_test" / "detail").mkdir(parents=True)
    return d


def fresh_process_view():
    """What a new process sees: no memory tier, no stat cache."""
    runtime.reset()


def test_nested_header_change_rebuilds_in_process_and_across_processes(inc, wrapper):
    (inc / "kf_test" / "value.h").write_text('#include "detail/inner.h"\n#define KF_VALUE (INNER + 1)\n')
    inner = inc / "kf_test" / "detail" / "inner.h"
    inner.write_text("#define INNER 10\n")
    assert run_value(runtime.compile("v", VALUE, include_dirs=(inc,))) == 11
    inner.write_text("#define INNER 20\n")
    module = runtime.compile("v", VALUE, include_dirs=(inc,))  # same process: memory tier must notice
    assert run_value(module) == 21
    assert "detail/inner.h changed" in module.miss_reason
    assert wrapper.compiles == 2
    fresh_process_view()
    assert run_value(runtime.compile("v", VALUE, include_dirs=(inc,))) == 21
    inner.write_text("#define INNER 10\n")  # back to the first version: its entry is reused
    fresh_process_view()
    module = runtime.compile("v", VALUE, include_dirs=(inc,))
    assert run_value(module) == 11 and module.miss_reason is None
    assert wrapper.compiles == 2


def test_header_reached_only_through_a_macro(inc, wrapper):
    (inc / "kf_test" / "value.h").write_text("#define PICK <kf_test/picked.h>\n#include PICK\n")
    picked = inc / "kf_test" / "picked.h"
    picked.write_text("#define KF_VALUE 1\n")
    assert run_value(runtime.compile("m", VALUE, include_dirs=(inc,))) == 1
    picked.write_text("#define KF_VALUE 2\n")
    fresh_process_view()
    assert run_value(runtime.compile("m", VALUE, include_dirs=(inc,))) == 2
    assert wrapper.compiles == 2


def test_header_outside_every_include_dir(inc, tmp_path, wrapper):
    outside = tmp_path / "elsewhere" / "abs.h"
    outside.parent.mkdir()
    outside.write_text("#define KF_OUT 5\n")
    (inc / "kf_test" / "value.h").write_text(f'#include "{outside}"\n#define KF_VALUE KF_OUT\n')
    module = runtime.compile("o", VALUE, include_dirs=(inc,))
    assert run_value(module) == 5
    assert {"anchor": "abs", "path": str(outside)} in [
        {k: r[k] for k in ("anchor", "path")} for r in module.manifest["closure"]]
    outside.write_text("#define KF_OUT 6\n")
    assert run_value(runtime.compile("o", VALUE, include_dirs=(inc,))) == 6
    # a forced include through an option is tracked the same way
    forced = tmp_path / "elsewhere" / "forced.h"
    forced.write_text("#define KF_FORCED 40\n")
    src = VALUE.replace("KF_VALUE;", "KF_VALUE + KF_FORCED;")
    assert run_value(runtime.compile("o", src, include_dirs=(inc,), options=("-include", str(forced)))) == 46
    forced.write_text("#define KF_FORCED 50\n")
    fresh_process_view()
    assert run_value(runtime.compile("o", src, include_dirs=(inc,), options=("-include", str(forced)))) == 56


def test_new_header_shadowing_a_later_include_dir(tmp_path, wrapper):
    first, second = tmp_path / "first", tmp_path / "second"
    (first / "kf_test").mkdir(parents=True)
    (second / "kf_test").mkdir(parents=True)
    (second / "kf_test" / "value.h").write_text("#define KF_VALUE 2\n")
    assert run_value(runtime.compile("s", VALUE, include_dirs=(first, second))) == 2
    (first / "kf_test" / "value.h").write_text("#define KF_VALUE 1\n")
    module = runtime.compile("s", VALUE, include_dirs=(first, second))
    assert run_value(module) == 1 and "shadowed" in module.miss_reason


def test_two_installs_share_entries(tmp_path, wrapper):
    for name in ("venv_a", "venv_b"):
        (tmp_path / name / "kf_test").mkdir(parents=True)
        (tmp_path / name / "kf_test" / "value.h").write_text("#define KF_VALUE 7\n")
    a = runtime.compile_without_load("i", VALUE, include_dirs=(tmp_path / "venv_a",))
    fresh_process_view()
    b = runtime.compile_without_load("i", VALUE, include_dirs=(tmp_path / "venv_b",))
    assert a.key == b.key and b.miss_reason is None and wrapper.compiles == 1


def test_changed_option_and_signature_miss_with_reason(inc, wrapper, monkeypatch):
    (inc / "kf_test" / "value.h").write_text("#ifdef BIG\n#define KF_VALUE 100\n#else\n#define KF_VALUE 1\n#endif\n")
    assert run_value(runtime.compile("k", VALUE, include_dirs=(inc,))) == 1
    module = runtime.compile("k", VALUE, include_dirs=(inc,), options=("-DBIG",))
    assert run_value(module) == 100
    assert module.miss_reason.startswith("changed since the last entry") and "options" in module.miss_reason
    module = runtime.compile("k", VALUE, include_dirs=(inc,), options=("-DBIG",), dependency_signature="cutlass-4.1")
    assert "signature" in module.miss_reason and wrapper.compiles == 3
    module = runtime.compile("k", VALUE.replace("KF_VALUE;", "KF_VALUE + 1;"), include_dirs=(inc,))
    assert "source" in module.miss_reason and run_value(module) == 2


def test_compiler_upgrade_through_wrapper_script(inc, wrapper, capfd, monkeypatch):
    (inc / "kf_test" / "value.h").write_text("#define KF_VALUE 3\n")
    first = runtime.compile_without_load("c", VALUE, include_dirs=(inc,))
    fresh_process_view()
    assert runtime.compile_without_load("c", VALUE, include_dirs=(inc,)).miss_reason is None
    wrapper.write(version="g++ (kernforge fake upgrade) 99.1.0")
    monkeypatch.setenv("KERNFORGE_JIT_VERBOSE", "1")
    fresh_process_view()
    upgraded = runtime.compile_without_load("c", VALUE, include_dirs=(inc,))
    assert upgraded.key != first.key and wrapper.compiles == 2
    assert "compiler.version" in upgraded.miss_reason and "99.1.0" in upgraded.miss_reason
    assert "compiler.version" in capfd.readouterr().err


def test_native_arch_changes_the_key(wrapper):
    a = runtime.compile_without_load("a", VALUE.replace('#include "kf_test/value.h"', "#define KF_VALUE 1"))
    b = runtime.compile_without_load("a", VALUE.replace('#include "kf_test/value.h"', "#define KF_VALUE 1"),
                                     options=("-march=x86-64",))
    assert a.key != b.key
    assert a.manifest["inputs"]["compiler"]["machine"] != b.manifest["inputs"]["compiler"]["machine"]


def test_header_edited_while_compiling_is_not_published_under_the_new_content(inc, wrapper):
    import threading
    import time

    value_h = inc / "kf_test" / "value.h"
    value_h.write_text("#define KF_VALUE 1\n")
    wrapper.write(sleep_after_s=1.0)  # g++ has read value.h; the edit lands before we hash it

    def edit_during_first_compile():
        while wrapper.compiles == 0:
            time.sleep(0.01)
        time.sleep(0.4)
        value_h.write_text("#define KF_VALUE 2\n")

    editor = threading.Thread(target=edit_during_first_compile)
    editor.start()
    module = runtime.compile("race_edit", VALUE, include_dirs=(inc,))
    editor.join()
    assert wrapper.compiles == 2  # the first build was discarded and redone
    assert run_value(module) == 2
    fresh_process_view()
    assert run_value(runtime.compile("race_edit", VALUE, include_dirs=(inc,))) == 2
