"""Streaming: backend chunks in, protocol events out.

`StreamProcessor` owns one `OutputParser` and hands its events to a protocol
generator (Chat, Responses or Messages), which turns them into that API's
chunk/event objects. The generator also builds the final finish reason.
"""
import enum

from .errors import InvalidArgumentError, InvalidTypeError, StreamStateError, UnsupportedFeatureError
from .options import ParsingOptions
from .parser import OutputParser


class InferenceFinishReason(enum.Enum):
    Stop = "stop"
    Length = "length"
    ContentFilter = "content_filter"


class PromptUsage:
    __slots__ = ("prompt_tokens", "prompt_cache_hit_tokens")

    def __init__(self, *, prompt_tokens: int = 0, prompt_cache_hit_tokens: int = 0):
        if prompt_tokens < 0 or not 0 <= prompt_cache_hit_tokens <= max(prompt_tokens, 0):
            raise InvalidArgumentError("token counts must be non-negative and cache hits <= prompt tokens")
        self.prompt_tokens, self.prompt_cache_hit_tokens = prompt_tokens, prompt_cache_hit_tokens


_new_chunk = object.__new__


class InferenceChunk:
    """One backend update: `ready`, `text` or `finish` (token-id chunks need a tokenizer)."""

    __slots__ = ("kind", "content", "token_count", "finish_reason", "prompt_usage", "system_fingerprint")

    def __init__(self, kind, content=None, token_count=None, finish_reason=None, prompt_usage=None,
                 system_fingerprint=None):
        self.kind, self.content, self.token_count = kind, content, token_count
        self.finish_reason, self.prompt_usage = finish_reason, prompt_usage
        self.system_fingerprint = system_fingerprint

    @staticmethod
    def ready(*, prompt_usage: PromptUsage | None = None, system_fingerprint: str | None = None):
        return InferenceChunk("ready", prompt_usage=prompt_usage, system_fingerprint=system_fingerprint)

    @staticmethod
    def text(content: str, token_count: int = 0):
        if type(content) is not str:
            raise InvalidTypeError("text chunk content must be str")
        chunk = _new_chunk(InferenceChunk)  # per-token path: skip the keyword-argument __init__
        chunk.kind, chunk.content, chunk.token_count = "text", content, token_count
        chunk.finish_reason = chunk.prompt_usage = chunk.system_fingerprint = None
        return chunk

    @staticmethod
    def finish(finish_reason: InferenceFinishReason):
        try:
            reason = InferenceFinishReason(finish_reason)
        except ValueError:
            raise InvalidArgumentError(f"finish_reason must be one of "
                                       f"{[r.value for r in InferenceFinishReason]}, got {finish_reason!r}") from None
        return InferenceChunk("finish", finish_reason=reason)


class StreamProcessor:
    """Push backend chunks, get protocol objects; `finish` flushes, `close` abandons."""

    def __init__(self, generator, options: ParsingOptions, tokenizer=None):
        if tokenizer is not None:
            raise UnsupportedFeatureError("tokenizer", "token-id chunks; decode to text first")
        self._gen = generator
        self._parser = OutputParser(options)
        self._feed, self._event = self._parser.feed, generator.event  # bound once for the per-token path
        self._closed = False
        self._done = False
        self._started = False
        self._streaming = False
        self._finish_reason: InferenceFinishReason | None = None
        self._completion_tokens = 0
        self._usage = PromptUsage()
        self._fingerprint = None

    @property
    def finished(self) -> bool:
        return self._done and not self._closed

    def _start(self, out):
        if not self._started:
            self._started = True
            self._streaming = True
            out.extend(self._gen.start(self._usage, self._fingerprint))

    def push(self, chunk: InferenceChunk) -> list:
        if self._streaming and chunk.kind == "text":
            # The per-token path, kept to a few attribute reads: it runs once per
            # backend chunk. `_streaming` means started and neither finished nor closed.
            self._completion_tokens += chunk.token_count or 0
            events = self._feed(chunk.content)
            if len(events) == 1:
                return self._event(events[0])
            out: list = []
            for ev in events:
                out += self._event(ev)
            return out
        return self._push_slow(chunk)

    def _push_slow(self, chunk: InferenceChunk) -> list:
        """Every chunk but text after the start: state checks, `ready`, `finish`, the first text."""
        if self._closed or self._done:
            raise StreamStateError("stream processor is finished or closed")
        out: list = []
        kind = chunk.kind
        if kind == "text":
            self._start(out)
            self._completion_tokens += chunk.token_count or 0
            for ev in self._parser.feed(chunk.content):
                out += self._gen.event(ev)
        elif kind == "ready":
            if chunk.prompt_usage is not None:
                self._usage = chunk.prompt_usage
            self._fingerprint = chunk.system_fingerprint
            self._start(out)
        elif kind == "finish":
            self._start(out)
            self._finish_reason = chunk.finish_reason
        else:
            self.close()
            raise StreamStateError(f"unsupported inference chunk kind {kind!r}")
        return out

    def finish(self) -> list:
        if self._closed:
            raise StreamStateError("stream processor is closed")
        if self._done:
            return []
        out: list = []
        self._start(out)
        for ev in self._parser.finish():
            out.extend(self._gen.event(ev))
        p = self._parser
        if any(c.valid for c in p.calls) and self._finish_reason in (None, InferenceFinishReason.Stop):
            reason = "tool_calls"
        elif self._finish_reason is InferenceFinishReason.Length:
            reason = "length"
        elif self._finish_reason is InferenceFinishReason.ContentFilter:
            reason = "content_filter"
        else:
            reason = "stop"
        out.extend(self._gen.end(reason, self._completion_tokens, p.stop_sequence))
        self._done = True
        self._streaming = False
        return out

    def close(self) -> None:
        self._closed = True
        self._streaming = False

    @property
    def issues(self) -> list:
        """Malformed-output reports (ParseIssue) seen so far."""
        return list(self._parser.issues)
