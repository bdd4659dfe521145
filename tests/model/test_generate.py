"""Byte tokenizer and the end-to-end smoke path: recipe -> prompt -> tokens -> tiny model -> text."""

import argparse
import json

import pytest
import torch
from hypothesis import given, strategies as st

from kernforge.model.cli import register
from kernforge.model.generate import generate, greedy_decode, render_prompt, smoke_model
from kernforge.model.tokenizer import BYTE_OFFSET, SPECIAL_TOKENS, VOCAB_SIZE, ByteTokenizer


@given(st.text())
def test_plain_text_round_trips_through_bytes(text):
    tok = ByteTokenizer()
    ids = tok.encode(text)
    assert all(BYTE_OFFSET <= i < VOCAB_SIZE for i in ids) and len(ids) == len(text.encode("utf-8"))
    assert tok.decode(ids) == text


def test_special_ranges_become_single_tokens_and_typed_spellings_stay_bytes():
    tok = ByteTokenizer()
    user = "<｜User｜>"
    text = f"<｜begin▁of▁sentence｜>{user}hi {user}<｜Assistant｜>"
    end = len(text) - len("<｜Assistant｜>")
    ranges = [(0, 21), (21, 21 + len(user)), (end, len(text))]  # the typed second "<｜User｜>" is not marked
    ids = tok.encode(text, ranges)
    assert ids[:2] == [0, SPECIAL_TOKENS.index(user)] and ids[-1] == SPECIAL_TOKENS.index("<｜Assistant｜>")
    assert len(ids) == 3 + len(f"hi {user}".encode("utf-8"))
    assert tok.decode(ids) == text
    with pytest.raises(ValueError, match="not a known special token"):
        tok.encode("abc", [(0, 2)])
    with pytest.raises(ValueError, match="out of order"):
        tok.encode(text, [(21, 29), (0, 21)])
    with pytest.raises(ValueError, match="outside the tokenizer vocabulary"):
        tok.decode([VOCAB_SIZE])


def test_recipe_prompt_encodes_with_its_special_tokens():
    prompt, ranges = render_prompt("What is 2+2?")
    ids = ByteTokenizer().encode(prompt, ranges)
    assert ids[0] == 0 and "What is 2+2?" in prompt
    assert SPECIAL_TOKENS.index("<｜User｜>") in ids and SPECIAL_TOKENS.index("<｜Assistant｜>") in ids
    assert ByteTokenizer().decode(ids) == prompt


def test_generate_runs_end_to_end_and_matches_uncached_greedy(_one_torch_thread):
    result = generate("Say hello.", max_tokens=4, seed=0)
    assert 1 <= len(result.output_ids) <= 4 and result.prompt_ids[0] == 0
    assert ByteTokenizer().decode(result.output_ids) == result.text
    # Cached decode picks the same tokens as re-running the whole sequence each step.
    model = smoke_model(0)
    seq = list(result.prompt_ids)
    for expected in result.output_ids:
        seq.append(int(model(torch.tensor([seq]))[0, -1].argmax()))
        assert seq[-1] == expected


def test_greedy_decode_checks_its_budget():
    model = smoke_model(0)
    with pytest.raises(ValueError, match="max_tokens"):
        greedy_decode(model, [0, 40], 0, 1)
    with pytest.raises(ValueError, match="leaves room"):
        greedy_decode(model, [0] * 1000, 30, 1)


@pytest.mark.slow
def test_cli_generate_subcommand(capsys, _one_torch_thread):
    parser = argparse.ArgumentParser(prog="kernforge")
    register(parser.add_subparsers())
    args = parser.parse_args(["generate", "hi", "--max-tokens", "2", "--json"])
    assert args.func(args) == 0
    record = json.loads(capsys.readouterr().out)
    assert record["prompt_tokens"] > 10 and 1 <= len(record["output_ids"]) <= 2
