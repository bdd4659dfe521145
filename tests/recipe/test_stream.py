"""Streaming through StreamProcessor, with cases from known bugs in vLLM/SGLang-style parsers.

Each case fails on the buggy behaviour: a whole tool call in one delta, wrong
indices for parallel calls, reasoning lost across turns, missing thinking deltas
in Anthropic streams, and long string arguments held until their closing tag.
"""
import json

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

import kernforge.recipe as K

from .conftest import chunked, drive
from .test_parser import D, dsml_block

TOOLS = [{"type": "function", "function": {"name": n, "parameters": {"type": "object", "properties": {
    "city": {"type": "string"}, "days": {"type": "integer"}, "body": {"type": "string"}}}}}
    for n in ("get_weather", "write_file")]


def chat_request(**extra):
    body = {"model": "DeepSeek-V4-Pro", "messages": [{"role": "user", "content": "hi"}], "tools": TOOLS,
            "stream": True}
    body.update(extra)
    return K.ChatCompletionRequest(body).convert(K.ConversionOptions())


def chat_stream(raw, step, req=None):
    req = req or chat_request()
    gen = K.ChatCompletionRequest.chunk_generator(req, "chatcmpl-1", "DeepSeek-V4-Pro")
    out, sp = drive(gen, req.parsing_options, chunked(raw, step))
    return [c.data for c in out], sp


def tool_deltas(chunks):
    return [tc for c in chunks for tc in c["choices"][0]["delta"].get("tool_calls") or ()]


PARALLEL = "Checking.</think>" + dsml_block([("get_weather", [("city", "Oslo"), ("days", 3)]),
                                              ("get_weather", [("city", "Rome")]),
                                              ("write_file", [("body", "x")])])


@pytest.mark.parametrize("step", [1, 5, 10_000])
def test_parallel_tool_call_indices(step):
    chunks, _ = chat_stream(PARALLEL, step)
    deltas = tool_deltas(chunks)
    starts = [d for d in deltas if "id" in d]
    assert [d["index"] for d in starts] == [0, 1, 2]
    assert len({d["id"] for d in starts}) == 3
    args = {}
    for d in deltas:
        args[d["index"]] = args.get(d["index"], "") + d["function"].get("arguments", "")
    assert [json.loads(args[i]) for i in range(3)] == [{"city": "Oslo", "days": 3}, {"city": "Rome"},
                                                       {"body": "x"}]
    # Deltas of one call are contiguous and never carry another call's index.
    order = [d["index"] for d in deltas]
    assert order == sorted(order)
    assert chunks[-1]["choices"][0]["finish_reason"] == "tool_calls"


def test_whole_tool_call_never_arrives_in_one_delta():
    chunks, _ = chat_stream(PARALLEL, 1)
    deltas = [d for d in tool_deltas(chunks) if d["index"] == 0]
    # name first with empty arguments, then several argument deltas
    assert deltas[0]["function"] == {"name": "get_weather", "arguments": ""}
    assert len(deltas) > 4
    assert all(len(d["function"].get("arguments", "")) < len('{"city": "Oslo", "days": 3}') for d in deltas)


def test_long_string_argument_streams_before_closing_tag():
    body = "line of the file\n" * 400
    prefix = f'</think><{D}tool_calls>\n<{D}invoke name="write_file">\n<{D}parameter name="body" string="true">'
    req = chat_request()
    gen = K.ChatCompletionRequest.chunk_generator(req, "c", "m")
    sp = K.StreamProcessor(gen, req.parsing_options)
    sp.push(K.InferenceChunk.ready())
    streamed = ""
    for piece in chunked(prefix + body, 50):  # the closing tag has not arrived yet
        for c in sp.push(K.InferenceChunk.text(piece, 1)):
            for tc in c.data["choices"][0]["delta"].get("tool_calls") or ():
                streamed += tc["function"].get("arguments", "")
    assert streamed.startswith('{"body": "')
    assert json.loads(streamed + '"}')["body"] in body
    assert len(streamed) > 0.9 * len(json.dumps(body))
    sp.close()


def test_reasoning_survives_the_next_turn():
    """The streamed reasoning, passed back with the tool result, is in the next prompt."""
    raw = "I must call the tool.</think>" + dsml_block([("get_weather", [("city", "Oslo")])])
    chunks, _ = chat_stream(raw, 3)
    acc = K.ChatCompletionResponse("c", "m", 0, 0, 0)
    for c in chunks:
        acc.accumulate(K.ChatCompletionChunk(c))
    msg = acc.to_dict()["choices"][0]["message"]
    assert msg["reasoning_content"] == "I must call the tool."
    call = msg["tool_calls"][0]
    history = [{"role": "user", "content": "hi"},
               {"role": "assistant", "content": msg["content"], "reasoning_content": msg["reasoning_content"],
                "tool_calls": [{"id": call["id"], "type": "function", "function": call["function"]}]},
               {"role": "tool", "tool_call_id": call["id"], "content": "sunny"}]
    for model in ("DeepSeek-V4-Pro", "DeepSeek-V4.1-Flash"):
        req = K.ChatCompletionRequest({"model": model, "messages": history, "tools": TOOLS}).convert(
            K.ConversionOptions())
        prompt = req.model_version.encoding().render_conversation(req.conversation).prompt
        assert "<think>I must call the tool.</think>" in prompt
        # and the rendered turn re-parses to the same call
        start = prompt.index("<think>I must") + len("<think>")
        end = prompt.index("<｜end▁of▁sentence｜>", start)
        opts = req.parsing_options
        ev = K.OutputParser(opts).feed(prompt[start:end]) if False else None
        p = K.OutputParser(opts)
        ev = p.feed(prompt[start:end]) + p.finish()
        ends = [e for e in ev if type(e).__name__ == "ToolCallEnd"]
        assert [json.loads(e.arguments) for e in ends] == [{"city": "Oslo"}]


def messages_stream(raw, step, thinking=True):
    body = {"model": "DeepSeek-V4-Pro", "max_tokens": 100, "messages": [{"role": "user", "content": "hi"}],
            "tools": [{"name": "get_weather", "input_schema": {"type": "object"}}], "stream": True,
            "thinking": {"type": "enabled" if thinking else "disabled"}}
    req = K.MessagesRequest(body).convert(K.ConversionOptions())
    gen = K.MessagesRequest.chunk_generator(req, "msg_1", "DeepSeek-V4-Pro")
    out, _ = drive(gen, req.parsing_options, chunked(raw, step))
    return [e.data for e in out]


def test_anthropic_stream_has_thinking_deltas_and_order():
    raw = "Let me think about it.</think>Sure.\n\n" + dsml_block([("get_weather", [("city", "Oslo")])])
    events = messages_stream(raw, 4)
    types = [e["type"] for e in events]
    assert types[0] == "message_start" and types[-1] == "message_stop" and types[-2] == "message_delta"
    blocks = [e["content_block"]["type"] for e in events if e["type"] == "content_block_start"]
    assert blocks == ["thinking", "text", "tool_use"]
    thinking = "".join(e["delta"]["thinking"] for e in events
                       if e["type"] == "content_block_delta" and e["delta"]["type"] == "thinking_delta")
    assert thinking == "Let me think about it."
    assert sum(1 for e in events if e["type"] == "content_block_delta"
               and e["delta"]["type"] == "thinking_delta") > 1
    sig = [e for e in events if e["type"] == "content_block_delta" and e["delta"]["type"] == "signature_delta"]
    assert len(sig) == 1 and sig[0]["index"] == 0
    partial = "".join(e["delta"]["partial_json"] for e in events
                      if e["type"] == "content_block_delta" and e["delta"]["type"] == "input_json_delta")
    assert json.loads(partial) == {"city": "Oslo"}
    # every started block is stopped, in order
    starts = [e["index"] for e in events if e["type"] == "content_block_start"]
    stops = [e["index"] for e in events if e["type"] == "content_block_stop"]
    assert starts == stops == [0, 1, 2]
    assert events[-2]["delta"]["stop_reason"] == "tool_use"


def test_responses_sequence_numbers_and_items():
    body = {"model": "DeepSeek-V4.1-Flash", "input": "hi", "stream": True,
            "tools": [{"type": "function", "name": "get_weather", "parameters": {"type": "object"}}]}
    req = K.ResponsesRequest(body).convert(K.ConversionOptions())
    from kernforge.recipe.dsml import V41_DSML
    raw = "R.</think>Text.\n\n" + dsml_block([("get_weather", [("city", "Oslo")])], V41_DSML)
    gen = K.ResponsesRequest.chunk_generator(req, "resp_1", "DeepSeek-V4.1-Flash")
    out, _ = drive(gen, req.parsing_options, chunked(raw, 3))
    events = [e.data for e in out]
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    assert events[0]["type"] == "response.created" and events[-1]["type"] == "response.completed"
    added = [e["item"]["type"] for e in events if e["type"] == "response.output_item.added"]
    assert added == ["reasoning", "message", "function_call"]
    final = events[-1]["response"]["output"]
    assert json.loads(final[2]["arguments"]) == {"city": "Oslo"}


def test_length_finish_and_usage():
    req = chat_request()
    gen = K.ChatCompletionRequest.chunk_generator(req, "c", "m")
    out, _ = drive(gen, req.parsing_options, ["abc", "</think>de"], finish=K.InferenceFinishReason.Length,
                   prompt_tokens=11)
    last = out[-1].data
    assert last["choices"][0]["finish_reason"] == "length"
    assert last["usage"]["prompt_tokens"] == 11 and last["usage"]["completion_tokens"] == 2


def test_processor_state_errors():
    req = chat_request()
    sp = K.StreamProcessor(K.ChatCompletionRequest.chunk_generator(req, "c", "m"), req.parsing_options)
    sp.push(K.InferenceChunk.text("x"))
    sp.finish()
    assert sp.finished and sp.finish() == []
    with pytest.raises(K.StreamStateError):
        sp.push(K.InferenceChunk.text("y"))
    sp.close()
    with pytest.raises(K.StreamStateError):
        sp.finish()


P = pytest.importorskip("deepseek_recipe")


def _peer_and_ours(raw, step, model):
    results = []
    for lib in (P, K):
        body = {"model": model, "messages": [{"role": "user", "content": "hi"}], "tools": TOOLS, "stream": True}
        req = lib.ChatCompletionRequest(body).convert(lib.ConversionOptions())
        gen = lib.ChatCompletionRequest.chunk_generator(req, "c", model)
        sp = lib.StreamProcessor(gen, req.parsing_options)
        out = sp.push(lib.InferenceChunk.ready())
        for piece in chunked(raw, step):
            out += sp.push(lib.InferenceChunk.text(piece, 1))
        out += sp.push(lib.InferenceChunk.finish(lib.InferenceFinishReason.Stop))
        out += sp.finish()
        acc = lib.ChatCompletionResponse("c", model, 0, 0, 0)
        for o in out:
            acc.accumulate(o)
        msg = json.loads(acc.to_json())["choices"][0]
        calls = [(c["function"]["name"], json.loads(c["function"]["arguments"]))
                 for c in msg["message"].get("tool_calls") or ()]
        results.append((msg["message"]["content"] or "", msg["message"]["reasoning_content"], calls,
                        msg["finish_reason"]))
    return results


words = st.lists(st.sampled_from(["a", " ", "\n", "é", "<", "x>", "{", '"', "中"]), max_size=10).map("".join)


@settings(max_examples=80, deadline=None)
@given(words, words, st.lists(st.tuples(st.sampled_from(["get_weather", "write_file"]),
                                        st.lists(st.tuples(st.sampled_from(["city", "days", "body"]),
                                                           st.one_of(words, st.integers(0, 99))),
                                                 max_size=3, unique_by=lambda t: t[0])), max_size=3),
       st.integers(1, 12), st.booleans())
def test_stream_results_match_peer(reasoning, content, calls, step, v41):
    from kernforge.recipe.dsml import V41_DSML, V4_DSML
    model = "DeepSeek-V4.1-Flash" if v41 else "DeepSeek-V4-Pro"
    # deepseek-recipe 0.2.0 keeps a "\n" before a marker when the text before it ends in "<" (its bug).
    assume(not reasoning.rstrip("\n").endswith("<"))
    assume(not (calls and content.rstrip("\n").endswith("<")))
    raw = reasoning + "</think>" + content
    if calls:
        raw += "\n\n" + dsml_block(calls, V41_DSML if v41 else V4_DSML)
    peer, ours = _peer_and_ours(raw, step, model)
    assert ours == peer


def _event_shape(lib, api, body, raw, step, finish):
    """Event types in order (runs of equal delta kinds collapsed) and the final text/arguments."""
    R = getattr(lib, api)
    req = R(json.loads(json.dumps(body))).convert(lib.ConversionOptions())
    sp = lib.StreamProcessor(R.chunk_generator(req, "id1", "m"), req.parsing_options)
    out = sp.push(lib.InferenceChunk.ready())
    for piece in chunked(raw, step):
        out += sp.push(lib.InferenceChunk.text(piece, 1))
    out += sp.push(lib.InferenceChunk.finish(finish))
    out += sp.finish()
    shape = []
    for o in out:
        d = json.loads(o.to_json())
        key = (d["type"], d["delta"].get("type") if isinstance(d.get("delta"), dict) else None)
        if key[0].endswith("delta") and shape and shape[-1] == key:
            continue
        shape.append(key)
    return shape


@settings(max_examples=60, deadline=None)
@given(words, words, st.lists(st.sampled_from([[("city", "Oslo")], [], [("days", 3), ("city", "x")]]), max_size=2),
       st.integers(1, 9), st.booleans(), st.sampled_from(["ResponsesRequest", "MessagesRequest"]),
       st.sampled_from(["Stop", "Length"]))
def test_responses_and_messages_event_sequences_match_peer(reasoning, content, calls, step, thinking, api, fin):
    assume(not reasoning.rstrip("\n").endswith("<") and not content.rstrip("\n").endswith("<"))
    raw = (reasoning + "</think>" if thinking else "") + content
    if calls:
        raw += "\n\n" + dsml_block([("get_weather", c) for c in calls])
    if api == "ResponsesRequest":
        body = {"model": "DeepSeek-V4-Pro", "input": "hi", "reasoning": {"effort": "high" if thinking else "none"},
                "tools": [{"type": "function", "name": "get_weather", "parameters": {"type": "object"}}]}
    else:
        body = {"model": "DeepSeek-V4-Pro", "max_tokens": 9, "messages": [{"role": "user", "content": "hi"}],
                "thinking": {"type": "enabled" if thinking else "disabled"},
                "tools": [{"name": "get_weather", "input_schema": {"type": "object"}}]}
    ours = _event_shape(K, api, body, raw, step, getattr(K.InferenceFinishReason, fin))
    peer = _event_shape(P, api, body, raw, step, getattr(P.InferenceFinishReason, fin))
    assert ours == peer


def test_responses_namespace_tool_round_trip_and_custom_apply_patch():
    body = {"model": "DeepSeek-V4-Pro", "input": "edit", "stream": True,
            "tools": [{"type": "namespace", "name": "fs", "description": "Files", "tools": [
                {"type": "function", "name": "read", "parameters": {"type": "object"}}]},
                {"type": "custom", "name": "apply_patch", "description": "Patch"}]}
    request = K.ResponsesRequest(body)
    assert request.namespace_tool_map(K.ConversionOptions()) == {"fs__read": ("fs", "read")}
    req = request.convert(K.ConversionOptions())
    assert [t.name for t in req.conversation.tools] == ["fs__read", "apply_patch"]
    assert req.conversation.tools[1].parameters["properties"]["input"]["type"] == "string"
    raw = "ok</think>" + dsml_block([("fs__read", [("path", "a.txt")]), ("apply_patch", [("input", "*** Begin Patch")])])
    out, _ = drive(K.ResponsesRequest.chunk_generator(req, "r1", "m"), req.parsing_options, chunked(raw, 7))
    items = [e.data["item"] for e in out if e.data["type"] == "response.output_item.done"]
    calls = [i for i in items if i["type"] == "function_call"]
    assert (calls[0]["namespace"], calls[0]["name"]) == ("fs", "read")
    assert calls[1]["name"] == "apply_patch" and "namespace" not in calls[1]
    # the history form of the same calls renders back into the prompt
    history = {"model": "DeepSeek-V4-Pro", "tools": body["tools"], "input": [
        {"type": "message", "role": "user", "content": "edit"},
        {"type": "reasoning", "id": "r", "summary": [], "content": [{"type": "reasoning_text", "text": "ok"}]},
        {"type": "function_call", "call_id": calls[0]["call_id"], "namespace": "fs", "name": "read",
         "arguments": calls[0]["arguments"]},
        {"type": "custom_tool_call", "call_id": "c2", "name": "apply_patch", "input": "*** Begin Patch"},
        {"type": "function_call_output", "call_id": calls[0]["call_id"], "output": "text"},
        {"type": "custom_tool_call_output", "call_id": "c2", "output": "done"}]}
    req2 = K.ResponsesRequest(history).convert(K.ConversionOptions())
    prompt = K.DeepseekV4Encoding().render_conversation(req2.conversation).prompt
    assert '<｜DSML｜invoke name="fs__read">' in prompt and "<think>ok</think>" in prompt
    assert '<｜DSML｜parameter name="input" string="true">*** Begin Patch</｜DSML｜parameter>' in prompt
    assert "<tool_result>text</tool_result>\n\n<tool_result>done</tool_result>" in prompt


def test_messages_signature_override():
    body = {"model": "DeepSeek-V4-Pro", "max_tokens": 9, "messages": [{"role": "user", "content": "hi"}]}
    req = K.MessagesRequest(body).convert(K.ConversionOptions())
    gen = K.MessagesRequest.chunk_generator(req, "msg_1", "m").with_signature("sig-123")
    out, _ = drive(gen, req.parsing_options, ["think", "</think>", "answer"])
    sigs = [e.data["delta"]["signature"] for e in out if e.data["type"] == "content_block_delta"
            and e.data["delta"]["type"] == "signature_delta"]
    assert sigs == ["sig-123"]
