"""Fuzzing the redactor: a generated secret in any form a credential flag, header or URI takes is
never in what `redact` returns; a plain word after "token" or "passwd" that names a path, an eval
set or a flag is always still there."""

from __future__ import annotations

import json
import shlex
import string
from urllib.parse import quote

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from infra import secrets
from infra.secrets import MASK, redact, redact_args

FLAGS = ("--api-key", "--api_key", "--hf-token", "--hf_token", "--token", "--password", "--passwd",
         "--secret", "--db-password", "--client-secret", "--credentials")
# Real keys are letters and digits with signs (sk-live-…, hf_…); a plain short word is one too.
SECRET = st.text(string.ascii_letters + string.digits + "-_.+/", min_size=3, max_size=48).filter(
    lambda value: value[0] not in "-.")
PREFIXES = ("", "error: ", "engine.extra_args ", "stage 'kv': extra_args: ",
            "Value error, refused in ")
PROSE = (" is refused", ": remove it", " (give it in engine.extra_args)")
SUFFIXES = ("", "\nnext line", *PROSE)
AFTER = ((), ("--quantization", "fp8"), ("--port", "8000"))


def forms(flag: str, secret: str, after: tuple[str, ...]) -> list[str]:
    """Every way a message can show `flag secret` followed by `after`."""
    listed = ["--max-model-len", "512", flag, secret, *after]
    rest = f" {' '.join(after)}" if after else ""
    return [
        f"{flag} {secret}{rest}",  # a command line
        f"{flag}={secret}{rest}",
        str(listed),  # a Python list's repr (pydantic's input_value=…)
        json.dumps(listed),
        f"[{', '.join(listed)}]",  # a YAML flow list
        shlex.join(["vllm", "serve", "/models/m", *listed]),  # a joined command string
        f"Authorization: Bearer {secret}",
        f"{{'Authorization': 'Bearer {secret}'}}",
        # a URI's password is percent-encoded (a `/` in it would end the host)
        f"postgresql://mlflow:{quote(secret, safe='')}@db.internal:5432/mlflow",
        f"http://alice:{quote(secret, safe='')}@10.0.0.5:5000/api",
    ]


@pytest.fixture(autouse=True)
def nothing_remembered(monkeypatch):
    # Only what the text itself shows may be masked: no remembered value, no key in the env.
    monkeypatch.setattr(secrets, "_remembered", set())
    for name in ("OPENAI_API_KEY", "VLLM_API_KEY", "HF_TOKEN"):
        monkeypatch.delenv(name, raising=False)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(flag=st.sampled_from(FLAGS), secret=SECRET, after=st.sampled_from(AFTER),
       prefix=st.sampled_from(PREFIXES), suffix=st.sampled_from(SUFFIXES), form=st.integers(0, 9))
def test_a_secret_in_any_flag_form_never_shows(flag, secret, after, prefix, suffix, form):
    shown = forms(flag, secret, after)[form]
    text = f"{prefix}{shown}{suffix}"
    # The secret must be what is hidden, not a word the rest of the message also holds.
    assume(secret not in f"{prefix}{suffix} {flag} {' '.join(after)} vllm serve /models/m "
                         "--max-model-len 512 Authorization Bearer postgresql mlflow db.internal "
                         "5432 http alice 10.0.0.5:5000 api" and secret != MASK)
    assume(secret.lower() not in secrets._PROSE)  # "the --api-key flag" is prose
    if form == 0 and not after and suffix in PROSE:
        # `--api-key hunter is refused` reads as prose: a value there holds a digit or a sign,
        # as every real key does. A list, a command line that goes on, or `=`, mask any value.
        assume(any(sign in secret for sign in string.digits + "-_.+/"))
    out = redact(text).replace(MASK, "")
    assert secret not in out and quote(secret, safe="") not in out, (text, out)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(flag=st.sampled_from(FLAGS), secret=SECRET, after=st.sampled_from(AFTER))
def test_a_command_line_never_shows_a_flags_secret(flag, secret, after):
    assume(secret not in " ".join(["vllm serve /models/m", *after]))  # shown for what it is
    for args in ([flag, secret, *after], [f"{flag}={secret}", *after]):
        out = redact_args(["vllm", "serve", "/models/m", *args])
        assert not any(secret in arg.replace(MASK, "") for arg in out), out


WORD = st.from_regex(r"[a-z]{1,12}", fullmatch=True)
PLAIN = (
    "path '/etc/passwd': {word} data file (valid: .jsonl, .csv)",
    "/etc/passwd {word}: data file not found",
    "eval set 'token': {word} data file needs a scorer",
    "eval set \"token\": {word} is missing",
    "evalsets.0.token: {word} required",
    "folder ./runs/token {word} is empty",
    "--tokenizer-mode {word} is not a choice",
    "max_tokens {word} budget",
    "the token {word} was not found in the vocabulary",
    "'--api-key' {word} in engine.extra_args",
    "stage 'secret': parent {word} is not an earlier stage",
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(template=st.sampled_from(PLAIN), word=WORD)
def test_a_word_after_token_or_passwd_that_is_no_credential_survives(template, word):
    text = template.format(word=word)
    assert redact(text) == text


@pytest.mark.parametrize("text", [
    "the --api-key flag",
    "give it as --api-key instead",
    "'--api-key' belongs in engine.extra_args (one key for every engine)",
    "give the key through --api-key instead; --tokenizer-mode slow; --api-key --port 8",
])
def test_prose_about_a_credential_flag_reads_as_written(text):
    assert redact(text) == text
