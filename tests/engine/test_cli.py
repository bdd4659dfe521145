"""`kernforge generate` runs the engine by default and the reference with --reference."""

import argparse
import json

import pytest

import kernforge.engine.generate as engine_generate
from kernforge.engine import Engine
from kernforge.model import random_model, tiny
from kernforge.model.cli import register
from kernforge.model.generate import greedy_decode
from kernforge.model.tokenizer import VOCAB_SIZE


def small_model(seed=0):
    """Two layers (window + ratio 4): the 482-token prompt stays cheap."""
    cfg = tiny(vocab_size=VOCAB_SIZE, max_batch_size=1, num_hidden_layers=2, compress_ratios=(0, 4, 0),
               num_hash_layers=1)
    return random_model(cfg, seed).eval()


@pytest.mark.parametrize("flags", [[], ["--reference"]])
def test_generate_command_picks_engine_or_reference(monkeypatch, capsys, flags):
    monkeypatch.setattr(engine_generate, "smoke_model", small_model)
    runners = []
    real = engine_generate.greedy_decode

    def spy(runner, *args):
        runners.append(runner)
        return real(runner, *args)

    monkeypatch.setattr(engine_generate, "greedy_decode", spy)
    parser = argparse.ArgumentParser()
    register(parser.add_subparsers())
    args = parser.parse_args(["generate", "Hi", "--max-tokens", "2", "--json", *flags])
    assert args.func(args) == 0
    record = json.loads(capsys.readouterr().out)
    assert len(record["output_ids"]) == 2
    assert isinstance(runners[0], Engine) != bool(flags)
    if flags:  # the reference path is kernforge.model's own greedy loop on the same model
        prompt_ids = engine_generate.ByteTokenizer().encode(*engine_generate.render_prompt("Hi"))
        eos = engine_generate.ByteTokenizer().eos_id
        assert record["output_ids"] == greedy_decode(small_model(), prompt_ids, 2, eos)


def test_backend_choice_is_checked():
    parser = argparse.ArgumentParser()
    register(parser.add_subparsers())
    with pytest.raises(SystemExit):
        parser.parse_args(["generate", "Hi", "--backend", "tpu"])
