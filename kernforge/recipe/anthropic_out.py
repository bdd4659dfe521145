"""Parser events → Anthropic Messages stream events (`message_start` … `message_stop`).

Thinking streams as `thinking_delta` in its own block, closed with a
`signature_delta`; tool arguments stream as `input_json_delta`.
"""
import json

from kernforge.recipe.events import StreamEvent, compact_json

STOP_REASONS = {"stop": "end_turn", "tool_calls": "tool_use", "length": "max_tokens",
                "content_filter": "refusal"}


class MessagesStreamEvent(StreamEvent):
    __slots__ = ()


def _usage(prompt, cache_hit, output):
    return {"input_tokens": prompt - cache_hit, "cache_creation_input_tokens": 0,
            "cache_read_input_tokens": cache_hit, "output_tokens": output, "service_tier": "standard"}


class MessagesChunkGenerator:
    """One content block per kind of output; a new kind closes the open block."""

    def __init__(self, id: str, model: str, thinking_mode: bool = True):
        self.id, self.model, self.thinking_mode = id, model, thinking_mode
        self.signature = id
        self.index = -1
        self.open_kind = None
        self.usage = None

    def with_signature(self, signature: str):
        self.signature = signature
        return self

    def start(self, usage, fingerprint):
        self.usage = usage
        msg = {"id": self.id, "type": "message", "role": "assistant", "model": self.model, "content": [],
               "stop_reason": None, "stop_sequence": None,
               "usage": _usage(usage.prompt_tokens, usage.prompt_cache_hit_tokens, 0)}
        return [MessagesStreamEvent({"type": "message_start", "message": msg})]

    def _close(self, out):
        if self.open_kind == "thinking":
            out.append(MessagesStreamEvent({"type": "content_block_delta", "index": self.index,
                                            "delta": {"type": "signature_delta", "signature": self.signature}}))
        if self.open_kind is not None:
            out.append(MessagesStreamEvent({"type": "content_block_stop", "index": self.index}))
        self.open_kind = None

    def _open(self, out, kind, block):
        if self.index < 0 and self.thinking_mode and kind != "thinking":
            # In thinking mode a message always starts with a thinking block, even an empty one.
            self._open(out, "thinking", {"type": "thinking", "thinking": "", "signature": ""})
        self._close(out)
        self.index += 1
        self.open_kind = kind
        out.append(MessagesStreamEvent({"type": "content_block_start", "index": self.index,
                                        "content_block": block}))
        if self.index == 0:  # Anthropic sends its first keep-alive after the first block opens
            out.append(MessagesStreamEvent({"type": "ping"}))

    def _delta(self, delta):
        return MessagesStreamEvent({"type": "content_block_delta", "index": self.index, "delta": delta})

    def event(self, ev):
        out = []
        name = type(ev).__name__
        if name == "ReasoningDelta":
            if self.open_kind != "thinking":
                self._open(out, "thinking", {"type": "thinking", "thinking": "", "signature": ""})
            out.append(self._delta({"type": "thinking_delta", "thinking": ev.text}))
        elif name == "ContentDelta":
            if self.open_kind != "text":
                self._open(out, "text", {"type": "text", "text": ""})
            out.append(self._delta({"type": "text_delta", "text": ev.text}))
        elif name == "ToolCallStart":
            self._open(out, "tool_use", {"type": "tool_use", "id": ev.id, "name": ev.name, "input": {}})
        elif name == "ToolCallDelta":
            out.append(self._delta({"type": "input_json_delta", "partial_json": ev.arguments}))
        elif name == "ToolCallEnd":
            self._close(out)
        return out

    def end(self, reason, completion_tokens, stop_sequence):
        out = []
        if self.index < 0 and self.thinking_mode:
            self._open(out, "thinking", {"type": "thinking", "thinking": "", "signature": ""})
        self._close(out)
        stop_reason = "stop_sequence" if stop_sequence is not None else STOP_REASONS[reason]
        u = self.usage
        out.append(MessagesStreamEvent({
            "type": "message_delta", "delta": {"stop_reason": stop_reason, "stop_sequence": stop_sequence},
            "usage": _usage(u.prompt_tokens, u.prompt_cache_hit_tokens, completion_tokens)}))
        out.append(MessagesStreamEvent({"type": "message_stop"}))
        return out


class MessagesResponse:
    """Accumulates stream events into a Messages `message` object."""

    def __init__(self, id: str, model: str, created: int = 0, prompt_tokens: int = 0,
                 prompt_cache_hit_tokens: int = 0):
        self.message = {"id": id, "type": "message", "role": "assistant", "model": model, "content": [],
                        "stop_reason": None, "stop_sequence": None,
                        "usage": _usage(prompt_tokens, prompt_cache_hit_tokens, 0)}
        self._json: dict[int, list] = {}

    def accumulate(self, event: MessagesStreamEvent):
        d = event.data
        t = d["type"]
        if t == "message_start":
            self.message.update({k: v for k, v in d["message"].items() if k != "content"})
        elif t == "content_block_start":
            self.message["content"].append(dict(d["content_block"]))
            if d["content_block"]["type"] == "tool_use":
                self._json[d["index"]] = []
        elif t == "content_block_delta":
            block = self.message["content"][d["index"]]
            delta = d["delta"]
            kind = delta["type"]
            if kind == "text_delta":
                block["text"] += delta["text"]
            elif kind == "thinking_delta":
                block["thinking"] += delta["thinking"]
            elif kind == "signature_delta":
                block["signature"] = delta["signature"]
            elif kind == "input_json_delta":
                self._json[d["index"]].append(delta["partial_json"])
        elif t == "content_block_stop":
            parts = self._json.get(d["index"])
            if parts is not None:
                self.message["content"][d["index"]]["input"] = json.loads("".join(parts) or "{}")
        elif t == "message_delta":
            self.message.update(d["delta"])
            self.message["usage"] = d["usage"]

    def to_dict(self) -> dict:
        return self.message

    def to_json(self) -> str:
        return compact_json(self.message)

    @staticmethod
    def sse_event_name(event) -> str:
        return event.data["type"]

    @staticmethod
    def sse_done_data():
        return None
