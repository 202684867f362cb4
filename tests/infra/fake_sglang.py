"""tests/evalsets/chat_fake.py's server answering as SGLang does: /get_server_info, /v1/models
with its model card, prompt logprobs on /v1/completions (echo + logprobs) and guided decoding on
/v1/chat/completions. No SGLang build runs on a CPU; the shapes are SGLang's own, read from its
sources (sgl-project/sglang):

- /get_server_info is `{**asdict(server_args), **scheduler_info, "internal_states": [...],
  "version": __version__}` (python/sglang/srt/entrypoints/http_server.py, get_server_info, commit
  0025436eab0556737d615b36a4dd3e1e26e82f3d); the scheduler's info carries max_total_num_tokens.
- /v1/models lists one ModelCard: id and root the served model name (the model path unless
  --served-model-name), max_model_len the context length (same file, available_models).
- echo + logprobs on /v1/completions scores the prompt from position 0 (logprob_start_len = 0)
  and returns OpenAI-style logprobs: tokens as text, the first prompt token's logprob null,
  text_offset -1 throughout, top_logprobs a dict per position keyed by token text
  (python/sglang/srt/entrypoints/openai/serving_completions.py, _convert_to_internal_request,
  and utils.py to_openai_style_logprobs, commit 004c82e07d876f6e4a0ad6e15325706b0f478f1a).
  A field SGLang does not know (vLLM's return_tokens_as_token_ids, which the corpus scoring
  sends) is dropped: its CompletionRequest keeps pydantic's default extra="ignore"
  (openai/protocol.py, same commit), so top_logprobs stay keyed by token text.
- response_format json_schema needs `json_schema.schema` ("schema_ is required for
  json_schema response format request.", serving_completions.py _build_sampling_params).
"""

from __future__ import annotations

import json
from typing import Any

from tests.evalsets.chat_fake import FakeChat, _ChatHandler


def server_info(model_path: str, **overrides: Any) -> dict[str, Any]:
    """The keys of SGLang's /get_server_info quantgate reads, among a few it ignores."""
    info = {
        "model_path": model_path, "tokenizer_path": model_path, "served_model_name": model_path,
        "host": "127.0.0.1", "port": 30000, "dtype": "bfloat16", "kv_cache_dtype": "auto",
        "quantization": None, "load_format": "auto", "context_length": 4096, "tp_size": 1,
        "mem_fraction_static": 0.9, "attention_backend": "fa3", "chunked_prefill_size": 8192,
        "max_total_num_tokens": 658_432, "max_req_input_len": 4090,
        "internal_states": [{"last_gen_throughput": 0.0}], "version": "0.5.23",
    }
    return info | overrides


class FakeSglang(FakeChat):
    """Serves as an SGLang engine would for `model_path`; `info` overrides /get_server_info
    keys; `guided`: False answers free text even when asked for JSON (guided decoding ignored)."""

    def __init__(self, model_path: str, info: dict[str, Any] | None = None, guided: bool = True,
                 **kwargs: Any) -> None:
        super().__init__(answer="Yes, the sky is blue.", model=model_path, **kwargs)
        self.info = server_info(model_path, **(info or {}))
        self.guided = guided

    @staticmethod
    def handler() -> type:
        return _SglangHandler


def prompt_logprobs(prompt_ids: list[int], top: int) -> dict[str, Any]:
    """SGLang's echo logprobs for `prompt_ids` and one generated token: a fixed logprob per
    token id, so two engines that agree give equal numbers."""
    ids = [*prompt_ids, 42]
    values = [None] + [-0.1 - (token % 7) / 10 for token in ids[1:]]
    tops = [None] + [{f"t{token}": value, "t0": value - 1.0}  # keyed by token text
                     for token, value in zip(ids[1:], values[1:], strict=True)]
    return {"tokens": [f"t{token}" for token in ids], "token_logprobs": values,
            "text_offset": [-1] * len(ids), "top_logprobs": tops if top else []}


class _SglangHandler(_ChatHandler):
    server_state: FakeSglang

    def do_GET(self) -> None:
        fake = self.server_state
        if self.path == "/get_server_info":
            self._json(200, fake.info)
        elif self.path == "/v1/models":
            self._json(200, {"object": "list", "data": [{
                "id": fake.model, "object": "model", "created": 1764748800, "owned_by": "sglang",
                "root": fake.model, "max_model_len": fake.info["context_length"]}]})
        else:
            super().do_GET()

    def do_POST(self) -> None:
        fake = self.server_state
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", "0"))) or b"{}")
        with fake._lock:
            fake.requests.append(body)
        rf = body.get("response_format") or {}
        if rf.get("type") == "json_schema" and "schema" not in (rf.get("json_schema") or {}):
            self._json(400, {"object": "error", "message": "schema_ is required for json_schema "
                             "response format request.", "type": "Bad Request", "code": 400})
            return
        guided = fake.guided and rf.get("type") == "json_schema"
        answer = json.dumps({"ok": True}) if guided else fake.answer
        usage = {"prompt_tokens": 10, "completion_tokens": 1, "total_tokens": 11}
        if self.path == "/v1/chat/completions":
            self._json(200, {"id": "chat-sglang", "object": "chat.completion", "model": fake.model,
                             "choices": [{"index": 0, "finish_reason": "stop", "message": {
                                 "role": "assistant", "content": answer}}], "usage": usage})
            return
        if self.path != "/v1/completions":
            self._json(404, {"error": {"message": f"no route {self.path}"}})
            return
        prompt = body.get("prompt")
        ids = prompt if isinstance(prompt, list) else [ord(c) for c in str(prompt)]
        choice: dict[str, Any] = {"index": 0, "text": answer, "finish_reason": "length",
                                  "logprobs": None, "matched_stop": None}
        if body.get("echo") and body.get("logprobs") is not None:
            choice["logprobs"] = prompt_logprobs(ids, int(body["logprobs"]))
            choice["text"] = "".join(f"t{token}" for token in ids) + " t42"
        usage = {"prompt_tokens": len(ids), "completion_tokens": 1, "total_tokens": len(ids) + 1}
        self._json(200, {"id": "cmpl-sglang", "object": "text_completion", "model": fake.model,
                         "choices": [choice], "usage": usage})

