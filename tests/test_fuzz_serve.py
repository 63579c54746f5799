"""Fuzzing the translation server's JSON: every field of /translate and /attention given
values of the wrong type, huge, nested, empty and unicode edge cases (lone surrogates, NUL,
right-to-left text, combining marks, emoji), unknown fields, and bodies of arbitrary bytes.
Every answer is a 200 or a 4xx whose JSON body is `{"error": <one line>, "field": ...}`,
never a 500, and the server keeps serving: a valid request afterwards gets its 200."""

from __future__ import annotations

import json

import pytest
from conftest import fuzz  # tests/conftest.py
from fastapi.testclient import TestClient
from hypothesis import event, given
from hypothesis import strategies as st

from transformer.decoding.translator import Translator
from transformer.deploy.serve import MAX_CHARS, AttentionRequest, TranslateRequest, create_app

pytestmark = pytest.mark.usefixtures("one_thread")  # see conftest.py

TRANSLATE_FIELDS = tuple(TranslateRequest.model_fields)  # every field, new ones included
ATTENTION_FIELDS = tuple(AttentionRequest.model_fields)


@pytest.fixture(scope="module")
def client(random_checkpoint):
    with TestClient(create_app(Translator.load(random_checkpoint, device="cpu"))) as client:
        yield client


# ---- values -------------------------------------------------------------------------------------

ODD_TEXT = st.one_of(
    st.text(max_size=20),
    st.sampled_from(["", " ", "\x00", "\ud800", "a\udfffb", "\u202eabc\u202c", "שלום עולם",
                     "e\u0301\u0301\u0301", "😀" * 5, "👩\u200d👩\u200d👧", "\ufeff", "\r\n",
                     "\u2028", "a" * (MAX_CHARS + 1), "ein Hund " * 40, "<s> </s> <pad>"]),
)
NUMBERS = st.one_of(st.integers(-(2**70), 2**70), st.integers(-3, 20),
                    st.floats(allow_nan=False, allow_infinity=False))
JSON = st.recursive(st.none() | st.booleans() | NUMBERS | ODD_TEXT,
                    lambda inner: st.lists(inner, max_size=3)
                    | st.dictionaries(ODD_TEXT, inner, max_size=3), max_leaves=8)


def field_value(name: str) -> st.SearchStrategy:
    """Values for field `name`: of its own type (often out of range) or any JSON."""
    if name in ("text", "prefix"):
        own = st.lists(ODD_TEXT, min_size=0, max_size=4) | st.just(["A dog."] * 65)
    elif name == "alignment":
        own = st.booleans()
    elif name in ("alpha", "max_len_a", "sampling_topp", "temperature"):
        own = NUMBERS
    elif name == "target_lang":  # the model records no target language: each is refused
        own = ODD_TEXT | st.sampled_from(["de", "en", "d e", "{0}", "x" * 10_000])
    else:
        own = st.integers(-3, 20) | st.integers(-(2**70), 2**70)
    return st.one_of(own, own, JSON)


def bodies(fields: tuple[str, ...]) -> st.SearchStrategy[dict]:
    """Request bodies: a text, some of `fields` with odd values, perhaps an unknown field."""
    return st.fixed_dictionaries(
        {"text": field_value("text") if "prefix" in fields else ODD_TEXT | JSON},
        optional={**{name: field_value(name) for name in fields if name != "text"},
                  "unknown": JSON})


# ---- the property -------------------------------------------------------------------------------


def check_answer(response) -> None:
    """A 200, or a 4xx with a one-line error naming its field; never a 5xx. (Statuses are
    counted in `--hypothesis-show-statistics`.)"""
    event(f"status {response.status_code}")
    assert response.status_code == 200 or 400 <= response.status_code < 500, response.text
    if response.status_code != 200:
        body = response.json()
        assert set(body) == {"error", "field"}, body
        assert isinstance(body["error"], str) and body["error"]
        assert "\n" not in body["error"], body


def still_serving(client) -> None:
    response = client.post("/translate", json={"text": ["A dog runs."], "beam_size": 1})
    assert response.status_code == 200, response.text


def check_json_body(client, path: str, body: dict) -> None:
    """POST `body` to `path`: a sound answer (`check_answer`), and the server goes on."""
    check_answer(client.post(path, content=json.dumps(body).encode(),
                             headers={"content-type": "application/json"}))
    still_serving(client)


@fuzz(30)
@given(body=bodies(TRANSLATE_FIELDS))
def test_translate_answers_any_json_body(client, body):
    check_json_body(client, "/translate", body)


@fuzz(15)
@given(body=bodies(ATTENTION_FIELDS))
def test_attention_answers_any_json_body(client, body):
    check_json_body(client, "/attention", body)


RAW = st.one_of(
    st.binary(max_size=64),
    st.sampled_from([b"", b"{", b"[]", b"null", b'"text"', b'{"text": ["a"]', b"\xff\xfe",
                     b'{"text": ["\\ud800"]}', b'{"text": ["a"], "text": 1}',
                     b"[" * 100_000 + b"]" * 100_000, b'{"text": ' + b"[" * 5_000 + b"]" * 5_000
                     + b"}", b'{"text": ["a"], "beam_size": 1e999}',
                     b'{"text": ["a"], "seed": 123456789012345678901234567890}',
                     b'{"text": ["a"], "alpha": NaN}', b'{"text": ["a"]}' + b" " * 600_000]),
)


@fuzz(20)
@given(raw=RAW, path=st.sampled_from(["/translate", "/attention"]),
       content_type=st.sampled_from(["application/json", "text/plain", "", "application/json; "
                                     "charset=latin-1"]))
def test_any_bytes_as_a_body(client, raw, path, content_type):
    check_answer(client.post(path, content=raw, headers={"content-type": content_type}))
    still_serving(client)
