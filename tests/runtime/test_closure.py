"""Depfile parsing and anchored closure records (no compiler involved)."""

import os

import pytest
from hypothesis import given, strategies as st

from kernforge.runtime.closure import Anchors, anchor_path, build_closure, check_closure, parse_depfile
from kernforge.runtime.hashing import StatCache


def test_parse_depfile_continuations_and_escapes():
    text = "kernel.so: kernel.cpp /usr/include/a.h \\\n  /opt/my\\ dir/b.h \\\n /x/c$$d.h\n"
    assert parse_depfile(text) == ["kernel.cpp", "/usr/include/a.h", "/opt/my dir/b.h", "/x/c$d.h"]


def test_parse_depfile_rejects_garbage():
    with pytest.raises(ValueError):
        parse_depfile("this is not a depfile")


@given(st.lists(st.text(alphabet="abcXYZ/_.- ", min_size=1, max_size=12).filter(lambda s: s.strip() == s and s),
                min_size=1, max_size=8))
def test_parse_depfile_roundtrips_escaped_names(names):
    escaped = [n.replace("\\", "\\\\").replace(" ", "\\ ").replace("$", "$$") for n in names]
    assert parse_depfile("out.o: " + " \\\n ".join(escaped) + "\n") == names


def test_anchor_prefers_first_include_dir(tmp_path):
    a, b = tmp_path / "a", tmp_path / "a" / "b"
    anchors = Anchors((str(a), str(b)), ())
    assert anchor_path(str(b / "x.h"), anchors) == ("inc0", "b/x.h")
    assert anchor_path("/elsewhere/y.h", anchors) == ("abs", "/elsewhere/y.h")
    # a sibling whose name merely starts with the dir name is not inside it
    assert anchor_path(str(tmp_path / "ab" / "z.h"), anchors)[0] == "abs"


def test_closure_is_path_independent_across_installs(tmp_path):
    stats = StatCache()
    for install in ("one", "two"):
        (tmp_path / install / "kf").mkdir(parents=True)
        (tmp_path / install / "kf" / "h.h").write_text("#define X 1\n")
    deps_one = [str(tmp_path / "one" / "kf" / "h.h")]
    rec_one = build_closure(deps_one, str(tmp_path / "build"), Anchors((str(tmp_path / "one"),), ()), stats)
    rec_two = build_closure([str(tmp_path / "two" / "kf" / "h.h")], str(tmp_path / "build"),
                            Anchors((str(tmp_path / "two"),), ()), stats)
    assert rec_one == rec_two
    assert check_closure(rec_one, Anchors((str(tmp_path / "two"),), ()), stats) is None


def test_check_closure_reports_change_missing_and_shadowing(tmp_path):
    stats = StatCache()
    first, second = tmp_path / "first", tmp_path / "second"
    first.mkdir(), second.mkdir()
    header = second / "h.h"
    header.write_text("int a;\n")
    anchors = Anchors((str(first), str(second)), ())
    records = build_closure([str(header)], str(tmp_path / "b"), anchors, stats)
    assert records == [{"anchor": "inc1", "path": "h.h", "digest": records[0]["digest"]}]
    assert check_closure(records, anchors, stats) is None
    header.write_text("int b;\n")
    assert "changed" in check_closure(records, anchors, stats)
    header.write_text("int a;\n")
    assert check_closure(records, anchors, stats) is None
    (first / "h.h").write_text("int a;\n")
    assert "shadowed" in check_closure(records, anchors, stats)
    os.unlink(first / "h.h")
    os.unlink(header)
    assert "no longer exists" in check_closure(records, anchors, stats)


def test_build_dir_files_are_excluded(tmp_path):
    build = tmp_path / "build"
    build.mkdir()
    (build / "kernel.cpp").write_text("x")
    assert build_closure(["kernel.cpp", str(build / "kernel.cpp")], str(build), Anchors((), ()), StatCache()) == []


def test_probe_parser_reads_gcc_and_clang_driver_output():
    from kernforge.runtime.compilers.cpu import parse_probe

    gcc = ("Target: x86_64-linux-gnu\ngcc version 12.2.0 (Debian 12.2.0-14+deb12u1) \n"
           " /usr/lib/gcc/x86_64-linux-gnu/12/cc1plus -E -quiet -v - -march=znver3 -mavx2 -mno-avx512f "
           "--param l1-cache-size=32 -mtune=znver3 -O3\n"
           "#include <...> search starts here:\n /usr/include/c++/12\n /usr/include\nEnd of search list.\n")
    got = parse_probe(gcc)
    assert got["version"].startswith("gcc version 12.2.0") and got["target"] == "x86_64-linux-gnu"
    assert got["machine"] == ["-march=znver3", "-mavx2", "-mno-avx512f", "--param=l1-cache-size=32", "-mtune=znver3"]
    assert got["search"] == ["/usr/include/c++/12", "/usr/include"]
    clang = ("Debian clang version 14.0.6\nTarget: x86_64-pc-linux-gnu\n"
             ' "/usr/lib/llvm-14/bin/clang" "-cc1" "-triple" "x86_64-pc-linux-gnu" "-E" "-target-cpu" "znver3" '
             '"-target-feature" "+avx2" "-target-feature" "-avx512f" "-O3"\n'
             "#include <...> search starts here:\n /usr/lib/llvm-14/lib/clang/14.0.6/include\nEnd of search list.\n")
    got = parse_probe(clang)
    assert got["version"] == "Debian clang version 14.0.6"
    assert got["machine"] == ["-triple=x86_64-pc-linux-gnu", "-target-cpu=znver3", "-target-feature=+avx2",
                              "-target-feature=-avx512f"]
