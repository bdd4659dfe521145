"""`kernforge generate "prompt" --max-tokens N`: the smoke path from the command line.

It runs the kernforge engine (`kernforge.engine`) by default; `--reference`
runs the torch model and `--backend` picks the engine's kernel backend.

The main CLI calls `register(subparsers)`; the parsed namespace carries the
handler as `func`, which returns the process exit code.
"""

from __future__ import annotations

import argparse
import json


def register(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(
        "generate", help="run chat recipe -> prompt -> tiny random DeepSeek-V4 model (smoke test, not quality)")
    parser.add_argument("prompt", help="user message text")
    parser.add_argument("--max-tokens", type=int, default=16, help="tokens to generate (default 16)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the random tiny model (default 0)")
    parser.add_argument("--json", action="store_true", help="print a JSON record instead of text")
    parser.add_argument("--reference", action="store_true",
                        help="run the torch reference model instead of the kernforge engine")
    parser.add_argument("--backend", default="cpu", choices=("cpu", "interp", "cuda-emu", "cuda"),
                        help="kernforge backend of the engine's kernels (default cpu)")
    parser.set_defaults(func=run_generate)
    return parser


def run_generate(args: argparse.Namespace) -> int:
    from kernforge.engine.generate import generate

    result = generate(args.prompt, args.max_tokens, seed=args.seed, backend=args.backend,
                      reference=args.reference)
    if args.json:
        print(json.dumps({"prompt_tokens": len(result.prompt_ids), "output_ids": result.output_ids,
                          "text": result.text}, ensure_ascii=False))
    else:
        print(f"prompt: {len(result.prompt_ids)} tokens; generated {len(result.output_ids)} tokens")
        print(result.text)
    return 0
