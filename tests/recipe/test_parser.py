"""Output parsing: whole text and streaming, chunking invariance, malformed output."""
import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import kernforge.recipe as K
from kernforge.recipe.dsml import V4_DSML, V41_DSML
from kernforge.recipe.parser import (ContentDelta, OutputParser, ParseIssue, ReasoningDelta, ToolCallDelta,
                                     ToolCallEnd, ToolCallStart)

THINK = K.ThinkingInitialStage.ReasoningStart
D = "｜DSML｜"


def dsml_block(calls, names=V4_DSML):
    """Raw model text of a tool-call block; calls = [(name, [(param, value)])]."""
    out = [f"<{D}{names.block}>\n"]
    for name, params in calls:
        out.append(f'<{D}{names.invoke} name="{name}">\n')
        for p, v in params:
            is_str = isinstance(v, str)
            text = v if is_str else json.dumps(v)
            out.append(f'<{D}{names.parameter} name="{p}" string="{"true" if is_str else "false"}">'
                       f'{text}</{D}{names.parameter}>\n')
        out.append(f"</{D}{names.invoke}>\n")
    out.append(f"</{D}{names.block}>")
    return "".join(out)


def parse(text, step=None, **kw):
    opts = K.ParsingOptions(**kw)
    p = OutputParser(opts)
    events = []
    if step is None:
        events += p.feed(text)
    else:
        for i in range(0, len(text), step):
            events += p.feed(text[i:i + step])
    events += p.finish()
    return events, p


def summary(events):
    reasoning = "".join(e.text for e in events if isinstance(e, ReasoningDelta))
    content = "".join(e.text for e in events if isinstance(e, ContentDelta))
    calls = {}
    for e in events:
        if isinstance(e, ToolCallStart):
            calls[e.index] = [e.name, ""]
        elif isinstance(e, ToolCallDelta):
            calls[e.index][1] += e.arguments
    ends = {e.index: e.arguments for e in events if isinstance(e, ToolCallEnd)}
    for i, (_, args) in calls.items():
        if i in ends:
            assert ends[i] == args  # the end event repeats exactly what was streamed
    return reasoning, content, [(n, json.loads(a)) for _, (n, a) in sorted(calls.items())], \
        [e.kind for e in events if isinstance(e, ParseIssue)]


def test_golden_segment_v4_first_turn():
    raw = ("The user wants to know the weather in Beijing. I should use the get_weather tool.</think>\n\n"
           + dsml_block([("get_weather", [("location", "Beijing"), ("unit", "celsius")])]))
    r, c, calls, issues = summary(parse(raw, parse_tool_calls=True, thinking_initial_stage=THINK)[0])
    assert r == "The user wants to know the weather in Beijing. I should use the get_weather tool."
    assert c == ""
    assert calls == [("get_weather", {"location": "Beijing", "unit": "celsius"})]
    assert issues == []


def test_v41_names_and_typed_parameters():
    params = [("s", 'a "quoted"\nline'), ("n", 3), ("f", -1.5), ("b", True), ("z", None),
              ("l", [1, {"k": "v"}]), ("o", {"x": [True]})]
    raw = "thinking</think>Answer.\n\n" + dsml_block([("f1", params), ("f2", [])], V41_DSML)
    ev, _ = parse(raw, parse_tool_calls=True, thinking_initial_stage=THINK)
    r, c, calls, issues = summary(ev)
    assert (r, c, issues) == ("thinking", "Answer.", [])
    assert calls == [("f1", dict(params)), ("f2", {})]


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 40), st.lists(st.text(max_size=15), min_size=1, max_size=3))
def test_chunking_does_not_change_result(step, texts):
    raw = ("\n\n" + texts[0] + "</think>" + texts[-1] + "\n\n"
           + dsml_block([("a", [("p", texts[0]), ("q", 7)]), ("b", [("p", texts[-1])])]))
    whole = summary(parse(raw, parse_tool_calls=True, thinking_initial_stage=THINK)[0])
    pieces = summary(parse(raw, step, parse_tool_calls=True, thinking_initial_stage=THINK)[0])
    assert pieces == whole
    assert whole[2] == [("a", {"p": texts[0], "q": 7}), ("b", {"p": texts[-1]})]


def test_duplicate_parameter_is_an_error_not_a_crash():
    raw = dsml_block([("f", [("x", "1"), ("x", "2")])])
    ev, p = parse(raw, parse_tool_calls=True)
    r, c, calls, issues = summary(ev)
    assert issues == ["duplicate_parameter"]
    assert calls == [("f", {"x": "1"})]
    assert not p.calls[0].valid


def test_non_json_value_with_string_false_is_reported():
    raw = f'<{D}tool_calls>\n<{D}invoke name="f">\n<{D}parameter name="x" string="false">not json</{D}parameter>\n</{D}invoke>\n</{D}tool_calls>'
    r, c, calls, issues = summary(parse(raw, parse_tool_calls=True)[0])
    assert calls == [("f", {"x": "not json"})]
    assert issues == ["invalid_json_parameter"]


def test_unterminated_block_reported():
    raw = f'<{D}tool_calls>\n<{D}invoke name="f">\n<{D}parameter name="x" string="true">abc'
    ev, p = parse(raw, 3, parse_tool_calls=True)
    assert "unterminated_tool_calls" in [e.kind for e in ev if isinstance(e, ParseIssue)]
    assert not p.calls[0].valid


def test_tool_markup_is_text_when_tools_are_off():
    raw = "Here: " + dsml_block([("f", [("x", "1")])])
    r, c, calls, issues = summary(parse(raw, 5, parse_tool_calls=False)[0])
    assert c == raw and calls == []


def test_stop_sequence_truncates_and_is_held_back():
    ev, p = parse("abcSTOPdef", 2, stop_sequences=["STOP"])
    assert summary(ev)[1] == "abc"
    assert p.stop_sequence == "STOP"
    # A partial stop sequence at the end is not a stop: it is emitted at finish.
    ev, p = parse("abcST", 1, stop_sequences=["STOP"])
    assert summary(ev)[1] == "abcST" and p.stop_sequence is None


def test_reasoning_start_strips_leading_newlines_only_at_start():
    ev, _ = parse("\n\nR\n</think>\nC", 1, thinking_initial_stage=THINK)
    assert summary(ev)[:2] == ("R", "C")  # newlines around </think> are markup
    ev, _ = parse("\nR</think>C", 1, thinking_initial_stage=K.ThinkingInitialStage.ReasoningContinuation)
    assert summary(ev)[:2] == ("\nR", "C")


def test_starts_in_tool_calls():
    raw = dsml_block([("f", [("x", 1)])])[len(f"<{D}tool_calls>"):]
    r, c, calls, issues = summary(parse(raw, 4, parse_tool_calls=True, starts_in_tool_calls=True)[0])
    assert calls == [("f", {"x": 1})] and c == "" and issues == []


@pytest.mark.parametrize("names", [V4_DSML, V41_DSML])
def test_both_dialects_parse_with_the_same_options(names):
    """The prompt fixes the dialect, not the parsing options (deepseek-recipe behaves the same)."""
    block = dsml_block([("f", [("x", 1)]), ("g", [("y", "z")])], names)
    r, c, calls, issues = summary(parse("R</think>" + block, 3, parse_tool_calls=True,
                                        thinking_initial_stage=THINK)[0])
    assert calls == [("f", {"x": 1}), ("g", {"y": "z"})] and issues == []
    opened = block[len(f"<{D}{names.block}>"):]
    r, c, calls, issues = summary(parse(opened, 2, parse_tool_calls=True, starts_in_tool_calls=True)[0])
    assert calls == [("f", {"x": 1}), ("g", {"y": "z"})] and issues == []


def test_text_after_block_is_kept_and_reported():
    raw = dsml_block([("f", [])]) + "\ntrailing"
    r, c, calls, issues = summary(parse(raw, parse_tool_calls=True)[0])
    assert c == "trailing" and issues == ["text_after_tool_calls"]


_pieces = st.lists(st.sampled_from(
    ["<", ">", "</think>", f"<{D}tool_calls>", f"</{D}tool_calls>", f'<{D}invoke name="f">', f"</{D}invoke>",
     f'<{D}parameter name="x" string="false">', f'<{D}parameter name="x" string="true">',
     f"</{D}parameter>", "\n", "{", "1", '"', "abc", "<｜end▁of▁sentence｜>", "STOP", f"<{D}", "name="]),
    max_size=30).map("".join)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_pieces, st.integers(1, 9), st.booleans(), st.booleans(), st.booleans())
def test_fuzz_raw_output_never_crashes(raw, step, think, tools, starts_in):
    ev, p = parse(raw, step, parse_tool_calls=tools, starts_in_tool_calls=starts_in and tools,
                  thinking_initial_stage=THINK if think else None, stop_sequences=["STOP"])
    # Every streamed call that ended has JSON-object arguments.
    for e in ev:
        if isinstance(e, ToolCallEnd):
            assert isinstance(json.loads(e.arguments), dict)
    # Nothing that is plain text is lost: without tools, stops or thinking, content is the input.
    if not tools and "STOP" not in raw and "<｜end▁of▁sentence｜>" not in raw and not think:
        assert summary(ev)[1] == raw.lstrip("\n")  # leading newlines of a fresh answer are markup


EOS = "<｜end▁of▁sentence｜>"


@pytest.mark.parametrize("step", [None, 1, 3, 7])
@pytest.mark.parametrize("sep", ["", "\n", " \n"])
def test_end_of_sentence_after_the_block_is_the_normal_end(step, sep):
    """Real models end a tool-calling turn with the block then EOS: no issue, calls valid,
    finish reason tool_calls; EOS split over chunks is held until it is complete."""
    raw = "Checking.\n\n" + dsml_block([("f", [("x", 1)]), ("g", [("y", "z")])]) + sep + EOS
    ev, p = parse(raw, step, parse_tool_calls=True)
    r, c, calls, issues = summary(ev)
    assert issues == [] and c == "Checking." and calls == [("f", {"x": 1}), ("g", {"y": "z"})]
    assert all(call.valid for call in p.calls) and p.saw_eos
    whole = K.parse_output(raw, K.ParsingOptions(parse_tool_calls=True))
    assert whole.issues == [] and whole.finish_reason == "tool_calls"


def test_text_after_the_block_is_still_an_issue_even_if_it_starts_like_eos():
    ev, p = parse(dsml_block([("f", [])]) + EOS[:4], 1, parse_tool_calls=True)   # a cut-off EOS is text
    issues = [e for e in ev if isinstance(e, ParseIssue)]
    assert [i.kind for i in issues] == ["text_after_tool_calls"] and issues[0].call is None
    assert p.calls[0].valid, "text after a finished block does not invalidate its calls"
    assert summary(ev)[1] == EOS[:4]


@pytest.mark.parametrize("raw, kind, bad", [
    (f'<{D}tool_calls>\n<{D}invoke name="f">\n<{D}parameter name="x" string="false">not json</{D}parameter>\n'
     f'</{D}invoke>\n<{D}invoke name="g">\n</{D}invoke>\n</{D}tool_calls>', "invalid_json_parameter", 0),
    (dsml_block([("f", []), ("g", [("x", "1"), ("x", "2")])]), "duplicate_parameter", 1),
    (dsml_block([("f", []), ("", [])]), "malformed_tool_call", 1),
    (dsml_block([("f", [])])[:-len(f"</{D}tool_calls>")] + f'<{D}invoke name="g">\n<{D}parameter name="x" string="true">abc',
     "unterminated_tool_calls", 1),
])
def test_valid_agrees_with_the_issues_list(raw, kind, bad):
    """An issue names the call it concerns, and exactly those calls are invalid (docs/recipe.md);
    an invalid_json_parameter call used to stay valid=True."""
    for step in (None, 2):
        ev, p = parse(raw, step, parse_tool_calls=True)
        issues = [e for e in ev if isinstance(e, ParseIssue)]
        assert [(i.kind, i.call) for i in issues] == [(kind, bad)]
        assert [c.valid for c in p.calls] == [i != bad for i in range(len(p.calls))]
    whole = K.parse_output(raw, K.ParsingOptions(parse_tool_calls=True))
    assert [c.valid for c in whole.tool_calls] == [i != bad for i in range(len(whole.tool_calls))]
    assert whole.finish_reason == "tool_calls"                      # the other call is valid
