"""The live page: `/` is one self-contained HTML document (no external assets); it opens `/events`
(server-sent events, written by door/management.py) and redraws from each snapshot. Everything is
text-escaped on the page (textContent), so a model name or a log line can never become markup."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from servedeck.door.manager import Manager

LOG_LINES = 8
EVERY_S = 1.0  # how often /events looks for a new snapshot


def _disk_parts(models: list[str]) -> dict[str, Any]:
    """Notices and each running model's log tail (file reads: run in a thread)."""
    from servedeck.deck import launch as L
    from servedeck.deck import state as S
    from servedeck.watch.notices import read_notices

    notices = [{"ts": n.get("ts"), "kind": n.get("kind"), "model": n.get("model"), "message": n.get("message")}
               for n in read_notices(since_s=6 * 3600)[-20:]]
    logs = {}
    for m in models:
        rec = S.live_or_none(m)  # a record that cannot be read shows no log, never breaks the page
        if rec and rec.launch_dir:
            logs[m] = L.log_tail(Path(rec.launch_dir), LOG_LINES).splitlines()
    return {"notices": notices, "logs": logs}


async def snapshot(manager: Manager, recent: Iterable[dict], gpu: dict[str, Any] | None = None) -> dict[str, Any]:
    """What the page shows (and /door/status answers): models, the GPUs' last reading (door/gpu_watch.py),
    recent requests, switches, notices, logs."""
    models = manager.snapshot()
    disk = await asyncio.to_thread(_disk_parts, [name for rt in manager.models.values() if rt.managed
                                                 for name in rt.members])
    return {"at": time.time(), "models": models, "gpu": gpu or {"not_sampled": "no GPU sampled"}, "recent": list(recent)[-20:][::-1],
            "swaps": list(manager.swaps)[-10:][::-1], **disk}


PAGE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>servedeck door</title>
<meta name="viewport" content="width=device-width, initial-scale=1"><link rel="icon" href="data:,">
<style>
body{font:14px/1.4 system-ui,sans-serif;margin:1.5em;color:#222}
h1{font-size:1.3em;margin:0 0 .3em} h2{font-size:1.05em;margin:1.2em 0 .3em}
table{border-collapse:collapse;min-width:40em} td,th{padding:.2em .6em;border-bottom:1px solid #ddd;text-align:left}
.state-ready{color:#070;font-weight:600} .state-starting,.state-draining,.state-stopping{color:#a60;font-weight:600}
.state-failed{color:#b00;font-weight:600} .state-stopped{color:#777}
pre{background:#f6f6f6;padding:.4em;margin:.2em 0;font-size:12px;white-space:pre-wrap;max-height:12em;overflow:auto}
#conn{color:#777;font-size:12px}
</style></head>
<body>
<h1>servedeck front door</h1><div id="conn">connecting…</div>
<h2>Models</h2>
<table id="models"><thead><tr><th>model</th><th>aliases</th><th>slot</th><th>state</th><th>in flight</th>
<th>queued</th><th>port</th><th>detail</th></tr></thead><tbody></tbody></table>
<h2>GPUs</h2><div id="gpu-note"></div>
<table id="gpus"><thead><tr><th>GPU</th><th>power W</th><th>limit W</th><th>share of limit</th><th>memory used GiB</th>
<th>of GiB</th><th>throttle</th></tr></thead><tbody></tbody></table>
<h2>Recent requests</h2>
<table id="recent"><thead><tr><th>model</th><th>path</th><th>status</th><th>waited</th><th>TTFT ms</th><th>E2E ms</th>
<th>tokens</th><th>error</th></tr></thead><tbody></tbody></table>
<h2>Switches</h2>
<table id="swaps"><thead><tr><th>at</th><th>model</th><th>kind</th><th>evicted</th><th>took s</th><th>outcome</th>
</tr></thead><tbody></tbody></table>
<h2>Notices</h2><table id="notices"><thead><tr><th>at</th><th>kind</th><th>model</th><th>message</th></tr></thead>
<tbody></tbody></table>
<h2>Logs</h2><div id="logs"></div>
<script>
"use strict";
function cell(tr, v, cls){const td=document.createElement("td"); td.textContent=(v===null||v===undefined)?"":String(v);
  if(cls){td.className=cls;} tr.appendChild(td);}
function fill(id, rows, cols){const tb=document.querySelector("#"+id+" tbody"); tb.replaceChildren();
  for(const r of rows){const tr=document.createElement("tr"); for(const c of cols){c(tr,r);} tb.appendChild(tr);}}
function draw(s){
  fill("models", s.models, [
    (t,m)=>{cell(t,m.model); if(m.managed){const a=document.createElement("a"); a.className="page-link";
      a.href="/page?model="+encodeURIComponent((m.members||[m.model])[0])+(key?"&key="+encodeURIComponent(key):"");
      a.textContent="page"; t.lastChild.append(" ", a);}},
    (t,m)=>cell(t,m.aliases.join(", ")), (t,m)=>cell(t,m.slot),
    (t,m)=>{cell(t,m.state,"state state-"+m.state); t.lastChild.dataset.model=m.model; t.lastChild.id="state-"+m.model;},
    (t,m)=>cell(t,m.inflight), (t,m)=>cell(t,m.queued), (t,m)=>cell(t,m.port),
    (t,m)=>cell(t,m.refusal?m.refusal.status+": "+m.refusal.message:m.detail)]);
  const g=s.gpu||{}, gib=b=>(b===null||b===undefined)?null:(b/2**30).toFixed(1);
  document.getElementById("gpu-note").textContent=g.not_sampled||g.pending||g.last_error||"";
  fill("gpus", g.gpus||[], [(t,r)=>cell(t,r.gpu),(t,r)=>cell(t,r.power_w),(t,r)=>cell(t,r.limit_w),
    (t,r)=>cell(t,r.share_of_limit===null?null:Math.round(r.share_of_limit*100)+" %"),
    (t,r)=>cell(t,gib(r.mem_used)),(t,r)=>cell(t,gib(r.mem_total)),(t,r)=>cell(t,(r.throttle||[]).join(", "))]);
  fill("recent", s.recent, [(t,r)=>cell(t,r.model),(t,r)=>cell(t,r.path),(t,r)=>cell(t,r.status===null?"…":r.status),
    (t,r)=>cell(t,r.waited),(t,r)=>cell(t,r.ttft_ms),(t,r)=>cell(t,r.e2e_ms),(t,r)=>cell(t,r.tokens),
    (t,r)=>cell(t,r.error)]);
  fill("swaps", s.swaps, [(t,r)=>cell(t,r.at),(t,r)=>cell(t,r.model),(t,r)=>cell(t,r.kind),
    (t,r)=>cell(t,r.evicted.join(", ")),(t,r)=>cell(t,r.took_s),(t,r)=>cell(t,r.outcome)]);
  fill("notices", s.notices.slice().reverse(), [(t,n)=>cell(t,n.ts),(t,n)=>cell(t,n.kind),(t,n)=>cell(t,n.model),
    (t,n)=>cell(t,n.message)]);
  const logs=document.getElementById("logs"); logs.replaceChildren();
  for(const [m, lines] of Object.entries(s.logs)){const h=document.createElement("div"); h.textContent=m;
    const p=document.createElement("pre"); p.textContent=lines.join("\\n"); logs.appendChild(h); logs.appendChild(p);}
}
const key=new URLSearchParams(location.search).get("key");
const es=new EventSource("/events"+(key?"?key="+encodeURIComponent(key):""));
es.addEventListener("snapshot", ev=>{draw(JSON.parse(ev.data));
  document.getElementById("conn").textContent="live, updated "+new Date().toLocaleTimeString();});
es.onerror=()=>{document.getElementById("conn").textContent="disconnected; retrying…";};
</script>
</body></html>
"""
