"""A choice set scores log-likelihoods on the completions endpoint once the runner's model
tokenizes (loglikelihood_model_args): the likelier choice wins, per item."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from evalsets import runner
from evalsets.spec import EvalSetSpec
from evalsets.userset import loglikelihood_model_args
from infra.errors import MeasurementError

FAVOURED = 7  # the token id the fake model likes: the word "shipping"
VOCAB = {"[UNK]": 0, "Ticket": 1, ":": 2, "lost": 3, "parcel": 4, "double": 5, "charge": 6,
         "shipping": 7, "billing": 8, "Answer": 9}


def tokenizer_dir(folder: Path) -> Path:
    """A word-level Hugging Face tokenizer on disk, as a checkpoint folder holds one."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    folder.mkdir()
    tokenizer = Tokenizer(models.WordLevel(VOCAB, unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps(
        {"tokenizer_class": "PreTrainedTokenizerFast", "unk_token": "[UNK]"}))
    return folder


class EchoLogprobs(BaseHTTPRequestHandler):
    """/v1/completions with echo: every prompt token's log-probability (FAVOURED likelier)."""

    protocol_version = "HTTP/1.1"

    def log_message(self, *args: object) -> None:
        pass

    def _json(self, payload: dict) -> None:
        data = json.dumps(payload).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:
        self._json({"data": [{"id": "m"}]})

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        assert body["echo"] is True and body["logprobs"] == 1
        prompts = body["prompt"] if isinstance(body["prompt"][0], list) else [body["prompt"]]
        choices = []
        for index, tokens in enumerate(prompts):
            logprobs = [None] + [-0.1 if t == FAVOURED else -3.0 for t in tokens[1:]] + [-1.0]
            choices.append({"index": index, "text": "", "logprobs": {
                "token_logprobs": logprobs, "top_logprobs": [None] + [{"x": -0.1}] * len(tokens)}})
        self._json({"choices": choices})


@pytest.fixture
def server():
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), EchoLogprobs)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()
    httpd.server_close()


def choice_set(tmp_path: Path) -> EvalSetSpec:
    rows = [{"id": "lost", "prompt": "Ticket : lost parcel Answer :",
             "choices": ["billing", "shipping"], "answer": "shipping"},
            {"id": "double", "prompt": "Ticket : double charge Answer :",
             "choices": ["billing", "shipping"], "answer": 0}]
    data = tmp_path / "quiz.jsonl"
    data.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return EvalSetSpec(name="quiz", path=data, scorer={"kind": "choice"})


def test_choice_scores_by_log_likelihood_when_the_model_tokenizes(tmp_path, server, monkeypatch):
    spec, tokenizer = choice_set(tmp_path), tokenizer_dir(tmp_path / "tok")
    extra = loglikelihood_model_args(runner.load_task_config(spec), tokenizer)
    assert extra["tokenized_requests"] is True
    task = runner.run_evalset(server, "m", spec, tmp_path / "out", None,
                              apply_chat_template=False, num_concurrent=1, tokenizer_dir=tokenizer)
    assert task.metric == "acc"
    assert {item.id: item.score for item in task.items} == {"lost": 1.0, "double": 0.0}


def test_without_a_tokenizer_a_choice_set_fails_closed(tmp_path, server):
    assert loglikelihood_model_args({"output_type": "generate_until"}, tmp_path) == {}
    with pytest.raises(MeasurementError, match="quality: lm-eval task 'quiz' failed"):
        runner.run_evalset(server, "m", choice_set(tmp_path), tmp_path / "out", None,
                           apply_chat_template=False, num_concurrent=1)
