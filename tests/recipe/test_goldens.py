"""Byte-exact prompt conformance: the vLLM V4/V4.1 goldens shipped in data/goldens and our own
peer-generated cases."""
import hashlib
import json

import pytest

import kernforge.recipe as K

from .conftest import DATA, golden_dir, load_json


def _tools(items):
    return [K.ToolDefinition(t["function"]["name"], t["function"].get("description"),
                             t["function"].get("parameters")) for t in items or ()]


def _conversation(data, **kw):
    """Reference-format input → Conversation, as the goldens' README prescribes."""
    messages = data["messages"] if isinstance(data, dict) else data
    out = []
    for m in messages:
        role, content = m["role"], m.get("content") or ""
        if isinstance(content, list):
            content = "\n\n".join(p["text"] if p["type"] == "text" else "<｜deepseek_image｜>" for p in content)
        if role == "system":
            out.append(K.SystemMessage(content))
        elif role == "user":
            out.append(K.UserMessage(content, task=m.get("task")))
        elif role == "developer":
            out.append(K.DeveloperMessage(content, _tools(m.get("tools"))))
        elif role == "latest_reminder":
            out.append(K.LatestReminderMessage(content))
        elif role == "tool":
            out.append(K.ToolMessage(content, m.get("tool_call_id")))
        else:
            calls = [K.ToolCall(tc.get("id", ""), tc["function"]["name"], tc["function"]["arguments"])
                     for tc in m.get("tool_calls") or ()]
            out.append(K.AssistantMessage(content, m.get("reasoning"), calls))
    tools = _tools(data.get("tools")) if isinstance(data, dict) else []
    return K.Conversation(out, tools=tools, **kw)


CASES = [
    ("v4", 1, K.DeepseekV4Encoding, dict(thinking_mode=True, reasoning_effort="low")),
    ("v4", 3, K.DeepseekV4Encoding, dict(thinking_mode=True, reasoning_effort="low")),
    ("v4", 4, K.DeepseekV4Encoding, dict(thinking_mode=False)),
    ("v4", 5, K.DeepseekV4Encoding, dict(thinking_mode=False)),
    ("v41", 1, K.DeepseekV41Encoding, dict()),
    ("v41", 2, K.DeepseekV41Encoding, dict()),
]


def test_golden_files_match_their_recorded_hashes():
    """The shipped goldens are the files data/goldens/PROVENANCE.md describes, byte for byte,
    and every case below has its input and its golden there."""
    root = golden_dir()
    recorded = {}
    for line in (root / "SHA256SUMS").read_text("ascii").splitlines():
        digest, name = line.split("  ", 1)
        recorded[name] = digest
    assert {f"{folder}/test_{kind}_{n}.{ext}" for folder, n, _, _ in CASES
            for kind, ext in (("input", "json"), ("output", "txt"))} == set(recorded)
    for name, digest in recorded.items():
        assert hashlib.sha256((root / name).read_bytes()).hexdigest() == digest, name


@pytest.mark.parametrize("folder,n,encoding,kw", CASES, ids=[f"{c[0]}-{c[1]}" for c in CASES])
def test_vllm_golden_byte_exact(folder, n, encoding, kw):
    root = golden_dir()
    data = load_json(root / folder / f"test_input_{n}.json")
    golden = (root / folder / f"test_output_{n}.txt").read_bytes().decode("utf-8")
    rendered = encoding().render_conversation(_conversation(data, **kw))
    prompt = rendered.prompt
    # Our renderer, like deepseek-recipe, always appends a generation prompt.
    suffix = "<｜Assistant｜>" + ("<think>" if kw.get("thinking_mode", True) else "</think>")
    if not golden.endswith(suffix):
        assert prompt.endswith(suffix)
        prompt = prompt[: -len(suffix)]
    assert prompt == golden


@pytest.mark.parametrize("folder,n,encoding,kw", CASES, ids=[f"{c[0]}-{c[1]}" for c in CASES])
def test_special_ranges_are_tokens(folder, n, encoding, kw):
    root = golden_dir()
    data = load_json(root / folder / f"test_input_{n}.json")
    r = encoding().render_conversation(_conversation(data, **kw))
    spellings = {t.default_str() for t in K.SpecialToken} | {"<｜action｜>"}
    prev = 0
    for a, b in r.special_ranges:
        assert prev <= a < b
        assert r.prompt[a:b] in spellings
        prev = b
    # Every BOS/EOS/role token in the prompt is marked (user text here holds none).
    for tok in ("<｜User｜>", "<｜Assistant｜>", "<｜end▁of▁sentence｜>"):
        starts = {a for a, b in r.special_ranges if r.prompt[a:b] == tok}
        i, found = r.prompt.find(tok), set()
        while i >= 0:
            found.add(i)
            i = r.prompt.find(tok, i + 1)
        assert starts == found


@pytest.mark.parametrize("case", json.loads((DATA / "peer_prompts.json").read_text("utf-8")),
                         ids=lambda c: c["name"])
def test_own_cases_match_peer_output(case):
    """Request dicts → prompts recorded from deepseek-recipe 0.2.0 (tests/recipe/data)."""
    req = getattr(K, case["api"])(case["body"]).convert(K.ConversionOptions())
    r = req.model_version.encoding().render_conversation(req.conversation)
    assert r.prompt == case["prompt"]
    assert [list(x) for x in r.special_ranges] == case["special_ranges"]
