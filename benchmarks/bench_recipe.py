"""Recipe benchmarks, side by side with deepseek-recipe 0.2.0 in the same run.

1. request dict -> prompt: `XRequest(body).convert(opts)` then `render_conversation`,
   for a multi-turn tool-calling Chat request, a Messages request and a short chat.
2. streaming parse throughput: raw model text (reasoning, content, parallel DSML
   tool calls with a long string argument) pushed in small chunks through a Chat
   `StreamProcessor`, in MB/s of model text.

Usage: python benchmarks/bench_recipe.py [--repeat N] [--json]
"""
import argparse
import json
import statistics
import time

import deepseek_recipe as P

import kernforge.recipe as K

TOOLS = [{"type": "function", "function": {"name": n, "description": f"The {n} tool.", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"},
                                     "filters": {"type": "object"}}, "required": ["city"]}}}
         for n in ("get_weather", "search", "read_file", "write_file")]


def multi_turn_chat(model="DeepSeek-V4-Pro"):
    msgs = [{"role": "system", "content": "You are a careful agent. " * 10}]
    for turn in range(4):
        msgs.append({"role": "user", "content": f"Question {turn}: what about city {turn}? " * 5})
        calls = [{"id": f"call_{turn}_{k}", "type": "function", "function": {
            "name": "get_weather", "arguments": json.dumps({"city": f"City {k}", "days": k + 1,
                                                            "filters": {"rain": True, "ids": [1, 2, 3]}})}}
                 for k in range(2)]
        msgs.append({"role": "assistant", "content": "", "reasoning_content": "I need the weather. " * 8,
                     "tool_calls": calls})
        for c in calls:
            msgs.append({"role": "tool", "tool_call_id": c["id"], "content": json.dumps({"t": [20, 21, 19]})})
        msgs.append({"role": "assistant", "content": "Here is the weather summary. " * 6,
                     "reasoning_content": "Summarise the results. " * 5})
    msgs.append({"role": "user", "content": "And tomorrow?"})
    return {"model": model, "messages": msgs, "tools": TOOLS}


def messages_body():
    chat = multi_turn_chat()
    out = []
    for m in chat["messages"][1:]:
        if m["role"] == "user":
            out.append({"role": "user", "content": m["content"]})
        elif m["role"] == "tool":
            block = {"type": "tool_result", "tool_use_id": m["tool_call_id"], "content": m["content"]}
            if out[-1]["role"] == "user" and isinstance(out[-1]["content"], list):
                out[-1]["content"].append(block)
            else:
                out.append({"role": "user", "content": [block]})
        else:
            blocks = [{"type": "thinking", "thinking": m["reasoning_content"], "signature": "s"}]
            if m["content"]:
                blocks.append({"type": "text", "text": m["content"]})
            for c in m.get("tool_calls") or ():
                blocks.append({"type": "tool_use", "id": c["id"], "name": c["function"]["name"],
                               "input": json.loads(c["function"]["arguments"])})
            out.append({"role": "assistant", "content": blocks})
    return {"model": "DeepSeek-V4-Pro", "max_tokens": 4096, "system": chat["messages"][0]["content"],
            "messages": out, "tools": [{"name": t["function"]["name"], "description": t["function"]["description"],
                                        "input_schema": t["function"]["parameters"]} for t in TOOLS]}


def short_chat():
    return {"model": "DeepSeek-V4.1-Flash", "messages": [{"role": "user", "content": "Hello!"}]}


def raw_output():
    d = "｜DSML｜"
    long_text = "def f(x):\n    return x * 2  # \"quoted\" \\ backslash\n" * 60
    calls = "".join(
        f'<{d}invoke name="write_file">\n<{d}parameter name="city" string="true">{long_text}</{d}parameter>\n'
        f'<{d}parameter name="days" string="false">{k}</{d}parameter>\n</{d}invoke>\n' for k in range(3))
    return ("Let me reason about this carefully. " * 40 + "</think>" + "Here is the plan. " * 30
            + f"\n\n<{d}tool_calls>\n" + calls + f"</{d}tool_calls>")


def time_per_call(fn, repeat, min_time=0.2):
    """Median seconds per call over `repeat` rounds of enough calls to last `min_time`."""
    fn()
    n, t0 = 1, time.perf_counter()
    fn()
    one = max(time.perf_counter() - t0, 1e-7)
    n = max(1, int(min_time / one))
    rounds = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        rounds.append((time.perf_counter() - t0) / n)
    return statistics.median(rounds)


def prompt_fn(lib, api, body):
    opts = lib.ConversionOptions()
    v41 = lib.DeepseekV41Encoding()
    v4 = lib.DeepseekV4Encoding()
    v41_version = lib.ModelVersion.DeepseekV41Flash

    def run():
        req = getattr(lib, api)(body).convert(opts)
        enc = v41 if req.model_version == v41_version else v4
        return enc.render_conversation(req.conversation).prompt
    return run


def stream_fn(lib, raw, step):
    body = {"model": "DeepSeek-V4-Pro", "messages": [{"role": "user", "content": "hi"}], "tools": TOOLS,
            "stream": True}
    pieces = [raw[i:i + step] for i in range(0, len(raw), step)]

    def run():
        req = lib.ChatCompletionRequest(body).convert(lib.ConversionOptions())
        sp = lib.StreamProcessor(lib.ChatCompletionRequest.chunk_generator(req, "c", "m"), req.parsing_options)
        n = len(sp.push(lib.InferenceChunk.ready()))
        for p in pieces:
            n += len(sp.push(lib.InferenceChunk.text(p, 1)))
        n += len(sp.push(lib.InferenceChunk.finish(lib.InferenceFinishReason.Stop)))
        n += len(sp.finish())
        return n
    return run


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeat", type=int, default=7)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    rows = []
    for name, api, body in [("chat multi-turn tools (V4)", "ChatCompletionRequest", multi_turn_chat()),
                            ("chat multi-turn tools (V4.1)", "ChatCompletionRequest",
                             multi_turn_chat("DeepSeek-V4.1-Flash")),
                            ("messages multi-turn tools (V4)", "MessagesRequest", messages_body()),
                            ("chat short (V4.1)", "ChatCompletionRequest", short_chat())]:
        assert prompt_fn(K, api, body)() == prompt_fn(P, api, body)(), f"prompts differ for {name}"
        ours = time_per_call(prompt_fn(K, api, body), args.repeat)
        peer = time_per_call(prompt_fn(P, api, body), args.repeat)
        rows.append({"case": f"request->prompt: {name}", "unit": "us/request", "kernforge": ours * 1e6,
                     "deepseek_recipe": peer * 1e6, "speedup": peer / ours})
    raw = raw_output()
    for step in (4, 32):
        ours = time_per_call(stream_fn(K, raw, step), args.repeat)
        peer = time_per_call(stream_fn(P, raw, step), args.repeat)
        mb = len(raw.encode()) / 1e6
        rows.append({"case": f"stream parse, {step}-char chunks ({len(raw)} chars)", "unit": "MB/s",
                     "kernforge": mb / ours, "deepseek_recipe": mb / peer, "speedup": peer / ours})
    if args.json:
        print(json.dumps(rows, indent=1))
        return
    print(f"{'case':58s} {'unit':>10s} {'kernforge':>10s} {'peer':>10s} {'speedup':>8s}")
    for r in rows:
        print(f"{r['case']:58s} {r['unit']:>10s} {r['kernforge']:10.1f} {r['deepseek_recipe']:10.1f} "
              f"{r['speedup']:8.2f}")


if __name__ == "__main__":
    main()
