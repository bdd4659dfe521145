"""Shared prompt renderer for the V4 family; encodings differ only in their tables.

The renderer appends pieces to a list and records which pieces are special
tokens; one pass at the end turns those into `special_ranges`, so the ranges are
exact without rescanning and the hot path is plain list appends.
"""
import re
from itertools import accumulate

from .conversation import Conversation, ToolDefinition
from .dsml import DsmlNames, arguments_to_parameters, dump_json
from .errors import ConversionError, UnsupportedFeatureError
from .prompt_text import SCHEMA_FORMAT, TOOL_PROMPT_HEAD, TOOL_PROMPT_TAIL
from .tokens import DEFAULT_SPECIAL_TOKENS, SpecialTokens

_TEMPLATE_MARK = re.compile(r"(\{D\}|<think>|</think>)")


class RenderedPrompt:
    """A prompt, the image sources of its placeholders, and its special-token spans."""

    __slots__ = ("prompt", "image_sources", "special_ranges")

    def __init__(self, prompt, image_sources, special_ranges):
        self.prompt, self.image_sources, self.special_ranges = prompt, image_sources, special_ranges

    def __repr__(self):
        return f"RenderedPrompt({self.prompt[:60]!r}..., {len(self.special_ranges)} special ranges)"


class _Builder:
    """Prompt pieces plus the indices of the pieces that are special tokens."""

    __slots__ = ("parts", "marks")

    def __init__(self):
        self.parts, self.marks = [], []

    def text(self, s: str):
        self.parts.append(s)

    def special(self, s: str):
        self.marks.append(len(self.parts))
        self.parts.append(s)

    def extend(self, parts, marks):
        """Append pre-split pieces; `marks` are the special pieces' offsets within them."""
        base = len(self.parts)
        self.parts.extend(parts)
        for m in marks:  # a few marks at most: a loop beats building a generator
            self.marks.append(base + m)

    def finish(self):
        starts = list(accumulate(map(len, self.parts), initial=0))
        return "".join(self.parts), [(starts[i], starts[i + 1]) for i in self.marks]


class PromptEncoding:
    """Renders a Conversation into a V4-family prompt.

    Subclasses set: `dsml` names, `system_token` (V4.1 marks system turns),
    `hoist_system` (V4 gathers every system message into the opening block),
    `supports_images`, `filter_empty_user_parts` (V4 skips empty user texts when it
    merges a user turn; V4.1 joins every part), `blank_line_in_empty_invoke` (V4.1
    writes an empty line inside a call without parameters), `missing_reasoning_is_empty`
    (V4.1 shows kept thinking-mode turns as `<think>…</think>` even without
    reasoning; V4 shows a turn's reasoning whenever it has some and it is kept) and `effort_text` / `json_object_text`.
    """

    dsml: DsmlNames
    system_token: bool
    hoist_system: bool
    supports_images: bool
    filter_empty_user_parts: bool
    blank_line_in_empty_invoke: bool
    missing_reasoning_is_empty: bool
    json_object_text: str

    def __init__(self, special_tokens: SpecialTokens = DEFAULT_SPECIAL_TOKENS):
        self.special_tokens = special_tokens
        t = special_tokens
        head = TOOL_PROMPT_HEAD.replace("{B}", self.dsml.block).replace("{I}", self.dsml.invoke)
        head = head.replace("{P}", self.dsml.parameter)
        split = [p for p in _TEMPLATE_MARK.split(head) if p]
        specials = {"{D}": t.dsml, "<think>": t.thinking_start, "</think>": t.thinking_end}
        pieces = [specials.get(p, p) for p in split]
        marks = [i for i, p in enumerate(split) if p in specials]
        self._tool_head = (tuple(pieces), tuple(marks))

    def with_special_tokens(self, special_tokens: SpecialTokens):
        return type(self)(special_tokens)

    def effort_text(self, effort: str | None) -> str:
        raise NotImplementedError

    # --- pieces -------------------------------------------------------------
    def _tool_prompt(self, b: _Builder, tools: list[ToolDefinition]):
        b.extend(*self._tool_head)
        b.text("\n".join(dump_json({"name": tool.name, "description": tool.description or "",
                                    "parameters": tool.parameters})
                         for tool in tools))
        b.text(TOOL_PROMPT_TAIL)

    def _format_text(self, conv: Conversation) -> str:
        fmt = conv.response_format
        if fmt == "json_schema":
            return SCHEMA_FORMAT + dump_json(conv.response_schema)
        if fmt == "json_object":
            return self.json_object_text
        return ""  # text, and regex: the constraint alone carries a regex format

    def _open_tag(self, b: _Builder, word: str):
        b.extend(("<", self.special_tokens.dsml, word + ">"), (1,))

    def _tool_calls(self, b: _Builder, calls):
        """The DSML block of a history turn; the hot path of long agent histories."""
        d, dsml = self.dsml, self.special_tokens.dsml
        parts, marks = b.parts, b.marks
        invoke_open = d.invoke + ' name="'
        param_open = d.parameter + ' name="'
        param_close = d.parameter + ">\n"
        invoke_close = d.invoke + ">\n"
        empty_params = "\n" if self.blank_line_in_empty_invoke else ""
        marks.append(len(parts) + 1)
        parts.extend(("<", dsml, d.block + ">\n"))
        for call in calls:
            params = arguments_to_parameters(call.name, call.arguments)
            marks.append(len(parts) + 1)
            parts.extend(("<", dsml, f'{invoke_open}{call.name}">\n{"" if params else empty_params}'))
            for name, text, is_string in params:
                n = len(parts)
                marks.append(n + 1)
                marks.append(n + 3)
                parts.extend(("<", dsml, f'{param_open}{name}" string="{"true" if is_string else "false"}">{text}</',
                              dsml, param_close))
            marks.append(len(parts) + 1)
            parts.extend(("</", dsml, invoke_close))
        marks.append(len(parts) + 1)
        parts.extend(("</", dsml, d.block + ">"))

    def _content_with_images(self, b: _Builder, message, images: list):
        """Write content; the first image-token occurrences become special placeholders."""
        sources = message.image_sources
        if not sources:
            b.text(message.content)
            return
        if not self.supports_images:
            raise UnsupportedFeatureError("image input", f"{type(self).__name__} has no vision input")
        token = self.special_tokens.image
        chunks = message.content.split(token, len(sources))
        if len(chunks) - 1 != len(sources):
            raise ConversionError(
                f"{message.role} message has {len(sources)} image sources but "
                f"{len(chunks) - 1} image placeholders")
        b.text(chunks[0])
        for src, chunk in zip(sources, chunks[1:]):
            b.special(token)
            images.append(src)
            b.text(chunk)

    # --- conversation -------------------------------------------------------
    def render_conversation(self, conv: Conversation) -> RenderedPrompt:
        t = self.special_tokens
        b = _Builder()
        images: list = []
        b.special(t.bos)
        messages = conv.messages
        thinking = conv.thinking_mode
        tools = conv.tools if conv.tool_choice != "none" else []
        if thinking and conv.tool_choice == "required":
            raise ConversionError("Thinking mode does not support this tool_choice", param="tool_choice")
        for i, m in enumerate(messages):
            if m.prefix and i != len(messages) - 1:
                raise ConversionError(f"messages[{i}]: only the last assistant message may be a prefix")

        # Opening system block.
        if self.hoist_system:
            opening, rest = [], []
            for m in messages:
                (opening if m.role == "system" else rest).append(m)
        elif messages and messages[0].role == "system":
            opening, rest = [messages[0]], messages[1:]
        else:
            opening, rest = [], messages
        effort = self.effort_text(conv.reasoning_effort) if thinking else ""
        fmt = self._format_text(conv)
        if opening or effort or tools or fmt:
            if self.system_token:
                b.special(t.system)
            b.text(effort)
            b.text("\n\n".join([m.content for m in opening if m.content]))
            for m in opening:
                if m.tools:
                    b.text("\n\n")
                    self._tool_prompt(b, m.tools)
            if tools:
                b.text("\n\n")
                self._tool_prompt(b, tools)
            b.text(fmt)

        # A turn shows its reasoning only if it has some and it is kept: with tools every
        # turn keeps it; without, only thinking-mode turns after the last user message do.
        drop = not tools and not any([m.tools for m in messages])
        last_user = len(rest)
        if drop and thinking:
            last_user = -1
            for i, m in enumerate(rest):
                if m.role in ("user", "developer"):
                    last_user = i
        turn: list = []  # user-side messages (user, tool, developer) of the open user turn
        task = None

        def write_user_side(m):
            nonlocal task
            if m.role == "tool":
                if m.image_sources:
                    b.text("<tool_result>")
                    self._content_with_images(b, m, images)
                    b.text("</tool_result>")
                else:
                    b.text(f"<tool_result>{m.content}</tool_result>")
            elif m.role == "developer":
                b.text(m.content)
                if m.tools:
                    b.text("\n\n")
                    self._tool_prompt(b, m.tools)
            else:
                if m.image_sources:
                    self._content_with_images(b, m, images)
                else:
                    b.text(m.content)
                task = m.task

        call_ids: list = []  # tool_call_ids of the latest assistant's calls, in call order

        def flush():
            if not turn:
                return
            if call_ids:
                # Results come back in any order; the model reads them in call order.
                slots = [k for k, m in enumerate(turn) if m.role == "tool"]
                if [turn[k].tool_call_id for k in slots] != call_ids[:len(slots)]:
                    order = {cid: k for k, cid in enumerate(call_ids)}
                    late = len(order)
                    ordered = sorted((turn[k] for k in slots), key=lambda m: order.get(m.tool_call_id, late))
                    for k, m in zip(slots, ordered):
                        turn[k] = m
            b.special(t.user)
            if self.filter_empty_user_parts:
                # V4: tool results, then the non-empty user texts, blank-line separated.
                n_tools = written = 0
                for m in turn:
                    if m.role == "tool":
                        n_tools += 1
                    elif not m.content and not m.tools:
                        continue
                    if written:
                        b.text("\n\n")
                    write_user_side(m)
                    written += 1
                if n_tools and written == n_tools and n_tools < len(turn):
                    b.text("\n\n")  # a user part follows the results, but it is empty
            else:
                for k, m in enumerate(turn):
                    if k:
                        b.text("\n\n")
                    write_user_side(m)
            turn.clear()

        for i, m in enumerate(rest):
            role = m.role
            if role in ("user", "tool", "developer"):
                if (role == "tool" and self.filter_empty_user_parts and turn
                        and turn[-1].role != "tool"):
                    flush()  # V4 starts a new user turn for tool results after user text
                turn.append(m)
                continue
            flush()
            if role == "assistant":
                content = m.content
                reasoning = m.reasoning_content
                kept = not drop or m.prefix or i >= last_user
                if self.missing_reasoning_is_empty:
                    show, reasoning = thinking and kept, reasoning or ""
                else:
                    show = reasoning is not None and kept
                if show:
                    if thinking and m.prefix and not content and not m.tool_calls:
                        # reasoning continuation: the model goes on thinking
                        b.extend((t.assistant, t.thinking_start, reasoning), (0, 1))
                        break
                    b.extend((t.assistant, t.thinking_start, reasoning, t.thinking_end), (0, 1, 3))
                elif thinking and m.prefix and not content:
                    b.special(t.assistant)  # V4 prefill with neither reasoning nor text: left bare
                else:
                    b.extend((t.assistant, t.thinking_end), (0, 1))
                if task:
                    b.special(f"<｜{task}｜>")
                    task = None
                b.text(content)
                call_ids = []
                if m.tool_calls:
                    b.text("\n\n")
                    self._tool_calls(b, m.tool_calls)
                    call_ids = [c.id for c in m.tool_calls]
                if not m.prefix:
                    b.special(t.eos)
            elif role == "system":
                if self.system_token:
                    b.special(t.system)
                b.text(m.content)
                if m.tools:
                    b.text("\n\n")
                    self._tool_prompt(b, m.tools)
            elif role == "latest_reminder":
                b.special(t.latest_reminder)
                b.text(m.content)
            else:
                raise ConversionError(f"unknown message role {role!r}")

        flush()
        prefix = messages[-1] if messages and messages[-1].prefix else None
        if prefix is None:
            b.extend((t.assistant, t.thinking_start if thinking else t.thinking_end), (0, 1))
            if task:
                b.special(f"<｜{task}｜>")
        if conv.tool_choice == "required" and tools and not (prefix and prefix.tool_calls):
            # A required tool call: the prompt itself opens the block (after any prefill text).
            b.text("\n\n")
            self._open_tag(b, self.dsml.block)
            b.text("\n")
        prompt, ranges = b.finish()
        return RenderedPrompt(prompt, images, ranges)
