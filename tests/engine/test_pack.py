"""The AOT kernel pack (kernforge/engine/pack.py, `kernforge engine kernels|build`).

The pack's list must be what the engine really launches: a real tiny forward in a fresh
process records its compile requests, and the static enumeration at the same step sizes
must equal them. Then a pack built for tiny must serve a fresh process as the read-only
shared tier of KERNFORGE_CACHE_DIR with zero compiles, at other batch and step sizes
than the recorded ones, without writing into the pack.
"""

import contextlib
import fcntl
import io
import json
import os
import shutil
import subprocess
import sys

import pytest

from kernforge.cli import main
from kernforge.engine import pack
from kernforge.model import tiny, v4_flash

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture(scope="session")
def tiny_cpu_pack(tmp_path_factory):
    """(pack directory, the JSON that `kernforge engine build --config tiny --backend cpu --json`
    printed): built once per test run, by whichever pytest-xdist worker asks first (the others
    wait on a lock in the run's shared base temp directory, as the JIT cache does), since
    compiling the pack's 89 kernels is most of this module's time and two tests need it."""
    base = tmp_path_factory.getbasetemp()
    root = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base
    out, printed = root / "tiny_cpu_pack", root / "tiny_cpu_pack.json"
    with open(root / "tiny_cpu_pack.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not printed.exists():
            buf = io.StringIO()
            with contextlib.redirect_stdout(buf):
                status = main(["engine", "build", "--config", "tiny", "--backend", "cpu", "-o", str(out),
                               "--jobs", "2", "--json"])
            assert status == 0, buf.getvalue()
            printed.write_text(buf.getvalue())
    return out, json.loads(printed.read_text())


@pytest.mark.slow
def test_static_enumeration_equals_what_a_forward_requests(tiny_cpu_pack, tmp_path, monkeypatch):
    # The recording process serves from the pack (a compile request is recorded when the op asks
    # kernforge.compile, hit or miss), so the forward does not compile the kernels a second time.
    monkeypatch.setenv("KERNFORGE_CACHE_DIR", pack.deployment_env(tiny_cpu_pack[0], tmp_path / "private"))
    recorded = pack.record("tiny", "cpu", prefill=140)
    static = pack.engine_kernels(tiny(), "cpu", tokens=(140, 1))
    assert recorded <= set(static), sorted(recorded - set(static))
    # The static list also holds an expert GEMM at every segment size a step of 140 tokens
    # can give an expert (1..140 rows); this run's routing reached only some of them.
    extra = set(static) - recorded
    assert all(static[s] == {"expert_gemm"} for s in extra), sorted(s for s in extra if static[s] != {"expert_gemm"})
    assert len(extra) <= 8  # block_M 2, 4, 8, 16 for each of the two expert GEMMs
    # every kernel of the pack's full list is a factory the pack can build
    assert {s.kernel for s in static} <= set(pack.FACTORIES)


def test_full_list_covers_every_step_size():
    """The pack holds each GEMM at every bucket its chooser has (decode rows and prefill rows)."""
    everything = set(pack.engine_kernels(tiny(), "cpu"))
    for tokens in ((1,), (7,), (300,), (5000, 2, 1)):
        assert set(pack.engine_kernels(tiny(), "cpu", tokens=tokens)) <= everything
    # the vocabulary projection: every row tile its chooser gives at any step size (1 to 8 x 1024
    # tokens, all of them), not just at the probed ones
    from kernforge.kernels.gemm import config

    c = tiny()
    heads = {s.kwargs["block_M"] for s in everything if s.kernel == "dense_gemm" and s.kwargs["N"] == c.vocab_size}
    want = {config.choose_dense("cpu", c.vocab_size, c.hidden_size, m, a_major="k", b_major="mn", accumulate=False,
                                dtype="float32", out_dtype="float32")["block_M"]
            for m in range(1, c.max_batch_size * c.max_seq_len + 1)}
    assert heads == want and len(want) > 1


def test_v4_flash_list_has_its_shapes():
    rows = pack.list_kernels("v4-flash", "cuda", "sm_90a")
    gemms = {(s.kwargs["N"], s.kwargs["K"]) for s, _ in rows if s.kernel == "dense_gemm"}
    assert (129280, 4096) in gemms and (1024, 4096) in gemms and (4096, 2048) in gemms  # head, wq_a, w2
    topks = {s.kwargs["topk"] for s, _ in rows if s.kernel == "mla_decode_sparse"}
    # window only; window + the indexer's 512 picks; window + every ratio-128 entry (max_seq_len / 128)
    c = v4_flash()
    assert topks == {128, 128 + 512, 128 + c.max_seq_len // 128}
    assert all(s.backend == "cuda" for s, _ in rows)
    assert len(rows) == len(set(s for s, _ in rows))


def test_kernels_cli_lists_the_rows(capsys):
    assert main(["engine", "kernels", "--config", "tiny", "--json"]) == 0
    listed = json.loads(capsys.readouterr().out)
    want = pack.list_kernels("tiny", "cpu")
    assert [(r["kernel"], r["backend"], r["params"], r["steps"]) for r in listed] == \
        [(s.kernel, s.backend, s.kwargs, steps) for s, steps in want]
    assert main(["engine", "kernels", "--config", "tiny"]) == 0
    out = capsys.readouterr().out
    assert out.count("\n") == len(want) + 4 and f"{len(want)} kernels for tiny on cpu" in out


@pytest.mark.parametrize("argv, words", [
    (["kernels", "--config", "v5"], ["config", "v5", "tiny"]),
    (["kernels", "--config", "tiny", "--backend", "tpu"], ["backend", "tpu"]),
    (["kernels", "--config", "tiny", "--backend", "cuda", "--arch", "sm_75"], ["arch", "sm_75", "sm_90a"]),
    (["kernels", "--config", "tiny", "--arch", "sm_90a"], ["--arch", "cuda"]),
    (["kernels", "--config", "tiny", "--dtype", "float16"], ["dtype", "float16"]),
    (["build", "--config", "tiny", "--backend", "rocm", "-o", "x"], ["backend", "rocm"]),
    (["build", "--config", "tiny", "-o", "x"], ["--backend"]),
    (["build", "--config", "tiny", "--backend", "cpu", "-o", "x", "--jobs", "0"], ["jobs", "0"]),
])
def test_bad_requests_are_one_line_errors(capsys, tmp_path, monkeypatch, argv, words):
    monkeypatch.chdir(tmp_path)
    assert main(["engine", *argv]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err and all(w in err for w in words), err
    assert not os.path.exists(tmp_path / "x")  # nothing built


def test_help_texts(capsys):
    for argv in (["engine", "--help"], ["engine", "build", "--help"], ["engine", "kernels", "--help"]):
        with pytest.raises(SystemExit) as e:
            main(argv)
        assert e.value.code == 0
    assert "KERNFORGE_CACHE_DIR" in capsys.readouterr().out


_SERVE = r"""
import json, torch
from kernforge import runtime
from kernforge.engine import Engine
from kernforge.model import random_model, tiny
torch.set_num_threads(1)
eng = Engine(random_model(tiny(), seed=5))
ids = torch.randint(0, 512, (2, 204), generator=torch.Generator().manual_seed(1))
eng.forward(ids[:, :200], 0)
for p in range(200, 203):
    eng.forward(ids[:, p:p + 1], p)
h = eng.forward_hidden(ids[:, :60], 0)
eng.mtp_logits(h, ids[:, 1:61], 0)
print(json.dumps(runtime.stats()))
"""


def _snapshot(root):
    return sorted((os.path.relpath(os.path.join(d, f), root), os.path.getsize(os.path.join(d, f)))
                  for d, _, files in os.walk(root) for f in files)


@pytest.mark.slow
def test_tiny_pack_serves_a_fresh_process_without_compiling(tiny_cpu_pack, tmp_path):
    out, result = tiny_cpu_pack
    listed = pack.list_kernels("tiny", "cpu")
    assert result["kernels"] == len(listed)
    manifest = json.load(open(out / "pack.json"))
    assert manifest["kernels"] == [s.to_json() for s, _ in listed]
    entries = os.listdir(out / "cache")
    assert len(entries) >= len(listed) - 2  # one entry per kernel (kernels sharing a source share one)
    before = _snapshot(out)
    private = tmp_path / "private"
    env = dict(os.environ, KERNFORGE_CACHE_DIR=pack.deployment_env(out, private), PYTHONPATH=REPO)
    proc = subprocess.run([sys.executable, "-c", _SERVE], env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    stats = json.loads(proc.stdout.strip().splitlines()[-1])
    assert stats["compiles"] == 0 and stats["misses"] == 0 and stats["disk_hits"] > 0, stats
    assert _snapshot(out) == before  # the shared tier is only read
    assert not os.path.exists(private / "cache")  # and the private tier got nothing to hold


@pytest.mark.slow
@pytest.mark.nvcc
@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not on PATH")
def test_tiny_sm90a_pack_builds_without_a_gpu(tmp_path):
    result = pack.build("tiny", "cuda", str(tmp_path / "pack"), "sm_90a", jobs=2)
    assert result.kernels == len(pack.list_kernels("tiny", "cuda", "sm_90a")) and result.bytes > 0
    cubins = [f for _, _, files in os.walk(tmp_path / "pack") for f in files if f.endswith(".cubin")]
    assert len(cubins) == result.kernels  # one compiled device binary per kernel of the list
