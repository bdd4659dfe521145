"""Our responses and stream events must load into the official openai/anthropic SDK types."""
import json

import pydantic
import pytest

import kernforge.recipe as K
from kernforge.recipe.dsml import V41_DSML

from .conftest import chunked, drive
from .test_parser import dsml_block

openai_types = pytest.importorskip("openai.types")
from anthropic.types import Message, RawMessageStreamEvent  # noqa: E402
from openai.types.chat import ChatCompletion, ChatCompletionChunk  # noqa: E402
from openai.types.responses import Response, ResponseStreamEvent  # noqa: E402

RAW = "Think.</think>Hello there.\n\n" + dsml_block([("get_weather", [("city", "Oslo"), ("days", 2)]),
                                                     ("get_weather", [("city", "Rome")])], V41_DSML)
MODEL = "DeepSeek-V4.1-Flash"
FN = {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}}}


@pytest.mark.parametrize("finish", [K.InferenceFinishReason.Stop, K.InferenceFinishReason.Length])
def test_chat_chunks_and_completion(finish):
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "stream": True,
            "tools": [{"type": "function", "function": {"name": "get_weather", "parameters": FN}}]}
    req = K.ChatCompletionRequest(body).convert(K.ConversionOptions())
    out, _ = drive(K.ChatCompletionRequest.chunk_generator(req, "chatcmpl-9", MODEL), req.parsing_options,
                   chunked(RAW, 6), finish=finish)
    acc = K.ChatCompletionResponse("chatcmpl-9", MODEL, 1, 7, 0)
    for c in out:
        chunk = ChatCompletionChunk.model_validate(c.data)
        assert chunk.object == "chat.completion.chunk"
        acc.accumulate(c)
    assert K.ChatCompletionResponse.sse_done_data() == "[DONE]"
    done = ChatCompletion.model_validate(acc.to_dict())
    assert done.choices[0].message.content == "Hello there."
    assert [json.loads(t.function.arguments) for t in done.choices[0].message.tool_calls] == \
        [{"city": "Oslo", "days": 2}, {"city": "Rome"}]
    assert done.choices[0].finish_reason == ("tool_calls" if finish is K.InferenceFinishReason.Stop else "length")
    assert done.usage.prompt_tokens == 7 and done.usage.completion_tokens == len(chunked(RAW, 6))


def test_responses_events_and_response():
    body = {"model": MODEL, "input": "hi", "stream": True, "instructions": "Be brief.",
            "tools": [{"type": "function", "name": "get_weather", "parameters": FN}]}
    req = K.ResponsesRequest(body).convert(K.ConversionOptions())
    out, _ = drive(K.ResponsesRequest.chunk_generator(req, "resp_9", MODEL), req.parsing_options,
                   chunked(RAW, 5))
    adapter = pydantic.TypeAdapter(ResponseStreamEvent)
    acc = K.ResponsesResponse("resp_9", MODEL, 1, 7, 0)
    for e in out:
        ev = adapter.validate_python(e.data)
        assert ev.type == e.data["type"] and ev.sequence_number == e.data["sequence_number"]
        acc.accumulate(e)
    resp = Response.model_validate(acc.to_dict())
    assert resp.status == "completed" and resp.instructions == "Be brief."
    assert [o.type for o in resp.output] == ["reasoning", "message", "function_call", "function_call"]
    assert resp.output_text == "Hello there."
    assert json.loads(resp.output[2].arguments) == {"city": "Oslo", "days": 2}
    assert resp.output[2].call_id != resp.output[3].call_id


def test_anthropic_events_and_message():
    body = {"model": MODEL, "max_tokens": 50, "messages": [{"role": "user", "content": "hi"}], "stream": True,
            "tools": [{"name": "get_weather", "input_schema": FN}]}
    req = K.MessagesRequest(body).convert(K.ConversionOptions())
    out, _ = drive(K.MessagesRequest.chunk_generator(req, "msg_9", MODEL), req.parsing_options,
                   chunked(RAW, 4))
    adapter = pydantic.TypeAdapter(RawMessageStreamEvent)
    acc = K.MessagesResponse("msg_9", MODEL, 1, 7, 0)
    for e in out:
        if e.data["type"] == "ping":  # a wire-level keep-alive, not in the typed union
            continue
        ev = adapter.validate_python(e.data)
        assert ev.type == e.data["type"]
        acc.accumulate(e)
    msg = Message.model_validate(acc.to_dict())
    assert [b.type for b in msg.content] == ["thinking", "text", "tool_use", "tool_use"]
    assert msg.content[0].thinking == "Think." and msg.content[0].signature == "msg_9"
    assert msg.content[2].input == {"city": "Oslo", "days": 2}
    assert msg.stop_reason == "tool_use"
