"""Unsupported features raise typed errors that name them; fuzzed requests never crash."""
import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import kernforge.recipe as K

U = [{"role": "user", "content": "hi"}]
V4, V41 = "DeepSeek-V4-Pro", "DeepSeek-V4.1-Flash"


def convert(api, body, options=None):
    return getattr(K, api)(body).convert(options or K.ConversionOptions())


@pytest.mark.parametrize("api,body,feature", [
    ("ChatCompletionRequest", {"model": V4, "messages": U, "n": 2}, "n"),
    ("ChatCompletionRequest", {"model": V4, "messages": U, "logprobs": True}, "logprobs"),
    ("ChatCompletionRequest", {"model": V4, "messages": U, "top_logprobs": 3}, "top_logprobs"),
    ("ChatCompletionRequest", {"model": V4, "messages": U, "frequency_penalty": 0.5}, "frequency_penalty"),
    ("ChatCompletionRequest", {"model": V4, "messages": U, "parallel_tool_calls": False}, "parallel_tool_calls"),
    ("ChatCompletionRequest", {"model": V4, "messages": U, "audio": {"voice": "x"}}, "audio"),
    ("ChatCompletionRequest", {"model": V4, "messages": [{"role": "user", "content": "a", "name": "bob"}]},
     "messages[0].name"),
    ("ChatCompletionRequest", {"model": V4, "messages": [{"role": "user", "content": [
        {"type": "input_audio", "input_audio": {"data": "", "format": "wav"}}]}]}, "input_audio"),
    ("ChatCompletionRequest", {"model": V4, "messages": [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": "https://x/y.png"}}]}]}, "image input"),
    ("ResponsesRequest", {"model": V4, "input": [{"type": "reasoning", "id": "r", "summary": [],
                                                 "encrypted_content": "gAAA"}]}, "encrypted_content"),
    ("ResponsesRequest", {"model": V4, "input": "hi", "previous_response_id": "resp_1"}, "previous_response_id"),
    ("ResponsesRequest", {"model": V4, "input": "hi", "include": ["reasoning.encrypted_content"]}, "include"),
    ("ResponsesRequest", {"model": V4, "input": "hi", "tools": [{"type": "file_search"}]}, "file_search"),
    ("ResponsesRequest", {"model": V4, "input": "hi", "tools": [{"type": "custom", "name": "sql"}]}, "sql"),
    ("MessagesRequest", {"model": V4, "max_tokens": 5, "messages": U, "top_k": 5}, "top_k"),
    ("MessagesRequest", {"model": V4, "max_tokens": 5, "messages": [{"role": "assistant", "content": [
        {"type": "redacted_thinking", "data": "x"}]}, *U]}, "redacted_thinking"),
    ("MessagesRequest", {"model": V4, "max_tokens": 5, "messages": U,
                         "tools": [{"type": "web_search_20250305", "name": "web_search"}]}, "web_search"),
])
def test_unsupported_feature_is_named(api, body, feature):
    with pytest.raises(K.UnsupportedFeatureError) as exc:
        convert(api, body)
    assert feature in str(exc.value)
    assert exc.value.status_code == 400
    assert feature in json.loads(exc.value.body)["error"]["message"]


@pytest.mark.parametrize("body,needle", [
    ({"model": "gpt-4o", "messages": U}, "gpt-4o"),
    ({"model": V4, "messages": U, "max_tokens": 10 ** 7}, "max_tokens"),
    ({"model": V4, "messages": U, "stop": ""}, "stop"),
    ({"model": V4, "messages": U, "stop": ["x", ""]}, "stop"),
    ({"model": V4, "messages": U, "tools": [{"type": "function", "function": {"name": "f"}}],
      "tool_choice": "required"}, "tool_choice"),
    ({"model": V4, "messages": U, "response_format": {"type": "json_object"}}, "json"),
    ({"model": V4, "messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "x",
                                                                 "tool_calls": [{"id": "1", "type": "function",
                                                                                 "function": {"name": "f", "arguments": "[1]"}}]}]},
     "JSON object"),
    ({"model": V4, "messages": [{"role": "assistant", "content": "p", "prefix": True}, *U]}, "prefix"),
    ({"model": V4, "messages": U, "temperature": 3}, "temperature"),
])
def test_invalid_requests_are_conversion_errors(body, needle):
    with pytest.raises(K.ConversionError) as exc:
        req = convert("ChatCompletionRequest", body)
        req.model_version.encoding().render_conversation(req.conversation)
    assert needle in str(exc.value)


def test_developer_role_is_accepted_as_system():
    """deepseek-recipe rejects Chat `developer`; the official API accepts it."""
    a = convert("ChatCompletionRequest", {"model": V4, "messages": [{"role": "developer", "content": "D"}, *U]})
    b = convert("ChatCompletionRequest", {"model": V4, "messages": [{"role": "system", "content": "D"}, *U]})
    enc = K.DeepseekV4Encoding()
    assert enc.render_conversation(a.conversation).prompt == enc.render_conversation(b.conversation).prompt


def test_model_alias_and_table():
    opts = K.ConversionOptions().with_model_alias("my-flash", K.ModelVersion.DeepseekV41Flash)
    req = convert("ChatCompletionRequest", {"model": "my-flash", "messages": U}, opts)
    assert req.model_version is K.ModelVersion.DeepseekV41Flash
    opts = K.ConversionOptions().with_model_versions_by_name({"only": K.ModelVersion.DeepseekV4Pro})
    with pytest.raises(K.ConversionError):
        convert("ChatCompletionRequest", {"model": V4, "messages": U}, opts)


def test_reasoning_reject_behavior():
    history = [*U, {"role": "assistant", "content": "", "tool_calls": [
        {"id": "1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "1", "content": "r"}]
    body = {"model": V4, "messages": history, "tools": [{"type": "function", "function": {"name": "f"}}]}
    opts = K.ConversionOptions(reasoning_content_behavior=K.ReasoningContentBehavior.Reject)
    with pytest.raises(K.ConversionError, match="reasoning_content"):
        convert("ChatCompletionRequest", body, opts)
    filled = convert("ChatCompletionRequest", body)
    assert filled.conversation.messages[1].reasoning_content == ""


json_leaf = st.one_of(st.none(), st.booleans(), st.integers(-3, 10 ** 7), st.floats(allow_nan=False),
                      st.text(max_size=6))
json_any = st.recursive(json_leaf, lambda c: st.one_of(st.lists(c, max_size=3),
                                                       st.dictionaries(st.text(max_size=5), c, max_size=3)),
                        max_leaves=8)
roles = st.sampled_from(["system", "developer", "user", "assistant", "tool", "latest_reminder", "bogus"])
message = st.fixed_dictionaries({"role": roles}, optional={
    "content": st.one_of(st.text(max_size=8), st.none(), st.lists(st.fixed_dictionaries(
        {"type": st.sampled_from(["text", "image_url", "input_text"])},
        optional={"text": st.text(max_size=5), "image_url": st.fixed_dictionaries(
            {"url": st.sampled_from(["https://a/b.png", "data:image/png;base64,AAAA", "ftp://x"])})}),
        max_size=2)),
    "reasoning_content": st.text(max_size=5), "prefix": st.booleans(), "tool_call_id": st.text(max_size=3),
    "tool_calls": st.lists(st.fixed_dictionaries({"id": st.text(max_size=3), "type": st.just("function"),
                                                  "function": st.fixed_dictionaries({
                                                      "name": st.sampled_from(["f", "g"]),
                                                      "arguments": st.one_of(st.text(max_size=6),
                                                                             json_any.map(json.dumps))})}),
                           max_size=2)})
chat_body = st.fixed_dictionaries(
    {"model": st.sampled_from([V4, V41, "x"]), "messages": st.lists(message, max_size=5)},
    optional={"tools": st.lists(st.fixed_dictionaries({"type": st.just("function"), "function":
                                                       st.fixed_dictionaries({"name": st.sampled_from(["f", "g"])},
                                                                             optional={"parameters": json_any})}),
                                max_size=2),
              "tool_choice": st.one_of(st.sampled_from(["auto", "none", "required", "bad"]), json_any),
              "thinking": st.fixed_dictionaries({"type": st.sampled_from(["enabled", "disabled", "x"])}),
              "reasoning_effort": st.sampled_from(["low", "medium", "high", "max", "none", "ultra"]),
              "max_tokens": st.integers(-2, 10 ** 6), "stop": st.one_of(st.text(max_size=3), json_any),
              "temperature": json_any, "response_format": json_any, "seed": json_any, "extra": json_any})


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(chat_body)
def test_fuzzed_chat_requests_raise_only_typed_errors(body):
    try:
        req = K.ChatCompletionRequest(body).convert(K.ConversionOptions())
        r = req.model_version.encoding().render_conversation(req.conversation)
    except K.RecipeError:
        return
    assert r.prompt.startswith("<｜begin▁of▁sentence｜>")


anthropic_block = st.fixed_dictionaries(
    {"type": st.sampled_from(["text", "thinking", "tool_use", "tool_result", "image", "document"])},
    optional={"text": st.text(max_size=4), "thinking": st.text(max_size=4), "id": st.text(max_size=3),
              "name": st.sampled_from(["f", ""]), "input": json_any, "tool_use_id": st.text(max_size=3),
              "content": st.text(max_size=3),
              "source": st.fixed_dictionaries({"type": st.sampled_from(["base64", "url"])},
                                              optional={"data": st.text(max_size=3),
                                                        "media_type": st.just("image/png"),
                                                        "url": st.just("https://a")})})
anthropic_message = st.fixed_dictionaries({
    "role": st.sampled_from(["user", "assistant", "system"]),
    "content": st.one_of(st.text(max_size=5), st.lists(anthropic_block, max_size=3))})
messages_body = st.fixed_dictionaries(
    {"model": st.sampled_from([V4, V41]), "max_tokens": st.integers(-1, 10 ** 6),
     "messages": st.lists(anthropic_message, max_size=4)},
    optional={"thinking": st.fixed_dictionaries({"type": st.sampled_from(["enabled", "disabled", "adaptive"])}),
              "system": st.text(max_size=4), "tool_choice": json_any})


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(messages_body)
def test_fuzzed_messages_requests_raise_only_typed_errors(body):
    try:
        req = K.MessagesRequest(body).convert(K.ConversionOptions())
        req.model_version.encoding().render_conversation(req.conversation)
    except K.RecipeError:
        pass


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.fixed_dictionaries({"model": st.sampled_from([V4, V41]), "input": st.one_of(st.text(max_size=4), st.lists(
    st.fixed_dictionaries({"type": st.sampled_from(["message", "reasoning", "function_call", "function_call_output",
                                                    "custom_tool_call", "weird"])},
                          optional={"role": st.sampled_from(["user", "assistant", "system", "developer"]),
                                    "content": st.one_of(st.text(max_size=3), json_any), "call_id": st.text(max_size=2),
                                    "name": st.sampled_from(["f", "apply_patch"]), "arguments": st.text(max_size=5),
                                    "output": st.text(max_size=3), "input": st.text(max_size=3),
                                    "summary": json_any}), max_size=4))},
                             optional={"tools": json_any, "reasoning": json_any, "text": json_any,
                                       "tool_choice": json_any, "instructions": st.text(max_size=3)}))
def test_fuzzed_responses_requests_raise_only_typed_errors(body):
    try:
        req = K.ResponsesRequest(body).convert(K.ConversionOptions())
        req.model_version.encoding().render_conversation(req.conversation)
    except K.RecipeError:
        pass


def test_resolve_max_tokens_defaults_and_limits():
    think = convert("ChatCompletionRequest", {"model": V4, "messages": U})
    assert think.resolve_max_tokens(100, 1_000_000) == 65536
    assert think.resolve_max_tokens(100, 1000) == 900
    maxed = convert("ChatCompletionRequest", {"model": V4, "messages": U, "reasoning_effort": "max"})
    assert maxed.resolve_max_tokens(10, 10 ** 6) == 131072
    chat = convert("ChatCompletionRequest", {"model": V4, "messages": U, "thinking": {"type": "disabled"}})
    assert chat.resolve_max_tokens(10, 10 ** 6) == 8192
    fixed = convert("ChatCompletionRequest", {"model": V4, "messages": U, "max_tokens": 50})
    assert fixed.resolve_max_tokens(10, 100) == 50
    with pytest.raises(K.ConversionError):
        fixed.resolve_max_tokens(60, 100)
    with pytest.raises(K.ConversionError):
        think.resolve_max_tokens(101, 100)


def test_option_builders_change_conversion():
    base = K.ConversionOptions()
    off = base.with_default_thinking_mode(False)
    assert convert("ChatCompletionRequest", {"model": V4, "messages": U}, off).conversation.thinking_mode is False
    assert base.default_thinking_mode is True  # builders copy
    small = base.with_thinking_max_tokens_upper_bound(10).with_non_thinking_max_tokens_upper_bound(20)
    with pytest.raises(K.ConversionError):
        convert("ChatCompletionRequest", {"model": V4, "messages": U, "max_tokens": 11}, small)
    msg = convert("MessagesRequest", {"model": V4, "max_tokens": 11, "messages": U}, small)
    assert msg.inference_options.max_tokens == 10  # Messages lowers instead of rejecting
    web = {"model": V4, "input": "hi", "tools": [{"type": "web_search"}]}
    assert convert("ResponsesRequest", web).conversation.tools == []
    with pytest.raises(K.UnsupportedFeatureError):
        convert("ResponsesRequest", web, base.with_responses_web_search(K.WebSearchBehavior.Reject))
    body = {"model": V4, "max_tokens": 5, "messages": U,
            "tools": [{"type": "web_search_20250305", "name": "web_search"}]}
    assert convert("MessagesRequest", body, base.with_messages_web_search(K.WebSearchBehavior.Drop)).conversation.tools == []
    reject = base.with_reasoning_content_behavior(K.ReasoningContentBehavior.Reject)
    assert reject.reasoning_content_behavior is K.ReasoningContentBehavior.Reject
