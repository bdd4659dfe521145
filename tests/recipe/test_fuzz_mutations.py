"""Seeded mutation fuzzing: only typed errors escape the recipe layer.

Valid request bodies of the three APIs are mutated (keys dropped, values replaced by
other JSON types, empty strings, huge numbers, list items duplicated or dropped, unknown
keys added) and converted, rendered and answered with random model output pushed
through a `StreamProcessor` in random chunks.  A request may be rejected only with a
`ConversionError` (a server's 400); model output may never raise; every streamed event
must serialise; and every tool call's `valid` must agree with the issues reported for
it.  The seed is fixed, so CI runs the same cases every time; `RECIPE_FUZZ_SEED` and
`RECIPE_FUZZ_CASES` explore others locally.
"""
import copy
import json
import os
import random
import time

import pytest

import kernforge.recipe as K
from tests.recipe.test_parser import D

SEED = int(os.environ.get("RECIPE_FUZZ_SEED", "20240516"))
CASES = int(os.environ.get("RECIPE_FUZZ_CASES", "6000"))
BUDGET_S = 20.0
V4, V41 = "DeepSeek-V4-Pro", "DeepSeek-V4.1-Flash"
PNG = ("data:image/png;base64,iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8BQ"
       "DwAEhQGAhKmMIQAAAABJRU5ErkJggg==")
FN = {"type": "object", "properties": {"city": {"type": "string"}}}


def _peer_bodies():
    path = os.path.join(os.path.dirname(__file__), "data", "peer_prompts.json")
    with open(path, encoding="utf-8") as f:
        return [(case["api"], case["body"]) for case in json.load(f)]


SEEDS = _peer_bodies() + [
    ("ChatCompletionRequest", {
        "model": V41, "stream": True, "stop": ["END"], "temperature": 0.3, "max_tokens": 50,
        "tools": [{"type": "function", "function": {"name": "f", "parameters": FN}}],
        "tool_choice": {"type": "function", "function": {"name": "f"}}, "thinking": {"type": "disabled"},
        "messages": [{"role": "developer", "content": "be brief"},
                     {"role": "user", "content": [{"type": "text", "text": "look"},
                                                  {"type": "image_url", "image_url": {"url": PNG}}]},
                     {"role": "assistant", "content": None, "tool_calls": [
                         {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{\"city\": \"x\"}"}}]},
                     {"role": "tool", "tool_call_id": "c1", "content": "sunny"},
                     {"role": "latest_reminder", "content": "today is Monday"},
                     {"role": "assistant", "content": "So", "prefix": True}]}),
    ("MessagesRequest", {
        "model": V4, "max_tokens": 100, "system": [{"type": "text", "text": "sys"}],
        "thinking": {"type": "enabled", "budget_tokens": 50}, "output_config": {"effort": "max"},
        "tools": [{"name": "f", "description": "d", "input_schema": FN}],
        "tool_choice": {"type": "auto"}, "stop_sequences": ["Z"],
        "messages": [{"role": "user", "content": "hi"},
                     {"role": "assistant", "content": [
                         {"type": "thinking", "thinking": "hmm", "signature": "sig"},
                         {"type": "text", "text": "calling"},
                         {"type": "tool_use", "id": "t1", "name": "f", "input": {"city": "x"}}]},
                     {"role": "user", "content": [
                         {"type": "tool_result", "tool_use_id": "t1", "content": [{"type": "text", "text": "ok"}],
                          "is_error": False},
                         {"type": "text", "text": "and now?"}]}]}),
    ("MessagesRequest", {
        "model": V41, "max_tokens": 10, "messages": [{"role": "user", "content": [
            {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": PNG.split(",")[1]}},
            {"type": "text", "text": "what is it?"}]}]}),
    ("ResponsesRequest", {
        "model": V41, "instructions": "be nice", "reasoning": {"effort": "high"},
        "text": {"format": {"type": "text"}}, "max_output_tokens": 30,
        "tools": [{"type": "function", "name": "f", "parameters": FN},
                  {"type": "namespace", "name": "ns", "tools": [{"type": "function", "name": "g"}]},
                  {"type": "custom", "name": "apply_patch"}],
        "input": [{"type": "message", "role": "user", "content": [{"type": "input_text", "text": "hi"},
                                                                  {"type": "input_image", "image_url": PNG}]},
                  {"type": "reasoning", "id": "r1", "summary": [{"type": "summary_text", "text": "think"}]},
                  {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"},
                  {"type": "function_call_output", "call_id": "c1", "output": "done"},
                  {"type": "custom_tool_call", "call_id": "c2", "name": "apply_patch", "input": "*** Begin Patch"},
                  {"type": "custom_tool_call_output", "call_id": "c2", "output": "applied"},
                  {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "ok"}]},
                  {"type": "message", "role": "user", "content": "thanks"}]}),
    ("ResponsesRequest", {"model": V4, "input": "plain", "tool_choice": "none"}),
]
GENERATORS = {"ChatCompletionRequest": K.ChatCompletionRequest, "MessagesRequest": K.MessagesRequest,
              "ResponsesRequest": K.ResponsesRequest}

_ODD_VALUES = [None, True, False, 0, -1, 1.5, 2 ** 70, -2 ** 63, "", " ", "x", "\x00", "<｜end▁of▁sentence｜>",
               [], [None], {}, {"type": "text"}, {"role": "user"}, "user", "assistant", "tool", "function",
               "text", "image", "image_url", "input_text", "tool_use", "tool_result", "thinking", "message",
               float("inf"), "https://a/b.png", "data:,", "auto", "required", "none", "any", "enabled"]


def _paths(node):
    """Every (container, key) in a JSON tree, the root's children first."""
    out = []
    if isinstance(node, dict):
        for k, v in node.items():
            out.append((node, k))
            out += _paths(v)
    elif isinstance(node, list):
        for i, v in enumerate(node):
            out.append((node, i))
            out += _paths(v)
    return out


def _random_value(rng: random.Random, depth=0):
    r = rng.random()
    if r < 0.6 or depth > 1:
        return copy.deepcopy(rng.choice(_ODD_VALUES))   # a fresh container: no shared (cyclic) lists
    if r < 0.8:
        return [_random_value(rng, depth + 1) for _ in range(rng.randint(0, 2))]
    return {rng.choice(["type", "text", "role", "content", "name", "id", "zz"]): _random_value(rng, depth + 1)
            for _ in range(rng.randint(0, 2))}


def mutate(body, rng: random.Random):
    body = copy.deepcopy(body)
    for _ in range(rng.randint(1, 3)):
        spots = _paths(body)
        if not spots:
            break
        parent, key = rng.choice(spots)
        op = rng.random()
        if op < 0.3:                                        # drop a required or optional field
            del parent[key]
        elif op < 0.7:                                      # another type or an edge value
            parent[key] = _random_value(rng)
        elif op < 0.8 and isinstance(parent, list):         # duplicate an item
            parent.insert(key, copy.deepcopy(parent[key]))
        elif op < 0.9 and isinstance(parent[key], str):     # empty or emptied-out string
            parent[key] = rng.choice(["", parent[key][:1], parent[key] * 2])
        elif isinstance(parent, dict):                      # an unknown or misplaced key
            parent[rng.choice(["bogus", "name", "content", "role", "id", "prefix", "tool_calls"])] = \
                _random_value(rng)
    return body


_OUTPUT_PIECES = ["R", "\n", "</think>", "text", f"<{D}tool_calls>", f"</{D}tool_calls>",
                  f'<{D}invoke name="f">', f'<{D}invoke name="">', f"</{D}invoke>", f"<{D} calls>",
                  f'<{D} invoke name="g">', f"</{D} invoke>", f"</{D} calls>",
                  f'<{D}parameter name="city" string="true">', f'<{D}parameter name="n" string="false">',
                  f"</{D}parameter>", f"</{D} parameter>", "{", "1", '"', "not json", "<", ">",
                  "<｜end▁of▁sentence｜>", "END", "Z", f"<{D}", 'name="x"']


def random_output(rng: random.Random) -> str:
    return "".join(rng.choice(_OUTPUT_PIECES) for _ in range(rng.randint(0, 14)))


def answer(req: K.ConversationRequest, api: str, text: str, rng: random.Random):
    """Stream ``text`` as the model's answer to ``req``; every event must serialise."""
    gen = GENERATORS[api].chunk_generator(req, "id_1", req.model)
    sp = K.StreamProcessor(gen, req.parsing_options)
    events = sp.push(K.InferenceChunk.ready(prompt_usage=K.PromptUsage(prompt_tokens=3)))
    i = 0
    while i < len(text):
        step = rng.randint(1, 9)
        events += sp.push(K.InferenceChunk.text(text[i:i + step], 1))
        i += step
    events += sp.push(K.InferenceChunk.finish(rng.choice(list(K.InferenceFinishReason)))) + sp.finish()
    for e in events:
        e.to_json()
    return sp


def assert_valid_agrees_with_issues(calls, issues):
    flagged = {i.call for i in issues if i.call is not None}
    for c in calls:
        assert c.valid == (c.index not in flagged), (c, issues)
    assert all(i.call is None or 0 <= i.call < len(calls) for i in issues)


def test_mutated_requests_and_random_output_raise_only_typed_errors():
    rng = random.Random(SEED)
    start = time.perf_counter()
    rejected = converted = 0
    for case in range(CASES):
        api, seed_body = rng.choice(SEEDS)
        body = mutate(seed_body, rng)
        if rng.random() < 0.05:                             # the wrong API for the body
            api = rng.choice(list(GENERATORS))
        options = K.ConversionOptions(default_thinking_mode=rng.random() < 0.5)
        where = f"case {case} (seed {SEED}): {api} {json.dumps(body, default=str)[:400]}"
        try:
            req = GENERATORS[api](body if rng.random() < 0.8 else json.dumps(body)).convert(options)
            req.model_version.encoding().render_conversation(req.conversation)
        except K.ConversionError:
            rejected += 1
            continue
        except Exception as exc:                            # a bare error is a server's 500
            raise AssertionError(f"{type(exc).__name__}: {exc} -- {where}") from exc
        converted += 1
        text = random_output(rng)
        try:
            sp = answer(req, api, text, rng)
        except Exception as exc:
            raise AssertionError(f"model output {text!r} raised {type(exc).__name__}: {exc} -- {where}") from exc
        assert_valid_agrees_with_issues(sp._parser.calls, sp.issues)
    elapsed = time.perf_counter() - start
    assert rejected > CASES // 10 and converted > CASES // 10, (rejected, converted)  # both sides exercised
    assert elapsed < BUDGET_S, f"{CASES} cases took {elapsed:.1f} s (budget {BUDGET_S} s)"


@pytest.mark.parametrize("api,body", SEEDS)
def test_the_seed_bodies_are_valid(api, body):
    """The mutations start from bodies that convert: a mutated body tests one change."""
    req = GENERATORS[api](body).convert(K.ConversionOptions())
    req.model_version.encoding().render_conversation(req.conversation)
