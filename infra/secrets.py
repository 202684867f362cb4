"""Credentials stay out of everything quantgate writes: redaction and the engine's API key.

A secret is whatever a credential-like flag (`--api-key`, `--hf-token`, `--password` …) or setting
(an environment variable named like a key, token, secret or password; the password of a URI)
carries. `redact` replaces every one it can see, and every value `remember` was told about, with
MASK in any text; `redact_args` does it to a command line. Nothing else is masked: a message that
only names a credential word (the path /etc/passwd, an eval set called `token`) reads as written.
The engine's API key reaches the clients (lm-eval, the perplexity and probe requests, the Locust
process) through OPENAI_API_KEY, the variable lm-eval's OpenAI-compatible models read, and reaches
vLLM through VLLM_API_KEY, so neither the command line nor vLLM's start-up log ever holds it.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from contextlib import contextmanager

MASK = "<redacted>"
CLIENT_KEY_ENV = "OPENAI_API_KEY"  # lm-eval's local-(chat-)completions send it as a Bearer token
ENGINE_KEY_ENV = "VLLM_API_KEY"  # vLLM serve reads it when --api-key is not given
# Environment variable names: HF_TOKEN, QG_WEBHOOK_SECRET, MLFLOW_TRACKING_PASSWORD, VLLM_API_KEY,
# but not TOKENIZERS_PARALLELISM.
_SECRET_NAME = re.compile(r"(^|_)(KEY|TOKEN|SECRET|PASSWORD|PASSWD|CREDENTIALS?)(_|$)", re.IGNORECASE)
_SECRET_FLAG = re.compile(r"^--?([\w-]*(api[-_]?key|token|secret|passw(or)?d|credential)[\w-]*)"
                          r"(=(.*))?$", re.IGNORECASE)
# user:password@ in any URI (http, postgresql, mysql …); the user name stays, the password goes.
_URI_PASSWORD = re.compile(r"(?P<head>\b[a-z][a-z0-9+.-]*://[^/\s:@]*:)(?P<password>[^@\s/]+)@",
                           re.IGNORECASE)
# A setting that holds a credential is named by a whole word (`hf_token`, `engine.api_key`,
# `--api-key`, `MLFLOW_TRACKING_PASSWORD`) that starts the text or follows a space, a quote or a
# separator: `/etc/passwd` is a path and `my-token` a folder, not settings.
_START = r"""(?<![^\s{\[(,;&?'"])"""
_SETTING_NAME = r"[\w.-]*(?:api[-_]?key|token|secret|passw(?:or)?d|credentials?)"
# "key": "value", 'key': 'value' (JSON, a dict's repr): a quoted name and a quoted value.
_QUOTED_SETTING = re.compile(
    rf"""{_START}(?P<key>(?P<key_quote>["']){_SETTING_NAME}(?P=key_quote)\s*[=:]\s*"""
    r"""(?P<quote>["']))(?P<value>(?:\\.|(?!(?P=quote))[^\\\n])+)(?=(?P=quote))""", re.IGNORECASE)
# key=value, key: value (YAML, an environment, a query string). `eval set 'token': a data file`
# and `evalsets.0.token: Field required` are messages about a setting, not its value: a value
# after `:` or after a quoted name is one only when it ends the setting or looks like a credential.
_SETTING = re.compile(
    rf"""{_START}(?P<key>(?P<key_quote>["']?){_SETTING_NAME}(?P=key_quote)\s*(?P<sep>[=:])\s*)"""
    r"""(?P<value>[^\s"',;&}\]]+)(?P<end>(?=[ \t]*(?:$|[\r\n,;&})\]#])))?""", re.IGNORECASE)
# `Authorization: Bearer …` as a header, a dict or a curl -H; a bare `Bearer …` when it looks
# like a credential ("a Bearer token" is prose).
_AUTHORIZATION = re.compile(
    r"""(?P<head>\b(?:proxy-)?authorization["']?\s*[:=]\s*["']?"""
    r"""(?:(?:bearer|basic|token|digest|apikey)\s+)?)(?P<value>[^\s"',;}\]]+)""", re.IGNORECASE)
_BEARER = re.compile(r"""(?P<head>\bBearer\s+)(?P<value>[^\s"',;}\]]+)""", re.IGNORECASE)
# A credential flag followed by its value as a command line, a list or its repr shows it:
# `--api-key sk-1…`, `['--api-key', 'sk-1…']`, `"--hf-token", "hf_1…"`. The credential word is a
# whole part of the flag's name (`--tokenizer-mode` is no token). In a list (a comma after the
# flag) or quoted, what follows is the value, however plain; after a space it is one when it
# looks like a credential (a digit or a sign in it, or 20 characters) or when a command line
# goes on after it (another flag, the end of the line), so prose such as "'--api-key' belongs in
# engine.extra_args" stays readable.
_FLAG_VALUE = re.compile(
    rf"""{_START}(?P<flag>--?(?:[a-z0-9]+[-_])*(?:api[-_]?key|token|secret|passw(?:or)?d|credentials?)"""
    r"""(?:[-_][a-z0-9]+)*)(?P<between>["']?\s*,?\s*["']?)(?P<value>[^\s"'`,;\]\-][^\s"'`,;\]]*)"""
    r"""(?P<command>(?=[ \t]*(?:$|[\r\n\])`])|[ \t]+-))?""", re.IGNORECASE)


def _looks_secret(value: str) -> bool:
    return value != MASK and (
        len(value) >= 20 or (len(value) >= 8 and bool(re.search(r"[\d_\-+/=.]", value))))


def _mask_setting(match: re.Match[str]) -> str:
    plain = match["sep"] == "=" and not match["key_quote"]
    if plain or _looks_secret(match["value"]) or (match["end"] is not None and not match["key_quote"]):
        return f"{match['key']}{MASK}"
    return match[0]


def _mask_flag_value(match: re.Match[str]) -> str:
    between, value = match["between"], match["value"]
    if not between or value == MASK:  # `--api-keyfile`: one word, no value
        return match[0]
    listed = "," in between or between[-1] in "\"'"
    # After a flag, a digit or a sign makes a word a value, however short ("--api-key 0000").
    looks_secret = len(value) >= 20 or bool(re.search(r"[\d_\-+/=.]", value))
    # A command line that goes on (another flag) or ends there; "the --api-key flag" ends prose.
    command = match["command"] is not None and (
        value.lower() not in _PROSE or match.string[match.end():].lstrip(" \t").startswith("-"))
    if listed or looks_secret or command or (
            not between.strip() and _in_command_line(match.string, match.start())):
        return f"{match['flag']}{between}{MASK}"
    return match[0]


# A flag earlier on the line (`vllm serve m --max-model-len 512 --api-key KEY …`): the words
# there are a command line's, not prose.
_EARLIER_FLAG = re.compile(r"(?:^|\s)--?[a-z][\w-]*(?:=\S*)?\s+\S", re.IGNORECASE)


_PROSE = {"flag", "option", "argument", "instead", "too", "also", "here", "there", "alone", "only",
          "itself", "set", "unset", "given", "missing", "required"}


def _in_command_line(text: str, at: int) -> bool:
    line = text[text.rfind("\n", 0, at) + 1:at]
    return bool(_EARLIER_FLAG.search(line))


_MIN_SECRET = 6  # shorter values would mask ordinary words
_remembered: set[str] = set()


def remember(value: str | None) -> None:
    """Mask this value wherever it appears from now on in this process."""
    if value and len(value) >= _MIN_SECRET and value != MASK:
        _remembered.add(value)


def secret_values() -> set[str]:
    """Values remembered plus those of credential-like environment variables."""
    found = {value for name, value in os.environ.items()
             if _SECRET_NAME.search(name) and len(value) >= _MIN_SECRET and value != MASK}
    return _remembered | found


def redact(text: str) -> str:
    """`text` with every credential it shows replaced by MASK."""
    if not text:
        return text
    text = _URI_PASSWORD.sub(lambda m: f"{m['head']}{MASK}@", text)
    text = _AUTHORIZATION.sub(lambda m: f"{m['head']}{MASK}", text)
    text = _BEARER.sub(lambda m: f"{m['head']}{MASK}" if _looks_secret(m["value"]) else m[0], text)
    text = _QUOTED_SETTING.sub(lambda m: f"{m['key']}{MASK}", text)
    text = _SETTING.sub(_mask_setting, text)
    text = _FLAG_VALUE.sub(_mask_flag_value, text)
    for value in sorted(secret_values(), key=len, reverse=True):
        text = text.replace(value, MASK)
    return text


def is_secret_flag(arg: str) -> bool:
    return bool(_SECRET_FLAG.match(arg))


def redact_args(args: list[str]) -> list[str]:
    """A command line with the value of every credential-like flag masked."""
    out: list[str] = []
    masking_next = False
    for arg in args:
        if masking_next and not arg.startswith("--"):
            out.append(MASK)
            masking_next = False
            continue
        masking_next = False
        match = _SECRET_FLAG.match(arg)
        if match and match.group(5) is not None:
            out.append(f"{arg[:match.start(5)]}{MASK}")
        elif match:
            out.append(arg)
            masking_next = True
        else:
            out.append(redact(arg))
    return out


def split_api_key(args: list[str]) -> tuple[list[str], str | None]:
    """Take vLLM's `--api-key KEY` / `--api-key=KEY` out of a command line: (the rest, KEY)."""
    rest: list[str] = []
    key: str | None = None
    items = iter(args)
    for arg in items:
        if arg == "--api-key" or arg == "--api_key":
            key = next(items, None)
        elif arg.startswith(("--api-key=", "--api_key=")):
            key = arg.split("=", 1)[1]
        else:
            rest.append(arg)
    remember(key)
    return rest, key


def auth_headers() -> dict[str, str]:
    """The Bearer header quantgate's own clients send to the engine, if it has a key."""
    key = os.environ.get(CLIENT_KEY_ENV)
    return {"Authorization": f"Bearer {key}"} if key else {}


@contextmanager
def engine_key(key: str | None) -> Iterator[None]:
    """Clients in this process and its children authenticate with `key` (none: unchanged)."""
    if not key:
        yield
        return
    remember(key)
    before = os.environ.get(CLIENT_KEY_ENV)
    os.environ[CLIENT_KEY_ENV] = key
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(CLIENT_KEY_ENV, None)
        else:
            os.environ[CLIENT_KEY_ENV] = before
