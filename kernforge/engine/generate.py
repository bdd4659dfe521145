"""The `kernforge generate` smoke path on the engine (default) or on the torch reference.

Why here: `kernforge.model.generate` is the reference's path; the engine has
the same `forward(input_ids, start_pos)` contract, so the same greedy loop
drives either, and the CLI picks one with `--reference` / `--backend`.
"""

from __future__ import annotations

from kernforge.engine.engine import Engine
from kernforge.model.generate import Generation, greedy_decode, render_prompt, smoke_model
from kernforge.model.tokenizer import ByteTokenizer


def generate(user_text: str, max_tokens: int, seed: int = 0, backend: str = "cpu",
             reference: bool = False) -> Generation:
    tokenizer = ByteTokenizer()
    prompt, special_ranges = render_prompt(user_text)
    prompt_ids = tokenizer.encode(prompt, special_ranges)
    model = smoke_model(seed)
    runner = model if reference else Engine(model, backend=backend)
    output_ids = greedy_decode(runner, prompt_ids, max_tokens, tokenizer.eos_id)
    return Generation(prompt, prompt_ids, output_ids, tokenizer.decode(output_ids))
