"""Multi-turn conversations that keep exactly what the server returned.

The seed's overnight soak re-sent `reasoning_content` that its server never returned, so every
later turn carried a field the server had not produced and the conversations lost their
reasoning. Here the assistant turn appended to the history is the server's own `message` object:
every field it sent (reasoning_content included, when it sent one) and nothing it did not send.
Fields sent as null are dropped: null is the server saying "nothing here", and echoing nulls back
(tool_calls, refusal, audio) is what some servers reject.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

TOPICS = ("rivers", "prime numbers", "lighthouses", "bread", "comets", "glaciers", "violins", "bees",
          "railways", "tides", "volcanoes", "chess", "maps", "owls", "clocks", "salt")


class ProtocolViolation(ValueError):
    """The response had no usable assistant message."""


@dataclass
class Conversation:
    id: str
    seed: int
    max_turns: int
    messages: list[dict[str, Any]] = field(default_factory=list)

    @property
    def turn(self) -> int:
        return sum(1 for m in self.messages if m.get("role") == "user")

    @property
    def done(self) -> bool:
        return self.turn >= self.max_turns

    def ask(self) -> list[dict[str, Any]]:
        """Add the next user turn; returns the messages to send (the whole history)."""
        t = self.turn
        topic = TOPICS[(self.seed + t) % len(TOPICS)]
        text = (f"Tell me one short fact about {topic}." if t == 0
                else f"Thanks. Now one more fact about {topic}, different from before (turn {t + 1}, #{self.seed}).")
        self.messages.append({"role": "user", "content": text})
        return list(self.messages)

    def absorb(self, response: dict[str, Any]) -> dict[str, Any]:
        """Append the server's assistant message as sent (minus nulls). Returns what was appended."""
        try:
            msg = response["choices"][0]["message"]
        except (KeyError, IndexError, TypeError) as e:
            raise ProtocolViolation(f"no choices[0].message in the response ({type(e).__name__})") from None
        if not isinstance(msg, dict):
            raise ProtocolViolation("choices[0].message is not an object")
        kept = {k: v for k, v in msg.items() if v is not None}
        kept.setdefault("role", "assistant")  # a role is required to send the turn back
        self.messages.append(kept)
        return kept
