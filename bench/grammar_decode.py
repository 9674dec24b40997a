#!/usr/bin/env python3
"""Decode speed with a JSON schema (response_format json_schema) and without one,
against a running `ember serve` (bench/RESULTS.md, section "Constrained decoding").

usage: bench/grammar_decode.py PORT [RUNS=3] [MAX_TOKENS=64] [SCHEMA_FILE | GRAMMAR.gbnf]

One request at a time, streaming, at temperature 1 with a fixed seed: the
decode rate is (tokens - 1) / (time of the last token - time of the first),
so the prompt's prefill is left out; answers of fewer than 8 tokens are
not timed (left out of the medians). Runs alternate (plain, schema, plain,
...); prints each run and the medians, and their ratio (schema / plain).
The default schema is bench/grammar_bench.c's nested order schema. A file
ending in .gbnf is sent as a GBNF grammar instead (the request's "grammar"
field; bench/json.gbnf writes JSON, so the outputs are checked the same way).
"""
import http.client
import json
import statistics
import sys
import time

ORDER = {
    "type": "object", "additionalProperties": False, "required": ["order", "items", "customer"],
    "properties": {
        "order": {"type": "string", "pattern": "^[A-Z]{2}-\\d{4}$"},
        "customer": {"type": "object", "additionalProperties": False, "required": ["name", "email"],
                     "properties": {"name": {"type": "string", "maxLength": 40}, "email": {"type": "string"},
                                    "vip": {"type": "boolean"},
                                    "address": {"type": "object", "properties": {
                                        "city": {"type": "string"},
                                        "zip": {"type": "string", "pattern": "^\\d{5}$"}}, "required": ["city"]}}},
        "items": {"type": "array", "minItems": 1, "maxItems": 4, "items": {
            "type": "object", "additionalProperties": False, "required": ["sku", "qty"],
            "properties": {"sku": {"type": "string"}, "qty": {"type": "integer", "minimum": 1, "maximum": 99},
                           "price": {"type": "number", "minimum": 0},
                           "note": {"anyOf": [{"type": "string"}, {"type": "null"}]}}}},
        "status": {"enum": ["new", "paid", "shipped", "cancelled"]}}}


def run(port, max_tokens, schema, seed):
    body = {"messages": [{"role": "user", "content": "Write the order as JSON."}], "max_tokens": max_tokens,
            "temperature": 1, "seed": seed, "stream": True}
    if isinstance(schema, str):
        body["grammar"] = schema
    elif schema is not None:
        body["response_format"] = {"type": "json_schema", "json_schema": {"name": "order", "schema": schema}}
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    c.request("POST", "/v1/chat/completions", json.dumps(body), {"Content-Type": "application/json"})
    r = c.getresponse()
    if r.status != 200:
        raise SystemExit(f"HTTP {r.status}: {r.read()[:300]!r}")
    times, text, finish = [], [], None
    for raw in r:
        line = raw.decode().strip()
        if not line.startswith("data: ") or line == "data: [DONE]":
            continue
        ch = json.loads(line[6:])["choices"]
        if not ch:
            continue
        if ch[0]["delta"].get("content"):
            times.append(time.perf_counter())
            text.append(ch[0]["delta"]["content"])
        finish = ch[0].get("finish_reason") or finish
    c.close()
    n = len(times)
    rate = (n - 1) / (times[-1] - times[0]) if n > 1 else 0.0
    return rate, n, finish, "".join(text)


def main():
    port = int(sys.argv[1])
    runs = int(sys.argv[2]) if len(sys.argv) > 2 else 3
    max_tokens = int(sys.argv[3]) if len(sys.argv) > 3 else 64
    schema = ORDER
    if len(sys.argv) > 4:
        schema = open(sys.argv[4]).read() if sys.argv[4].endswith(".gbnf") else json.load(open(sys.argv[4]))
    plain, constrained = [], []
    run(port, 8, None, 0)  # warm-up
    for i in range(runs):
        for kind, sch, acc in (("plain", None, plain), ("grammar" if isinstance(schema, str) else "schema", schema, constrained)):
            rate, n, finish, text = run(port, max_tokens, sch, 100 + i)
            if n >= 8:  # an answer of a few tokens (a grammar may allow "{}") has no decode rate to speak of
                acc.append(rate)
            valid = ""
            if sch is not None:
                try:
                    json.loads(text)
                    valid = " (parses)"
                except ValueError:
                    valid = " (DOES NOT PARSE)"
            timed = f"{rate:.2f} tokens/s" if n >= 8 else "too short to time (left out)"
            print(f"run {i} {kind}: {n} chunks, finish {finish}, {timed}{valid}", flush=True)
    p, s = statistics.median(plain), statistics.median(constrained)
    kind = "grammar" if isinstance(schema, str) else "schema"
    print(f"median decode: plain {p:.2f} tokens/s, {kind} {s:.2f} tokens/s, ratio {s / p:.3f}")


if __name__ == "__main__":
    main()
