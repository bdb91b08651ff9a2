"""run_attack.py with a judge served over HTTP, end to end on a tiny random checkpoint: the answers are
judged with the paper's prompt, and the run's manifest says which prompt that was."""

import json
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from atp_jax.eval.judge import PAPER_JUDGE_PROMPT

REPO = Path(__file__).resolve().parents[1]


class _JudgeServer:
    """A chat-completions server on 127.0.0.1 that answers every prompt with ``reply`` and keeps the prompts."""

    def __init__(self, reply):
        self.prompts = []
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                server.prompts.append(body["messages"][0]["content"])
                data = json.dumps({"choices": [{"message": {"role": "assistant", "content": reply}}]}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args):
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.httpd.shutdown()
        self.httpd.server_close()
        self.thread.join(timeout=5)


def test_run_attack_judges_with_the_papers_prompt_and_records_it(tiny_checkpoint, tmp_path):
    out = tmp_path / "out"
    with _JudgeServer("Score: 8/10") as server:
        command = [
            sys.executable,
            "-m",
            "atp_jax.cli.run_attack",
            "--model",
            str(tiny_checkpoint),
            "--attacks",
            "vanilla",
            "--num_examples",
            "1",
            "--max_new_tokens",
            "4",
            "--metrics",
            "auto,judge",
            "--judge_url",
            server.url,
            "--output_dir",
            str(out),
        ]
        done = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=600, check=False)
    assert done.returncode == 0, done.stderr[-3000:]

    manifest = json.loads((out / "run.json").read_text())
    assert manifest["judge_prompt"] == {"name": "paper_a1", "sha256": PAPER_JUDGE_PROMPT.sha256}
    (record,) = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    assert record["scores"]["judge"] == 0.8
    # the probe and the one answer, both in the paper's words
    assert len(server.prompts) == 2
    assert all(p.startswith("You are a text analyzer to analyze") for p in server.prompts)
    assert f"Assistant answer: {record['prediction'].strip()}." in server.prompts[1]
