"""Shared helpers for recipe tests: golden loading and stream driving."""
import json
from pathlib import Path

import kernforge.recipe as K

DATA = Path(__file__).parent / "data"
# The V4/V4.1 prompt goldens ship with the tests (see data/goldens/PROVENANCE.md).
GOLDENS = DATA / "goldens"


def golden_dir():
    return GOLDENS


def drive(generator, options, text_chunks, finish=K.InferenceFinishReason.Stop, prompt_tokens=7):
    """Run a StreamProcessor over text chunks; return (objects, processor)."""
    sp = K.StreamProcessor(generator, options)
    out = sp.push(K.InferenceChunk.ready(prompt_usage=K.PromptUsage(prompt_tokens=prompt_tokens)))
    for c in text_chunks:
        out += sp.push(K.InferenceChunk.text(c, 1))
    out += sp.push(K.InferenceChunk.finish(finish))
    out += sp.finish()
    return out, sp


def chunked(text, step):
    return [text[i:i + step] for i in range(0, len(text), step)]


def load_json(path):
    return json.loads(Path(path).read_bytes().decode("utf-8"))
