"""`kernforge generate --profile`: the per-step time table, through the command line."""

import json
import re

import kernforge.engine.generate as engine_generate
from kernforge.cli import main
from kernforge.engine import steps
from tests.engine.test_cli import small_model

LAYERS = 2  # small_model's main layers


def _run(monkeypatch, capsys, *flags):
    monkeypatch.setattr(engine_generate, "smoke_model", small_model)
    code = main(["generate", "Hi", "--max-tokens", "2", *flags])
    out = capsys.readouterr()
    return code, out.out, out.err


def test_profile_table_counts_the_steps_that_ran(monkeypatch, capsys):
    code, out, _ = _run(monkeypatch, capsys, "--profile")
    assert code == 0
    table = out[out.index("step "):]
    rows = {m[0]: m[1:] for m in re.findall(r"^(\w+)\s+(kernel|torch)\s+(\d+)\s+([\d.]+)\s+([\d.]+)%$", table, re.M)}
    # two forwards (the prompt, then the first generated token): one embedding and one head
    # each, one attention per layer each
    assert rows["embedding"][:2] == ("kernel", "2") and rows["hc_head"][1] == "2"
    assert rows["sparse_mla"][1] == str(2 * LAYERS)
    assert all(r[0] == steps.STEPS[name].kind for name, r in rows.items())
    assert set(rows) <= set(steps.STEPS) and {"linear", "moe_reduce", "indexer_topk"} <= set(rows)
    assert abs(sum(float(r[3]) for r in rows.values()) - 100.0) < 0.5
    times = [float(r[2]) for r in rows.values()]
    assert times == sorted(times, reverse=True) and min(times) >= 0
    in_steps, wall = map(float, re.search(r"steps: ([\d.]+) ms of ([\d.]+) ms wall", out).groups())
    assert 0 < in_steps <= wall


def test_profile_json_and_without_profile(monkeypatch, capsys):
    code, out, _ = _run(monkeypatch, capsys, "--profile", "--json")
    record = json.loads(out)
    prof = {r["step"]: r for r in record["profile"]["steps"]}
    assert code == 0 and prof["embedding"]["calls"] == 2 and prof["embedding"]["kind"] == "kernel"
    assert sum(r["total_ms"] for r in prof.values()) <= record["profile"]["wall_ms"]
    code, out, _ = _run(monkeypatch, capsys, "--json")
    assert code == 0 and "profile" not in json.loads(out)


def test_profile_needs_the_engine(monkeypatch, capsys):
    code, out, err = _run(monkeypatch, capsys, "--profile", "--reference")
    assert code == 1 and out == ""
    assert "--profile" in err and "--reference" in err and "Traceback" not in err


def test_record_times_with_the_given_clock():
    """steps.record(clock): every outermost step call is timed by `clock` (a fake one here, one
    tick a read), nested steps belong to the outer one, and nothing is recorded outside."""
    ticks = iter(range(100))

    @steps.step("_test_outer", "kernel", "test only")
    def outer():
        return inner() + 1

    @steps.step("_test_inner", "kernel", "test only")
    def inner():
        return 1

    try:
        with steps.record(lambda: float(next(ticks))) as rec:
            assert outer() == 2 and outer() == 2
        outer()  # not recorded
        assert rec == {"_test_outer": [2, 2.0]}  # two calls, one tick between each start and end
    finally:
        del steps.STEPS["_test_outer"], steps.STEPS["_test_inner"]
