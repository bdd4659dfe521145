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
