"""End-to-end smoke path: chat request -> recipe prompt -> byte tokens -> tiny model -> text.

This checks that the pieces connect (request conversion, prompt rendering,
special-token handling, prefill, cached decode), not output quality: the
model has random weights.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from kernforge.model.config import tiny
from kernforge.model.init import random_model
from kernforge.model.tokenizer import VOCAB_SIZE, ByteTokenizer
from kernforge.model.transformer import Transformer

# V4-Flash shares the V4 prompt format, which the recipe's default options name after V4-Pro.
REQUEST_MODEL = "DeepSeek-V4-Pro"


@dataclass(frozen=True)
class Generation:
    prompt: str
    prompt_ids: list[int]
    output_ids: list[int]
    text: str


def render_prompt(user_text: str) -> tuple[str, list[tuple[int, int]]]:
    """The recipe's rendering of a one-message chat request with the default options."""
    from kernforge.recipe import ChatCompletionRequest, ConversionOptions, DeepseekV4Encoding

    body = {"model": REQUEST_MODEL, "messages": [{"role": "user", "content": user_text}]}
    request = ChatCompletionRequest(body).convert(ConversionOptions())
    rendered = DeepseekV4Encoding().render_conversation(request.conversation)
    return rendered.prompt, list(rendered.special_ranges)


def smoke_model(seed: int = 0) -> Transformer:
    """The tiny config with the byte tokenizer's vocabulary and random weights."""
    return random_model(tiny(vocab_size=VOCAB_SIZE, max_batch_size=1), seed).eval()


@torch.no_grad()
def greedy_decode(model: Transformer, prompt_ids: list[int], max_tokens: int, stop_id: int) -> list[int]:
    """Prefill the prompt, then decode one token at a time from the caches."""
    if max_tokens < 1:
        raise ValueError(f"max_tokens must be >= 1, got {max_tokens}")
    room = model.config.max_seq_len - len(prompt_ids)
    if max_tokens > room:
        raise ValueError(f"prompt of {len(prompt_ids)} tokens leaves room for {room} new tokens "
                         f"(max_seq_len={model.config.max_seq_len}), asked for {max_tokens}")
    logits = model(torch.tensor([prompt_ids]), 0)
    out: list[int] = []
    pos = len(prompt_ids)
    while True:
        token = int(logits[0, -1].argmax())
        out.append(token)
        if token == stop_id or len(out) == max_tokens:
            return out
        logits = model(torch.tensor([[token]]), pos)
        pos += 1


def generate(user_text: str, max_tokens: int, seed: int = 0) -> Generation:
    tokenizer = ByteTokenizer()
    prompt, special_ranges = render_prompt(user_text)
    prompt_ids = tokenizer.encode(prompt, special_ranges)
    output_ids = greedy_decode(smoke_model(seed), prompt_ids, max_tokens, tokenizer.eos_id)
    return Generation(prompt, prompt_ids, output_ids, tokenizer.decode(output_ids))
