"""OpenAI Chat Completions request → Conversation.

Accepts the official roles, including `developer` (treated as `system`, as OpenAI
does; deepseek-recipe rejects it), plus DeepSeek's `latest_reminder` role,
`reasoning_content` (alias `reasoning`), assistant `prefix` and `thinking`.
"""
from typing import Annotated, Any, Literal, Union

import pydantic

from ..conversation import (AssistantMessage, LatestReminderMessage, SystemMessage, ToolCall,
                            ToolDefinition, ToolMessage, UserMessage)
from ..errors import ConversionError, UnsupportedFeatureError
from ..options import ConversionOptions, ConversationRequest
from .common import Parts, Strict, assemble, image_source, map_effort, text_of_parts, validate


class TextPart(Strict):
    type: Literal["text"]
    text: str


class ImageUrl(Strict):
    url: str
    detail: Literal["low", "high", "auto", "original"] = "auto"


class ImagePart(Strict):
    type: Literal["image_url"]
    image_url: ImageUrl


class OtherPart(pydantic.BaseModel):
    """Audio, file, refusal...: kept only to name them in the error."""

    model_config = pydantic.ConfigDict(extra="allow")
    type: str


Part = Union[TextPart, ImagePart, OtherPart]


class FunctionCall(Strict):
    name: str
    arguments: str


class ToolCallItem(Strict):
    id: str | None = None
    type: Literal["function"] = "function"
    function: FunctionCall


class ChatMessage(Strict):
    role: Literal["system", "developer", "user", "assistant", "tool", "latest_reminder"]
    content: str | list[Part] | None = None
    name: str | None = None
    reasoning_content: str | None = None
    reasoning: str | None = None
    tool_calls: list[ToolCallItem] | None = None
    tool_call_id: str | None = None
    prefix: bool = False
    refusal: str | None = None


class FunctionDef(Strict):
    name: str
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class Tool(Strict):
    type: Literal["function"]
    function: FunctionDef


class NamedFunction(Strict):
    name: str


class NamedToolChoice(Strict):
    type: Literal["function"]
    function: NamedFunction


class JsonSchemaSpec(Strict):
    name: str
    description: str | None = None
    schema_: dict[str, Any] | None = pydantic.Field(default=None, alias="schema")
    strict: bool | None = None


class ResponseFormat(Strict):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaSpec | None = None


class Thinking(Strict):
    type: Literal["enabled", "disabled"]


class StreamOptions(Strict):
    include_usage: bool = False


class ChatBody(Strict):
    model: str
    messages: list[ChatMessage]
    tools: list[Tool] | None = None
    tool_choice: Literal["auto", "none", "required"] | NamedToolChoice | None = None
    parallel_tool_calls: bool | None = None
    reasoning_effort: str | None = None
    thinking: Thinking | None = None
    temperature: float | None = None
    top_p: float | None = None
    max_tokens: int | None = None
    max_completion_tokens: int | None = None
    stop: str | list[str] | None = None
    seed: int | None = None
    n: int | None = None
    logprobs: bool | None = None
    top_logprobs: int | None = None
    frequency_penalty: float | None = None
    presence_penalty: float | None = None
    response_format: ResponseFormat | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    user: str | None = None
    metadata: dict[str, str] | None = None
    store: bool | None = None


def _reject_unsupported(b: ChatBody):
    if b.n not in (None, 1):
        raise UnsupportedFeatureError("n", "Invalid n value (currently only n = 1 is supported)")
    if b.logprobs:
        raise UnsupportedFeatureError("logprobs")
    if b.top_logprobs:
        raise UnsupportedFeatureError("top_logprobs")
    for name in ("frequency_penalty", "presence_penalty"):
        if getattr(b, name) not in (None, 0, 0.0):
            raise UnsupportedFeatureError(name, "only 0 is supported")
    if b.parallel_tool_calls is False:
        raise UnsupportedFeatureError("parallel_tool_calls=false", "the model may emit several calls")
    if b.store:
        raise UnsupportedFeatureError("store", "this layer keeps no state")


def _content(m: ChatMessage, i: int, allow_images: bool):
    """Text with image placeholders, and the image sources, of one message's content."""
    from ..tokens import DEFAULT_SPECIAL_TOKENS
    c = m.content
    if c is None:
        return "", []
    if isinstance(c, str):
        return c, []
    texts, images = [], []
    for j, part in enumerate(c):
        path = f"messages[{i}].content[{j}]"
        if isinstance(part, TextPart):
            texts.append(part.text)
        elif isinstance(part, ImagePart) and allow_images:
            detail = part.image_url.detail
            images.append(image_source(part.image_url.url, "high" if detail == "auto" else detail, path))
            texts.append(DEFAULT_SPECIAL_TOKENS.image)
        else:
            raise UnsupportedFeatureError(f"{path}.type={part.type}", f"not allowed in a {m.role} message")
    return "\n\n".join(texts), images


def _messages(b: ChatBody):
    out = []
    for i, m in enumerate(b.messages):
        if m.name is not None:
            raise UnsupportedFeatureError(f"messages[{i}].name", "participant names are not rendered")
        role = m.role
        if role != "assistant" and (m.tool_calls or m.reasoning_content or m.reasoning or m.prefix):
            raise ConversionError(f"messages[{i}]: tool_calls, reasoning_content and prefix belong "
                                  "to assistant messages", param=f"messages[{i}]")
        if role != "tool" and m.tool_call_id is not None:
            raise ConversionError(f"messages[{i}]: tool_call_id belongs to tool messages",
                                  param=f"messages[{i}].tool_call_id")
        if role in ("system", "developer"):
            text, _ = _content(m, i, allow_images=False)
            if text:  # an empty system message renders nothing useful; deepseek-recipe drops it too
                out.append(SystemMessage(text))
        elif role == "user":
            text, images = _content(m, i, allow_images=True)
            out.append(UserMessage(text, images))
        elif role == "latest_reminder":
            out.append(LatestReminderMessage(_content(m, i, allow_images=False)[0]))
        elif role == "tool":
            text, images = _content(m, i, allow_images=True)
            out.append(ToolMessage(text, m.tool_call_id, images))
        else:
            if m.refusal is not None:
                raise UnsupportedFeatureError(f"messages[{i}].refusal")
            if m.reasoning_content is not None and m.reasoning is not None \
                    and m.reasoning_content != m.reasoning:
                raise ConversionError(f"messages[{i}]: reasoning and reasoning_content differ",
                                      param=f"messages[{i}].reasoning_content")
            text = m.content if isinstance(m.content, str) or m.content is None else \
                text_of_parts(m.content, f"messages[{i}].content")
            calls = [ToolCall(tc.id or f"call_{i}_{k}", tc.function.name, tc.function.arguments)
                     for k, tc in enumerate(m.tool_calls or ())]
            out.append(AssistantMessage(text or "", m.reasoning_content if m.reasoning_content is not None
                                        else m.reasoning, calls, prefix=m.prefix))
    return out


class ChatCompletionRequest:
    """A Chat Completions request body; `convert` yields a ConversationRequest."""

    def __init__(self, body):
        self._body = validate(ChatBody, body)

    @property
    def model(self) -> str:
        return self._body.model

    def convert(self, options: ConversionOptions) -> ConversationRequest:
        b = self._body
        _reject_unsupported(b)
        thinking, effort = map_effort(b.reasoning_effort, "reasoning_effort")
        if b.thinking is not None:
            wanted = b.thinking.type == "enabled"
            if thinking is not None and thinking != wanted:
                raise ConversionError("thinking and reasoning_effort disagree", param="thinking")
            thinking = wanted
        if b.max_tokens is not None and b.max_completion_tokens is not None:
            raise ConversionError("give max_tokens or max_completion_tokens, not both", param="max_tokens")
        choice, forced = "auto", None
        if isinstance(b.tool_choice, NamedToolChoice):
            forced = b.tool_choice.function.name
        elif b.tool_choice is not None:
            choice = b.tool_choice
        fmt, schema = "text", None
        if b.response_format is not None:
            fmt = b.response_format.type
            if fmt == "json_schema":
                if b.response_format.json_schema is None or b.response_format.json_schema.schema_ is None:
                    raise ConversionError("response_format json_schema needs json_schema.schema",
                                          param="response_format")
                schema = b.response_format.json_schema.schema_
        parts = Parts(
            model=b.model, messages=_messages(b),
            tools=[ToolDefinition(t.function.name, t.function.description, t.function.parameters,
                                  t.function.strict) for t in b.tools or ()],
            tool_choice=choice, forced_tool=forced, thinking=thinking, effort=effort,
            temperature=b.temperature, top_p=b.top_p,
            max_tokens=b.max_tokens if b.max_tokens is not None else b.max_completion_tokens,
            stop=[b.stop] if isinstance(b.stop, str) else list(b.stop or ()), seed=b.seed,
            response_format=fmt, response_schema=schema, stream=b.stream,
            include_usage=bool(b.stream_options and b.stream_options.include_usage))
        return assemble(parts, options)

    @staticmethod
    def chunk_generator(request: ConversationRequest, id: str, model: str):
        from ..chat_out import ChatCompletionChunkGenerator
        return ChatCompletionChunkGenerator(id, model, request)
