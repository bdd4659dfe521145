"""The one Conversation representation every protocol request converts into.

Plain slotted classes, not pydantic: conversations are built once per request on
the hot path, and the request models already validated the input.
"""
from collections.abc import Sequence
from typing import Any

from .errors import InvalidArgumentError, InvalidTypeError


TOOL_CHOICES = ("auto", "none", "required")
REASONING_EFFORTS = ("low", "high", "xhigh", "max")
IMAGE_DETAILS = ("low", "high", "original", "auto")


class ToolCall:
    """A tool call in the history; `arguments` is a JSON object as text."""

    __slots__ = ("id", "name", "arguments")

    def __init__(self, id: str, name: str, arguments: str):
        self.id, self.name, self.arguments = id, name, arguments

    def __repr__(self):
        return f"ToolCall({self.id!r}, {self.name!r}, {self.arguments!r})"


class ToolDefinition:
    """A client tool: name, description and the JSON Schema of its input."""

    __slots__ = ("name", "description", "parameters", "strict", "defer_loading")

    def __init__(self, name: str, description: str | None = None, parameters: Any = None,
                 strict: bool | None = None, defer_loading: bool = False):
        if not name:
            raise InvalidArgumentError("tool name must be non-empty")
        self.name, self.description, self.parameters = name, description, parameters
        self.strict, self.defer_loading = strict, defer_loading

    def to_chat_tool(self) -> dict:
        """The Chat Completions function-tool shape, used for output constraints."""
        fn = {"name": self.name, "description": self.description,
              "parameters": self.parameters, "strict": self.strict}
        if self.defer_loading:
            fn["defer_loading"] = True
        return {"type": "function", "function": fn}


class ImageSource:
    """Where an image comes from; `path` locates it in the request for errors."""

    __slots__ = ("kind", "detail", "data_url", "url", "data", "path")

    def __init__(self, kind, detail, *, data_url=None, url=None, data=None, path=""):
        if detail not in IMAGE_DETAILS:
            raise InvalidArgumentError(f"image detail must be one of {IMAGE_DETAILS}, got {detail!r}")
        self.kind, self.detail, self.path = kind, detail, path
        self.data_url, self.url, self.data = data_url, url, data

    def __repr__(self):
        return f"{type(self).__name__}(kind={self.kind!r}, path={self.path!r})"


class DataUrlImageSource(ImageSource):
    __slots__ = ()

    def __init__(self, data_url: str, detail: str = "high", *, path: str = ""):
        super().__init__("data_url", detail, data_url=data_url, path=path)


class UrlImageSource(ImageSource):
    __slots__ = ()

    def __init__(self, url: str, detail: str = "high", *, path: str = ""):
        super().__init__("url", detail, url=url, path=path)


class BytesImageSource(ImageSource):
    __slots__ = ()

    def __init__(self, data: bytes, detail: str = "high", *, path: str = ""):
        super().__init__("bytes", detail, data=bytes(data), path=path)


def _text(role: str, content) -> str:
    if type(content) is not str:
        raise InvalidTypeError(f"{role} message content must be str, got {type(content).__name__}")
    return content


class Message:
    """Base of conversation messages; role-specific fields default to empty.

    Subclass constructors assign their slots directly (no `super()` chain): a
    long agent history builds hundreds of these per request.
    """

    __slots__ = ("content", "image_sources")
    role = ""
    reasoning_content = None
    tool_calls = None
    tool_call_id = None
    prefix = False
    tools = None
    task = None

    def __repr__(self):
        return f"{type(self).__name__}({self.content[:40]!r})"


class SystemMessage(Message):
    __slots__ = ("tools",)
    role = "system"

    def __init__(self, content: str, image_sources: Sequence[ImageSource] | None = None,
                 tools: Sequence[ToolDefinition] | None = None):
        self.content = _text("system", content)
        self.image_sources = list(image_sources) if image_sources else []
        self.tools = list(tools) if tools else None


class DeveloperMessage(Message):
    """The reference encoder's `developer` turn: rendered as a user turn, may carry tools.

    Protocol conversion never produces it (Chat `developer` means system there);
    it exists so conversations of the DeepSeek reference format can be rendered.
    """

    __slots__ = ("tools",)
    role = "developer"

    def __init__(self, content: str, tools: Sequence[ToolDefinition] | None = None):
        self.content = _text("developer", content)
        self.image_sources = []
        self.tools = list(tools) if tools else None


class UserMessage(Message):
    """A user turn; each image source needs one image-token placeholder in `content`."""

    __slots__ = ("task",)
    role = "user"

    def __init__(self, content: str, image_sources: Sequence[ImageSource] | None = None, *,
                 task: str | None = None):
        self.content = _text("user", content)
        self.image_sources = list(image_sources) if image_sources else []
        if task is not None and not task.isidentifier():
            raise InvalidArgumentError(f"task must be an identifier, got {task!r}")
        self.task = task


class AssistantMessage(Message):
    __slots__ = ("reasoning_content", "tool_calls", "prefix")
    role = "assistant"

    def __init__(self, content: str, reasoning_content: str | None = None,
                 tool_calls: Sequence[ToolCall] | None = None, prefix: bool = False):
        self.content = _text("assistant", content)
        self.image_sources = []
        self.reasoning_content = reasoning_content
        self.tool_calls = list(tool_calls) if tool_calls else None
        self.prefix = bool(prefix)


class ToolMessage(Message):
    """A tool result; each image source needs one image-token placeholder in `content`."""

    __slots__ = ("tool_call_id",)
    role = "tool"

    def __init__(self, content: str, tool_call_id: str | None = None,
                 image_sources: Sequence[ImageSource] | None = None):
        self.content = _text("tool", content)
        self.image_sources = list(image_sources) if image_sources else []
        self.tool_call_id = tool_call_id


class LatestReminderMessage(Message):
    """Extra instructions rendered with the `<｜latest_reminder｜>` token."""

    __slots__ = ()
    role = "latest_reminder"

    def __init__(self, content: str):
        self.content = _text("latest_reminder", content)
        self.image_sources = []


class Conversation:
    """Messages plus the prompt-level settings that shape rendering.

    `response_format` is text/json_object; a `response_schema` selects json_schema
    and a `response_regex` selects regex.
    """

    __slots__ = ("messages", "thinking_mode", "tools", "tool_choice",
                 "reasoning_effort", "_format", "response_schema", "response_regex")

    def __init__(self, messages: Sequence[Message] | None = None, *, thinking_mode: bool = True,
                 tools: Sequence[ToolDefinition] | None = None, tool_choice: str = "auto",
                 reasoning_effort: str | None = None, response_format: str = "text",
                 response_schema: Any = None, response_regex: str | None = None):
        if tool_choice not in TOOL_CHOICES:
            raise InvalidArgumentError(f"tool_choice must be one of {TOOL_CHOICES}, got {tool_choice!r}")
        if reasoning_effort is not None and reasoning_effort not in REASONING_EFFORTS:
            raise InvalidArgumentError(f"reasoning_effort must be one of {REASONING_EFFORTS}, got {reasoning_effort!r}")
        if response_format not in ("text", "json_object"):
            raise InvalidArgumentError(f"response_format must be 'text' or 'json_object', got {response_format!r}")
        if response_schema is not None and response_regex is not None:
            raise InvalidArgumentError("response_schema and response_regex are mutually exclusive")
        if response_format == "json_object" and (response_schema is not None or response_regex is not None):
            raise InvalidArgumentError("json_object cannot be combined with a schema or regex")
        self.messages = list(messages or ())
        for m in self.messages:
            if not isinstance(m, Message):
                raise InvalidTypeError(f"conversation messages must be Message objects, got {type(m).__name__}")
        self.thinking_mode = bool(thinking_mode)
        self.tools = list(tools or ())
        self.tool_choice = tool_choice
        self.reasoning_effort = reasoning_effort
        self._format = response_format
        self.response_schema = response_schema
        self.response_regex = response_regex

    @property
    def response_format(self) -> str:
        if self.response_schema is not None:
            return "json_schema"
        if self.response_regex is not None:
            return "regex"
        return self._format
