"""Parser events → OpenAI Responses stream events, numbered by `sequence_number`."""

from kernforge.recipe.events import StreamEvent, compact_json
import time

STATUS = {"stop": "completed", "tool_calls": "completed", "length": "incomplete",
          "content_filter": "incomplete"}


class ResponsesStreamEvent(StreamEvent):
    __slots__ = ()


class ResponsesChunkGenerator:
    """Output items in order: reasoning, message, function calls; each opened and closed once."""

    def __init__(self, id: str, model: str, request=None):
        self.id, self.model = id, model
        self.created = int(time.time())
        self.seq = 0
        self.items: list[dict] = []
        self.open = None  # (kind, item, text parts)
        self.usage = None
        self.namespace_tool_map = dict(request.namespace_tool_map) if request is not None else {}
        self.echo = request.echo if request is not None else None

    def with_namespace_tool_map(self, table: dict):
        self.namespace_tool_map = dict(table)
        return self

    def with_echo(self, echo):
        self.echo = echo
        return self

    def _ev(self, data):
        data["sequence_number"] = self.seq
        self.seq += 1
        return ResponsesStreamEvent(data)

    def _response(self, status, usage=None, incomplete=None):
        e = self.echo or {}
        return {"id": self.id, "object": "response", "created_at": self.created, "status": status,
                "error": None, "incomplete_details": incomplete, "instructions": e.get("instructions"),
                "max_output_tokens": e.get("max_output_tokens"), "model": self.model,
                "output": list(self.items), "parallel_tool_calls": True,
                "temperature": e.get("temperature", 1.0), "top_p": e.get("top_p", 1.0),
                "tool_choice": e.get("tool_choice", "auto"), "tools": e.get("tools", []),
                "metadata": e.get("metadata") or {}, "usage": usage}

    def start(self, usage, fingerprint):
        self.usage = usage
        return [self._ev({"type": "response.created", "response": self._response("in_progress")}),
                self._ev({"type": "response.in_progress", "response": self._response("in_progress")})]

    def _item_id(self, prefix):
        return f"{prefix}_{self.id}_{len(self.items)}"

    def _open_text(self, out, kind):
        self._close(out)
        idx = len(self.items)
        if kind == "reasoning":
            item = {"type": "reasoning", "id": self._item_id("rs"), "status": "in_progress",
                    "summary": [], "content": []}
            part = {"type": "reasoning_text", "text": ""}
        else:
            item = {"type": "message", "id": self._item_id("msg"), "status": "in_progress",
                    "role": "assistant", "content": []}
            part = {"type": "output_text", "annotations": [], "logprobs": [], "text": ""}
        self.open = (kind, item, [], idx)
        out.append(self._ev({"type": "response.output_item.added", "output_index": idx, "item": dict(item)}))
        out.append(self._ev({"type": "response.content_part.added", "item_id": item["id"],
                             "output_index": idx, "content_index": 0, "part": part}))

    def _close(self, out):
        if self.open is None:
            return
        kind, item, parts, idx = self.open
        self.open = None
        text = "".join(parts)
        if kind == "function_call":
            item["arguments"] = text
            out.append(self._ev({"type": "response.function_call_arguments.done", "item_id": item["id"],
                                 "output_index": idx, "arguments": text}))
        else:
            if kind == "reasoning":
                part = {"type": "reasoning_text", "text": text}
                done = {"type": "response.reasoning_text.done", "text": text}
            else:
                part = {"type": "output_text", "annotations": [], "logprobs": [], "text": text}
                done = {"type": "response.output_text.done", "text": text, "logprobs": []}
            done.update({"item_id": item["id"], "output_index": idx, "content_index": 0})
            out.append(self._ev(done))
            out.append(self._ev({"type": "response.content_part.done", "item_id": item["id"],
                                 "output_index": idx, "content_index": 0, "part": part}))
            item["content"] = [part]
        item["status"] = "completed"
        self.items.append(item)
        out.append(self._ev({"type": "response.output_item.done", "output_index": idx, "item": item}))

    def event(self, ev):
        out = []
        name = type(ev).__name__
        if name in ("ReasoningDelta", "ContentDelta"):
            kind = "reasoning" if name == "ReasoningDelta" else "message"
            if self.open is None or self.open[0] != kind:
                self._open_text(out, kind)
            _, item, parts, idx = self.open
            parts.append(ev.text)
            etype = "response.reasoning_text.delta" if kind == "reasoning" else "response.output_text.delta"
            data = {"type": etype, "item_id": item["id"], "output_index": idx, "content_index": 0,
                    "delta": ev.text}
            if kind == "message":
                data["logprobs"] = []
            out.append(self._ev(data))
        elif name == "ToolCallStart":
            self._close(out)
            idx = len(self.items)
            item = {"type": "function_call", "id": self._item_id("fc"), "status": "in_progress",
                    "call_id": ev.id, "name": ev.name, "arguments": ""}
            ns = self.namespace_tool_map.get(ev.name)
            if ns is not None:
                item["namespace"], item["name"] = ns
            self.open = ("function_call", item, [], idx)
            out.append(self._ev({"type": "response.output_item.added", "output_index": idx,
                                 "item": dict(item)}))
        elif name == "ToolCallDelta":
            _, item, parts, idx = self.open
            parts.append(ev.arguments)
            out.append(self._ev({"type": "response.function_call_arguments.delta", "item_id": item["id"],
                                 "output_index": idx, "delta": ev.arguments}))
        elif name == "ToolCallEnd":
            self._close(out)
        return out

    def end(self, reason, completion_tokens, stop_sequence):
        out = []
        self._close(out)
        u = self.usage
        usage = {"input_tokens": u.prompt_tokens,
                 "input_tokens_details": {"cached_tokens": u.prompt_cache_hit_tokens,
                                          "cache_write_tokens": 0},
                 "output_tokens": completion_tokens, "output_tokens_details": {"reasoning_tokens": 0},
                 "total_tokens": u.prompt_tokens + completion_tokens}
        status = STATUS[reason]
        incomplete = None
        if status == "incomplete":
            incomplete = {"reason": "max_output_tokens" if reason == "length" else "content_filter"}
        etype = "response.completed" if status == "completed" else "response.incomplete"
        out.append(self._ev({"type": etype, "response": self._response(status, usage, incomplete)}))
        return out


class ResponsesResponse:
    """Keeps the final response object carried by the terminal event."""

    def __init__(self, id: str, model: str, created: int = 0, prompt_tokens: int = 0,
                 prompt_cache_hit_tokens: int = 0):
        self.response = {"id": id, "object": "response", "created_at": created, "status": "in_progress",
                         "model": model, "output": [], "usage": None}

    def accumulate(self, event: ResponsesStreamEvent):
        if "response" in event.data:
            self.response = event.data["response"]

    def to_dict(self) -> dict:
        return self.response

    def to_json(self) -> str:
        return compact_json(self.response)

    @staticmethod
    def sse_event_name(event) -> str:
        return event.data["type"]

    @staticmethod
    def sse_done_data():
        return None
