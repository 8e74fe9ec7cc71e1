"""Issue 48 item 5 on real llama-server engines: the numbers the door forwards are checked against what
the model can do, an unreadable body says what is unreadable, and an error quotes at most a bounded
prefix of what the client sent. Before: `max_tokens = 2**63` came back 200 with a one-token answer
(llama-server wrapped it), `10**12` got llama-server's own overflowing message ("got -727379968"),
invalid UTF-8 and a 5,000-digit integer got "the JSON body names no "model"", and a 1 MiB model name
was echoed whole in the 404 (1,048,759 bytes). One door for the module (tests/door/conftest.py)."""

from __future__ import annotations

import json

import pytest

pytestmark = [pytest.mark.engine, pytest.mark.llamacpp]

CHAT = [{"role": "user", "content": "Say hello."}]


def post(door, body: bytes | dict, path: str = "/v1/chat/completions", timeout: float = 120):
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    return door.client.post(path, content=data, headers={"Content-Type": "application/json"}, timeout=timeout)


def context(door) -> int:
    return door.cfg.models["smollm2"].context


@pytest.mark.parametrize("value", [2**63, 10**12, "context + 1", 0, -5, 2.0, True, "12"])
def test_max_tokens_beyond_the_models_context_is_refused_naming_the_field_and_its_limit(door, value):
    value = context(door) + 1 if value == "context + 1" else value
    r = post(door, {"model": "smol", "messages": CHAT, "max_tokens": value})
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert '"max_tokens"' in err["message"] and f"{context(door):,}" in err["message"], err
    assert err["param"] == "max_tokens", err


def test_n_and_friends_within_their_stated_limits(door):
    for field, value, limit in (("n", 10**9, "128"), ("top_logprobs", 1000, "20"), ("seed", 2**70, "64-bit"),
                                ("max_completion_tokens", 10**12, f"{context(door):,}")):
        r = post(door, {"model": "smol", "messages": CHAT, field: value})
        assert r.status_code == 400 and f'"{field}"' in r.text and limit in r.text, (field, r.text)
    r = post(door, {"model": "smol", "prompt": "Hi", "logprobs": 99}, "/v1/completions")
    assert r.status_code == 400 and '"logprobs"' in r.text, r.text


def test_values_within_the_limits_are_answered(door):
    r = post(door, {"model": "smol", "messages": CHAT, "max_tokens": 2, "n": 1, "seed": 2**40},
             timeout=600)  # the first request boots smollm2 (minutes on a loaded 2-core box)
    assert r.status_code == 200, r.text


def test_an_unreadable_body_says_what_is_unreadable(door):
    r = post(door, b'{"model": "smol", "messages": [{"role": "user", "content": "caf\xe9"}]}')
    assert r.status_code == 400 and "not UTF-8" in r.text and "0xe9" in r.text, r.text
    r = post(door, b'{"model": "smol", "max_tokens": ' + b"9" * 5000 + b', "messages": []}')
    assert r.status_code == 400 and "digits" in r.text and "names no" not in r.text, r.text
    r = post(door, b'{"model": "smol", "messages": [}')
    assert r.status_code == 400 and "not valid JSON" in r.text and "offset" in r.text, r.text


def test_an_error_quotes_a_bounded_prefix_of_what_the_client_sent(door):
    name = "m" * 2**20
    r = post(door, {"model": name, "messages": CHAT})
    assert r.status_code == 404, r.text[:300]
    assert len(r.content) < 4096 and "1,048,576 characters" in r.text, r.text[:300]
    r = door.client.get("/" + "p" * 60_000)
    assert r.status_code == 404 and len(r.content) < 4096, r.text[:300]
