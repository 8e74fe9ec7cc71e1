"""A campaign file's conversations keys, checked where the file is read (campaign/file.py calls these):
a `kind = "conversations"` workload's users, turns, turn_tokens, answer_tokens, think_time,
system_prompt_tokens and max_context, the same as `servedeck bench --workload conversations`' options."""

from __future__ import annotations

from typing import Any

from servedeck.errors import UsageError

CONVERSATION_KEYS = ("users", "turns", "turn_tokens", "answer_tokens", "think_time", "system_prompt_tokens",
                     "max_context")


def check_workload(w: Any) -> None:
    """One [[workloads]] entry's conversations keys (a ValueError names what is wrong; pydantic adds the path)."""
    if w.kind != "conversations":
        given = [k for k in CONVERSATION_KEYS if getattr(w, k) is not None]
        if given:
            raise ValueError(f"{', '.join(given)}: only a kind = \"conversations\" workload takes "
                             f"{', '.join(CONVERSATION_KEYS)}")
        return
    if w.concurrency or w.rate:
        raise ValueError("a conversations workload's load is its users: drop concurrency/rate (users = 16)")
    try:
        spec_of(w)
    except UsageError as e:  # the option's name as the file spells it
        raise ValueError(as_key(e.message, CONVERSATION_KEYS)) from None


def as_key(text: str, keys: tuple[str, ...]) -> str:
    """A `servedeck bench` message naming options (`--turn-tokens`) → naming the campaign file's keys
    (`turn_tokens`), for each of `keys`."""
    for k in keys:
        text = text.replace("--" + k.replace("_", "-"), k)
    return text


def spec_of(w: Any) -> Any:
    """A kind = "conversations" entry → the ConversationsSpec `servedeck bench` would run, same defaults."""
    from servedeck.campaign.conversations import ConversationsSpec, spec_from_options

    d = ConversationsSpec()
    return spec_from_options(users=d.users if w.users is None else w.users,
                             turns=d.turns if w.turns is None else w.turns, turn_tokens=w.turn_tokens,
                             answer_tokens=d.answer_tokens if w.answer_tokens is None else w.answer_tokens,
                             think_time=w.think_time or "0", system_prompt_tokens=0 if w.system_prompt_tokens is None else w.system_prompt_tokens,
                            
                             content=None, seed=w.seed, request_timeout_s="default", max_context=w.max_context)
