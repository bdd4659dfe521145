"""Incremental parser of raw DeepSeek V4-family output.

Text goes in as it arrives; typed events come out as soon as they are certain:
reasoning and content deltas, tool-call starts, argument deltas (string values
stream before their closing tag arrives) and tool-call ends. Anything that could
still be the start of a marker is held back, never emitted twice or dropped.
Malformed output becomes a `ParseIssue` and plain text; the parser never raises
on model output.
"""
import functools
import json
import re
from json.encoder import encode_basestring
import secrets
import string
from dataclasses import dataclass

from .dsml import V4_DSML, V41_DSML, DsmlNames
from .errors import UnsupportedFeatureError
from .options import ParsingOptions, ThinkingInitialStage

_ID_ALPHABET = (string.ascii_letters + string.digits).encode("ascii")
# Random bytes map onto the 62-symbol alphabet with one `bytes.translate`: bytes
# below 248 (= 4 * 62) map uniformly, the 8 bytes above are deleted. This keeps
# ids uniform while costing one system call instead of 24 `secrets.choice` calls
# (about 24 µs per tool call, most of a short stream's parse time).
_ID_UNIFORM = 4 * len(_ID_ALPHABET)
_ID_TABLE = bytes(_ID_ALPHABET[b % len(_ID_ALPHABET)] if b < _ID_UNIFORM else 0 for b in range(256))
_ID_DROPPED = bytes(range(_ID_UNIFORM, 256))
_ID_LENGTH = 24


def new_tool_call_id(index: int) -> str:
    """`call_NN_` + 24 uniformly random letters/digits from the OS CSPRNG."""
    while True:  # 32 bytes leave fewer than 24 symbols with probability ~1e-13
        symbols = secrets.token_bytes(32).translate(_ID_TABLE, _ID_DROPPED)
        if len(symbols) >= _ID_LENGTH:
            return f"call_{index:02d}_" + symbols[:_ID_LENGTH].decode("ascii")


@dataclass(slots=True)
class ReasoningDelta:
    text: str


@dataclass(slots=True)
class ContentDelta:
    text: str


@dataclass(slots=True)
class ToolCallStart:
    index: int
    id: str
    name: str


@dataclass(slots=True)
class ToolCallDelta:
    index: int
    arguments: str


@dataclass(slots=True)
class ToolCallEnd:
    index: int
    arguments: str


@dataclass(slots=True)
class ParseIssue:
    """Malformed model output, reported instead of raised.

    ``call`` is the index of the tool call the issue concerns (that call is then
    ``valid=False``), or ``None`` for an issue outside any call (text after the block)."""

    kind: str
    message: str
    call: int | None = None


REASONING, CONTENT, BLOCK, INVOKE, VALUE, AFTER, STOPPED = range(7)

_ATTR = re.compile(r'\s+(\w+)="([^"]*)"')
_CACHED_ATTR_TEXT = 256  # longer attribute texts are parsed without the cache


@functools.lru_cache(maxsize=1024)
def _cached_attributes(attr_text: str) -> dict:
    return dict(_ATTR.findall(attr_text))


def _tag_attributes(attr_text: str) -> dict:
    """A tag's `name="value"` pairs; read-only, as the dict may be shared.

    Agents call the same tools with the same parameters over and over, so the
    attribute texts repeat and are cached; only short ones, so that the cache
    stays small whatever the model writes.
    """
    if len(attr_text) <= _CACHED_ATTR_TEXT:
        return _cached_attributes(attr_text)
    return dict(_ATTR.findall(attr_text))


def _held_suffix(buf: str, markers) -> int:
    """Length of the longest tail of `buf` that is a proper prefix of some marker.

    Only positions holding a marker's first character are tried, so text with no
    `<` near its end costs one `find` per marker.
    """
    n = len(buf)
    best = 0
    for m in markers:
        i = buf.find(m[0], max(0, n - len(m) + 1))
        while i >= 0 and n - i > best:
            if m.startswith(buf[i:]):
                best = n - i
                break
            i = buf.find(m[0], i + 1)
    return best


_encode_json = json.JSONEncoder(ensure_ascii=False).encode


# A JSON integer that json.dumps(json.loads(.)) returns unchanged: no sign on zero, no
# leading zeros or spaces, and short enough for Python's int-string digit limit.
_CANONICAL_INT = re.compile(r"0|-?[1-9][0-9]{0,17}")


def _canonical_json(raw: str) -> str:
    """`json.dumps(json.loads(raw), ensure_ascii=False)`; integers, the common non-string
    argument, skip the decoder and encoder, whose setup costs more than the value.
    """
    if _CANONICAL_INT.fullmatch(raw):
        return raw
    value = json.loads(raw)
    return int.__repr__(value) if type(value) is int else _encode_json(value)


class _DialectTags:
    """The complete tag spellings of one DSML dialect."""

    __slots__ = ("block_open", "block_close", "invoke_open", "invoke_close", "param_open", "param_close",
                 "in_block", "in_invoke")

    def __init__(self, token: str, d: DsmlNames):
        self.block_open, self.block_close = f"<{token}{d.block}>", f"</{token}{d.block}>"
        self.invoke_open, self.invoke_close = f"<{token}{d.invoke}", f"</{token}{d.invoke}>"
        self.param_open, self.param_close = f"<{token}{d.parameter}", f"</{token}{d.parameter}>"
        # The tags that may come next inside a block and inside an invoke, in the order tried.
        self.in_block = (self.invoke_open, self.block_close)
        self.in_invoke = (self.param_open, self.invoke_close)


@functools.lru_cache(maxsize=8)
def _dialects(token: str) -> tuple:
    """Both dialects' tags for one DSML token, built once: every stream needs them."""
    return tuple(_DialectTags(token, d) for d in (V4_DSML, V41_DSML))


class ToolCallState:
    """One call being parsed: its argument JSON pieces so far and its parameter names."""

    __slots__ = ("index", "id", "name", "parts", "params", "valid")

    def __init__(self, index: int, id: str, name: str, valid: bool = True):
        self.index, self.id, self.name, self.valid = index, id, name, valid
        self.parts: list = []
        self.params: set = set()

    def __repr__(self):
        return f"ToolCallState({self.index}, {self.id!r}, {self.name!r}, valid={self.valid})"


class OutputParser:
    """Feed text with `feed`, then `finish`; both return lists of events."""

    def __init__(self, options: ParsingOptions):
        if options.parse_json_output:
            raise UnsupportedFeatureError("parse_json_output", "JSON extraction is not implemented")
        t = options.special_tokens
        self.think_end = t.thinking_end
        self.eos = t.eos
        # Both DSML dialects are recognised (as deepseek-recipe does); the first tag
        # of a block fixes the dialect for the rest of it.
        self.dialects = _dialects(t.dsml)
        self.block_opens = [dt.block_open for dt in self.dialects]
        self.tags = None
        self.parse_tools = options.parse_tool_calls
        self.stops = options.stop_sequences
        stage = options.thinking_initial_stage
        # A new turn's reasoning, and content that starts fresh (not a continuation),
        # drop the newlines the model writes after `<think>` / `</think>`.
        self.strip_leading = stage is ThinkingInitialStage.ReasoningStart
        self.strip_content = stage is not ThinkingInitialStage.ContentContinuation
        if options.starts_in_tool_calls:
            self.state = BLOCK
        elif stage is not None and stage.starts_in_reasoning():
            self.state = REASONING
        else:
            self.state = CONTENT
        self.buf = ""
        self.pending_newlines = ""
        self.pending_reasoning_newlines = ""
        self.calls: list[ToolCallState] = []
        self.call: ToolCallState | None = None
        self.value_is_string = True
        self.value_parts: list = []
        self.stop_sequence: str | None = None
        self.saw_eos = False
        self.issues: list[ParseIssue] = []

    # --- public -------------------------------------------------------------
    def feed(self, text: str) -> list:
        if "<" not in text and text and not self.buf:
            # Fast paths for the common chunk, one per backend token: no marker can start
            # inside it and nothing is held back, so it is a delta of the current state.
            # (A stopped parser has an empty buffer and matches no branch.)
            st = self.state
            if st == VALUE:
                target = self.value_target
                if target is not None and self.value_is_string:
                    delta = encode_basestring(text)[1:-1]
                    target.parts.append(delta)
                    return [ToolCallDelta(target.index, delta)]
            elif text[-1] != "\n" and not self.stops:  # trailing newlines may be markup
                if st == REASONING:
                    if not self.strip_leading and not self.pending_reasoning_newlines:
                        return [ReasoningDelta(text)]
                elif st == CONTENT and not self.strip_content and not self.pending_newlines:
                    return [ContentDelta(text)]
        if self.state == STOPPED or not text:
            return []
        self.buf += text
        out: list = []
        self._run(out, final=False)
        return out

    def finish(self) -> list:
        out: list = []
        if self.state != STOPPED:
            self._run(out, final=True)
            if self.buf and self.state in (REASONING, CONTENT):
                self._emit_text(out, self.buf)
                self.buf = ""
            if self.state in (BLOCK, INVOKE, VALUE):
                self._issue(out, "unterminated_tool_calls", "output ended inside a tool-call block",
                            self.call)
            if self.pending_reasoning_newlines and self.state == REASONING:
                out.append(ReasoningDelta(self.pending_reasoning_newlines))
                self.pending_reasoning_newlines = ""
            if self.pending_newlines and self.state == CONTENT:
                out.append(ContentDelta(self.pending_newlines))
                self.pending_newlines = ""
            self.state = STOPPED
        return out

    # --- machinery ----------------------------------------------------------
    def _issue(self, out, kind, message, call: "ToolCallState | None" = None):
        """Report an issue; one that concerns ``call`` also marks that call invalid, so
        ``valid`` and the issues list always agree."""
        if call is not None:
            call.valid = False
        issue = ParseIssue(kind, message, None if call is None else call.index)
        self.issues.append(issue)
        out.append(issue)

    def _emit_text(self, out, text):
        if not text:
            return
        if self.state == REASONING:
            if self.strip_leading:
                text = text.lstrip("\n")
                if not text:
                    return
                self.strip_leading = False
            # Newlines right before `</think>` are markup, held until more reasoning comes.
            body = text.rstrip("\n")
            if body:
                if self.pending_reasoning_newlines:
                    out.append(ReasoningDelta(self.pending_reasoning_newlines))
                    self.pending_reasoning_newlines = ""
                out.append(ReasoningDelta(body))
            self.pending_reasoning_newlines += text[len(body):]
            return
        if self.strip_content:
            text = text.lstrip("\n")
            if not text:
                return
            self.strip_content = False
        # Content: newlines right before a tool-call block belong to the markup.
        if self.parse_tools:
            body = text.rstrip("\n")
            if body:
                if self.pending_newlines:
                    out.append(ContentDelta(self.pending_newlines))
                    self.pending_newlines = ""
                out.append(ContentDelta(body))
            self.pending_newlines += text[len(body):]
        else:
            out.append(ContentDelta(text))

    def _run(self, out, final):
        while self.buf:
            st = self.state
            if st == VALUE:  # the hot state: long argument values stream through here
                if not self._scan_value(out, final):
                    return
            elif st == REASONING or st == CONTENT:
                if not self._scan_text(out, final):
                    return
            elif st in (BLOCK, INVOKE):
                if not self._scan_tag(out, final):
                    return
            elif st == AFTER:
                stripped = self.buf.lstrip()
                if stripped.startswith(self.eos):  # the normal end of a turn that made calls
                    self.saw_eos = True
                    self._stop()
                    return
                if stripped and not final and self.eos.startswith(stripped):
                    self.buf = stripped            # may still become the end-of-sentence token
                    return
                if stripped:
                    self._issue(out, "text_after_tool_calls", "text after the tool-call block")
                    self.state = CONTENT
                    self.pending_newlines = ""
                    self.buf = stripped
                    continue
                self.buf = ""
                return
            else:
                self.buf = ""
                return

    def _scan_text(self, out, final) -> bool:
        buf = self.buf
        markers = [self.eos] + self.stops
        if self.state == REASONING:
            markers.append(self.think_end)
        elif self.parse_tools:
            markers += self.block_opens
        # Earliest complete marker.
        hit, which = -1, None
        for m in markers:
            i = buf.find(m)
            if i >= 0 and (hit < 0 or i < hit):
                hit, which = i, m
        if hit < 0:
            keep = 0 if final else _held_suffix(buf, markers)
            self._emit_text(out, buf[:len(buf) - keep])
            self.buf = buf[len(buf) - keep:]
            return False
        self._emit_text(out, buf[:hit])
        self.buf = buf[hit + len(which):]
        if which == self.think_end and self.state == REASONING:
            self.pending_reasoning_newlines = ""
            self.state = CONTENT
        elif which in self.block_opens and self.state == CONTENT:
            self.tags = self.dialects[self.block_opens.index(which)]
            self.pending_newlines = ""
            self.state = BLOCK
        elif which == self.eos:
            self.saw_eos = True
            self._stop()
        else:
            self.stop_sequence = which
            self._stop()
        return True

    def _stop(self):
        self.state = STOPPED
        self.buf = ""

    def _scan_tag(self, out, final) -> bool:
        rest = self.buf.lstrip()  # the whitespace between tags (str.isspace's definition)
        if not rest:
            self.buf = ""
            return False
        tags = self.tags
        if self.state == BLOCK:
            if tags is None:  # the prompt opened the block: either dialect may follow
                expected = [x for dt in self.dialects for x in (dt.invoke_open, dt.block_close)]
            else:
                expected = tags.in_block
        else:
            expected = tags.in_invoke
        for tag in expected:
            if rest.startswith(tag):
                end = rest.find(">")
                if end < 0:
                    if final:
                        break
                    self.buf = rest
                    return False
                self.buf = rest[end + 1:]
                self._on_tag(out, tag, rest[len(tag):end])
                return True
            if tag.startswith(rest) and not final:
                self.buf = rest
                return False
        self._issue(out, "malformed_tool_call", f"unexpected text in tool-call block: {rest[:40]!r}",
                    self.call)
        if self.call is not None:
            self._end_call(out)
        self.state = CONTENT
        self.pending_newlines = ""
        self.buf = rest
        return True

    def _on_tag(self, out, tag, attr_text):
        attrs = _tag_attributes(attr_text)
        if self.tags is None:
            self.tags = next(dt for dt in self.dialects if tag in (dt.invoke_open, dt.block_close))
        tags = self.tags
        if tag == tags.block_close:
            self.state = AFTER
        elif tag == tags.invoke_open:
            name = attrs.get("name") or ""
            index = len(self.calls)
            self.call = ToolCallState(index, new_tool_call_id(index), name)
            self.calls.append(self.call)
            if not name:
                self._issue(out, "malformed_tool_call", "invoke tag without a name", self.call)
            out.append(ToolCallStart(index, self.call.id, name))
            self.state = INVOKE
        elif tag == tags.invoke_close:
            self._end_call(out)
            self.state = BLOCK
        else:  # parameter
            name = attrs.get("name", "")
            call = self.call
            if not name or name in call.params:
                kind = "duplicate_parameter" if name else "malformed_tool_call"
                self._issue(out, kind, f"tool call {call.name!r}: parameter {name!r} "
                                       f"{'repeated' if name else 'has no name'}", call)
                self.value_target = None
            else:
                call.params.add(name)
                self.value_target = call
                lead = ("{" if len(call.params) == 1 else ", ") + encode_basestring(name) + ": "
                self.value_is_string = attrs.get("string", "true") != "false"
                if self.value_is_string:
                    lead += '"'
                self._args(out, lead)
            self.value_parts = []
            self.state = VALUE

    def _args(self, out, text):
        call = self.call
        call.parts.append(text)
        out.append(ToolCallDelta(call.index, text))

    def _end_call(self, out):
        call = self.call
        if call is None:
            return
        self._args(out, "}" if call.params else "{}")
        out.append(ToolCallEnd(call.index, "".join(call.parts)))
        self.call = None

    def _scan_value(self, out, final) -> bool:
        buf = self.buf
        close = self.tags.param_close
        i = buf.find(close)
        target = self.value_target
        if i < 0:
            keep = 0 if final else _held_suffix(buf, (close,))
            chunk = buf[:len(buf) - keep]
            self.buf = buf[len(buf) - keep:]
            if chunk and target is not None:
                if self.value_is_string:
                    text = encode_basestring(chunk)[1:-1]
                    target.parts.append(text)
                    out.append(ToolCallDelta(target.index, text))
                else:
                    self.value_parts.append(chunk)
            return False
        chunk = buf[:i]
        self.buf = buf[i + len(close):]
        if target is not None:
            if self.value_is_string:
                if chunk:
                    self._args(out, encode_basestring(chunk)[1:-1])
                self._args(out, '"')
            else:
                raw = "".join(self.value_parts) + chunk
                try:
                    text = _canonical_json(raw)
                except ValueError:
                    self._issue(out, "invalid_json_parameter",
                                f"tool call {target.name!r}: non-string parameter is not JSON; kept as a string",
                                target)
                    text = encode_basestring(raw)
                self._args(out, text)
        self.state = INVOKE
        return True


@dataclass
class ParsedToolCall:
    id: str
    name: str
    arguments: str
    valid: bool


@dataclass
class ParsedOutput:
    """The whole-text parse of one completion."""

    reasoning: str | None
    content: str
    tool_calls: list[ParsedToolCall]
    issues: list[ParseIssue]
    stop_sequence: str | None

    @property
    def finish_reason(self) -> str:
        """`tool_calls` when a well-formed call was made, else `stop` (length comes from the backend)."""
        return "tool_calls" if any(c.valid for c in self.tool_calls) else "stop"


def parse_output(text: str, options: ParsingOptions) -> ParsedOutput:
    """Parse a complete model output; the same machine as streaming, fed once."""
    parser = OutputParser(options)
    events = parser.feed(text) + parser.finish()
    reasoning = [e.text for e in events if type(e) is ReasoningDelta]
    content = "".join(e.text for e in events if type(e) is ContentDelta)
    calls = [ParsedToolCall(c.id, c.name, "".join(c.parts), c.valid) for c in parser.calls]
    in_thinking = options.thinking_initial_stage is not None and \
        options.thinking_initial_stage.starts_in_reasoning() and not options.starts_in_tool_calls
    return ParsedOutput("".join(reasoning) if in_thinking else None, content, calls, list(parser.issues),
                        parser.stop_sequence)
