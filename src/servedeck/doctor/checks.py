"""`servedeck doctor`: rows of checks, each OK / WARN / FAIL / SKIP with what it saw and what to do.

A row that cannot be checked on this host (no GPU, no kernel log, no policy set) is SKIP with the reason,
never OK: a quiet box is not a healthy one. Each check is a function of explicit inputs (inventory,
holdings, kernel log, config) so tests feed them real or built data; `run_doctor` gathers the inputs once.
"""

from __future__ import annotations

import errno
import socket
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Iterable, Mapping

import psutil

from servedeck.doctor.build import BuildReport, verify_build
from servedeck.doctor.kernel import KernelLog, read_kernel_events
from servedeck.doctor.kernel_ack import read_acks, split
from servedeck.doctor.weights import check_source
from servedeck.errors import ServedeckError
from servedeck.gpu.fit import FITS, NO_ROOM, RUNNING, fit_of, needs_plan
from servedeck.gpu.holders import Holding, holders, live_records, model_pids
from servedeck.gpu.nvml import Inventory, gib, inventory

if TYPE_CHECKING:
    from servedeck.config import Config, Host, Model

OK, WARN, FAIL, SKIP = "OK", "WARN", "FAIL", "SKIP"
GiB = 1024**3


@dataclass
class Row:
    check: str  # config | build | build.integrity | build.requires | weights | port | gpu | host-ram | power | kernel
    subject: str  # the model or build it is about; "" for the host
    status: str
    saw: str
    action: str = ""
    data: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


# ---------------------------------------------------------------- config
def check_config(load: Callable[[], "Config"]) -> tuple[Row, "Config | None"]:
    try:
        cfg = load()
    except ServedeckError as e:
        return Row("config", "", FAIL, e.message, e.hint or "fix models.toml"), None
    return Row("config", "", OK, f"{cfg.path}: {len(cfg.models)} models, {len(cfg.deck.builds)} builds valid"), cfg


# ---------------------------------------------------------------- build
def build_rows(name: str, rep: BuildReport) -> list[Row]:
    rows = []
    if not rep.exists:
        rows.append(Row("build", name, FAIL, "; ".join(rep.problems) or f"{rep.path} not found",
                        "fix the path in [builds.%s] or install the engine there" % name, rep.to_json()))
    else:
        ver = f"{rep.engine} {rep.engine_version}" if rep.engine_version else f"{rep.engine}, version unknown"
        status = OK if rep.engine_version else WARN
        rows.append(Row("build", name, status, f"{rep.path}: {ver}" + (f" ({rep.version_source})" if rep.version_source else ""),
                        "" if rep.engine_version else "; ".join(rep.problems) or "the engine reports no version",
                        {"engine_version": rep.engine_version}))
    if not rep.integrity_checked:
        rows.append(Row("build.integrity", name, SKIP, rep.integrity_skip or "not checked"))
    else:
        saw = f"{rep.files_matched:,} of {rep.files_total:,} files match their RECORD hashes ({rep.dists} distributions)"
        bad = rep.changed + rep.missing
        extra = []
        if rep.changed:
            extra.append(f"changed: {', '.join(rep.changed[:3])}{' …' if len(rep.changed) > 3 else ''}")
        if rep.missing:
            extra.append(f"missing: {', '.join(rep.missing[:3])}{' …' if len(rep.missing) > 3 else ''}")
        if rep.untracked:
            extra.append(f"{len(rep.untracked)} untracked under the engine package: {', '.join(rep.untracked[:3])}")
        if rep.no_record:
            extra.append(f"no RECORD: {', '.join(rep.no_record[:3])}")
        if rep.editable:
            extra.append(f"editable: {', '.join(rep.editable[:3])}")
        status = OK if not bad and not rep.untracked else WARN
        rows.append(Row("build.integrity", name, status, "; ".join([saw] + extra),
                        "" if status == OK else f"`servedeck verify-build {name}` lists every file; a changed "
                        "file means this is not the release its version says",
                        {k: getattr(rep, k) for k in ("files_total", "files_matched", "changed", "missing", "untracked")}))
    if rep.requires:
        bad_req = [r for r in rep.requires if not r.ok]
        saw = "; ".join(f"{r.path}: {r.saw}" for r in (bad_req or rep.requires))
        rows.append(Row("build.requires", name, FAIL if bad_req else OK, saw,
                        "recreate the missing paths (a miss shows as a failed request, not a boot error)" if bad_req else ""))
    return rows


# ---------------------------------------------------------------- weights
def check_weights(cfg: "Config", name: str) -> Row:
    from servedeck.engines import get_engine
    from servedeck.gpu.modelplan import engine_env

    model = cfg.models[name]
    build = cfg.deck.builds.get(model.build)
    src = cfg.expand(model.source) if model.source.startswith(("/", "~", ".", "$")) else model.source
    rev = get_engine(build.engine).arg(model, "revision") if build else model.args.get("revision")
    r = check_source(src, engine_env(model, build) if build else dict(model.env),
                     str(rev) if rev else None, base=cfg.path.parent)
    return Row("weights", name, r.status, r.saw, r.action, r.data)


# ---------------------------------------------------------------- port
def listeners(port: int) -> list[int | None]:
    """Pids listening on `port` (None for a socket whose owner psutil may not see: another user's)."""
    try:
        conns = psutil.net_connections(kind="inet")
    except (psutil.AccessDenied, PermissionError):
        return []
    return sorted({c.pid for c in conns if c.status == psutil.CONN_LISTEN and c.laddr and c.laddr.port == port},
                  key=lambda p: p or 0)


def _bindable(host: str, port: int) -> bool:
    fam = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(fam, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # TIME_WAIT leftovers do not block a server
        try:
            s.bind((host, port))
            return True
        except OSError as e:
            return e.errno not in (errno.EADDRINUSE, errno.EACCES)


def check_port(cfg: "Config", name: str, records: list[Mapping[str, Any]]) -> Row:
    from servedeck.gpu.holders import describe_pid

    model = cfg.models[name]
    port = model.port
    pids = listeners(port)
    owners: dict[int, str] = {}
    for rec in records:
        for pid in model_pids(rec):
            owners[pid] = str(rec.get("model"))
    if pids:
        mine = [p for p in pids if p is not None and owners.get(p) == name]
        if mine:
            return Row("port", name, OK, f"{port} is held by {name}'s own engine (pid {mine[0]})")
        who = []
        for p in pids:
            if p is None:
                who.append("a process servedeck cannot see (another user's)")
            elif p in owners:
                who.append(f"servedeck model {owners[p]} (pid {p})")
            else:
                pname, user, cmd = describe_pid(p)
                who.append(f"{pname} (pid {p}{', user ' + user if user else ''}): {cmd[:80]}")
        return Row("port", name, FAIL, f"{port} is held by {'; '.join(who)}",
                   f"stop that process or give {name} another port in models.toml", {"pids": pids})
    if not _bindable(model.host, port):
        return Row("port", name, FAIL, f"{model.host}:{port} cannot be bound (in use by a process servedeck cannot see)",
                   f"`ss -ltnp 'sport = :{port}'` as root names it")
    return Row("port", name, OK, f"{model.host}:{port} is free")


# ---------------------------------------------------------------- GPU memory
def check_gpu(cfg: "Config", name: str, inv: Inventory, holdings: list[Holding],
              plan_for: Callable[[str], Any] | None = None) -> Row:
    if not inv.available:
        return Row("gpu", name, SKIP, f"no GPU to check here: {inv.reason}")
    plan = plan_for(name) if plan_for and needs_plan(cfg, name) else None
    rep = fit_of(cfg, name, inv, holdings, plan=plan)
    if rep.status == RUNNING:
        return Row("gpu", name, OK, rep.reason)
    if rep.status == FITS:
        return Row("gpu", name, OK, rep.reason, data=rep.to_json())
    if rep.status == NO_ROOM:
        return Row("gpu", name, FAIL, rep.message(), rep.refusal().hint or "", rep.to_json())
    return Row("gpu", name, SKIP, rep.reason)


# ---------------------------------------------------------------- host RAM
def check_host_ram(name: str, model: "Model", available: int | None = None,
                   asleep: dict[str, int] | None = None) -> Row:
    """`asleep`: pinned host memory of the models asleep at level 1 (already out of what is available),
    named so that the row says what `servedeck stop` would give back."""
    pinned = {m: b for m, b in (asleep or {}).items() if b and m != name}
    held = ("; asleep at level 1, pinning host memory: " + ", ".join(f"{m} {gib(b)}" for m, b in pinned.items())
            + f" (`servedeck stop {' '.join(pinned)}` frees it)") if pinned else ""
    if model.host_ram_gib is None:
        return Row("host-ram", name, SKIP, "the model sets no host_ram_gib, so there is nothing to check against" + held,
                   "measure its resident host memory and set host_ram_gib if it pins real RAM")
    avail = psutil.virtual_memory().available if available is None else available
    need = model.host_ram_gib * GiB
    if avail >= need:
        return Row("host-ram", name, OK, f"needs {model.host_ram_gib:g} GiB, {gib(avail)} available" + held)
    return Row("host-ram", name, FAIL, f"needs {model.host_ram_gib:g} GiB of host RAM, only {gib(avail)} available" + held,
               "stop what holds host memory (`servedeck status`, `ps aux --sort=-rss | head`)",
               {"need": need, "available": avail, "asleep_pinned": pinned})


# ---------------------------------------------------------------- power
def check_power(host: "Host | None", inv: Inventory, now: "dict[int, dict] | str | None" = None) -> Row:
    """The enforced limits against [host]'s policy; `now`, the GPUs' current draw as the telemetry sampler
    reads it (telemetry/live.py: the same source and units as telemetry.jsonl), is said beside them."""
    row = _power_limits(host, inv)
    if isinstance(now, dict) and now:
        from servedeck.telemetry.live import draw_text

        drawing = draw_text(now)
        if drawing:
            row.saw = f"{row.saw}; now {drawing}"
    elif isinstance(now, str) and inv.available:
        row.saw = f"{row.saw}; current draw not read: {now}"
    return row


def _power_limits(host: "Host | None", inv: Inventory) -> Row:
    if not inv.available:
        return Row("power", "", SKIP, f"no GPU to check here: {inv.reason}")
    if host is None or (host.power_min_w is None and host.power_max_w is None):
        limits = ", ".join(f"GPU {g.index} {g.power_limit_w:g} W" for g in inv.gpus if g.power_limit_w)
        return Row("power", "", SKIP, f"no [host] power_min_w/power_max_w policy to check against ({limits})",
                   "set [host] power_min_w/power_max_w in models.toml to the range this host is safe at")
    lo, hi = host.power_min_w, host.power_max_w
    over, under, unknown, seen = [], [], [], []
    for g in inv.gpus:
        if g.power_limit_w is None:
            unknown.append(g.index)
            continue
        seen.append(f"GPU {g.index} {g.power_limit_w:g} W")
        if hi is not None and g.power_limit_w > hi:
            over.append(f"GPU {g.index} limit {g.power_limit_w:g} W > power_max_w {hi:g} W")
        if lo is not None and g.power_limit_w < lo:
            under.append(f"GPU {g.index} limit {g.power_limit_w:g} W < power_min_w {lo:g} W")
    policy = f"policy {lo or '-'}–{hi or '-'} W"
    if over:
        return Row("power", "", FAIL, "; ".join(over) + f" ({policy})",
                   f"lower it: `sudo nvidia-smi -i N -pl {hi:g}` (and fix the boot service that set it)")
    if under:
        return Row("power", "", WARN, "; ".join(under) + f" ({policy})",
                   "the card runs below the host's planned limit: check the boot service that sets it (HOST.md)")
    if unknown and not seen:
        return Row("power", "", SKIP, "the driver reports no enforced power limit")
    return Row("power", "", OK, ", ".join(seen) + f" within {policy}")


def _draw_now(inv: Inventory) -> "dict[int, dict] | str | None":
    if not inv.available:
        return None
    from servedeck.telemetry.live import readings_now

    return readings_now()


# ---------------------------------------------------------------- kernel
def _events_text(events: list) -> list[str]:
    by_code: dict[int, list] = {}
    for e in events:
        if e.kind == "xid":
            by_code.setdefault(int(e.code or 0), []).append(e)

    def boots_of(es: list) -> str:
        return ", ".join(dict.fromkeys(e.boot_label for e in es))

    parts = [f"Xid {c} ×{len(es)} ({es[0].meaning}; last {es[-1].line[:19] if es[-1].at else 'time unknown'}; "
             f"in {boots_of(es)})" for c, es in sorted(by_code.items())]
    ooms = [e for e in events if e.kind == "oom-kill"]
    if ooms:
        parts.append(f"OOM killer ×{len(ooms)} ({', '.join(sorted({e.process or '?' for e in ooms}))}; "
                     f"in {boots_of(ooms)})")
    return parts


def check_kernel(klog: KernelLog, acks: list[dict] | None = None) -> Row:
    """Xid and OOM-killer events in every boot the journal keeps. Events a user acknowledged
    (`servedeck doctor --ack-kernel`, doctor/kernel_ack.py) are shown but judge nothing; newer ones do."""
    if not klog.readable:
        return Row("kernel", "", SKIP, f"kernel log not readable: {klog.reason}",
                   "run as a user who may read it (journalctl -k needs systemd-journal or root; dmesg needs "
                   "kernel.dmesg_restrict=0)")
    over = f"{klog.lines_read:,} kernel lines, {klog.boots_read} boot{'s' if klog.boots_read != 1 else ''}"
    if not klog.events:
        return Row("kernel", "", OK, f"no NVRM Xid events ({over} from {klog.source})")
    seen = split(klog.events, acks or [])
    data = {"events": [e.to_json() for e in klog.events], "acknowledged": len(seen.acked)}
    acked = ""
    if seen.acked:
        a = seen.last_ack or {}
        acked = (f"acknowledged by {a.get('by', '?')} on {a.get('acknowledged_at', '?')}: "
                 + "; ".join(_events_text(seen.acked)))
    if not seen.new:
        return Row("kernel", "", OK, f"no NVRM Xid events since the acknowledged ones ({acked}; read {over} "
                                     f"from {klog.source})", data=data)
    xids = [e for e in seen.new if e.kind == "xid"]
    parts = _events_text(seen.new) + ([acked] if acked else []) + [f"read {over} from {klog.source}"]
    severe = any(e.severity in ("device", "node") for e in xids)
    actions = sorted({e.action for e in xids if e.severity in ("device", "node")}) or sorted({e.action for e in xids})
    action = " | ".join(actions) or "see host RAM"
    action += "; once read, `servedeck doctor --ack-kernel` acknowledges them (shown, no longer failing this row)"
    return Row("kernel", "", FAIL if severe else WARN, "; ".join(parts), action, data)


# ---------------------------------------------------------------- all of it
def run_doctor(load: Callable[[], "Config"], model: str | None = None, *, inv: Inventory | None = None,
               klog: KernelLog | None = None, integrity: bool = True) -> list[Row]:
    """Every row for one model (and its build), or for all models and builds when `model` is None."""
    rows: list[Row] = []
    cfg_row, cfg = check_config(load)
    rows.append(cfg_row)
    inv = inv if inv is not None else inventory()
    klog = klog if klog is not None else read_kernel_events()
    acks = read_acks()
    if cfg is None:
        rows += [check_power(None, inv, _draw_now(inv)), check_kernel(klog, acks)]
        return rows
    names = [cfg.resolve(model)] if model else sorted(cfg.models)
    builds = sorted({cfg.models[n].build for n in names if cfg.models[n].build in cfg.deck.builds})
    for b in builds:
        rows += build_rows(b, verify_build(cfg.deck.builds[b], b, cfg, integrity=integrity))
    records = live_records()
    holdings = holders(inv, records) if inv.available else []
    asleep_pins = {str(r.get("model")): int(r.get("asleep_host_bytes") or 0) for r in records if r.get("state") == "asleep"}

    def plan_for(n: str):
        from servedeck.gpu.modelplan import plan_model

        try:
            return plan_model(cfg, n, inv)[0]
        except (ServedeckError, ValueError, OSError):
            return None

    for n in names:
        m = cfg.models[n]
        rows += [check_weights(cfg, n), check_port(cfg, n, records), check_gpu(cfg, n, inv, holdings, plan_for),
                 check_host_ram(n, m, asleep=asleep_pins)]
    rows += [check_power(cfg.deck.host, inv, _draw_now(inv)), check_kernel(klog, acks)]
    return rows


def worst(rows: Iterable[Row]) -> str:
    order = {FAIL: 3, WARN: 2, SKIP: 1, OK: 0}
    return max((r.status for r in rows), key=lambda s: order[s], default=OK)

