#!/usr/bin/env python3
"""Time from `ember serve` start to the first /health 200 (issue 18, startup).

usage: bench/serve_startup.py EMBER MODEL [--runs N] [--port P] [-- SERVE_ARGS...]

Starts `EMBER serve MODEL --port P SERVE_ARGS` N times (default 5), one after
the other. Each time it polls GET /health on 127.0.0.1:P every millisecond
from the moment the process is spawned, records the time of the first 200,
then stops the server (SIGTERM, waits for it to exit). Prints every run and
the best and the median in milliseconds, as one JSON line at the end.

The process is spawned warm: the model files are read once before the first
run (page cache), so the numbers are the server's own work, not the disk.
On a shared machine compare the best of N; the median shows the noise.
"""
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import time


def health(port):
    """True on a 200 from GET /health; False while nothing listens yet."""
    try:
        s = socket.create_connection(("127.0.0.1", port), timeout=1)
    except OSError:
        return False
    try:
        s.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        data = b""
        while b"\r\n" not in data:
            chunk = s.recv(256)
            if not chunk:
                break
            data += chunk
        return data.startswith(b"HTTP/1.1 200") or data.startswith(b"HTTP/1.0 200")
    except OSError:
        return False
    finally:
        s.close()


def warm(model):
    """Reads every file of the model once (page cache)."""
    paths = [model] if os.path.isfile(model) else [os.path.join(model, f) for f in os.listdir(model)]
    for p in paths:
        if os.path.isfile(p):
            with open(p, "rb") as f:
                while f.read(1 << 24):
                    pass


def main():
    args = sys.argv[1:]
    extra = []
    if "--" in args:
        i = args.index("--")
        args, extra = args[:i], args[i + 1:]
    if len(args) < 2:
        sys.exit(__doc__)
    ember, model = args[0], args[1]
    runs, port = 5, 28917
    rest = args[2:]
    while rest:
        if rest[0] == "--runs":
            runs = int(rest[1])
        elif rest[0] == "--port":
            port = int(rest[1])
        else:
            sys.exit(__doc__)
        rest = rest[2:]
    warm(model)
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
        sys.exit(f"serve_startup: something already listens on port {port}: pick another with --port")
    except OSError:
        pass
    times = []
    for r in range(runs):
        t0 = time.monotonic()
        p = subprocess.Popen([ember, "serve", model, "--port", str(port)] + extra,
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        ok = False
        while p.poll() is None and time.monotonic() - t0 < 120:
            if health(port):
                ok = True
                break
            time.sleep(0.001)
        dt = time.monotonic() - t0
        p.send_signal(signal.SIGTERM)
        err = p.communicate(timeout=60)[1].decode(errors="replace")
        if not ok:
            sys.exit("serve_startup: the server did not answer /health 200:\n" + err)
        times.append(dt * 1e3)
        print(f"run {r + 1}: {dt * 1e3:.1f} ms", flush=True)
    print(json.dumps({"model": model, "serve_args": extra, "runs": runs, "best_ms": round(min(times), 1),
                      "median_ms": round(statistics.median(times), 1)}))


if __name__ == "__main__":
    main()
