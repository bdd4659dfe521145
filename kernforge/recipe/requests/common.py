"""Conversion steps shared by the three protocol front ends.

Each front end validates its own request shape and turns it into messages and
settings; `assemble` applies the cross-API rules (model table, thinking mode,
tool choice, limits, output constraints, parsing options) in one place.
"""
import json
from dataclasses import dataclass, field
from typing import Any

import pydantic

from ..conversation import (AssistantMessage, Conversation, DataUrlImageSource, Message, ToolDefinition,
                            UrlImageSource)
from ..errors import ConversionError, UnsupportedFeatureError
from ..options import (ConversationRequest, ConversionOptions, InferenceOptions, ModelVersion,
                       OutputConstraint, ParsingOptions, ReasoningContentBehavior,
                       ThinkingInitialStage)

_COMPACT = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"))

# OpenAI effort words mapped onto the model's three budgets; "none" turns thinking off.
EFFORT_WORDS = {"minimal": "low", "low": "low", "medium": "high", "high": "high",
                "xhigh": "xhigh", "max": "max"}


FORBID_EXTRA = pydantic.ConfigDict(extra="forbid")


class Strict(pydantic.BaseModel):
    """Request models forbid unknown fields: an unknown field is never silently ignored."""

    model_config = pydantic.ConfigDict(extra="forbid", frozen=False)


def validate(model_cls, body) -> Any:
    """Parse a body (dict, JSON str or bytes) into `model_cls`, as a ConversionError on failure."""
    try:
        if isinstance(body, (str, bytes, bytearray)):
            return model_cls.model_validate_json(body)
        if not isinstance(body, dict):
            raise ConversionError(f"request body must be a JSON object, got {type(body).__name__}")
        return model_cls.model_validate(body)
    except pydantic.ValidationError as exc:
        raise conversion_error(exc) from None


_TYPE_LABELS = frozenset(("str", "int", "float", "bool", "none", "dict", "list"))


def _field_path(loc: tuple) -> str:
    """A pydantic error location as the client wrote it: union-member labels (``str``,
    ``list[...]``) dropped, and a tagged union's tag, which repeats the field name
    (``text.text``), said once."""
    parts: list = []
    for p in loc:
        if isinstance(p, str) and (p in _TYPE_LABELS or "[" in p or "-" in p):
            continue
        if parts and p == parts[-1] and isinstance(p, str):
            continue
        parts.append(p)
    return ".".join(str(p) for p in parts)


def conversion_error(exc: pydantic.ValidationError, prefix: str = "") -> ConversionError:
    """The typed error for a failed validation.  Of a union's failed branches the one
    that got deepest is reported (a content list missing a part's ``text`` says so,
    not "content should be a valid string")."""
    errors = exc.errors()
    err = max(errors, key=lambda e: len(e["loc"]))
    loc = ".".join(x for x in (prefix, _field_path(err["loc"])) if x)
    if err["type"] == "extra_forbidden":
        return UnsupportedFeatureError(loc, "unknown or unsupported field")
    return ConversionError(f"invalid request: {loc}: {err['msg']}", param=loc or None)


class PydanticStyle:
    """The pydantic-style constructors beside `Cls(body)`: `Cls.model_validate(dict)` and
    `Cls.model_validate_json(text)`, so code written for pydantic request models (and
    deepseek-recipe's) works unchanged.  Both validate exactly as `Cls(body)` does."""

    @classmethod
    def model_validate(cls, body):
        return cls(body)

    @classmethod
    def model_validate_json(cls, data):
        if not isinstance(data, (str, bytes, bytearray)):
            raise ConversionError(f"request body must be JSON text, got {type(data).__name__}")
        return cls(data)


def tool_definition(path: str, name, *rest) -> ToolDefinition:
    """A ToolDefinition from a request: an empty tool name is the client's error (400)."""
    if not name:
        raise ConversionError(f"Invalid '{path}': empty string. Expected a non-empty tool name", param=path)
    return ToolDefinition(name, *rest)


def map_effort(word: str | None, where: str) -> tuple[bool | None, str | None]:
    """(thinking override, effort) for an OpenAI-style effort word."""
    if word is None:
        return None, None
    if word == "none":
        return False, None
    try:
        return True, EFFORT_WORDS[word]
    except KeyError:
        raise ConversionError(f"unknown {where} {word!r}", param=where) from None


@dataclass
class Parts:
    """What a front end extracted from its request, before the shared rules run."""

    model: str
    messages: list[Message]
    tools: list[ToolDefinition] = field(default_factory=list)
    tool_choice: str = "auto"          # auto | none | required
    forced_tool: str | None = None     # a named tool choice
    thinking: bool | None = None
    effort: str | None = None
    temperature: float | None = None
    top_p: float | None = None
    max_tokens: int | None = None
    clamp_max_tokens: bool = False     # Messages lowers too-large max_tokens instead of rejecting
    stop: list[str] = field(default_factory=list)
    seed: int | None = None
    response_format: str = "text"      # text | json_object | json_schema | regex
    response_schema: Any = None
    response_regex: str | None = None
    stream: bool = False
    echo: Any = None
    namespace_tool_map: dict = field(default_factory=dict)


def _check_unique_tools(tools: list[ToolDefinition]):
    seen = set()
    for t in tools:
        if t.name in seen:
            raise ConversionError(f"duplicate tool name {t.name!r}", param="tools")
        seen.add(t.name)


def _mentions_json(messages: list[Message]) -> bool:
    return any("json" in m.content.lower() for m in messages)


def assemble(p: Parts, options: ConversionOptions) -> ConversationRequest:
    version = options.resolve_model(p.model)
    thinking = options.default_thinking_mode if p.thinking is None else p.thinking
    effort = p.effort if thinking else None
    tools = p.tools
    for tool in tools:
        if tool.parameters is None:
            tool.parameters = {}  # an omitted schema means "no parameters", as in the official APIs
    if len(tools) > 1:
        _check_unique_tools(tools)
    choice = p.tool_choice
    if p.forced_tool is not None:
        if thinking:
            raise ConversionError("Thinking mode does not support this tool_choice", param="tool_choice")
        named = [t for t in tools if t.name == p.forced_tool]
        if not named:
            raise ConversionError(f"tool_choice names {p.forced_tool!r}, which is not a declared tool",
                                  param="tool_choice")
        tools, choice = named, "required"
    if choice == "required":
        if thinking:
            raise ConversionError("Thinking mode does not support this tool_choice", param="tool_choice")
        if not tools:
            raise ConversionError("tool_choice 'required' needs at least one tool", param="tool_choice")

    bound = options.thinking_max_tokens_upper_bound if thinking else options.non_thinking_max_tokens_upper_bound
    max_tokens = p.max_tokens
    if max_tokens is not None:
        if max_tokens < 1:
            raise ConversionError(f"Invalid max_tokens value, the valid range of max_tokens is [1, {bound}]",
                                  param="max_tokens")
        if max_tokens > bound:
            if not p.clamp_max_tokens:
                raise ConversionError(
                    f"Invalid max_tokens value, the valid range of max_tokens is [1, {bound}]",
                    param="max_tokens")
            max_tokens = bound
    if p.temperature is not None and not 0.0 <= p.temperature <= 2.0:
        raise ConversionError("temperature must be in [0, 2]", param="temperature")
    if p.top_p is not None and not 0.0 < p.top_p <= 1.0:
        raise ConversionError("top_p must be in (0, 1]", param="top_p")
    if not all(p.stop):
        raise ConversionError("stop sequences must be non-empty strings", param="stop")
    if p.seed is not None and not 0 <= p.seed < 2 ** 63:
        raise ConversionError("seed must be in [0, 2^63)", param="seed")
    if p.response_format == "json_object" and not _mentions_json(p.messages):
        raise ConversionError("Prompt must contain the word 'json' in some form to use 'response_format' "
                              "of type 'json_object'.", param="response_format")
    messages = p.messages
    if not messages:
        raise ConversionError("messages must not be empty", param="messages")
    for i, m in enumerate(messages if version is ModelVersion.DeepseekV4Pro else ()):
        if m.image_sources:
            raise UnsupportedFeatureError("image input", f"model {p.model} (DeepSeek V4) has no vision input; "
                                          f"image at {m.image_sources[0].path or f'messages[{i}]'}")
    last = messages[-1]
    if thinking:
        _pass_back_reasoning(messages, bool(tools) and choice != "none", options)
    else:
        # Outside thinking mode the model never sees reasoning (the format has no place for it).
        for m in messages:
            if m.reasoning_content is not None:
                m.reasoning_content = None

    conv = Conversation(messages, thinking_mode=thinking, tools=tools, tool_choice=choice,
                        reasoning_effort=effort,
                        response_format="json_object" if p.response_format == "json_object" else "text",
                        response_schema=p.response_schema, response_regex=p.response_regex)

    use_tools = bool(tools) and choice != "none"
    constraint = None
    if use_tools:
        kind = "tool_call_required" if choice == "required" else "tool_call"
        constraint = OutputConstraint(kind, build=lambda: _COMPACT.encode([t.to_chat_tool() for t in tools]))
    elif p.response_format == "json_schema":
        schema = p.response_schema
        constraint = OutputConstraint("json", build=lambda: _COMPACT.encode(schema))
    elif p.response_format == "json_object":
        constraint = OutputConstraint("json", "")
    elif p.response_format == "regex":
        constraint = OutputConstraint("regex", p.response_regex)
    inference = InferenceOptions(
        max_tokens=max_tokens,
        temperature=1.0 if thinking or p.temperature is None else p.temperature,
        top_p=1.0 if thinking or p.top_p is None else p.top_p,
        seed=p.seed, output_constraint=constraint,
        requested_temperature=p.temperature, requested_top_p=p.top_p)

    stage = None
    if thinking:
        stage = ThinkingInitialStage.ReasoningStart
        if last.prefix and (last.content or last.tool_calls):
            stage = ThinkingInitialStage.ContentContinuation
        elif last.prefix and last.reasoning_content:
            stage = ThinkingInitialStage.ReasoningContinuation
    parsing = ParsingOptions(parse_tool_calls=use_tools, starts_in_tool_calls=choice == "required",
                             parse_json_output=False, thinking_initial_stage=stage, stop_sequences=p.stop,
                             special_tokens=options.special_tokens)
    return ConversationRequest(conv, version, inference_options=inference, parsing_options=parsing,
                               stream=p.stream, model=p.model, echo=p.echo,
                               namespace_tool_map=p.namespace_tool_map)


def _pass_back_reasoning(messages: list[Message], has_tools: bool, options: ConversionOptions):
    """Fill or reject missing reasoning on assistant turns whose reasoning the prompt keeps.

    With tools every turn keeps its reasoning; without, only turns after the last
    user message do (earlier reasoning is dropped by the encoder). `Reject` applies
    to turns after the last user message: the running tool loop, where DeepSeek
    requires the reasoning to be passed back.
    """
    last_user = -1
    for i, m in enumerate(messages):
        if m.role == "user":
            last_user = i
    for i, m in enumerate(messages):
        if not isinstance(m, AssistantMessage) or m.reasoning_content is not None:
            continue
        if i < last_user and not has_tools:
            continue
        if i > last_user and not m.prefix and options.reasoning_content_behavior is ReasoningContentBehavior.Reject:
            raise ConversionError(
                f"messages[{i}]: the reasoning_content of an assistant message must be passed back "
                "in thinking mode", param=f"messages[{i}].reasoning_content")
        m.reasoning_content = ""


def image_source(url: str, detail: str, path: str):
    """An ImageSource for an OpenAI-style image URL (data: URLs carry the bytes inline)."""
    if url.startswith("data:"):
        return DataUrlImageSource(url, detail, path=path)
    if url.startswith(("http://", "https://")):
        return UrlImageSource(url, detail, path=path)
    raise ConversionError(f"{path}: image URL must be an http(s) or data: URL", param=path)
