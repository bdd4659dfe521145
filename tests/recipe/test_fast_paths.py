"""The streaming fast paths cannot change output.

The per-token path skips work when a chunk cannot hold a marker (no `<`), and
Chat chunks build their dict and JSON lazily. These tests cut model output at
arbitrary offsets (so every marker gets split at every position somewhere) and
check the result against deepseek-recipe and against feeding the text whole,
and check the lazy chunks against dicts built here from the parser events.
"""
import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import kernforge.recipe as K
from kernforge.recipe.dsml import V4_DSML, V41_DSML
from kernforge.recipe.parser import (ContentDelta, OutputParser, ReasoningDelta, ToolCallDelta, ToolCallStart,
                                     new_tool_call_id)

from .test_parser import D, dsml_block
from .test_stream import TOOLS

P = pytest.importorskip("deepseek_recipe")


def cut(text, offsets):
    """`text` split at the given offsets (sorted, deduplicated, empty pieces dropped)."""
    points = sorted({0, len(text), *(o % (len(text) + 1) for o in offsets)})
    return [text[a:b] for a, b in zip(points, points[1:]) if b > a]


def stream(lib, pieces, model="DeepSeek-V4-Pro", stop=None):
    body = {"model": model, "messages": [{"role": "user", "content": "hi"}], "tools": TOOLS, "stream": True}
    if stop:
        body["stop"] = stop
    req = lib.ChatCompletionRequest(body).convert(lib.ConversionOptions())
    sp = lib.StreamProcessor(lib.ChatCompletionRequest.chunk_generator(req, "c", model), req.parsing_options)
    out = sp.push(lib.InferenceChunk.ready())
    for piece in pieces:
        out += sp.push(lib.InferenceChunk.text(piece, 1))
    out += sp.push(lib.InferenceChunk.finish(lib.InferenceFinishReason.Stop))
    out += sp.finish()
    return out


def accumulated(lib, chunks, model="DeepSeek-V4-Pro"):
    acc = lib.ChatCompletionResponse("c", model, 0, 0, 0)
    for c in chunks:
        acc.accumulate(c)
    choice = json.loads(acc.to_json())["choices"][0]
    msg = choice["message"]
    calls = [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in msg.get("tool_calls") or ()]
    return msg["content"] or "", msg["reasoning_content"], calls, choice["finish_reason"]


LONG = 'def f(x):\n    return x * 2  # "q" \\ <b> é 中\n' * 3
CALLS = [("write_file", [("body", LONG), ("days", 3)]), ("get_weather", [("city", "Oslo")])]


def raw_output(names=V4_DSML):
    return ("Let me think.\n\nStill < thinking\n" + "</think>" + "\n\nThe plan: a<b, c > d.\n\n"
            + dsml_block(CALLS, names))


RAW = raw_output()


@pytest.mark.parametrize("model,names", [("DeepSeek-V4-Pro", V4_DSML), ("DeepSeek-V4.1-Flash", V41_DSML)])
def test_one_cut_at_every_offset_matches_whole_text(model, names):
    """Two pieces, cut at each offset: every marker is split at every position once."""
    raw = raw_output(names)
    whole = accumulated(K, stream(K, [raw], model), model)
    assert whole == accumulated(P, stream(P, [raw], model), model)
    assert whole[2] == [("write_file", {"body": LONG, "days": 3}), ("get_weather", {"city": "Oslo"})]
    for k in range(1, len(raw)):
        assert accumulated(K, stream(K, [raw[:k], raw[k:]], model), model) == whole, k


_fragments = st.lists(st.sampled_from(
    ["a", "bc ", "\n", "\n\n", "<", ">", "<b>", "é", "中", '"', "\\", "{", "</think>", "<｜end▁of▁sentence｜>",
     "</", "<｜", f"<{D}", "STOP", "ST"]), max_size=12).map("".join)
_values = st.one_of(_fragments.filter(lambda s: f"</{D}" not in s), st.integers(-5, 99))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_fragments, _fragments, st.lists(st.tuples(st.sampled_from(["get_weather", "write_file"]),
                                                  st.lists(st.tuples(st.sampled_from(["city", "days", "body"]),
                                                                     _values),
                                                           max_size=3, unique_by=lambda t: t[0])), max_size=2),
       st.lists(st.integers(0, 10 ** 4), max_size=30), st.booleans())
def test_arbitrary_cuts_match_peer_and_whole_text(reasoning, content, calls, offsets, with_stop):
    raw = reasoning + "</think>" + content
    if calls:
        raw += "\n\n" + dsml_block(calls)
    stop = ["STOP"] if with_stop else None
    pieces = cut(raw, offsets)
    ours = accumulated(K, stream(K, pieces, stop=stop))
    assert ours == accumulated(K, stream(K, [raw], stop=stop))
    # Where deepseek-recipe 0.2.0 differs on purpose (docs/recipe.md) it is no reference: it keeps
    # a "\n" before a marker after the start of a marker ("<", "</"...), treats a second `</think>`
    # and EOS as plain text, and drops an unfinished special token at the end of the output.
    peer_differs = (_ends_in_marker_start(reasoning, "</think>")
                    or (calls and _ends_in_marker_start(content, f"<{D}tool_calls>"))
                    or raw.count("</think>") > 1 or "｜" in reasoning + content)
    if not peer_differs and not with_stop:  # its processor also ends itself at a stop sequence
        assert ours == accumulated(P, stream(P, pieces, stop=stop))


def _ends_in_marker_start(text, marker):
    """Whether `text`, without trailing newlines, ends with a proper prefix of `marker`."""
    body = text.rstrip("\n")
    return any(body.endswith(marker[:k]) for k in range(1, len(marker)))


def _expected_delta(ev):
    """The Chat delta of a parser event, written out independently of chat_out."""
    if isinstance(ev, ReasoningDelta):
        return {"content": None, "reasoning_content": ev.text}
    if isinstance(ev, ContentDelta):
        return {"content": ev.text, "reasoning_content": None}
    if isinstance(ev, ToolCallStart):
        return {"tool_calls": [{"index": ev.index, "id": ev.id, "type": "function",
                                "function": {"name": ev.name, "arguments": ""}}]}
    if isinstance(ev, ToolCallDelta):
        return {"tool_calls": [{"index": ev.index, "function": {"arguments": ev.arguments}}]}
    return None


@pytest.mark.parametrize("step", [1, 7, 10_000])
def test_lazy_chat_chunks_equal_their_events(step):
    """Each per-token chunk's dict and JSON are exactly what its parser event says."""
    req = K.ChatCompletionRequest({"model": "DeepSeek-V4-Pro", "messages": [{"role": "user", "content": "hi"}],
                                   "tools": TOOLS, "stream": True}).convert(K.ConversionOptions())
    parser = OutputParser(req.parsing_options)
    gen = K.ChatCompletionRequest.chunk_generator(req, "chatcmpl-9", "m")
    gen.start(K.PromptUsage(prompt_tokens=3), "fp_1")
    head = {"id": "chatcmpl-9", "object": "chat.completion.chunk", "created": gen.created, "model": "m",
            "system_fingerprint": "fp_1"}
    seen = 0
    for i in range(0, len(RAW), step):
        for ev in parser.feed(RAW[i:i + step]):
            chunks = gen.event(ev)
            delta = _expected_delta(ev)
            if delta is None:
                assert chunks == []
                continue
            (chunk,) = chunks
            expected = {**head, "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": None}]}
            text = chunk.to_json()  # before `data` is built: the spliced JSON
            assert json.loads(text) == expected
            assert text == json.dumps(expected, ensure_ascii=False, separators=(",", ":"))
            assert chunk.data == expected and chunk.to_json() == text
            seen += 1
    assert seen > 10


def test_lazy_chunk_reflects_edits_to_its_data():
    req = K.ChatCompletionRequest({"model": "DeepSeek-V4-Pro", "messages": [{"role": "user", "content": "hi"}],
                                   "stream": True}).convert(K.ConversionOptions())
    gen = K.ChatCompletionRequest.chunk_generator(req, "c", "m")
    gen.start(K.PromptUsage(), None)
    (chunk,) = gen.event(ContentDelta("x"))
    chunk.data["choices"][0]["delta"]["content"] = "y"
    assert json.loads(chunk.to_json())["choices"][0]["delta"]["content"] == "y"


def test_tool_call_ids_are_uniform_over_the_alphabet():
    """60k random symbols: each of the 62 appears close to 1/62 of the time (no modulo bias)."""
    ids = [new_tool_call_id(i % 100) for i in range(2500)]
    assert all(len(x) == 32 and x.startswith(f"call_{i % 100:02d}_") for i, x in enumerate(ids))
    symbols = "".join(x[8:] for x in ids)
    counts = {c: symbols.count(c) for c in set(symbols)}
    assert set(counts) == set("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789")
    expected = len(symbols) / 62
    # Chi-square with 61 degrees of freedom; 120 is far beyond its 99.99th percentile (~110).
    assert sum((n - expected) ** 2 / expected for n in counts.values()) < 120


def _conversion_view(req):
    """Everything a converted request carries, as plain comparable data."""
    conv, inf, po = req.conversation, req.inference_options, req.parsing_options
    messages = [(type(m).__name__, m.content, m.reasoning_content, m.tool_calls, m.prefix, m.image_sources,
                 getattr(m, "tool_call_id", None), getattr(m, "task", None)) for m in conv.messages]
    prompt = req.model_version.encoding().render_conversation(conv)
    return (messages, conv.thinking_mode, conv.tools, conv.tool_choice, conv.reasoning_effort,
            conv.response_format, req.model_version, req.model, req.stream, req.echo, req.namespace_tool_map,
            inf.max_tokens, inf.temperature, inf.top_p, inf.seed, inf.output_constraint,
            po.parse_tool_calls, po.starts_in_tool_calls, po.thinking_initial_stage, po.stop_sequences,
            prompt.prompt, prompt.special_ranges, prompt.image_sources)


_roles = st.sampled_from(["user", "assistant", "system", "developer", "tool", "latest_reminder"])
_plain_messages = st.lists(st.fixed_dictionaries({"role": _roles, "content": st.text(max_size=8)}),
                           max_size=5)


@settings(max_examples=150, deadline=None)
@given(_plain_messages, st.sampled_from(["DeepSeek-V4-Pro", "DeepSeek-V4.1-Flash", "gpt-x"]),
       st.sampled_from([None, True, False]), st.booleans())
def test_plain_chat_skips_validation_without_changing_the_result(messages, model, stream, thinking):
    """A plain chat (model, messages of role+content, stream) converts as the validating path does.

    The same body sent as JSON text always takes the validating path, so it is the reference.
    """
    body = {"model": model, "messages": messages}
    if stream is not None:
        body["stream"] = stream
    options = K.ConversionOptions(default_thinking_mode=thinking)
    outcomes = []
    for form in (body, json.dumps(body)):
        try:
            req = K.ChatCompletionRequest(form)
            outcomes.append(("ok", req.model, _conversion_view(req.convert(options))))
        except K.RecipeError as exc:
            outcomes.append((type(exc), str(exc)))
    assert outcomes[0] == outcomes[1]


def test_plain_chat_is_a_snapshot_of_the_body():
    body = {"model": "DeepSeek-V4-Pro", "messages": [{"role": "user", "content": "a"}]}
    req = K.ChatCompletionRequest(body)
    body["messages"][0]["content"] = "b"
    body["model"] = "other"
    conv = req.convert(K.ConversionOptions())
    assert req.model == "DeepSeek-V4-Pro" and conv.conversation.messages[0].content == "a"


@pytest.mark.parametrize("body", [
    {"model": "DeepSeek-V4-Pro", "messages": [{"role": "user", "content": "a", "name": "x"}]},
    {"model": "DeepSeek-V4-Pro", "messages": [{"role": "robot", "content": "a"}]},
    {"model": "DeepSeek-V4-Pro", "messages": [{"role": "user", "content": 3}]},
    {"model": "DeepSeek-V4-Pro", "messages": [{"role": "user"}]},
    {"model": "DeepSeek-V4-Pro", "messages": ({"role": "user", "content": "a"},)},
    {"model": "DeepSeek-V4-Pro", "messages": [{"role": "user", "content": "a"}], "stream": "yes"},
    {"model": 4, "messages": [{"role": "user", "content": "a"}]},
    {"messages": [{"role": "user", "content": "a"}]},
    {"model": "DeepSeek-V4-Pro", "messages": [{"role": "user", "content": "a"}], "n": 3},
])
def test_almost_plain_bodies_are_validated(body):
    """Bodies just outside the plain shape behave exactly as their JSON text does."""
    outcomes = []
    for form in (body, json.dumps(body)):
        try:
            req = K.ChatCompletionRequest(form)
            outcomes.append(("ok", _conversion_view(req.convert(K.ConversionOptions()))))
        except K.RecipeError as exc:
            outcomes.append((type(exc), str(exc)))
    assert outcomes[0] == outcomes[1]


_json_texts = st.one_of(
    st.integers(-10 ** 25, 10 ** 25).map(str),
    st.from_regex(r"-?[0-9]{1,20}", fullmatch=True),
    st.recursive(st.none() | st.booleans() | st.floats(allow_nan=True) | st.text(max_size=4),
                 lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=3), inner, max_size=3),
                 max_leaves=6).map(json.dumps),
    st.text(alphabet=" -+0123456789.eE", max_size=8))


@settings(max_examples=300, deadline=None)
@given(_json_texts)
def test_non_string_values_are_rewritten_as_json_dumps_would(raw):
    """The integer shortcut gives what json.dumps(json.loads(raw)) gives, or fails where it fails."""
    from kernforge.recipe.parser import _canonical_json
    try:
        expected = json.dumps(json.loads(raw), ensure_ascii=False)
    except ValueError:
        with pytest.raises(ValueError):
            _canonical_json(raw)
        return
    assert _canonical_json(raw) == expected
