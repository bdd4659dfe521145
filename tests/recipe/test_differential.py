"""Differential tests against deepseek-recipe 0.2.0 on generated requests.

Known, documented differences are kept out of the generated space: a request
ending with an assistant turn (we keep its reasoning, as the reference encoder
does), the Chat `developer` role (we accept it), images on V4 (we reject them).
"""
import json

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

import kernforge.recipe as K

P = pytest.importorskip("deepseek_recipe")

text = st.lists(st.sampled_from(list("ab c\n{}\"<>/|_é中") + ["<think>", "</think>", "<｜User｜>", "json"]),
                max_size=8).map("".join)
names = st.sampled_from(["get_weather", "search", "ls"])
arg_values = st.one_of(text, st.integers(-5, 10**6), st.booleans(), st.none(),
                       st.lists(st.integers(0, 3), max_size=3), st.dictionaries(st.sampled_from("xy"), text,
                                                                                max_size=2))
TOOLS = [{"type": "function", "function": {"name": n, "description": f"{n} tool",
                                           "parameters": {"type": "object", "properties": {"a": {"type": "string"}}}}}
         for n in ("get_weather", "search", "ls")]


@st.composite
def chat_bodies(draw):
    model = draw(st.sampled_from(["DeepSeek-V4-Pro", "DeepSeek-V4.1-Flash"]))
    with_tools = draw(st.booleans())
    thinking = draw(st.sampled_from([None, "enabled", "disabled"]))
    msgs = []
    if draw(st.booleans()):
        msgs.append({"role": "system", "content": draw(text)})
    call_no = 0
    for _ in range(draw(st.integers(1, 3))):
        msgs.append({"role": "user", "content": draw(text)})
        if draw(st.booleans()):
            msgs.append({"role": draw(st.sampled_from(["system", "latest_reminder"])), "content": draw(text)})
        for _ in range(draw(st.integers(0, 2))):
            m = {"role": "assistant", "content": draw(text)}
            if draw(st.booleans()):
                m["reasoning_content"] = draw(text)
            if with_tools and draw(st.booleans()):
                calls = []
                for _ in range(draw(st.integers(1, 2))):
                    call_no += 1
                    args = draw(st.dictionaries(st.sampled_from(["a", "b", "city"]), arg_values, max_size=3))
                    calls.append({"id": f"c{call_no}", "type": "function",
                                  "function": {"name": draw(names), "arguments": json.dumps(args)}})
                m["tool_calls"] = calls
                msgs.append(m)
                for c in calls:
                    msgs.append({"role": "tool", "tool_call_id": c["id"], "content": draw(text)})
            else:
                msgs.append(m)
                break
    if msgs[-1]["role"] == "assistant":
        msgs.append({"role": "user", "content": draw(text)})
    body = {"model": model, "messages": msgs}
    if with_tools:
        body["tools"] = TOOLS
        if thinking == "disabled":
            body["tool_choice"] = draw(st.sampled_from(["auto", "none", "required"]))
    if thinking:
        body["thinking"] = {"type": thinking}
    if thinking != "disabled" and draw(st.booleans()):
        body["reasoning_effort"] = draw(st.sampled_from(["low", "medium", "high", "max"]))
    if draw(st.booleans()):
        body["stop"] = [draw(st.sampled_from(["END", "\n\n"]))]
    return body


def _rejected(exc):
    """The outcome of a request both libraries must refuse: each raises its own
    ``ConversionError`` class (deepseek-recipe's lives in its native module), so the class
    name is what is compared.  Any other exception (a TypeError, a KeyError) is a bug and
    propagates, so it can never pass as "both failed"."""
    return ("rejected", type(exc).__name__)


def _render(lib, body):
    try:
        req = lib.ChatCompletionRequest(json.loads(json.dumps(body))).convert(lib.ConversionOptions())
    except lib.ConversionError as exc:
        return _rejected(exc)
    enc = lib.DeepseekV41Encoding() if req.model_version == lib.ModelVersion.DeepseekV41Flash \
        else lib.DeepseekV4Encoding()
    r = enc.render_conversation(req.conversation)
    po = req.parsing_options
    return (r.prompt, [tuple(x) for x in r.special_ranges], po.parse_tool_calls, po.starts_in_tool_calls,
            list(po.stop_sequences), po.thinking_initial_stage is not None)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(chat_bodies())
def test_chat_prompts_match_peer(body):
    assert _render(K, body) == _render(P, body)


def _messages_body(chat):
    """The same conversation as an Anthropic Messages body."""
    out = []
    for m in chat["messages"]:
        if m["role"] in ("system", "latest_reminder"):
            continue
        if m["role"] == "user":
            out.append({"role": "user", "content": [{"type": "text", "text": m["content"] or "."}]})
        elif m["role"] == "tool":
            block = {"type": "tool_result", "tool_use_id": m["tool_call_id"], "content": m["content"]}
            if out and out[-1]["role"] == "user":
                blocks = out[-1]["content"]
                at = next((k for k, b in enumerate(blocks) if b["type"] != "tool_result"), len(blocks))
                blocks.insert(at, block)
            else:
                out.append({"role": "user", "content": [block]})
        else:
            blocks = [{"type": "thinking", "thinking": m.get("reasoning_content") or "", "signature": "s"}]
            if m["content"]:
                blocks.append({"type": "text", "text": m["content"]})
            for c in m.get("tool_calls") or ():
                blocks.append({"type": "tool_use", "id": c["id"], "name": c["function"]["name"],
                               "input": json.loads(c["function"]["arguments"])})
            out.append({"role": "assistant", "content": blocks})
    body = {"model": chat["model"], "max_tokens": 64, "messages": out,
            "tools": [{"name": t["function"]["name"], "description": t["function"]["description"],
                       "input_schema": t["function"]["parameters"]} for t in chat.get("tools", [])]}
    return body


def _render_messages(lib, body):
    try:
        req = lib.MessagesRequest(json.loads(json.dumps(body))).convert(lib.ConversionOptions())
    except lib.ConversionError as exc:
        return _rejected(exc)
    enc = lib.DeepseekV41Encoding() if req.model_version == lib.ModelVersion.DeepseekV41Flash \
        else lib.DeepseekV4Encoding()
    return enc.render_conversation(req.conversation).prompt


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(chat_bodies())
def test_messages_prompts_match_peer(chat):
    body = _messages_body(chat)
    assert _render_messages(K, body) == _render_messages(P, body)


def _build(lib, spec, version, opts):
    msgs = []
    ids, next_result = [], 0
    for kind, a, b, c in spec:
        if kind == "system":
            msgs.append(lib.SystemMessage(a))
        elif kind == "user":
            msgs.append(lib.UserMessage(a))
        elif kind == "reminder":
            msgs.append(lib.LatestReminderMessage(a))
        elif kind == "tool":  # answers the latest calls in reverse order: the encoder sorts them
            msgs.append(lib.ToolMessage(a, ids[-1 - next_result] if next_result < len(ids) else "unknown"))
            next_result += 1
        else:
            ids = [f"c{len(msgs)}_{i}" for i in range(len(c))]
            next_result = 0
            calls = [lib.ToolCall(ids[i], n, json.dumps(args)) for i, (n, args) in enumerate(c)]
            msgs.append(lib.AssistantMessage(a, b, calls or None, prefix=kind == "prefix"))
    tools = [lib.ToolDefinition(n, f"{n} tool", {"type": "object"}) for n in ("f", "g")] if opts["tools"] else None
    conv = lib.Conversation(msgs, thinking_mode=opts["thinking"], tools=tools, tool_choice=opts["choice"],
                            reasoning_effort=opts["effort"], response_format=opts["format"],
                            response_schema=opts["schema"])
    enc = lib.DeepseekV41Encoding() if version == "v41" else lib.DeepseekV4Encoding()
    try:
        r = enc.render_conversation(conv)
    except lib.ConversionError as exc:
        return _rejected(exc)
    return r.prompt, [tuple(x) for x in r.special_ranges]


message_spec = st.one_of(
    st.tuples(st.sampled_from(["system", "user", "reminder", "tool"]), text, st.none(), st.just(())),
    st.tuples(st.just("assistant"), text, st.one_of(st.none(), text),
              st.lists(st.tuples(names, st.dictionaries(st.sampled_from("ab"), arg_values, max_size=2)),
                       max_size=2)))


def _results_per_call_turn(spec):
    """(calls, number of tool results that follow) for each assistant turn of a message spec."""
    out = []
    for m in spec:
        if m[0] == "assistant":
            out.append([m[3], 0])
        elif m[0] == "tool" and out:
            out[-1][1] += 1
    return out


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(message_spec, min_size=1, max_size=7), st.sampled_from(["v4", "v41"]),
       st.fixed_dictionaries({"thinking": st.booleans(), "tools": st.booleans(),
                              "choice": st.sampled_from(["auto", "none", "required"]),
                              "effort": st.sampled_from([None, "low", "high", "xhigh", "max"]),
                              "format": st.sampled_from(["text", "json_object"]),
                              "schema": st.sampled_from([None, {"type": "object"}])}),
       st.one_of(st.none(), st.tuples(text, st.one_of(st.none(), text))))
def test_direct_conversation_rendering_matches_peer(spec, version, opts, prefix):
    """Encoders alone, on Conversations built with each library's own classes."""
    if opts["format"] == "json_object" and opts["schema"] is not None:
        opts["schema"] = None
    if not opts["tools"] or opts["choice"] == "none" or spec[-1][0] == "assistant":
        # A finished assistant turn after the last user message keeps its reasoning in the
        # reference encoder (and here) but not in deepseek-recipe (documented difference).
        spec.append(("user", "next", None, ()))
    if prefix is not None:
        spec.append(("prefix", prefix[0], prefix[1], ()))
    if opts["thinking"] and opts["choice"] == "required":
        opts["choice"] = "auto"
    # Tool results only where the APIs allow them: right after a call or another result.
    assume(all(cur[0] != "tool" or (prev[0] == "tool" or (prev[0] == "assistant" and prev[3]))
               for prev, cur in zip([("start", "", None, ())] + spec, spec)))
    # At most one result per call: a result for an unknown call id has no defined place; we put it
    # after the matched results, deepseek-recipe keeps it where it arrived (docs/recipe.md).
    assume(all(n <= len(calls) for calls, n in _results_per_call_turn(spec)))
    # Two assistant turns in a row (no API produces them) hit a deepseek-recipe quirk that
    # drops a following empty tool result; keep them out.
    assume(not any(a[0] == b[0] == "assistant" for a, b in zip(spec, spec[1:])))
    # deepseek-recipe's V4.1 drops the second of two adjacent reminders (its bug); we keep both.
    assume(not any(a[0] == b[0] == "reminder" for a, b in zip(spec, spec[1:])))
    assert _build(K, spec, version, opts) == _build(P, spec, version, opts)


@pytest.mark.parametrize("version", ["v4", "v41"])
def test_parallel_results_are_rendered_in_call_order(version):
    """Clients may return parallel results in any order; both encoders sort them by call."""
    def render(lib):
        calls = [lib.ToolCall(i, "f", json.dumps({"n": k})) for k, i in enumerate(["a", "b", "c"])]
        msgs = [lib.UserMessage("u"), lib.AssistantMessage("", "r", calls), lib.ToolMessage("C", "c"),
                lib.ToolMessage("A", "a"), lib.ToolMessage("B", "b"), lib.UserMessage("next")]
        conv = lib.Conversation(msgs, tools=[lib.ToolDefinition("f", "F", {"type": "object"})])
        enc = lib.DeepseekV41Encoding() if version == "v41" else lib.DeepseekV4Encoding()
        return enc.render_conversation(conv).prompt
    ours = render(K)
    assert "<tool_result>A</tool_result>\n\n<tool_result>B</tool_result>\n\n<tool_result>C</tool_result>" in ours
    assert ours == render(P)


REJECTED_BODIES = {
    "thinking with tool_choice required": (
        {"model": "DeepSeek-V4-Pro", "messages": [{"role": "user", "content": "a"}], "tools": TOOLS,
         "tool_choice": "required"}, "Thinking mode does not support this tool_choice"),
    "unknown model": (
        {"model": "gpt-4", "messages": [{"role": "user", "content": "a"}]},
        "The supported API model names are DeepSeek-V4-Pro, DeepSeek-V4.1-Flash, but you passed gpt-4."),
}


@pytest.mark.parametrize("name", list(REJECTED_BODIES))
def test_requests_both_libraries_reject(name):
    """The generated spaces above hold only valid requests, so their rejection branch is
    exercised here: both libraries refuse these with their ConversionError and the same text."""
    body, message = REJECTED_BODIES[name]
    assert _render(K, body) == _render(P, body) == ("rejected", "ConversionError")
    for lib in (K, P):
        with pytest.raises(lib.ConversionError) as info:
            lib.ChatCompletionRequest(json.loads(json.dumps(body))).convert(lib.ConversionOptions())
        assert str(info.value) == message


def test_messages_request_for_an_unknown_model_is_rejected_by_both():
    body = _messages_body(REJECTED_BODIES["unknown model"][0])
    assert _render_messages(K, body) == _render_messages(P, body) == ("rejected", "ConversionError")


def test_direct_rendering_rejects_a_prefix_before_the_last_turn():
    """The direct-rendering helper's rejection branch: kernforge refuses an assistant prefix
    that is not the last message (deepseek-recipe renders it; not in the generated space)."""
    spec = [("user", "a", None, ()), ("prefix", "x", None, ()), ("user", "b", None, ())]
    opts = dict(thinking=False, tools=False, choice="auto", effort=None, format="text", schema=None)
    assert _build(K, spec, "v4", opts) == ("rejected", "ConversionError")
    assert _build(P, spec, "v4", opts)[0].endswith("<｜User｜>b<｜Assistant｜></think>")
