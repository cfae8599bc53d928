"""Serve a GGUF with llama.cpp's own HTTP server from the ``xllamacpp`` wheel, on loopback.

Run as a child process by the tests (so a test can kill it mid-run)::

    python serve_tiny.py MODEL.gguf --slots 4 --threads 1

Prints one line ``LISTENING http://127.0.0.1:PORT`` once the model is loaded and the server
accepts connections, then serves until killed. ``xllamacpp.Server(params)`` starts llama.cpp's
server (continuous batching over ``n_parallel`` slots) in background threads of this process.
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("--port", type=int, default=0, help="0: any free port")
    ap.add_argument("--slots", type=int, default=4, help="parallel sequences (llama.cpp -np)")
    ap.add_argument("--ctx-per-slot", type=int, default=2048)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()

    import xllamacpp

    p = xllamacpp.CommonParams()
    p.model.path = args.model
    p.hostnames = ["127.0.0.1"]
    p.port = args.port
    p.n_parallel = args.slots
    p.n_ctx = args.ctx_per_slot * args.slots
    p.cont_batching = True
    p.cpuparams.n_threads = args.threads
    p.cpuparams_batch.n_threads = args.threads
    p.endpoint_metrics = True
    server = xllamacpp.Server(p)
    print(f"LISTENING {server.listening_address}", flush=True)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    stop.wait()
    sys.exit(0)


if __name__ == "__main__":
    main()
