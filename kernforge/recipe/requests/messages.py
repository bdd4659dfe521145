"""Anthropic Messages request → Conversation.

Thinking blocks become reasoning, tool_use/tool_result blocks become tool calls
and tool messages, `thinking.type` and `output_config.effort` pick the mode.
Too-large `max_tokens` is lowered to the configured bound, as deepseek-recipe does.
"""
from typing import Any, Literal, Union

import pydantic

from ..conversation import (AssistantMessage, SystemMessage, ToolCall, ToolDefinition, ToolMessage,
                            UserMessage)
from ..dsml import dump_json
from ..errors import ConversionError, UnsupportedFeatureError
from ..options import ConversionOptions, ConversationRequest, WebSearchBehavior
from ..tokens import DEFAULT_SPECIAL_TOKENS
from .common import Parts, Strict, assemble, validate

ANTHROPIC_EFFORTS = {"low": "low", "medium": "high", "high": "high", "xhigh": "xhigh", "max": "max"}


class ImageSourceSpec(Strict):
    type: Literal["base64", "url"]
    media_type: str | None = None
    data: str | None = None
    url: str | None = None


class Block(pydantic.BaseModel):
    """Any content block; fields are checked per type in `_blocks`."""

    model_config = pydantic.ConfigDict(extra="forbid")
    type: str
    text: str | None = None
    thinking: str | None = None
    signature: str | None = None
    data: str | None = None
    source: ImageSourceSpec | None = None
    id: str | None = None
    name: str | None = None
    input: Any = None
    tool_use_id: str | None = None
    content: str | list["Block"] | None = None
    is_error: bool | None = None
    cache_control: dict | None = None
    citations: list | None = None


class Message(Strict):
    role: Literal["user", "assistant"]
    content: str | list[Block]


class Tool(pydantic.BaseModel):
    model_config = pydantic.ConfigDict(extra="forbid")
    name: str
    type: str | None = None
    description: str | None = None
    input_schema: dict[str, Any] | None = None
    cache_control: dict | None = None
    max_uses: int | None = None
    allowed_domains: list[str] | None = None
    blocked_domains: list[str] | None = None
    user_location: dict | None = None


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


def _image(block: Block, path: str):
    from ..conversation import DataUrlImageSource, UrlImageSource
    src = block.source
    if src is None:
        raise ConversionError(f"{path}: image block needs a source", param=path)
    if src.type == "base64":
        if not src.media_type or src.data is None:
            raise ConversionError(f"{path}: base64 image needs media_type and data", param=path)
        return DataUrlImageSource(f"data:{src.media_type};base64,{src.data}", "high", path=path)
    if not src.url:
        raise ConversionError(f"{path}: url image needs a url", param=path)
    return UrlImageSource(src.url, "high", path=path)


def _tool_result_text(block: Block, path: str):
    c = block.content
    if c is None:
        return "", []
    if isinstance(c, str):
        return c, []
    texts, images = [], []
    for j, sub in enumerate(c):
        if sub.type == "text":
            texts.append(sub.text or "")
        elif sub.type == "image":
            images.append(_image(sub, f"{path}.content[{j}]"))
            texts.append(DEFAULT_SPECIAL_TOKENS.image)
        else:
            raise UnsupportedFeatureError(f"{path}.content[{j}].type={sub.type}")
    return "\n\n".join(texts), images


def _messages(b: MessagesBody, options: ConversionOptions):
    out = []
    if b.system:
        if isinstance(b.system, str):
            out.append(SystemMessage(b.system))
        else:
            for j, blk in enumerate(b.system):
                if blk.type != "text":
                    raise UnsupportedFeatureError(f"system[{j}].type={blk.type}")
            out.append(SystemMessage("\n\n".join(blk.text or "" for blk in b.system)))
    for i, m in enumerate(b.messages):
        blocks = [Block(type="text", text=m.content)] if isinstance(m.content, str) else m.content
        if m.role == "assistant":
            msg = AssistantMessage("")
            texts, calls = [], []
            for j, blk in enumerate(blocks):
                path = f"messages[{i}].content[{j}]"
                if blk.type == "thinking":
                    msg.reasoning_content = (msg.reasoning_content or "") + (blk.thinking or "")
                elif blk.type == "redacted_thinking":
                    raise UnsupportedFeatureError(f"{path}.type=redacted_thinking",
                                                  "encrypted reasoning cannot be rendered")
                elif blk.type == "text":
                    texts.append(blk.text or "")
                elif blk.type == "tool_use":
                    if not blk.id or not blk.name:
                        raise ConversionError(f"{path}: tool_use needs id and name", param=path)
                    calls.append(ToolCall(blk.id, blk.name, dump_json(blk.input if blk.input is not None else {})))
                elif blk.type in ("server_tool_use", "web_search_tool_result"):
                    if options.messages_web_search is WebSearchBehavior.Reject:
                        raise UnsupportedFeatureError(f"{path}.type={blk.type}", "server-side web search")
                else:
                    raise UnsupportedFeatureError(f"{path}.type={blk.type}")
            msg.content = "".join(texts)
            msg.tool_calls = calls or None
            out.append(msg)
            continue
        texts, images = [], []
        for j, blk in enumerate(blocks):
            path = f"messages[{i}].content[{j}]"
            if blk.type == "tool_result":
                text, imgs = _tool_result_text(blk, path)
                if blk.is_error:
                    text = "Error: " + text
                out.append(ToolMessage(text, blk.tool_use_id, imgs))
            elif blk.type == "text":
                texts.append(blk.text or "")
            elif blk.type == "image":
                images.append(_image(blk, path))
                texts.append(DEFAULT_SPECIAL_TOKENS.image)
            else:
                raise UnsupportedFeatureError(f"{path}.type={blk.type}")
        if texts:
            out.append(UserMessage("\n\n".join(texts), images))
    # A trailing assistant message is a prefill: the model continues it.
    if out and isinstance(out[-1], AssistantMessage):
        out[-1].prefix = True
    return out


class MessagesRequest:
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
            if t.type and t.type.startswith("web_search"):
                if options.messages_web_search is WebSearchBehavior.Reject:
                    raise UnsupportedFeatureError(f"tools[{i}].type={t.type}", "server-side web search")
                continue
            if t.type not in (None, "custom"):
                raise UnsupportedFeatureError(f"tools[{i}].type={t.type}")
            tools.append(ToolDefinition(t.name, t.description, t.input_schema))
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
        from ..anthropic_out import MessagesChunkGenerator
        return MessagesChunkGenerator(id, model, request.conversation.thinking_mode)
