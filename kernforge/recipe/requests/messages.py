"""Anthropic Messages request → Conversation.

Thinking blocks become reasoning, tool_use/tool_result blocks become tool calls
and tool messages, `thinking.type` and `output_config.effort` pick the mode.
Too-large `max_tokens` is lowered to the configured bound, as deepseek-recipe does.
"""
from typing import Any, Literal

from typing_extensions import NotRequired, TypedDict

from ..anthropic_out import MessagesChunkGenerator
from ..conversation import (AssistantMessage, DataUrlImageSource, UrlImageSource, SystemMessage, ToolCall, ToolMessage,
                            UserMessage)
from ..dsml import dump_json
from ..errors import ConversionError, UnsupportedFeatureError
from ..options import ConversionOptions, ConversationRequest, WebSearchBehavior
from ..tokens import DEFAULT_SPECIAL_TOKENS
from .common import FORBID_EXTRA, Parts, PydanticStyle, Strict, assemble, tool_definition, validate

IMAGE_TOKEN = DEFAULT_SPECIAL_TOKENS.image
ANTHROPIC_EFFORTS = {"low": "low", "medium": "high", "high": "high", "xhigh": "xhigh", "max": "max"}


class ImageSourceSpec(TypedDict):
    type: Literal["base64", "url"]
    media_type: NotRequired[str]
    data: NotRequired[str]
    url: NotRequired[str]


class Block(TypedDict):
    """Any content block; which fields a type needs is checked in `_messages`.

    TypedDicts rather than models: long histories validate several times faster.
    """

    type: str
    text: NotRequired[str]
    thinking: NotRequired[str]
    signature: NotRequired[str]
    data: NotRequired[str]
    source: NotRequired[ImageSourceSpec]
    id: NotRequired[str]
    name: NotRequired[str]
    input: NotRequired[Any]
    tool_use_id: NotRequired[str]
    content: NotRequired[str | list["Block"] | None]
    is_error: NotRequired[bool | None]
    cache_control: NotRequired[dict | None]
    citations: NotRequired[list | None]


class Message(TypedDict):
    role: Literal["user", "assistant"]
    content: str | list[Block]


class Tool(TypedDict):
    name: str
    type: NotRequired[str | None]
    description: NotRequired[str | None]
    input_schema: NotRequired[dict[str, Any] | None]
    cache_control: NotRequired[dict | None]
    max_uses: NotRequired[int | None]
    allowed_domains: NotRequired[list[str] | None]
    blocked_domains: NotRequired[list[str] | None]
    user_location: NotRequired[dict | None]


for _td in (ImageSourceSpec, Block, Message, Tool):
    _td.__pydantic_config__ = FORBID_EXTRA


class ToolChoice(Strict):
    type: Literal["auto", "any", "tool", "none"]
    name: str | None = None
    disable_parallel_tool_use: bool | None = None


class Thinking(Strict):
    type: Literal["enabled", "disabled", "adaptive"]
    budget_tokens: int | None = None


class OutputConfig(Strict):
    effort: Literal["low", "medium", "high", "xhigh", "max"] | None = None


class MessagesBody(Strict):
    model: str
    max_tokens: int
    messages: list[Message]
    system: str | list[Block] | None = None
    tools: list[Tool] | None = None
    tool_choice: ToolChoice | None = None
    thinking: Thinking | None = None
    output_config: OutputConfig | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    stop_sequences: list[str] | None = None
    stream: bool = False
    metadata: dict[str, Any] | None = None
    service_tier: str | None = None


# Fields each block type must carry, as the official API (and deepseek-recipe) require.
_BLOCK_FIELDS = {"text": ("text",), "thinking": ("thinking",), "tool_use": ("id", "name", "input"),
                 "tool_result": ("tool_use_id",), "image": ("source",)}


def _check_block(block: Block, path: str):
    for key in _BLOCK_FIELDS.get(block["type"], ()):
        if key not in block:
            raise ConversionError(f"{path}: a {block['type']} block needs {key!r}", param=f"{path}.{key}")


def _image(block: Block, path: str):
    src = block.get("source")
    if src is None:
        raise ConversionError(f"{path}: image block needs a source", param=path)
    if src["type"] == "base64":
        if not src.get("media_type") or src.get("data") is None:
            raise ConversionError(f"{path}: base64 image needs media_type and data", param=path)
        return DataUrlImageSource(f"data:{src['media_type']};base64,{src['data']}", "high", path=path)
    if not src.get("url"):
        raise ConversionError(f"{path}: url image needs a url", param=path)
    return UrlImageSource(src["url"], "high", path=path)


def _tool_result_text(block: Block, path: str):
    c = block.get("content")
    if c is None:
        return "", ()
    if isinstance(c, str):
        return c, ()
    texts, images = [], []
    for j, sub in enumerate(c):
        kind = sub["type"]
        _check_block(sub, f"{path}.content[{j}]")
        if kind == "text":
            texts.append(sub["text"])
        elif kind == "image":
            images.append(_image(sub, f"{path}.content[{j}]"))
            texts.append(IMAGE_TOKEN)
        else:
            raise UnsupportedFeatureError(f"{path}.content[{j}].type={kind}")
    return "\n\n".join(texts), images


def _assistant(blocks, i: int, options: ConversionOptions) -> AssistantMessage:
    reasoning, texts, calls = None, [], []
    for j, blk in enumerate(blocks):
        kind = blk["type"]
        _check_block(blk, f"messages[{i}].content[{j}]")
        if kind == "text":
            texts.append(blk["text"])
        elif kind == "thinking":
            reasoning = (reasoning or "") + blk["thinking"]
        elif kind == "tool_use":
            if not blk["id"] or not blk["name"]:
                path = f"messages[{i}].content[{j}]"
                raise ConversionError(f"{path}: tool_use needs a non-empty id and name", param=path)
            tool_input = blk["input"]
            calls.append(ToolCall(blk["id"], blk["name"], dump_json({} if tool_input is None else tool_input)))
        elif kind == "redacted_thinking":
            raise UnsupportedFeatureError(f"messages[{i}].content[{j}].type=redacted_thinking",
                                          "encrypted reasoning cannot be rendered")
        elif kind in ("server_tool_use", "web_search_tool_result") \
                and options.messages_web_search is WebSearchBehavior.Drop:
            continue
        else:
            raise UnsupportedFeatureError(f"messages[{i}].content[{j}].type={kind}")
    return AssistantMessage("".join(texts), reasoning, calls)


def _messages(b: MessagesBody, options: ConversionOptions):
    out = []
    if b.system:
        if isinstance(b.system, str):
            out.append(SystemMessage(b.system))
        else:
            for j, blk in enumerate(b.system):
                if blk["type"] != "text":
                    raise UnsupportedFeatureError(f"system[{j}].type={blk['type']}")
                _check_block(blk, f"system[{j}]")
            out.append(SystemMessage("\n\n".join(blk["text"] for blk in b.system)))
    for i, m in enumerate(b.messages):
        content = m["content"]
        if m["role"] == "assistant":
            if isinstance(content, str):
                out.append(AssistantMessage(content))
            else:
                out.append(_assistant(content, i, options))
            continue
        if isinstance(content, str):
            out.append(UserMessage(content))
            continue
        texts, images = [], []
        for j, blk in enumerate(content):
            kind = blk["type"]
            _check_block(blk, f"messages[{i}].content[{j}]")
            if kind == "tool_result":
                text, imgs = _tool_result_text(blk, f"messages[{i}].content[{j}]")
                if blk.get("is_error"):
                    text = "Error: " + text
                out.append(ToolMessage(text, blk.get("tool_use_id"), imgs))
            elif kind == "text":
                texts.append(blk["text"])
            elif kind == "image":
                images.append(_image(blk, f"messages[{i}].content[{j}]"))
                texts.append(IMAGE_TOKEN)
            else:
                raise UnsupportedFeatureError(f"messages[{i}].content[{j}].type={kind}")
        if texts:
            out.append(UserMessage("\n\n".join(texts), images))
    # A trailing assistant message is a prefill: the model continues it.
    if out and isinstance(out[-1], AssistantMessage):
        out[-1].prefix = True
    return out


class MessagesRequest(PydanticStyle):
    """An Anthropic Messages request body; `convert` yields a ConversationRequest."""

    def __init__(self, body):
        self._body = validate(MessagesBody, body)

    @property
    def model(self) -> str:
        return self._body.model

    def convert(self, options: ConversionOptions) -> ConversationRequest:
        b = self._body
        if b.top_k is not None:
            raise UnsupportedFeatureError("top_k")
        tools = []
        for i, t in enumerate(b.tools or ()):
            kind = t.get("type")
            if kind and kind.startswith("web_search"):
                if options.messages_web_search is WebSearchBehavior.Reject:
                    raise UnsupportedFeatureError(f"tools[{i}].type={kind}", "server-side web search")
                continue
            if kind not in (None, "custom"):
                raise UnsupportedFeatureError(f"tools[{i}].type={kind}")
            tools.append(tool_definition(f"tools[{i}].name", t["name"], t.get("description"), t.get("input_schema")))
        choice, forced = "auto", None
        if b.tool_choice is not None:
            if b.tool_choice.disable_parallel_tool_use:
                raise UnsupportedFeatureError("tool_choice.disable_parallel_tool_use")
            kind = b.tool_choice.type
            if kind == "tool":
                if not b.tool_choice.name:
                    raise ConversionError("tool_choice type 'tool' needs a name", param="tool_choice")
                forced = b.tool_choice.name
            else:
                choice = {"auto": "auto", "any": "required", "none": "none"}[kind]
        thinking = None if b.thinking is None else b.thinking.type != "disabled"
        effort = None
        if b.output_config is not None and b.output_config.effort is not None:
            effort = ANTHROPIC_EFFORTS[b.output_config.effort]
        parts = Parts(model=b.model, messages=_messages(b, options), tools=tools, tool_choice=choice,
                      forced_tool=forced, thinking=thinking, effort=effort, temperature=b.temperature,
                      top_p=b.top_p, max_tokens=b.max_tokens, clamp_max_tokens=True,
                      stop=list(b.stop_sequences or ()), stream=b.stream)
        return assemble(parts, options)

    @staticmethod
    def chunk_generator(request: ConversationRequest, id: str, model: str):
        return MessagesChunkGenerator(id, model, request.conversation.thinking_mode)
