"""The disk cache of compiled templates and rewritten kernels (``kernforge.runtime.code_cache``,
``kernforge.backends.templates``): a hit gives exactly what compiling gives, an edit is never
served stale, a corrupt entry is a miss, and the cache tiers behave as the JIT cache's."""
from __future__ import annotations

import os
import random
import subprocess
import sys

import jinja2
import pytest

from kernforge.backends import templates
from kernforge.runtime import code_cache


@pytest.fixture
def roots(tmp_path, monkeypatch):
    """Two private cache roots, the first writable: what ``KERNFORGE_CACHE_DIR=a:b`` gives."""
    rs = (str(tmp_path / "private"), str(tmp_path / "shared"))
    monkeypatch.setattr(code_cache, "roots", lambda: rs)
    return rs


def _entries(root: str) -> list[str]:
    out = []
    for d, _, files in os.walk(root):
        out += [os.path.join(d, f) for f in files]
    return sorted(out)


def _snapshot(root: str) -> dict:
    return {p: open(p, "rb").read() for p in _entries(root)}


# -- the store ----------------------------------------------------------------------------------

def test_keys_frame_their_parts():
    assert code_cache.key("ab", "c") != code_cache.key("a", "bc")
    assert code_cache.key("a", b"b") == code_cache.key("a", "b")
    assert code_cache.key("a") != code_cache.key("a", "")


def test_store_then_load_round_trips(roots):
    payload = os.urandom(1000)
    assert code_cache.load("k", "x" * 64) is None
    assert code_cache.store("k", "x" * 64, payload)
    assert code_cache.load("k", "x" * 64) == payload
    assert code_cache.load("k", "y" * 64) is None and code_cache.load("other", "x" * 64) is None
    assert not os.path.exists(roots[1])  # only the first root is written


CORRUPTIONS = {
    "flipped payload byte": lambda b: b[:-7] + bytes([b[-7] ^ 0x10]) + b[-6:],
    "flipped digest byte": lambda b: b[:10] + bytes([b[10] ^ 1]) + b[11:],
    "truncated": lambda b: b[:len(b) // 2],
    "wrong magic": lambda b: b"KFCODE0\n" + b[8:],
    "empty": lambda b: b"",
}


@pytest.mark.parametrize("corrupt", CORRUPTIONS.values(), ids=CORRUPTIONS.keys())
def test_a_corrupt_entry_is_a_miss_and_is_rewritten(roots, corrupt):
    code = compile("x = 6 * 7", "<t>", "exec")
    assert code_cache.store_code("k", "e" * 64, code)
    path, = _entries(roots[0])
    with open(path, "rb") as f:
        good = f.read()
    with open(path, "wb") as f:
        f.write(corrupt(good))
    assert code_cache.load("k", "e" * 64) is None and code_cache.load_code("k", "e" * 64) is None
    assert code_cache.store_code("k", "e" * 64, code)
    ns: dict = {}
    exec(code_cache.load_code("k", "e" * 64), ns)
    assert ns["x"] == 42


def test_racing_writers_and_readers_see_an_entry_whole_or_not_at_all(roots):
    """Concurrent processes compiling the same template publish the same bytes by rename; a
    reader sees the whole entry or none, and no temp file is left behind."""
    from concurrent.futures import ThreadPoolExecutor

    payload = os.urandom(200_000)

    def work(i):
        if i % 2:
            return code_cache.store("k", "r" * 64, payload)
        return code_cache.load("k", "r" * 64)

    with ThreadPoolExecutor(8) as pool:
        seen = list(pool.map(work, range(64)))
    assert all(s in (None, payload, True) for s in seen)
    assert [os.path.basename(p) for p in _entries(roots[0])] == ["r" * 64 + ".bin"]


def test_a_valid_entry_that_is_not_code_is_a_miss(roots):
    import marshal

    code_cache.store("k", "n" * 64, marshal.dumps([1, 2, 3]))
    assert code_cache.load_code("k", "n" * 64) is None


def test_a_hit_in_a_later_root_writes_nothing(roots, monkeypatch):
    """A read-only shared tier behind a private one: its entries are used as they are."""
    monkeypatch.setattr(code_cache, "roots", lambda: (roots[1],))
    code_cache.store("k", "s" * 64, b"shared")
    monkeypatch.setattr(code_cache, "roots", lambda: roots)
    before = (_snapshot(roots[0]), _snapshot(roots[1]))
    assert code_cache.load("k", "s" * 64) == b"shared"
    assert (_snapshot(roots[0]), _snapshot(roots[1])) == before
    code_cache.store("k", "s" * 64, b"private")  # a later miss publishes in the first root only
    assert code_cache.load("k", "s" * 64) == b"private" and _snapshot(roots[1]) == before[1]


def test_an_unwritable_first_root_costs_the_write_not_the_render(tmp_path, monkeypatch):
    """As a read-only or full disk: the first root cannot be created (a file is in the way; the
    tests run as root, so permissions would not stop a write)."""
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    monkeypatch.setattr(code_cache, "roots", lambda: (str(blocker / "cache"),))
    assert not code_cache.store("k", "u" * 64, b"x")
    (tmp_path / "t").mkdir()
    (tmp_path / "t" / "a.j2").write_text("{{ x }}!")
    assert templates.environment(tmp_path / "t").get_template("a.j2").render(x=3) == "3!"
    assert blocker.read_text() == "not a directory" and os.listdir(tmp_path / "t") == ["a.j2"]


def test_a_misconfigured_cache_dir_disables_the_cache(monkeypatch):
    import kernforge.runtime as rt

    monkeypatch.setenv("KERNFORGE_CACHE_DIR", "a::b")  # an empty element: a ConfigError
    rt.reset()
    try:
        assert code_cache.roots() == ()
        assert not code_cache.store("k", "m" * 64, b"x") and code_cache.load("k", "m" * 64) is None
    finally:
        monkeypatch.undo()
        rt.reset()


# -- templates ----------------------------------------------------------------------------------

TEMPLATES = {
    "main.j2": ("{% import 'macros.j2' as m %}\n{% for r in rows %}\n  {{ m.row(r) }}\n{% endfor %}\n"
                "{% if rows|length > 2 %}many{% else %}few{% endif %}\n{% include 'tail.j2' %}"),
    "macros.j2": "{% macro row(r) %}<{{ r.name }}={{ '%.3f'|format(r.v) }}>{% endmacro %}",
    "tail.j2": "  {# a comment #}\n  end {{ rows|map(attribute='name')|join(',') }}\n",
}
OPTIONS = [dict(), dict(trim_blocks=True, lstrip_blocks=True, keep_trailing_newline=True),
           dict(trim_blocks=True), dict(keep_trailing_newline=True)]


def _reference(directory, options, name, **ctx) -> str:
    """The render of a plain Jinja environment, no bytecode cache."""
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(str(directory)), undefined=jinja2.StrictUndefined,
                             **options)
    return env.get_template(name).render(**ctx)


def _no_compiling(monkeypatch):
    def refuse(self, *a, **k):
        raise AssertionError("compiled a template the cache holds")
    monkeypatch.setattr(jinja2.Environment, "compile", refuse)


@pytest.fixture
def tdir(tmp_path):
    d = tmp_path / "templates"
    d.mkdir()
    for name, text in TEMPLATES.items():
        (d / name).write_text(text)
    return d


def _rows(seed):
    rng = random.Random(seed)
    return [{"name": f"r{i}", "v": rng.uniform(-1e3, 1e3)} for i in range(rng.randint(0, 6))]


@pytest.mark.parametrize("options", OPTIONS, ids=lambda o: ",".join(o) or "defaults")
def test_a_cached_template_renders_as_a_compiled_one(roots, tdir, monkeypatch, options):
    rows = _rows(len(options))
    want = _reference(tdir, options, "main.j2", rows=rows)
    assert templates.environment(tdir, **options).get_template("main.j2").render(rows=rows) == want
    assert len(_entries(roots[0])) == 3  # main, its import and its include
    with monkeypatch.context() as m:  # a fresh process: a new environment, nothing compiles
        _no_compiling(m)
        assert templates.environment(tdir, **options).get_template("main.j2").render(rows=rows) == want


def test_syntax_options_are_part_of_the_key(roots, tdir):
    """``trim_blocks`` changes the compiled code: a cache keyed by name and source alone would
    hand one environment's code to the other."""
    rows = _rows(7)
    for options in OPTIONS + OPTIONS[::-1]:
        got = templates.environment(tdir, **options).get_template("main.j2").render(rows=rows)
        assert got == _reference(tdir, options, "main.j2", rows=rows), options
    assert len({_reference(tdir, o, "main.j2", rows=rows) for o in OPTIONS}) == len(OPTIONS)


def test_an_edited_template_is_compiled_again_not_served_stale(roots, tdir):
    rows = _rows(5)
    assert templates.environment(tdir).get_template("tail.j2").render(rows=rows).strip().startswith("end ")
    # same name, same length, same mtime: only the content tells them apart
    stat = os.stat(tdir / "tail.j2")
    (tdir / "tail.j2").write_text(TEMPLATES["tail.j2"].replace("end", "END"))
    os.utime(tdir / "tail.j2", ns=(stat.st_atime_ns, stat.st_mtime_ns))
    got = templates.environment(tdir).get_template("tail.j2").render(rows=rows)
    assert got == _reference(tdir, {}, "tail.j2", rows=rows) and got.strip().startswith("END ")


def test_a_corrupt_template_entry_is_compiled_again(roots, tdir):
    rows = _rows(3)
    want = _reference(tdir, {}, "main.j2", rows=rows)
    templates.environment(tdir).get_template("main.j2").render(rows=rows)
    for path in _entries(roots[0]):
        with open(path, "r+b") as f:
            f.seek(-5, os.SEEK_END)
            f.write(b"\x00\xff\x00\xff\x00")
    assert templates.environment(tdir).get_template("main.j2").render(rows=rows) == want


def _matmul(M, N, K, BM=32, BN=32, BK=16, dtype="bfloat16"):
    import kernforge.dsl as T

    @T.prim_func
    def matmul(A: T.Tensor((M, K), dtype), B: T.Tensor((K, N), dtype), C: T.Tensor((M, N), "float32")):
        with T.Kernel(T.ceildiv(N, BN), T.ceildiv(M, BM), threads=128) as (bx, by):
            A_s = T.alloc_shared((BM, BK), dtype)
            B_s = T.alloc_shared((BK, BN), dtype)
            C_f = T.alloc_fragment((BM, BN), "float32")
            T.clear(C_f)
            for k in T.Pipelined(T.ceildiv(K, BK), num_stages=2):
                T.copy(A[by * BM, k * BK], A_s)
                T.copy(B[k * BK, bx * BN], B_s)
                T.gemm(A_s, B_s, C_f)
            T.copy(C_f, C[by * BM, bx * BN])
    return matmul


def test_the_backends_render_the_same_source_from_the_cache(roots, monkeypatch):
    """The CPU and CUDA renderers' real templates: no cache, filling it, and reading it in a
    fresh environment give byte-identical kernels."""
    from kernforge import backends
    from kernforge.backends.cpu import renderer as cpu_renderer
    from kernforge.backends.cuda import renderer as cuda_renderer
    from kernforge.codegen.renderer import Target

    kernel = _matmul(M=96, N=64, K=48).ir
    targets = (("cpu", Target("cpu"), cpu_renderer), ("cuda", Target("cuda", "sm_90a"), cuda_renderer))

    def render_all():
        for _, _, mod in targets:
            mod._environment.cache_clear()
        return [backends.get(name).render(kernel, target).source for name, target, _ in targets]

    monkeypatch.setattr(code_cache, "roots", lambda: ())
    uncached = render_all()
    monkeypatch.setattr(code_cache, "roots", lambda: roots)
    try:
        assert render_all() == uncached
        assert _entries(roots[0])
        with monkeypatch.context() as m:
            _no_compiling(m)
            assert render_all() == uncached
    finally:
        for _, _, mod in targets:
            mod._environment.cache_clear()


def test_tracing_at_import_does_not_fix_the_runtimes_cache_dir(tmp_path):
    """Kernel modules trace (and read the code cache) when imported; that must not create the
    default runtime, or a process that sets KERNFORGE_CACHE_DIR after its imports (the pack
    builder's and the tuner's spawned workers) would build into the directory it inherited."""
    first, later = tmp_path / "inherited", tmp_path / "chosen"
    code = ("import os\n"
            "import kernforge.kernels.topk.kernel\n"
            "from kernforge.runtime import code_cache, get_runtime\n"
            f"assert code_cache.roots() == ({str(first)!r},)\n"
            f"os.environ['KERNFORGE_CACHE_DIR'] = {str(later)!r}\n"
            f"assert get_runtime().config.cache_dirs == ({str(later)!r},), get_runtime().config.cache_dirs\n"
            f"assert code_cache.roots() == ({str(later)!r},)\n")
    env = dict(os.environ, KERNFORGE_CACHE_DIR=str(first))
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
