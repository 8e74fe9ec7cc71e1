"""The deck: start, switch, stop, status and restore models; desired state; the journal."""

from servedeck.deck.deck import Deck, Status

__all__ = ["Deck", "Status"]
