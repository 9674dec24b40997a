#!/usr/bin/env python3
"""A multi-turn chat over a long system prompt against an OpenAI-style server:
time to first token per turn, with the prompt cache and without it
("cache_prompt": false, which ember and llama-server both honour).

usage: bench/prefix_chat.py PORT [TURNS=8] [SYSTEM_WORDS=1500] [MODE=cache|nocache|restart] [MAX_TOKENS=16]

Each turn sends the whole conversation so far (system prompt, earlier user
turns and the model's own answers) plus a new user message, streaming, at
temperature 0, and records the time from sending to the first streamed
token, the prompt tokens and the cached tokens the server reports. Prints
one JSON object per turn, then a summary line.

MODE restart: like cache, but before every turn after the first the shell
command in $RESTART_CMD runs (it must stop the server gracefully and start
it again, returning once it answers /health): each turn then measures the
first request after a restart (ember's --prompt-cache-dir).
"""
import http.client
import json
import os
import random
import subprocess
import sys
import time


def turn(port, messages, max_tokens, cache):
    body = {"messages": messages, "max_tokens": max_tokens, "temperature": 0, "stream": True,
            "stream_options": {"include_usage": True}}
    if not cache:
        body["cache_prompt"] = False
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    t0 = time.perf_counter()
    c.request("POST", "/v1/chat/completions", json.dumps(body), {"Content-Type": "application/json"})
    r = c.getresponse()
    if r.status != 200:
        raise SystemExit(f"HTTP {r.status}: {r.read()[:300]!r}")
    ttft, text, usage = None, [], None
    for raw in r:
        line = raw.decode().strip()
        if not line.startswith("data: ") or line == "data: [DONE]":
            continue
        ev = json.loads(line[6:])
        if ev.get("usage"):
            usage = ev["usage"]
        if ev.get("timings") and usage is None:  # llama-server: prompt_n / cache_n
            tm = ev["timings"]
            usage = {"prompt_tokens": tm.get("prompt_n", 0) + tm.get("cache_n", 0),
                     "prompt_tokens_details": {"cached_tokens": tm.get("cache_n", 0)}}
        for ch in ev.get("choices", []):
            d = ch.get("delta", {}).get("content")
            if d:
                if ttft is None:
                    ttft = time.perf_counter() - t0
                text.append(d)
    c.close()
    return ttft, "".join(text), usage


VOCAB = ["river", "stone", "light", "window", "garden", "number", "system", "answer", "quiet", "market",
         "paper", "signal", "forest", "engine", "winter", "letter", "bridge", "silver", "orange", "planet"]


def words(rng, n):
    """n random words of VOCAB (prefix_share.py builds its prompt with this too)."""
    return " ".join(rng.choice(VOCAB) for _ in range(n))


def main():
    a = sys.argv[1:]
    if not a:
        raise SystemExit(__doc__)
    port = int(a[0])
    turns = int(a[1]) if len(a) > 1 else 8
    n_words = int(a[2]) if len(a) > 2 else 1500
    mode = a[3] if len(a) > 3 else "cache"
    max_tokens = int(a[4]) if len(a) > 4 else 16
    rng = random.Random(1234)
    system = "You are a helpful assistant. " + words(rng, n_words)
    messages = [{"role": "system", "content": system}]
    out = []
    for t in range(turns):
        messages.append({"role": "user", "content": f"Question {t + 1}: " + words(rng, 12)})
        if mode == "restart" and t > 0:
            subprocess.run(os.environ["RESTART_CMD"], shell=True, check=True)
        ttft, text, usage = turn(port, messages, max_tokens, mode != "nocache")
        messages.append({"role": "assistant", "content": text})
        u = usage or {}
        cached = (u.get("prompt_tokens_details") or {}).get("cached_tokens", 0)
        row = {"turn": t + 1, "mode": mode, "ttft_s": round(ttft or -1, 4), "prompt_tokens": u.get("prompt_tokens"),
               "cached_tokens": cached}
        out.append(row)
        print(json.dumps(row), flush=True)
    print(json.dumps({"mode": mode, "turns": turns, "ttft_s": [r["ttft_s"] for r in out]}))


if __name__ == "__main__":
    main()
