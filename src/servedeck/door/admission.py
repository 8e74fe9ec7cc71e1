"""Who may ask the door what, decided from a request's head: api keys and the loopback rule.

With a key set (--api-key, SERVEDECK_API_KEY, [host] api_keys) every request needs it (401 otherwise;
the live page's EventSource, which cannot send headers, may give it as ?key= on a management path).
With none set, the management endpoints answer loopback peers only (403 to others), so a
non-loopback bind never opens them without a key. /v1/* (/v1/models too) is open without a key.
The health probes (/health, /v1/health) answer anyone, as llama-server's and vLLM's own do outside
their --api-key: load balancers and load generators probe without credentials. What they say beyond
"ok" (the models and their states; `?model=NAME`, which would confirm a name) is for a caller who may
read /v1/models (`may_list`): with a key set, one who sends it.
"""

from __future__ import annotations

import hmac
import ipaddress
from functools import lru_cache
from urllib.parse import parse_qs

from servedeck.door.checks import cut
from servedeck.door.front import Answer, Req, error_body


@lru_cache(maxsize=1024)
def is_loopback(host: str | None) -> bool:
    if not host:
        return False
    if host in ("localhost",):
        return True
    try:
        return ipaddress.ip_address(host.split("%")[0]).is_loopback
    except ValueError:
        return False


# GET/HEAD only: what guidellm, aiperf and vllm-router probe (docs/door.md, "Health")
HEALTH_PATHS = (b"/health", b"/v1/health")


def is_health(r: Req) -> bool:
    return r.path in HEALTH_PATHS and r.method in (b"GET", b"HEAD")


def is_management(r: Req) -> bool:
    """Everything outside /v1/ (the page, its events, /metrics, /door/status)."""
    return not r.path.startswith(b"/v1/")


class Admission:
    def __init__(self, api_keys: list[str] = ()) -> None:
        self.keys = [k.encode() for k in api_keys if k]

    def _key_ok(self, given: bytes | None) -> bool:
        if not given:
            return False
        ok = False
        for k in self.keys:  # every key compared, in constant time: no early exit to time
            ok |= hmac.compare_digest(given, k)
        return ok

    def _given(self, r: Req, mgmt: bool) -> bytes | None:
        auth = r.header(b"authorization") or b""
        given = auth[7:].strip() if auth[:7].lower() == b"bearer " else r.header(b"x-api-key")
        if given is None and mgmt and b"?" in r.url:  # the page's EventSource cannot send headers
            q = parse_qs(r.url.split(b"?", 1)[1].decode("latin-1")).get("key")
            given = q[0].encode("latin-1") if q else None
        return given

    def may_list(self, r: Req) -> bool:
        """Whether `r` may read what /v1/models says (a health probe's model states): always without
        keys (/v1/models is open then), else with a right key in its headers."""
        return not self.keys or self._key_ok(self._given(r, False))

    def check(self, r: Req) -> Answer | None:
        """None when the request may go on, else the answer it gets instead."""
        if is_health(r):
            return None
        mgmt = is_management(r)
        if self.keys:
            given = self._given(r, mgmt)
            if not self._key_ok(given):
                return Answer(401, error_body(401, "missing or wrong api key",
                                              "send Authorization: Bearer <key> (the key given to "
                                              "--api-key, SERVEDECK_API_KEY or [host] api_keys)"),
                              {"WWW-Authenticate": "Bearer"})
        elif mgmt and not is_loopback(r.peer_host):
            path = cut(r.path)
            return Answer(403, error_body(403, f"{path} is a management endpoint and no api key is set: "
                                               "it answers only on loopback",
                                          "set --api-key / SERVEDECK_API_KEY to open it to other hosts"))
        return None
