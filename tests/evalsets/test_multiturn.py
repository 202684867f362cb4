"""Multi-turn dialogues: the encoding round-trips, and the server receives separate messages."""

from __future__ import annotations

import json

import pytest

from evalsets.contracts import check_chat_template
from evalsets.multiturn import (
    MARKER,
    decode_dialogue,
    encode_dialogue,
    expand_messages,
)
from evalsets.runner import recording_model, run_evalset
from evalsets.spec import EvalSetSpec
from infra.errors import MeasurementError, SpecError
from tests.evalsets.chat_fake import FakeChat

DIALOGUE = [
    {"role": "user", "content": "My order is 4711."},
    {"role": "assistant", "content": "Noted: order 4711."},
    {"role": "user", "content": "What was my order number?"},
]


def test_encode_then_decode_gives_the_same_turns():
    text = encode_dialogue(DIALOGUE)
    assert text.startswith(MARKER)
    assert decode_dialogue(text) == DIALOGUE


def test_ordinary_prompts_do_not_decode():
    assert decode_dialogue("What is 2+3?") is None
    assert decode_dialogue(MARKER + "not json") is None
    assert decode_dialogue(None) is None


@pytest.mark.parametrize("messages, message", [
    ([], "non-empty list"),
    ([{"role": "robot", "content": "hi"}], "role 'robot'"),
    ([{"role": "user", "content": "  "}], "non-empty text"),
    ([{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yes"}], "last turn"),
])
def test_bad_dialogues_are_named(messages, message):
    with pytest.raises(SpecError, match=message):
        encode_dialogue(messages)


def test_expand_replaces_only_encoded_messages():
    system = {"role": "system", "content": "Be brief."}
    expanded = expand_messages([system, {"role": "user", "content": encode_dialogue(DIALOGUE)}])
    assert expanded == [system, *DIALOGUE]
    plain = [{"role": "user", "content": "Hello"}]
    assert expand_messages(plain) == plain


def test_chat_payload_carries_separate_turns():
    model = recording_model(True, model="m", base_url="http://127.0.0.1:1/v1/chat/completions",
                            tokenizer_backend=None, tokenized_requests=False)
    payload = model._create_payload([{"role": "user", "content": encode_dialogue(DIALOGUE)}],
                                    generate=True, gen_kwargs={"max_gen_toks": 8})
    assert payload["messages"] == DIALOGUE
    assert "response_format" not in payload


def test_completions_refuse_a_dialogue():
    model = recording_model(False, model="m", base_url="http://127.0.0.1:1/v1/completions",
                            tokenizer_backend=None, tokenized_requests=False)
    with pytest.raises(MeasurementError, match="chat_template: true"):
        model._create_payload(encode_dialogue(DIALOGUE), generate=True,
                              gen_kwargs={"max_gen_toks": 8})


def test_validate_refuses_a_multiturn_set_without_chat_template():
    sets = [EvalSetSpec(name="math"), EvalSetSpec(name="conversation")]
    check_chat_template(sets, chat_template=True)
    check_chat_template([EvalSetSpec(name="math")], chat_template=False)
    with pytest.raises(SpecError, match="'conversation' is multi-turn.*chat_template: false"):
        check_chat_template(sets, chat_template=False)


def test_server_receives_each_dialogue_as_its_turns(tmp_path):
    """The conversation set through lm-eval against a fake chat server: every request body holds
    the dialogue's own messages (the chat template is applied per turn), not one string."""
    rows = [json.loads(line) for line in
            (EvalSetSpec(name="conversation").info.folder / "data.jsonl").read_text().splitlines()]
    with FakeChat(answer="15") as server:
        task = run_evalset(server.base_url, server.model, EvalSetSpec(name="conversation", limit=3),
                           tmp_path, count_tokens=None, num_concurrent=1)
        bodies = list(server.requests)
    assert len(bodies) == 3
    sent = sorted((body["messages"] for body in bodies), key=lambda m: m[0]["content"])
    expected = sorted((row["messages"] for row in rows[:3]), key=lambda m: m[0]["content"])
    assert sent == expected
    assert all(len(messages) >= 5 and MARKER not in json.dumps(messages) for messages in sent)
    # conv-0002 asks for 12 + 3: the fixed answer "15" is right there and wrong elsewhere.
    assert {item.id: item.score for item in task.items} == {
        "conv-0000": 0.0, "conv-0001": 0.0, "conv-0002": 1.0}


def test_the_scoring_corpus_reads_a_logged_dialogue_as_its_turns():
    import json

    from evalsets.multiturn import encode_dialogue
    from evalsets.token_corpus import _messages

    turns = [{"role": "user", "content": "My order is 4471."},
             {"role": "assistant", "content": "Noted."},
             {"role": "user", "content": "What is my order number?"}]
    logged = json.dumps([{"role": "user", "content": encode_dialogue(turns)}])
    assert _messages(logged) == turns
    assert _messages("plain text") == "plain text"
