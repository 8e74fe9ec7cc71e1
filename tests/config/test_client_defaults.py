"""models.toml's client_defaults (issue 49): what the door fills in for a client that leaves it out. The door
applies them on real engines in tests/door/test_chat_ui_defaults.py; here, what is filled and what is not."""

from __future__ import annotations

from servedeck.config.schema import ClientDefaults

GEMMA = ClientDefaults(max_tokens=256, stop=["<|im_end|>"], tools=False)


def test_what_a_client_leaves_out_is_filled_and_its_tools_dropped():
    body = {"model": "gemma", "messages": [], "tools": [{"type": "function"}], "tool_choice": "auto"}
    assert GEMMA.fill(body, chat=True) == ["max_tokens", "stop", "-tools", "-tool_choice"]
    assert body == {"model": "gemma", "messages": [], "max_tokens": 256, "stop": ["<|im_end|>"]}


def test_what_a_client_sends_wins():
    body = {"max_completion_tokens": 9, "stop": None, "temperature": 0.3}
    assert ClientDefaults(max_tokens=256, temperature=0.7).fill(body, chat=True) == []
    assert body == {"max_completion_tokens": 9, "stop": None, "temperature": 0.3}


def test_tools_are_kept_unless_the_entry_says_false_and_completions_have_none_to_drop():
    body = {"prompt": "x", "tools": [1]}
    assert GEMMA.fill(body, chat=False) == ["max_tokens", "stop"] and body["tools"] == [1]
    assert ClientDefaults().fill({"tools": [1]}, chat=True) == []
