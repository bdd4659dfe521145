#!/usr/bin/env python3
"""Regenerate ``tests/recipe/data/peer_prompts.json``: request bodies rendered by the peer
implementation, ``deepseek-recipe`` 0.2.0 (PyPI), which ``tests/recipe/test_goldens.py``
then requires kernforge.recipe to reproduce byte for byte.

For each case: ``deepseek_recipe.<api>(body).convert(ConversionOptions())``, then the
encoding of the request's model version (``DeepseekV41Encoding`` for DeepSeek-V4.1-Flash,
else ``DeepseekV4Encoding``) renders the converted conversation; the file records the
prompt and its special-token ranges.  Written as ``json.dumps(..., indent=1,
ensure_ascii=False)`` in UTF-8 with no trailing newline.

    pip install deepseek-recipe==0.2.0
    python tools/gen_peer_prompts.py                  # rewrite the shipped file
    python tools/gen_peer_prompts.py --output X.json  # write elsewhere
    python tools/gen_peer_prompts.py --check          # exit 1 if the shipped file differs

To add a case, append it to CASES and rerun; ``tests/recipe/test_peer_prompts_generator.py``
checks that the shipped file is this script's output.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

DEFAULT_OUTPUT = Path(__file__).resolve().parents[1] / "tests/recipe/data/peer_prompts.json"
PEER_VERSION = "0.2.0"

# the two function tools every chat case offers
_CHAT_TOOLS = [{'type': 'function',
                'function': {'name': 'get_weather',
                             'description': 'Weather',
                             'parameters': {'type': 'object',
                                            'properties': {'city': {'type': 'string'},
                                                           'days': {'type': 'integer'}},
                                            'required': ['city']}}},
               {'type': 'function',
                'function': {'name': 'search',
                             'description': 'Search the web',
                             'parameters': {'type': 'object',
                                            'properties': {'q': {'type': 'string'},
                                                           'filters': {'type': 'object'}}}}}]

# one multi-turn tool conversation, rendered for V4 and (with max reasoning effort) V4.1
_MULTITURN_TOOLS = {
    'model': 'DeepSeek-V4-Pro',
    'messages': [{'role': 'system', 'content': 'You are terse.'},
                 {'role': 'user', 'content': 'Weather in Oslo and Rome for 3 days?'},
                 {'role': 'assistant',
                  'content': '',
                  'reasoning_content': 'Two cities: call twice.',
                  'tool_calls': [{'id': 'c1',
                                  'type': 'function',
                                  'function': {'name': 'get_weather',
                                               'arguments': '{"city":"Oslo","days":3}'}},
                                 {'id': 'c2',
                                  'type': 'function',
                                  'function': {'name': 'get_weather',
                                               'arguments': '{"city":"Rome","days":3}'}}]},
                 {'role': 'tool', 'tool_call_id': 'c1', 'content': '{"t":[1,2,3]}'},
                 {'role': 'tool', 'tool_call_id': 'c2', 'content': '{"t":[20,21,19]}'},
                 {'role': 'assistant',
                  'content': 'Oslo is cold; Rome is warm.',
                  'reasoning_content': 'Summarise.'},
                 {'role': 'user', 'content': 'Search news about "Rome" & <think> tags'}],
    'tools': _CHAT_TOOLS}

# (name, request class of deepseek_recipe, request body)
CASES = [
    ('chat_multiturn_tools_v4', 'ChatCompletionRequest', _MULTITURN_TOOLS),
    ('chat_multiturn_tools_v41', 'ChatCompletionRequest',
        {**_MULTITURN_TOOLS, 'model': 'DeepSeek-V4.1-Flash', 'reasoning_effort': 'max'}),
    ('chat_required_nothink_v4', 'ChatCompletionRequest',
        {'model': 'DeepSeek-V4-Pro',
         'messages': [{'role': 'system', 'content': 'You are terse.'},
                      {'role': 'user', 'content': 'Weather in Oslo and Rome for 3 days?'}],
         'tools': _CHAT_TOOLS,
         'tool_choice': 'required',
         'thinking': {'type': 'disabled'}}),
    ('chat_drop_reasoning_v41', 'ChatCompletionRequest',
        {'model': 'DeepSeek-V4.1-Flash',
         'messages': [{'role': 'user', 'content': 'a'},
                      {'role': 'assistant', 'content': 'b', 'reasoning_content': 'r'},
                      {'role': 'user', 'content': 'c'}],
         'reasoning_effort': 'low'}),
    ('chat_json_schema_v4', 'ChatCompletionRequest',
        {'model': 'DeepSeek-V4-Pro',
         'messages': [{'role': 'user', 'content': 'give json'}],
         'response_format': {'type': 'json_schema',
                             'json_schema': {'name': 'o',
                                             'schema': {'type': 'object',
                                                        'properties': {'名前': {'type': 'string'}}}}},
         'reasoning_effort': 'max'}),
    ('messages_tools_v4', 'MessagesRequest',
        {'model': 'DeepSeek-V4-Pro',
         'max_tokens': 100,
         'system': 'Be brief.',
         'messages': [{'role': 'user', 'content': 'hi'},
                      {'role': 'assistant',
                       'content': [{'type': 'thinking', 'thinking': 'call g', 'signature': 'x'},
                                   {'type': 'tool_use',
                                    'id': 't1',
                                    'name': 'get_weather',
                                    'input': {'city': 'Paris'}}]},
                      {'role': 'user',
                       'content': [{'type': 'tool_result', 'tool_use_id': 't1', 'content': 'sunny'}]}],
         'tools': [{'name': 'get_weather',
                    'description': 'Weather',
                    'input_schema': {'type': 'object',
                                     'properties': {'city': {'type': 'string'},
                                                    'days': {'type': 'integer'}},
                                     'required': ['city']}}]}),
    ('responses_reasoning_v41', 'ResponsesRequest',
        {'model': 'DeepSeek-V4.1-Flash',
         'instructions': 'Use tools.',
         'input': [{'type': 'message', 'role': 'user', 'content': 'list files'},
                   {'type': 'reasoning',
                    'id': 'r',
                    'summary': [],
                    'content': [{'type': 'reasoning_text', 'text': 'call ls'}]},
                   {'type': 'function_call',
                    'call_id': 'c9',
                    'name': 'ls',
                    'arguments': '{"path":"."}'},
                   {'type': 'function_call_output', 'call_id': 'c9', 'output': 'a.txt'}],
         'tools': [{'type': 'function',
                    'name': 'ls',
                    'description': 'List',
                    'parameters': {'type': 'object', 'properties': {'path': {'type': 'string'}}}}],
         'reasoning': {'effort': 'high'}}),
]


def render(peer=None) -> str:
    """The file's text, rendered with ``peer`` (default: the installed deepseek_recipe, which
    must be version PEER_VERSION)."""
    if peer is None:
        import importlib.metadata

        import deepseek_recipe as peer

        version = importlib.metadata.version("deepseek-recipe")
        if version != PEER_VERSION:
            raise SystemExit(f"deepseek-recipe {PEER_VERSION} recorded these prompts; {version} is installed")
    out = []
    for name, api, body in CASES:
        req = getattr(peer, api)(json.loads(json.dumps(body))).convert(peer.ConversionOptions())
        encoding = (peer.DeepseekV41Encoding if req.model_version == peer.ModelVersion.DeepseekV41Flash
                    else peer.DeepseekV4Encoding)()
        r = encoding.render_conversation(req.conversation)
        out.append({"name": name, "api": api, "body": body, "prompt": r.prompt,
                    "special_ranges": [list(x) for x in r.special_ranges]})
    return json.dumps(out, indent=1, ensure_ascii=False)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description="Regenerate tests/recipe/data/peer_prompts.json.")
    parser.add_argument("--output", type=Path, default=DEFAULT_OUTPUT,
                        help=f"where to write the file (default: {DEFAULT_OUTPUT})")
    parser.add_argument("--check", action="store_true",
                        help="compare with --output instead of writing it; exit 1 if they differ")
    args = parser.parse_args(argv)
    data = render().encode("utf-8")
    if args.check:
        if not (args.output.is_file() and args.output.read_bytes() == data):
            print(f"{args.output} is not what tools/gen_peer_prompts.py generates", file=sys.stderr)
            return 1
        return 0
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_bytes(data)
    return 0


if __name__ == "__main__":
    sys.exit(main())
