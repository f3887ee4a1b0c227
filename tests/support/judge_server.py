"""A chat server that speaks the OpenAI and Anthropic protocols, for the API judges."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

JUDGE_TIMEOUT = 0.5  # seconds the tests give an API judge per request; the scripted "slow" reply takes twice as long


def preference_for(prompt: str) -> str:
    """The scripted judge: prefers whichever shown summary contains "good"."""
    shown_a = prompt.split("Summary A:\n", 1)[1].split("\n\nSummary B:", 1)[0]
    return f"Comparison: one summary is good.\nPreferred: {'A' if 'good' in shown_a else 'B'}"


class ProtocolServer:
    """A chat server on 127.0.0.1 speaking the OpenAI (`POST /v1/chat/completions`) or Anthropic
    (`POST /v1/messages`) protocol. Request n takes action `script[n]` ("ok" once the script runs out):

    ok            a well-formed reply with the text `reply(prompt)` (by default preferring the shown
                  summary that contains "good")
    429 / 500     that status (429 with `Retry-After: <retry_after>`)
    401           an authentication error whose body echoes the key, as some servers do
    slow          an ok reply after twice the client's timeout
    bad_json      status 200, JSON content type, a truncated body
    no_preferred  a well-formed reply without the `Preferred:` line
    echo_key      a well-formed reply whose text contains the key it was sent
    """

    def __init__(self, protocol: str, delay: float = 0.0, reply: Callable[[str], str] = preference_for):
        self.protocol = protocol
        self.delay = delay  # seconds every request takes, so concurrent requests overlap
        self.reply = reply
        self.script: list[str] = []
        self.retry_after = "0"
        self.bodies: list[dict] = []  # every request's JSON body, in arrival order
        self.keys_seen: set[str] = set()
        self.active = self.max_active = 0
        self.lock = threading.Lock()
        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), ProtocolHandler)
        self.httpd.daemon_threads = True
        self.httpd.owner = self
        threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()

    @property
    def url(self) -> str:
        root = f"http://127.0.0.1:{self.httpd.server_port}"
        return root + "/v1" if self.protocol == "openai" else root  # the Anthropic SDK adds /v1 itself

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()

    @property
    def prompts(self) -> list[str]:
        return [body["messages"][0]["content"] for body in self.bodies]

    def next_action(self, body: dict, key: str) -> str:
        with self.lock:
            self.bodies.append(body)
            self.keys_seen.add(key)
            self.active += 1
            self.max_active = max(self.max_active, self.active)
            return self.script.pop(0) if self.script else "ok"

    def finished(self) -> None:
        with self.lock:
            self.active -= 1

    def body(self, text: str) -> dict:
        if self.protocol == "openai":
            return {
                "id": "chatcmpl-1",
                "object": "chat.completion",
                "created": 0,
                "model": "judge-model",
                "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}],
                "usage": {"prompt_tokens": 100, "completion_tokens": 10, "total_tokens": 110},
            }
        return {
            "id": "msg_1",
            "type": "message",
            "role": "assistant",
            "model": "judge-model",
            "content": [{"type": "text", "text": text}],
            "stop_reason": "end_turn",
            "stop_sequence": None,
            "usage": {"input_tokens": 100, "output_tokens": 10},
        }


class ProtocolHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_POST(self) -> None:
        server: ProtocolServer = self.server.owner
        expected = "/v1/chat/completions" if server.protocol == "openai" else "/v1/messages"
        request = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        key = self.headers.get("x-api-key") or self.headers.get("authorization", "").removeprefix("Bearer ")
        action = server.next_action(request, key)
        try:
            time.sleep(server.delay + (2 * JUDGE_TIMEOUT if action == "slow" else 0))
            if self.path != expected:
                self.send(404, {"error": {"message": f"no route {self.path}"}})
            elif action in ("ok", "slow"):
                self.send(200, server.body(server.reply(request["messages"][0]["content"])))
            elif action == "no_preferred":
                self.send(200, server.body("Both summaries are fine."))
            elif action == "echo_key":
                self.send(200, server.body(f"You sent {key}.\nPreferred: A"))
            elif action == "bad_json":
                self.send_raw(200, b'{"choices": [{"message": ')
            elif action == "401":
                self.send(
                    401, {"error": {"type": "authentication_error", "message": f"Incorrect API key provided: {key}"}}
                )
            else:
                headers = {"Retry-After": server.retry_after} if action == "429" else {}
                self.send(int(action), {"error": {"type": "server_error", "message": f"scripted {action}"}}, headers)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the client gave up on a slow reply
        finally:
            server.finished()

    def send(self, status: int, payload: dict, headers: dict | None = None) -> None:
        self.send_raw(status, json.dumps(payload).encode(), headers)

    def send_raw(self, status: int, data: bytes, headers: dict | None = None) -> None:
        self.send_response(status)
        for name, value in {
            "Content-Type": "application/json",
            "Content-Length": str(len(data)),
            **(headers or {}),
        }.items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args) -> None:
        pass  # keep test output free of access logs
