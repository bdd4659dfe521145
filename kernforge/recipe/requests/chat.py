"""OpenAI Chat Completions request → Conversation.

Accepts the official roles, including `developer` (treated as `system`, as OpenAI
does; deepseek-recipe rejects it), plus DeepSeek's `latest_reminder` role,
`reasoning_content` (alias `reasoning`), assistant `prefix` and `thinking`.
"""
from typing import Annotated, Any, Literal, Union

import pydantic
from typing_extensions import NotRequired, Required, TypedDict

from ..chat_out import ChatCompletionChunkGenerator
from ..conversation import (AssistantMessage, LatestReminderMessage, SystemMessage, ToolCall, ToolMessage,
                            UserMessage)
from ..errors import ConversionError, UnsupportedFeatureError
from ..options import ConversionOptions, ConversationRequest
from ..tokens import DEFAULT_SPECIAL_TOKENS
from .common import (FORBID_EXTRA, Parts, PydanticStyle, Strict, assemble, image_source, map_effort,
                     tool_definition, validate)

IMAGE_TOKEN = DEFAULT_SPECIAL_TOKENS.image


class TextPart(TypedDict):
    type: Literal["text"]
    text: str


class ImageUrl(TypedDict):
    url: str
    detail: NotRequired[Literal["low", "high", "auto", "original"]]


class ImagePart(TypedDict):
    type: Literal["image_url"]
    image_url: ImageUrl


class OtherPart(TypedDict, total=False):
    """Audio, file, refusal...: validated only far enough to name them in the error."""

    type: Required[str]


def _part_kind(value) -> str:
    kind = value.get("type") if isinstance(value, dict) else None
    return kind if kind in ("text", "image_url") else "other"


Part = Annotated[Union[Annotated[TextPart, pydantic.Tag("text")], Annotated[ImagePart, pydantic.Tag("image_url")],
                       Annotated[OtherPart, pydantic.Tag("other")]], pydantic.Discriminator(_part_kind)]


class FunctionCall(TypedDict):
    name: str
    arguments: str


class ToolCallItem(TypedDict):
    id: str                     # required, as in the official API (deepseek-recipe too)
    type: Literal["function"]
    function: FunctionCall


class ChatMessage(TypedDict):
    """One message; a TypedDict, not a model, because long histories validate 3x faster."""

    role: Literal["system", "developer", "user", "assistant", "tool", "latest_reminder"]
    content: NotRequired[str | list[Part] | None]
    name: NotRequired[str | None]
    reasoning_content: NotRequired[str | None]
    reasoning: NotRequired[str | None]
    tool_calls: NotRequired[list[ToolCallItem] | None]
    tool_call_id: NotRequired[str | None]
    prefix: NotRequired[bool]
    refusal: NotRequired[str | None]


class FunctionDef(TypedDict):
    name: str
    description: NotRequired[str | None]
    parameters: NotRequired[dict[str, Any] | None]
    strict: NotRequired[bool | None]


class Tool(TypedDict):
    type: Literal["function"]
    function: FunctionDef


for _td in (TextPart, ImageUrl, ImagePart, FunctionCall, ToolCallItem, ChatMessage, FunctionDef, Tool):
    _td.__pydantic_config__ = FORBID_EXTRA
OtherPart.__pydantic_config__ = pydantic.ConfigDict(extra="allow")


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
    c = m.get("content")
    if c is None:
        return "", ()
    if isinstance(c, str):
        return c, ()
    texts, images = [], []
    for j, part in enumerate(c):
        kind = part["type"]
        if kind == "text":
            texts.append(part["text"])
        elif kind == "image_url" and allow_images:
            path = f"messages[{i}].content[{j}]"
            detail = part["image_url"].get("detail", "auto")
            images.append(image_source(part["image_url"]["url"], "high" if detail == "auto" else detail, path))
            texts.append(IMAGE_TOKEN)
        else:
            raise UnsupportedFeatureError(f"messages[{i}].content[{j}].type={kind}",
                                          f"not allowed in a {m['role']} message")
    return "\n\n".join(texts), images


_ROLE_KEYS = {
    "user": frozenset(("role", "content")),
    "system": frozenset(("role", "content")),
    "developer": frozenset(("role", "content")),
    "latest_reminder": frozenset(("role", "content")),
    "tool": frozenset(("role", "content", "tool_call_id")),
    "assistant": frozenset(("role", "content", "reasoning_content", "reasoning", "tool_calls", "prefix")),
}


# Fields the official API requires (and deepseek-recipe too), per role: present and not null.
_REQUIRED = {"user": ("content",), "system": ("content",), "developer": ("content",),
             "latest_reminder": ("content",), "tool": ("content", "tool_call_id"), "assistant": ()}


def _check_required(m: ChatMessage, i: int):
    role = m["role"]
    for key in _REQUIRED[role]:
        if m.get(key) is None:
            raise ConversionError(f"messages[{i}]: a {role} message needs {key!r}", param=f"messages[{i}].{key}")
    if role == "assistant" and m.get("content") is None and not m.get("tool_calls"):
        raise ConversionError(f"messages[{i}]: an assistant message needs content or tool_calls",
                              param=f"messages[{i}].content")


def _check_keys(m: ChatMessage, i: int):
    """Reject fields that do not belong to the message's role (null/false values are harmless)."""
    for key in m.keys() - _ROLE_KEYS[m["role"]]:
        value = m[key]
        if value is None or value is False:
            continue
        if key == "name":
            raise UnsupportedFeatureError(f"messages[{i}].name", "participant names are not rendered")
        if key == "refusal":
            raise UnsupportedFeatureError(f"messages[{i}].refusal")
        raise ConversionError(f"messages[{i}]: {key} does not belong to a {m['role']} message",
                              param=f"messages[{i}].{key}")


def _messages(b: ChatBody):
    out = []
    append = out.append
    for i, m in enumerate(b.messages):
        role = m["role"]
        if not m.keys() <= _ROLE_KEYS[role]:
            _check_keys(m, i)
        _check_required(m, i)
        content = m.get("content")
        if type(content) is str:
            images = ()
        else:
            content, images = _content(m, i, allow_images=role in ("user", "tool"))
        if role == "user":
            append(UserMessage(content, images))
        elif role == "assistant":
            reasoning = m.get("reasoning_content")
            alias = m.get("reasoning")
            if reasoning is None:
                reasoning = alias
            elif alias is not None and reasoning != alias:
                raise ConversionError(f"messages[{i}]: reasoning and reasoning_content differ",
                                      param=f"messages[{i}].reasoning_content")
            calls = m.get("tool_calls")
            if calls:
                calls = [ToolCall(tc["id"], tc["function"]["name"], tc["function"]["arguments"])
                         for tc in calls]
            append(AssistantMessage(content, reasoning, calls, prefix=m.get("prefix", False)))
        elif role == "tool":
            append(ToolMessage(content, m.get("tool_call_id"), images))
        elif role == "latest_reminder":
            append(LatestReminderMessage(content))
        elif content:  # system, developer; an empty system message renders nothing (deepseek-recipe drops it too)
            append(SystemMessage(content))
    return out


_PLAIN_BODY_KEYS = frozenset(("model", "messages", "stream"))
_PLAIN_MESSAGE_KEYS = frozenset(("role", "content"))
# not "tool": a tool message needs a tool_call_id, which a plain message lacks
_PLAIN_ROLES = frozenset(("user", "assistant", "system", "developer", "latest_reminder"))


def _plain_messages(body) -> tuple | None:
    """`(role, content)` pairs if `body` is a plain chat, else None.

    A plain chat has only `model`, `messages` and `stream`, and every message is
    exactly `{"role": <known role>, "content": <str>}` (exact built-in types). For
    such a body `ChatBody` validation cannot fail or change a value, so it is
    skipped: it costs more than everything else in a short request. Anything else,
    valid or not, takes the validating path.
    """
    if type(body) is not dict or not body.keys() <= _PLAIN_BODY_KEYS or type(body.get("model")) is not str \
            or type(body.get("stream", False)) is not bool:
        return None
    messages = body.get("messages")
    if type(messages) is not list:
        return None
    pairs = []
    for m in messages:
        if type(m) is not dict or m.keys() != _PLAIN_MESSAGE_KEYS:
            return None
        role, content = m["role"], m["content"]
        if type(role) is not str or role not in _PLAIN_ROLES or type(content) is not str:
            return None
        pairs.append((role, content))
    return tuple(pairs)


def _plain_parts(model: str, pairs: tuple, stream: bool) -> Parts:
    """`Parts` of a plain chat: what `convert` extracts when every other field is unset."""
    out = []
    for role, content in pairs:
        if role == "assistant":
            out.append(AssistantMessage(content, None, None, prefix=False))
        elif role in ("system", "developer"):
            if content:  # as in `_messages`: an empty system message renders nothing
                out.append(SystemMessage(content))
        elif role == "latest_reminder":
            out.append(LatestReminderMessage(content))
        else:
            out.append(UserMessage(content, ()))
    return Parts(model=model, messages=out, stream=stream)


class ChatCompletionRequest(PydanticStyle):
    """A Chat Completions request body; `convert` yields a ConversationRequest."""

    def __init__(self, body):
        self._plain = _plain_messages(body)
        if self._plain is None:
            self._body = validate(ChatBody, body)
        else:  # immutable snapshot: later edits of `body` must not change the request
            self._body = None
            self._model, self._stream = body["model"], body.get("stream", False)

    @property
    def model(self) -> str:
        return self._model if self._body is None else self._body.model

    def convert(self, options: ConversionOptions) -> ConversationRequest:
        if self._body is None:
            return assemble(_plain_parts(self._model, self._plain, self._stream), options)
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
            tools=[tool_definition(f"tools[{i}].function.name", t["function"]["name"],
                                   t["function"].get("description"), t["function"].get("parameters"),
                                   t["function"].get("strict"))
                   for i, t in enumerate(b.tools or ())],
            tool_choice=choice, forced_tool=forced, thinking=thinking, effort=effort,
            temperature=b.temperature, top_p=b.top_p,
            max_tokens=b.max_tokens if b.max_tokens is not None else b.max_completion_tokens,
            stop=[b.stop] if isinstance(b.stop, str) else list(b.stop or ()), seed=b.seed,
            response_format=fmt, response_schema=schema, stream=b.stream)
        return assemble(parts, options)

    @staticmethod
    def chunk_generator(request: ConversationRequest, id: str, model: str):
        return ChatCompletionChunkGenerator(id, model, request)
