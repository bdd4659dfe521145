"""docs/dsl.md is generated from the DSL's docstrings and cannot go stale; every exported
``T.*`` name has a docstring of its own; ``kernforge`` shows its public names."""
from __future__ import annotations

import importlib.util
import inspect
import subprocess
import sys
from pathlib import Path

import pytest

import kernforge.dsl as T
from kernforge import dtypes

ROOT = Path(__file__).resolve().parents[2]


def _generator():
    spec = importlib.util.spec_from_file_location("gen_dsl_reference", ROOT / "tools" / "gen_dsl_reference.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_dsl_md_is_up_to_date():
    text = _generator().render()
    assert (ROOT / "docs" / "dsl.md").read_text() == text, \
        "docs/dsl.md is stale: run python tools/gen_dsl_reference.py"


def test_reference_has_an_entry_per_exported_name():
    text = _generator().render()
    for name in T.__all__:
        obj = getattr(T, name)
        if isinstance(obj, dtypes.DType):
            assert f"| `T.{name}` (`\"{obj.name}\"`)" in text, name
        else:
            assert f"\n### `T.{name}`\n" in text, name


def test_reference_markdown_is_clean():
    """No reStructuredText left over: roles, unbalanced code spans, literal-block markers."""
    text = _generator().render()
    assert ":func:" not in text and ":class:" not in text and ":attr:" not in text
    prose = [part for i, part in enumerate(text.split("```")) if i % 2 == 0]  # outside fences
    for part in prose:
        for para in part.split("\n\n"):
            assert "``" not in para and para.count("`") % 2 == 0, para


def _own_doc(obj) -> str:
    if isinstance(obj, dtypes.DType):  # dtype values are documented by their class
        return type(obj).__doc__ or ""
    return obj.__doc__ or ""  # a class's __doc__ is its own, never a base class's


@pytest.mark.parametrize("name", T.__all__)
def test_every_exported_name_has_a_real_docstring(name):
    doc = inspect.cleandoc(_own_doc(getattr(T, name)))
    assert len(doc) >= 40 or (isinstance(getattr(T, name), type) and len(doc) >= 30), \
        f"T.{name} needs a docstring that says what it does and why"


def test_check_mode_reports_staleness(tmp_path, monkeypatch):
    gen = _generator()
    stale = tmp_path / "dsl.md"
    stale.write_text("old\n")
    monkeypatch.setattr(gen, "OUT", stale)
    monkeypatch.setattr(gen, "ROOT", tmp_path)
    assert gen.main(["--check"]) == 1
    assert gen.main([]) == 0 and gen.main(["--check"]) == 0
    assert stale.read_text() == gen.render()


# ------------------------------------------------------------------ kernforge's namespace


def test_dir_kernforge_lists_the_public_names():
    code = ("import kernforge; d = dir(kernforge); "
            "assert {'compile', 'CompiledKernel', 'ArgumentError', 'ShapeError', 'BackendError', "
            "'__version__'} <= set(d), d; "
            "import sys; assert 'kernforge.jit' not in sys.modules, 'import kernforge stays lazy'; "
            "ns = {}; exec('from kernforge import *', ns); "
            "assert sorted(k for k in ns if k != '__builtins__') == sorted(kernforge.__all__); "
            "from kernforge.jit import compile as c; assert ns['compile'] is c")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT)


def test_kernforge_all_names_resolve_and_unknown_names_raise():
    import kernforge

    for name in kernforge.__all__:
        assert getattr(kernforge, name) is not None
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        kernforge.nope  # noqa: B018
