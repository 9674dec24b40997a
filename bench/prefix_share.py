#!/usr/bin/env python3
"""Rows sharing a system prompt hold one copy of its KV blocks: N concurrent
chat requests with the same long system prompt and different questions,
against a running `ember serve`, while /metrics is sampled. Reports the
most KV bytes the running requests' rows refer to (shared blocks counted
once per row: what they would hold without sharing) and the most bytes of
blocks held in all (each block once), and the cached tokens of each request.

usage: bench/prefix_share.py PORT [N=4] [SYSTEM_WORDS=1500] [MAX_TOKENS=64]
The first request runs alone (it fills the cache); the other N - 1 then run
at once. Prints one JSON line.
"""
import http.client
import json
import random
import sys
import threading
import time

import prefix_chat  # the prompt builder (same directory)


def metrics(port):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    c.request("GET", "/metrics")
    out = {}
    for line in c.getresponse().read().decode().splitlines():
        if line and not line.startswith("#"):
            k, _, v = line.rpartition(" ")
            out[k] = float(v)
    c.close()
    return out


def ask(port, system, q, max_tokens, res, i):
    body = {"messages": [{"role": "system", "content": system}, {"role": "user", "content": q}],
            "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True}
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    c.request("POST", "/v1/chat/completions", json.dumps(body), {"Content-Type": "application/json"})
    r = json.loads(c.getresponse().read())
    c.close()
    res[i] = r.get("usage", {})


def main():
    a = sys.argv[1:]
    if not a:
        raise SystemExit(__doc__)
    port = int(a[0])
    n = int(a[1]) if len(a) > 1 else 4
    n_words = int(a[2]) if len(a) > 2 else 1500
    max_tokens = int(a[3]) if len(a) > 3 else 64
    rng = random.Random(99)
    system = "You are a helpful assistant. " + prefix_chat.words(rng, n_words)
    res = [None] * n
    ask(port, system, "Question 0: what is first?", max_tokens, res, 0)
    ts = [threading.Thread(target=ask, args=(port, system, f"Question {i}: and then {i}?", max_tokens, res, i))
          for i in range(1, n)]
    for t in ts:
        t.start()
    used = held = 0.0
    while any(t.is_alive() for t in ts):
        m = metrics(port)
        used = max(used, m.get("ember_kv_cache_used_bytes", 0))
        held = max(held, m.get("ember_kv_cache_held_bytes", 0))
        time.sleep(0.05)
    for t in ts:
        t.join()
    m = metrics(port)
    print(json.dumps({"requests": n, "prompt_tokens": [r.get("prompt_tokens") for r in res],
                      "cached_tokens": [(r.get("prompt_tokens_details") or {}).get("cached_tokens") for r in res],
                      "max_bytes_rows_refer_to": int(used), "max_bytes_held": int(held),
                      "bytes_per_token": m.get("ember_kv_cache_bytes_per_token"),
                      "prefix_cache_blocks": m.get("ember_prefix_cache_blocks"),
                      "prefix_cache_hits": m.get("ember_prefix_cache_hits_total")}))


if __name__ == "__main__":
    main()
