"""A stand-in for a vLLM upstream in the live deploy tests (its own process, so a test can kill it): it speaks
the parts of vLLM's OpenAI API the gateway calls without streaming — ``GET /v1/models``, ``POST
/v1/completions`` with ``n`` — and answers " 12" in 2 tokens, after ``--delay`` seconds (a prompt holding
``sleep=S`` waits S seconds). It models no timing beyond that and generates nothing: its answers are fixed.

    python tests/vllm_standin.py PORT [--delay S]

The replay upstream (``isocompute replay``), once it lands, is the CPU topology's real choice: real models'
recorded answers and lengths (docs/deploy.md).
"""

from __future__ import annotations

import argparse
import json
import re
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


def handler(delay: float) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def _json(self, data: dict) -> None:
            body = json.dumps(data).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self):
            self._json({"object": "list", "data": [{"id": "m", "object": "model"}]})

        def do_POST(self):
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            asked = re.search(r"sleep=([0-9.]+)", str(body.get("prompt")))
            time.sleep(float(asked.group(1)) if asked else delay)
            n = body.get("n", 1)
            self._json({"choices": [{"index": j, "text": " 12", "token_ids": [7, 2], "finish_reason": "stop"}
                                    for j in range(n)],
                        "usage": {"prompt_tokens": 3, "completion_tokens": 2 * n}})

    return Handler


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("port", type=int)
    p.add_argument("--delay", type=float, default=0.0)
    a = p.parse_args()
    ThreadingHTTPServer(("127.0.0.1", a.port), handler(a.delay)).serve_forever()


if __name__ == "__main__":
    main()
