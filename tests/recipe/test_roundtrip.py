"""Round trips: an assistant turn rendered into a prompt parses back to the same turn."""
import json

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

import kernforge.recipe as K

from .conftest import golden_dir

MARKERS = ("</think>", "<think>", "｜DSML｜", "<｜end▁of▁sentence｜>")
text = st.text(alphabet=st.sampled_from(list("ab <>/\"\\{}:,\n\té中😀")), max_size=20)
json_values = st.recursive(st.one_of(st.none(), st.booleans(), st.integers(-10 ** 12, 10 ** 12), text),
                           lambda c: st.one_of(st.lists(c, max_size=3), st.dictionaries(text, c, max_size=3)),
                           max_leaves=6)
ENCODINGS = {"v4": K.DeepseekV4Encoding, "v41": K.DeepseekV41Encoding}


@settings(max_examples=120, deadline=None)
@given(text, text, st.lists(st.tuples(st.sampled_from(["f", "get_weather"]),
                                      st.dictionaries(st.sampled_from(["a", "b", "path"]), json_values, max_size=3)),
                            max_size=3), st.sampled_from(sorted(ENCODINGS)))
def test_rendered_turn_parses_back(reasoning, content, calls, version):
    assume(not any(m in s for s in (reasoning, content) for m in MARKERS))
    assume(reasoning == reasoning.strip("\n") and content == content.strip("\n"))
    assume(all(not any(m in json.dumps(v, ensure_ascii=False) for m in MARKERS) for _, a in calls
               for v in a.values()))
    encoding = ENCODINGS[version]
    tools = [K.ToolDefinition("f", "F", {"type": "object"}), K.ToolDefinition("get_weather", "W", {"type": "object"})]
    turn = K.AssistantMessage(content, reasoning, [K.ToolCall(f"c{i}", n, json.dumps(a)) for i, (n, a) in
                                                   enumerate(calls)])
    conv = K.Conversation([K.UserMessage("q"), turn], tools=tools)
    raw = _segments(encoding().render_conversation(conv).prompt)[-1]
    out = K.parse_output(raw, K.ParsingOptions(parse_tool_calls=True,
                                               thinking_initial_stage=K.ThinkingInitialStage.ReasoningStart))
    assert out.reasoning == reasoning.lstrip("\n")
    assert out.content == content
    assert [(c.name, json.loads(c.arguments)) for c in out.tool_calls] == calls
    assert out.issues == []
    assert out.finish_reason == ("tool_calls" if calls else "stop")


def _segments(prompt):
    """Raw model output of each completed assistant turn of a thinking-mode prompt."""
    out, pos = [], 0
    while True:
        i = prompt.find("<｜Assistant｜><think>", pos)
        if i < 0:
            return out
        start = i + len("<｜Assistant｜><think>")
        end = prompt.find("<｜end▁of▁sentence｜>", start)
        if end < 0:
            return out  # the generation prompt
        out.append(prompt[start:end])
        pos = end


@pytest.mark.parametrize("folder", ["v4", "v41"])
def test_golden_parse_checks(folder):
    """The parse checks the goldens' README derives from v4/1 and v41/1."""
    golden = (golden_dir() / folder / "test_output_1.txt").read_bytes().decode("utf-8")
    first, last = _segments(golden)
    opts = K.ParsingOptions(parse_tool_calls=True,
                            thinking_initial_stage=K.ThinkingInitialStage.ReasoningStart)
    a = K.parse_output(first, opts)
    assert a.reasoning == "The user wants to know the weather in Beijing. I should use the get_weather tool."
    assert a.content == "" and a.finish_reason == "tool_calls"
    assert [(c.name, json.loads(c.arguments)) for c in a.tool_calls] == \
        [("get_weather", {"location": "Beijing", "unit": "celsius"})]
    b = K.parse_output(last, opts)
    assert b.reasoning == "Got the weather data. Let me format a nice response."
    assert b.content == ("The weather in Beijing is currently sunny with a temperature of 22°C and 45% humidity.")
    assert b.tool_calls == [] and b.finish_reason == "stop"


def test_golden_v41_2_last_turn():
    golden = (golden_dir() / "v41" / "test_output_2.txt").read_bytes().decode("utf-8")
    out = K.parse_output(_segments(golden)[-1], K.ParsingOptions(
        thinking_initial_stage=K.ThinkingInitialStage.ReasoningStart))
    assert (out.reasoning, out.content) == ("The user asks about the capital of France. It is Paris.",
                                            "The capital of France is Paris.")
