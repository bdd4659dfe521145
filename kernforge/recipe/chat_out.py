"""Parser events → Chat Completions `chat.completion.chunk` objects, and their accumulation."""
import time

from .events import compact_json as _dumps
from .parser import ContentDelta, ReasoningDelta, ToolCallDelta, ToolCallStart


_new = object.__new__
# The fixed tail of a per-token chunk, after its delta.
_DELTA_TAIL = ',"logprobs":null,"finish_reason":null}]}'


class ChatCompletionChunk:
    """One `chat.completion.chunk` object (`data`) and its SSE text (`to_json`).

    Per-token chunks are lazy: a stream makes one per parser event, and a server
    usually only serialises it, so such a chunk keeps its parser event and the
    stream's shared head and builds the dict on first access of `data`. Its
    `to_json` splices the event's delta into the head's prebuilt JSON text, which
    gives the same bytes as serialising the dict.
    """

    __slots__ = ("_data", "_event", "_stream")

    def __init__(self, data: dict):
        self._data = data

    @property
    def data(self) -> dict:
        data = self._data
        if data is None:
            data = self._data = self._stream.head.copy()
            data["choices"] = [{"index": 0, "delta": _delta(self._event), "logprobs": None,
                                "finish_reason": None}]
        return data

    def to_json(self) -> str:
        if self._data is None:
            return self._stream.json_head + _dumps(_delta(self._event)) + _DELTA_TAIL
        return _dumps(self._data)




def _delta(ev) -> dict:
    """The Chat `delta` of one parser event (only the kinds `_DELTA_KINDS` lists)."""
    kind = type(ev)
    if kind is ToolCallDelta:
        return {"tool_calls": [{"index": ev.index, "function": {"arguments": ev.arguments}}]}
    if kind is ReasoningDelta:
        return {"content": None, "reasoning_content": ev.text}
    if kind is ContentDelta:
        return {"content": ev.text, "reasoning_content": None}
    return {"tool_calls": [{"index": ev.index, "id": ev.id, "type": "function",
                            "function": {"name": ev.name, "arguments": ""}}]}


# ToolCallEnd and ParseIssue carry nothing new for Chat clients.
_DELTA_KINDS = frozenset((ToolCallDelta, ReasoningDelta, ContentDelta, ToolCallStart))


class _StreamHead:
    """The fields every chunk of one stream shares, as a dict and as JSON text."""

    __slots__ = ("head", "json_head")

    def __init__(self, head: dict):
        self.head = head
        self.json_head = _dumps(head)[:-1] + ',"choices":[{"index":0,"delta":'


def _usage(prompt, completion, cache_hit):
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion,
            "prompt_tokens_details": {"cached_tokens": cache_hit},
            "prompt_cache_hit_tokens": cache_hit, "prompt_cache_miss_tokens": prompt - cache_hit}


class ChatCompletionChunkGenerator:
    """Builds chunks for one choice; every tool-call delta carries its call's own index."""

    def __init__(self, id: str, model: str, request=None):
        self.id, self.model = id, model
        self.thinking = bool(request and request.conversation.thinking_mode)
        self.created = int(time.time())
        self.usage = None
        self.fingerprint = None

    def _chunk(self, delta, finish_reason=None, usage=None):
        data = {"id": self.id, "object": "chat.completion.chunk", "created": self.created,
                "model": self.model, "system_fingerprint": self.fingerprint,
                "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}]}
        if usage is not None:
            data["usage"] = usage
        return ChatCompletionChunk(data)

    def start(self, usage, fingerprint):
        self.usage, self.fingerprint = usage, fingerprint
        self._stream = _StreamHead({"id": self.id, "object": "chat.completion.chunk", "created": self.created,
                                    "model": self.model, "system_fingerprint": fingerprint})
        delta = {"role": "assistant", "content": None if self.thinking else ""}
        if self.thinking:
            delta["reasoning_content"] = ""
        return [self._chunk(delta)]

    def event(self, ev):
        """The per-token path: one lazy chunk per delta event (see `ChatCompletionChunk`)."""
        if type(ev) not in _DELTA_KINDS:
            return []
        chunk = _new(ChatCompletionChunk)
        chunk._data, chunk._event, chunk._stream = None, ev, self._stream
        return [chunk]

    def end(self, reason, completion_tokens, stop_sequence):
        u = self.usage
        return [self._chunk({"content": "", "reasoning_content": None}, reason,
                            _usage(u.prompt_tokens, completion_tokens, u.prompt_cache_hit_tokens))]


class ChatCompletionResponse:
    """Accumulates chunks into a `chat.completion` object."""

    def __init__(self, id: str, model: str, created: int, prompt_tokens: int = 0,
                 prompt_cache_hit_tokens: int = 0):
        self.id, self.model, self.created = id, model, created
        self.content, self.reasoning = [], []
        self.tool_calls: dict[int, dict] = {}
        self.finish_reason = None
        self.usage = _usage(prompt_tokens, 0, prompt_cache_hit_tokens)
        self.fingerprint = None
        self._saw_reasoning = False

    def accumulate(self, chunk: ChatCompletionChunk):
        data = chunk.data
        self.fingerprint = data.get("system_fingerprint")
        if "usage" in data:
            self.usage = data["usage"]
        for choice in data["choices"]:
            delta = choice["delta"]
            if delta.get("content"):
                self.content.append(delta["content"])
            if delta.get("reasoning_content") is not None:
                self._saw_reasoning = True
                self.reasoning.append(delta["reasoning_content"])
            for tc in delta.get("tool_calls") or ():
                slot = self.tool_calls.get(tc["index"])
                if slot is None:
                    slot = self.tool_calls[tc["index"]] = {"index": tc["index"], "id": tc["id"],
                                                            "type": "function",
                                                            "function": {"name": tc["function"]["name"],
                                                                         "arguments": ""}}
                slot["function"]["arguments"] += tc["function"].get("arguments", "")
            if choice.get("finish_reason"):
                self.finish_reason = choice["finish_reason"]

    def to_dict(self) -> dict:
        message = {"role": "assistant", "content": "".join(self.content),
                   "reasoning_content": "".join(self.reasoning) if self._saw_reasoning else None}
        if self.tool_calls:
            message["tool_calls"] = [self.tool_calls[k] for k in sorted(self.tool_calls)]
        return {"id": self.id, "object": "chat.completion", "created": self.created, "model": self.model,
                "choices": [{"index": 0, "message": message, "logprobs": None,
                             "finish_reason": self.finish_reason}],
                "usage": self.usage, "system_fingerprint": self.fingerprint}

    def to_json(self) -> str:
        return _dumps(self.to_dict())

    @staticmethod
    def sse_event_name(chunk) -> str | None:
        return None

    @staticmethod
    def sse_done_data() -> str | None:
        return "[DONE]"
