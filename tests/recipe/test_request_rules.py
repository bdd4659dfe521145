"""Request rules of issue 16: required fields in every message of the three APIs (as the
official APIs and deepseek-recipe enforce them), accepted model names, pydantic-style
constructors."""
import json

import pytest

import kernforge.recipe as K
from kernforge.recipe.options import DEFAULT_MODEL_VERSIONS

V4 = "DeepSeek-V4-Pro"
U = {"role": "user", "content": "hi"}
CALL = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}


def chat(*messages, **kw):
    return "ChatCompletionRequest", {"model": V4, "messages": list(messages), **kw}


def anthropic(*messages, **kw):
    return "MessagesRequest", {"model": V4, "max_tokens": 5, "messages": list(messages), **kw}


def responses(*items, **kw):
    return "ResponsesRequest", {"model": V4, "input": list(items), **kw}


def assistant_blocks(*blocks):
    return anthropic(U, {"role": "assistant", "content": list(blocks)}, U)


# (request, the field the error must name): each is rejected by deepseek-recipe 0.2.0 too
# (or, where marked, by the official API alone)
MISSING = [
    (chat({"role": "user"}), "messages[0].content"),
    (chat({"role": "user", "content": None}), "messages[0].content"),
    (chat({"role": "system"}, U), "messages[0].content"),
    (chat({"role": "developer"}, U), "messages[0].content"),
    (chat({"role": "latest_reminder"}, U), "messages[0].content"),
    (chat({"content": "x"}), "messages.0.role"),
    (chat(U, {"role": "assistant"}, U), "messages[1].content"),
    (chat(U, {"role": "assistant", "content": None}, U), "messages[1].content"),
    (chat(U, {"role": "assistant", "content": None, "tool_calls": [CALL]}, {"role": "tool", "content": "r"}),
     "messages[2].tool_call_id"),
    (chat(U, {"role": "assistant", "content": None, "tool_calls": [CALL]}, {"role": "tool", "tool_call_id": "c1"}),
     "messages[2].content"),
    (chat(U, {"role": "assistant", "content": "", "tool_calls": [{k: v for k, v in CALL.items() if k != "id"}]}, U),
     "messages.1.tool_calls.0.id"),
    (chat(U, {"role": "assistant", "content": "", "tool_calls": [{k: v for k, v in CALL.items() if k != "type"}]}, U),
     "messages.1.tool_calls.0.type"),
    (chat({"role": "user", "content": [{"type": "text"}]}), "messages.0.content.0.text"),
    (chat(U, tools=[{"type": "function", "function": {"name": ""}}]), "tools[0].function.name"),
    (anthropic({"role": "user"}), "messages.0.content"),
    (anthropic({"role": "user", "content": [{"type": "text"}]}), "messages[0].content[0].text"),
    (anthropic(U, system=[{"type": "text"}]), "system[0].text"),
    (assistant_blocks({"type": "thinking", "signature": "s"}), "messages[1].content[0].thinking"),
    (assistant_blocks({"type": "tool_use", "id": "1", "name": "f"}), "messages[1].content[0].input"),
    (assistant_blocks({"type": "tool_use", "name": "f", "input": {}}), "messages[1].content[0].id"),
    (anthropic({"role": "user", "content": [{"type": "tool_result", "content": "x"}]}),
     "messages[0].content[0].tool_use_id"),
    (anthropic({"role": "user", "content": [{"type": "tool_result", "tool_use_id": "1",
                                             "content": [{"type": "text"}]}]}),
     "messages[0].content[0].content[0].text"),
    (anthropic(U, tools=[{"input_schema": {}}]), "tools.0.name"),
    (anthropic(U, tools=[{"name": ""}]), "tools[0].name"),
    (responses({"type": "message", "content": "x"}), "input[0].role"),
    (responses({"type": "message", "role": "user"}), "input[0].content"),
    (responses({"type": "message", "role": "user", "content": [{"type": "input_text"}]}), "input[0].content[0].text"),
    (responses({"type": "message", "role": "user", "content": "x"}, {"type": "function_call", "call_id": "1",
                                                                     "name": "f"}), "input[1].arguments"),
    (responses({"type": "function_call_output", "call_id": "1"}), "input[0].output"),
    (responses({"type": "function_call_output", "output": "x"}), "input[0].call_id"),          # official API
    (responses({"type": "message", "role": "user", "content": "x"}, {"type": "reasoning", "id": "r"}),
     "input[1].summary"),                                                                       # official API
    (responses({"type": "custom_tool_call", "call_id": "1", "name": "apply_patch"}), "input[0].input"),
    (responses({"type": "custom_tool_call_output", "output": "x"}), "input[0].call_id"),
    (("ResponsesRequest", {"model": V4, "input": "x", "tools": [{"type": "function"}]}), "name"),
    (("ResponsesRequest", {"model": V4, "input": "x", "tools": [{"type": "function", "name": ""}]}), "tools[0].name"),
]


@pytest.mark.parametrize("case", MISSING, ids=[c[-1] for c in MISSING])
def test_a_missing_required_field_is_a_conversion_error_naming_it(case):
    (api, body), field = case
    with pytest.raises(K.ConversionError) as info:
        req = getattr(K, api)(body).convert(K.ConversionOptions())
        req.model_version.encoding().render_conversation(req.conversation)
    assert field in (info.value.param or ""), (info.value.param, str(info.value))
    assert info.value.status_code == 400


@pytest.mark.parametrize("case", [
    chat(U, {"role": "assistant", "content": None, "tool_calls": [CALL]},
         {"role": "tool", "tool_call_id": "c1", "content": "r"}),
    chat({"role": "system", "content": ""}, {"role": "user", "content": ""}),
    assistant_blocks({"type": "thinking", "thinking": "t"}, {"type": "text", "text": ""}),  # no signature: fine
    responses({"type": "message", "role": "user", "content": "x"}, {"type": "reasoning", "summary": []},
              {"type": "function_call", "call_id": "1", "name": "f", "arguments": "{}"},
              {"type": "function_call_output", "call_id": "1", "output": ""}),
])
def test_complete_messages_still_convert(case):
    """The other side of the rule: null is not missing where the API allows it, and empty
    strings are values."""
    api, body = case
    req = getattr(K, api)(body).convert(K.ConversionOptions())
    req.model_version.encoding().render_conversation(req.conversation)


def test_plain_tool_message_without_id_takes_the_checking_path():
    """The plain-chat fast path skips validation; a tool message must not slip through it."""
    with pytest.raises(K.ConversionError, match="tool_call_id"):
        K.ChatCompletionRequest({"model": V4, "messages": [U, {"role": "tool", "content": "r"}]}).convert(
            K.ConversionOptions())


def test_unknown_model_error_lists_the_accepted_names():
    for api, body in (chat(U, model="gpt-4o"), anthropic(U, model="gpt-4o"), responses(U, model="gpt-4o")):
        with pytest.raises(K.ConversionError) as info:
            getattr(K, api)(body).convert(K.ConversionOptions())
        assert info.value.param == "model" and "gpt-4o" in str(info.value)
        for name in DEFAULT_MODEL_VERSIONS:
            assert name in str(info.value)
    options = K.ConversionOptions().with_model_alias("mine", K.ModelVersion.DeepseekV4Pro)
    with pytest.raises(K.ConversionError, match="DeepSeek-V4-Pro, DeepSeek-V4.1-Flash, mine, but you passed x"):
        K.ChatCompletionRequest({"model": "x", "messages": [U]}).convert(options)


@pytest.mark.parametrize("api,body", [
    chat({"role": "system", "content": "S"}, U, tools=[{"type": "function", "function": {"name": "f"}}]),
    anthropic(U, system="S"),
    responses({"type": "message", "role": "user", "content": "hi"}, instructions="S"),
])
def test_pydantic_style_constructors_equal_the_plain_one(api, body):
    cls = getattr(K, api)
    prompts = []
    for req in (cls(body), cls.model_validate(body), cls.model_validate_json(json.dumps(body)),
                cls.model_validate_json(json.dumps(body).encode())):
        conv = req.convert(K.ConversionOptions())
        prompts.append(conv.model_version.encoding().render_conversation(conv.conversation).prompt)
    assert len(set(prompts)) == 1 and "S" in prompts[0]
    with pytest.raises(K.ConversionError):
        cls.model_validate({"model": V4})
    with pytest.raises(K.ConversionError, match="JSON text"):
        cls.model_validate_json(body)


def test_direct_api_errors_are_recipe_errors_and_keep_their_builtin_class():
    cases = [(lambda: K.ToolDefinition(""), ValueError), (lambda: K.Conversation(tool_choice="bad"), ValueError),
             (lambda: K.Conversation([object()]), TypeError), (lambda: K.UserMessage(3), TypeError),
             (lambda: K.InferenceChunk.finish("later"), ValueError), (lambda: K.InferenceChunk.text(b"x"), TypeError),
             (lambda: K.PromptUsage(prompt_tokens=-1), ValueError), (lambda: K.ParsingOptions(stop_sequences=[""]),
                                                                     ValueError)]
    for make, builtin in cases:
        with pytest.raises(K.RecipeError) as info:
            make()
        assert isinstance(info.value, builtin)
