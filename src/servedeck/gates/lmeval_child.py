"""lm-eval's command line with one model more: `servedeck-chat-completions`, lm-eval's local-chat-completions
that turns a failed request into one failed sample instead of stopping the whole run.

    python -m servedeck.gates.lmeval_child run --model servedeck-chat-completions ...   (gates/lmeval.py)

lm-eval re-raises a request that fails after its retries, and the run ends with no samples at all. Here
such a request answers FAILED (no digit, so no filter turns it into an answer) and its error goes, one JSON
line {"prompt", "error"}, to the file named by $SERVEDECK_LMEVAL_ERRORS; gates/lmeval.py then counts that
sample as an error (and as not correct), never drops it. A subclass rather than a patch: lm-eval's model
registry is the way it is meant to be extended.
"""

from __future__ import annotations

import json
import os
from typing import Any

from lm_eval.api.registry import register_model
from lm_eval.models.openai_completions import LocalChatCompletion

from servedeck.gates.lmeval import FAILED

ERRORS_ENV = "SERVEDECK_LMEVAL_ERRORS"


def _note(messages: Any, err: BaseException) -> None:
    path = os.environ.get(ERRORS_ENV)
    if not path:
        return
    text = f"{type(err).__name__}: {err}".rstrip(": ")
    status = getattr(err, "status", None) or getattr(getattr(err, "response", None), "status_code", None)
    if status:
        text = f"HTTP {status}: {text}"
    with open(path, "a", encoding="utf-8") as fh:
        for m in messages:
            fh.write(json.dumps({"prompt": getattr(m, "prompt", str(m)), "error": text[:500]}) + "\n")


@register_model("servedeck-chat-completions")
class CountedChatCompletion(LocalChatCompletion):
    async def amodel_call(self, session: Any, sem: Any, messages: Any, **kwargs: Any) -> Any:  # concurrent path
        try:
            return await super().amodel_call(session, sem, messages, **kwargs)
        except Exception as e:  # not CancelledError: Ctrl-C still stops the run
            _note(messages, e)
            return [FAILED] * len(messages)

    def model_call(self, messages: Any, **kwargs: Any) -> Any:  # num_concurrent=1: one request at a time
        try:
            return super().model_call(messages, **kwargs)
        except Exception as e:
            _note(messages, e)
            return {"choices": [{"index": i, "message": {"content": FAILED}} for i in range(len(messages))]}


if __name__ == "__main__":
    from lm_eval.__main__ import cli_evaluate

    cli_evaluate()
