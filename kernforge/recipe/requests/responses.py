"""OpenAI Responses request → Conversation.

Input items: messages (system/developer/user/assistant), reasoning items,
function and custom (apply_patch) tool calls and their outputs. Tools: function,
namespace (flattened to `namespace__name`) and the apply_patch custom tool.
"""
from typing import Any, Literal, Union

import pydantic

from ..conversation import (AssistantMessage, SystemMessage, ToolCall, ToolDefinition, ToolMessage,
                            UserMessage)
from ..dsml import dump_json
from ..errors import ConversionError, UnsupportedFeatureError
from ..responses_out import ResponsesChunkGenerator
from ..options import ConversionOptions, ConversationRequest, WebSearchBehavior
from ..tokens import DEFAULT_SPECIAL_TOKENS
from .common import (Parts, PydanticStyle, Strict, assemble, conversion_error, image_source, map_effort,
                     tool_definition, validate)

APPLY_PATCH_PARAMETERS = {
    "type": "object", "additionalProperties": False, "required": ["input"],
    "properties": {"input": {"type": "string",
                             "description": "The whole patch, from '*** Begin Patch' to '*** End Patch'."}}}
APPLY_PATCH_DESCRIPTION = (
    "Edit files by applying a patch. The input is one patch envelope: '*** Begin Patch', then "
    "file operations ('*** Add File: <path>' with '+' lines, '*** Delete File: <path>', or "
    "'*** Update File: <path>' with optional '*** Move to: <path>' and '@@' hunks of ' ', '-' and "
    "'+' lines), then '*** End Patch'. Paths are relative.")


class Part(pydantic.BaseModel):
    model_config = pydantic.ConfigDict(extra="forbid")
    type: Literal["input_text", "output_text", "input_image", "reasoning_text", "summary_text",
                  "refusal", "input_file", "input_audio"]
    text: str | None = None
    image_url: str | None = None
    detail: Literal["low", "high", "auto", "original"] = "auto"
    annotations: list | None = None
    logprobs: list | None = None
    file_id: str | None = None


class Item(pydantic.BaseModel):
    """Any input item; fields are checked per type in `_items`."""

    model_config = pydantic.ConfigDict(extra="forbid")
    type: str = "message"
    id: str | None = None
    role: Literal["system", "developer", "user", "assistant"] | None = None
    content: str | list[Part] | None = None
    status: str | None = None
    phase: str | None = None
    summary: list[Part] | None = None
    encrypted_content: str | None = None
    call_id: str | None = None
    name: str | None = None
    namespace: str | None = None
    arguments: str | None = None
    input: str | None = None
    output: str | list[Part] | None = None


class FunctionTool(Strict):
    type: Literal["function"]
    name: str
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None
    defer_loading: bool = False


class NamespaceTool(Strict):
    type: Literal["namespace"]
    name: str
    description: str | None = None
    tools: list[FunctionTool]


class CustomTool(Strict):
    type: Literal["custom"]
    name: str
    description: str | None = None
    format: dict[str, Any] | None = None


class OtherTool(pydantic.BaseModel):
    model_config = pydantic.ConfigDict(extra="allow")
    type: str


class TextFormat(Strict):
    type: Literal["text", "json_object", "json_schema"]
    name: str | None = None
    schema_: dict[str, Any] | None = pydantic.Field(default=None, alias="schema")
    description: str | None = None
    strict: bool | None = None


class TextConfig(Strict):
    format: TextFormat | None = None
    verbosity: str | None = None


class Reasoning(Strict):
    effort: str | None = None
    summary: str | None = None


class NamedTool(Strict):
    type: Literal["function", "custom"]
    name: str


class ResponsesBody(Strict):
    model: str
    input: str | list[Item]
    instructions: str | None = None
    tools: list[Union[FunctionTool, NamespaceTool, CustomTool, OtherTool]] | None = None
    tool_choice: Literal["auto", "none", "required"] | NamedTool | None = None
    parallel_tool_calls: bool | None = None
    reasoning: Reasoning | None = None
    text: TextConfig | None = None
    temperature: float | None = None
    top_p: float | None = None
    max_output_tokens: int | None = None
    stream: bool = False
    store: bool | None = None
    previous_response_id: str | None = None
    include: list[str] | None = None
    metadata: dict[str, str] | None = None
    user: str | None = None
    top_logprobs: int | None = None
    truncation: Literal["disabled"] | None = None
    background: bool | None = None


_TYPED_TOOLS = {"function": FunctionTool, "namespace": NamespaceTool, "custom": CustomTool}


def _tools(b: ResponsesBody, options: ConversionOptions):
    tools, ns_map = [], {}
    for i, t in enumerate(b.tools or ()):
        if isinstance(t, FunctionTool):
            tools.append(tool_definition(f"tools[{i}].name", t.name, t.description, t.parameters, t.strict,
                                         t.defer_loading))
        elif isinstance(t, NamespaceTool):
            if not t.name:
                raise ConversionError(f"Invalid 'tools[{i}].name': empty string", param=f"tools[{i}].name")
            for j, f in enumerate(t.tools):
                if not f.name:
                    raise ConversionError(f"Invalid 'tools[{i}].tools[{j}].name': empty string",
                                          param=f"tools[{i}].tools[{j}].name")
                full = f"{t.name}__{f.name}"
                ns_map[full] = (t.name, f.name)
                tools.append(ToolDefinition(full, f.description, f.parameters, f.strict, f.defer_loading))
        elif isinstance(t, CustomTool):
            if t.name != "apply_patch":
                raise UnsupportedFeatureError(f"tools[{i}]: custom tool {t.name!r}",
                                              "only the apply_patch custom tool is supported")
            tools.append(ToolDefinition("apply_patch", t.description or APPLY_PATCH_DESCRIPTION,
                                        APPLY_PATCH_PARAMETERS))
        elif t.type in _TYPED_TOOLS:  # a typed tool that failed its own schema: say why
            try:
                _TYPED_TOOLS[t.type].model_validate(t.model_dump())
            except pydantic.ValidationError as exc:
                raise conversion_error(exc, f"tools.{i}") from None
        elif t.type == "apply_patch":
            tools.append(ToolDefinition("apply_patch", APPLY_PATCH_DESCRIPTION, APPLY_PATCH_PARAMETERS))
        elif t.type.startswith("web_search"):
            if options.responses_web_search is WebSearchBehavior.Reject:
                raise UnsupportedFeatureError(f"tools[{i}].type={t.type}", "server-side web search")
        else:
            raise UnsupportedFeatureError(f"tools[{i}].type={t.type}")
    return tools, ns_map


def _text(parts, where, allow_images=False):
    if isinstance(parts, str):
        return parts, []
    texts, images = [], []
    for j, p in enumerate(parts or ()):
        path = f"{where}[{j}]"
        if p.type in ("input_text", "output_text", "reasoning_text", "summary_text"):
            if p.text is None:
                raise ConversionError(f"{path}: a {p.type} part needs 'text'", param=f"{path}.text")
            texts.append(p.text)
        elif p.type == "input_image" and allow_images:
            if not p.image_url:
                raise UnsupportedFeatureError(f"{path}.file_id", "images must be given by image_url")
            images.append(image_source(p.image_url, "high" if p.detail == "auto" else p.detail, path))
            texts.append(DEFAULT_SPECIAL_TOKENS.image)
        else:
            raise UnsupportedFeatureError(f"{path}.type={p.type}")
    return "\n\n".join(texts), images


# Fields each input item type must carry, as the official API requires.
_ITEM_FIELDS = {"message": ("role", "content"), "reasoning": ("summary",),
                "function_call": ("call_id", "name", "arguments"), "function_call_output": ("call_id", "output"),
                "custom_tool_call": ("call_id", "name", "input"), "custom_tool_call_output": ("call_id", "output")}


def _items(b: ResponsesBody):
    out = []
    if b.instructions:
        out.append(SystemMessage(b.instructions))
    if isinstance(b.input, str):
        out.append(UserMessage(b.input))
        return out
    pending_reasoning = None

    def assistant():
        nonlocal pending_reasoning
        last = out[-1] if out else None
        if isinstance(last, AssistantMessage) and not last.tool_calls and pending_reasoning is None:
            return last
        msg = AssistantMessage("", pending_reasoning)
        pending_reasoning = None
        out.append(msg)
        return msg

    for i, it in enumerate(b.input):
        where = f"input[{i}]"
        if it.encrypted_content is not None:
            raise UnsupportedFeatureError(f"{where}.encrypted_content", "reasoning must be sent as text")
        t = it.type
        for key in _ITEM_FIELDS.get(t, ()):
            if getattr(it, key) is None:
                raise ConversionError(f"{where}: a {t} item needs {key!r}", param=f"{where}.{key}")
        if t == "message":
            if it.role == "assistant":
                text, _ = _text(it.content, f"{where}.content")
                msg = assistant()
                msg.content = (msg.content + text) if msg.content else text
            elif it.role in ("system", "developer"):
                text = _text(it.content, f"{where}.content")[0]
                if text:
                    out.append(SystemMessage(text))
            else:
                text, images = _text(it.content, f"{where}.content", allow_images=True)
                out.append(UserMessage(text, images))
        elif t == "reasoning":
            text, _ = _text(it.content or [], f"{where}.content")
            if not text and it.summary:
                text, _ = _text(it.summary, f"{where}.summary")
            pending_reasoning = text
        elif t in ("function_call", "custom_tool_call"):
            if not it.call_id or not it.name:
                raise ConversionError(f"{where}: {t} needs call_id and name", param=where)
            name = f"{it.namespace}__{it.name}" if it.namespace else it.name
            args = it.arguments if t == "function_call" else dump_json({"input": it.input})
            msg = out[-1] if out and isinstance(out[-1], AssistantMessage) and pending_reasoning is None \
                else assistant()
            msg.tool_calls = (msg.tool_calls or []) + [ToolCall(it.call_id, name, args)]
        elif t in ("function_call_output", "custom_tool_call_output"):
            text, images = _text(it.output, f"{where}.output", allow_images=True)
            out.append(ToolMessage(text, it.call_id, images))
        else:
            raise UnsupportedFeatureError(f"{where}.type={t}")
    if pending_reasoning is not None:
        out.append(AssistantMessage("", pending_reasoning, prefix=True))
    return out


class ResponsesRequest(PydanticStyle):
    """A Responses request body; `convert` yields a ConversationRequest."""

    def __init__(self, body):
        self._body = validate(ResponsesBody, body)

    @property
    def model(self) -> str:
        return self._body.model

    def namespace_tool_map(self, options: ConversionOptions) -> dict:
        return _tools(self._body, options)[1]

    def echo(self) -> dict:
        b = self._body
        return {"instructions": b.instructions, "max_output_tokens": b.max_output_tokens,
                "temperature": 1.0 if b.temperature is None else b.temperature,
                "top_p": 1.0 if b.top_p is None else b.top_p, "metadata": b.metadata or {},
                "tool_choice": b.tool_choice if isinstance(b.tool_choice, str) else
                (b.tool_choice.model_dump() if b.tool_choice else "auto"),
                "tools": [t.model_dump(by_alias=True) for t in b.tools or ()], "user": b.user}

    def convert(self, options: ConversionOptions) -> ConversationRequest:
        b = self._body
        if b.previous_response_id is not None:
            raise UnsupportedFeatureError("previous_response_id", "this layer keeps no state")
        if b.store:
            raise UnsupportedFeatureError("store", "this layer keeps no state")
        if b.background:
            raise UnsupportedFeatureError("background")
        if b.include:
            raise UnsupportedFeatureError(f"include={b.include}")
        if b.top_logprobs:
            raise UnsupportedFeatureError("top_logprobs")
        if b.parallel_tool_calls is False:
            raise UnsupportedFeatureError("parallel_tool_calls=false")
        tools, ns_map = _tools(b, options)
        thinking, effort = map_effort(b.reasoning.effort if b.reasoning else None, "reasoning.effort")
        choice, forced = "auto", None
        if isinstance(b.tool_choice, NamedTool):
            forced = b.tool_choice.name
        elif b.tool_choice is not None:
            choice = b.tool_choice
        fmt, schema = "text", None
        if b.text and b.text.format:
            fmt = b.text.format.type
            schema = b.text.format.schema_
            if fmt == "json_schema" and schema is None:
                raise ConversionError("text.format json_schema needs a schema", param="text.format")
        parts = Parts(model=b.model, messages=_items(b), tools=tools, tool_choice=choice, forced_tool=forced,
                      thinking=thinking, effort=effort, temperature=b.temperature, top_p=b.top_p,
                      max_tokens=b.max_output_tokens, response_format=fmt, response_schema=schema,
                      stream=b.stream, echo=self.echo(), namespace_tool_map=ns_map)
        return assemble(parts, options)

    @staticmethod
    def chunk_generator(request: ConversationRequest, id: str, model: str):
        return ResponsesChunkGenerator(id, model, request)
