"""Reading Xid events from the kernel log: parsing (written lines), the reader's fallbacks, and the real log here."""

from __future__ import annotations

import json
import subprocess

import pytest

from servedeck.doctor.checks import check_kernel
from servedeck.doctor.kernel import KernelLog, events_near, parse_kernel_lines, read_kernel_events

from servedeck.doctor.kernel import parse_journal_json, parse_list_boots  # noqa: E402

# written from seed 004 / ENGINES.md: journal (ISO), dmesg --time-format iso, and plain dmesg forms
JOURNAL = """\
2026-09-11T21:24:41.123456+0200 box kernel: NVRM: Xid (PCI:0000:01:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus.
2026-09-11T21:24:41.200000+0200 box kernel: r8169 0000:05:00.0 eth0: RTL8125B, XID 641, IRQ 140
2026-09-12T08:00:00.000000+0200 box kernel: NVRM: Xid (PCI:0000:01:00): 31, pid=41235, name=VLLM::EngineCor, Ch 00000008
"""


def cp(argv, rc=0, out="", err=""):
    return subprocess.CompletedProcess(argv, rc, out, err)


def test_parse_journal_lines():
    evs = parse_kernel_lines(JOURNAL)
    assert [(e.code, e.pid, e.process, e.family, e.severity) for e in evs] == [
        (79, None, "<unknown>", "gpu-lost", "node"), (31, 41235, "VLLM::EngineCor", "cuda-fault", "app")]
    assert evs[0].at is not None and evs[0].pci == "PCI:0000:01:00"
    assert "fallen off the bus" in evs[0].meaning


def test_plain_dmesg_uses_boot_time():
    evs = parse_kernel_lines("[  100.500000] NVRM: Xid (PCI:0000:01:00): 13, pid=7, name=python, Graphics Exception",
                             boot_time=1_000_000.0)
    assert evs[0].at == 1_000_100.5 and evs[0].code == 13


def test_journal_first_then_dmesg_then_skip_with_why():
    calls = []

    def run(argv):
        calls.append(argv[0])
        if argv[0] == "journalctl":
            return cp(argv, 0, "-- No entries --\n")  # what a container without a journal prints
        return cp(argv, 0, JOURNAL)

    log = read_kernel_events(run=run)
    assert log.readable and log.source.startswith("dmesg") and calls == ["journalctl", "dmesg"]
    assert [e.code for e in log.xids] == [79, 31]

    def deny(argv):
        if argv[0] == "journalctl":
            raise FileNotFoundError
        return cp(argv, 1, "", "dmesg: read kernel buffer failed: Operation not permitted")

    log = read_kernel_events(run=deny)
    assert not log.readable and "not installed" in log.reason and "Operation not permitted" in log.reason
    row = check_kernel(log)
    assert row.status == "SKIP" and "Operation not permitted" in row.saw


def test_window_keeps_events_near_an_end_time():
    evs = parse_kernel_lines(JOURNAL)
    t79 = evs[0].at
    near = events_near(t79 + 30, before_s=60, after_s=10, run=journal_run(journal_json(JOURNAL_BOOTS)))
    assert [e.code for e in near] == [79]
    assert events_near(t79, run=lambda argv: cp(argv, 1, "", "denied")) == []


def test_all_boots_uses_the_journal_without_b():
    seen = []
    read_kernel_events(boots="all", run=lambda argv: seen.append(argv) or cp(argv, 0, JOURNAL))
    assert "_TRANSPORT=kernel" in seen[0] and "-b" not in seen[0]


def test_kernel_rows():
    assert check_kernel(KernelLog(True, "dmesg", None, 345, [])).status == "OK"
    r = check_kernel(KernelLog(True, "journalctl", None, 3, parse_kernel_lines(JOURNAL)))
    assert r.status == "FAIL" and "Xid 79 ×1" in r.saw and "Xid 31 ×1" in r.saw and "reboot" in r.action
    app_only = check_kernel(KernelLog(True, "journalctl", None, 1, parse_kernel_lines(JOURNAL.splitlines()[2])))
    assert app_only.status == "WARN"


def _kernel_text_here() -> str | None:
    """This boot's kernel log as a user reads it (the journal, else dmesg), or None if neither can be read."""
    for argv in (["journalctl", "-k", "-b", "-q", "--no-pager", "-o", "cat"], ["dmesg"]):
        try:
            cp = subprocess.run(argv, capture_output=True, text=True, timeout=60)
        except (FileNotFoundError, subprocess.TimeoutExpired):
            continue
        if cp.returncode == 0 and cp.stdout.strip():
            return cp.stdout
    return None


def test_the_real_kernel_log_here_is_judged_by_what_it_holds():
    """Readable or not, and events or none, decided by reading the log here directly, not by the row."""
    text = _kernel_text_here()
    row = check_kernel(read_kernel_events(boots="current"))
    if text is None:
        assert row.status == "SKIP" and "not readable" in row.saw
        return
    flagged = [ln for ln in text.splitlines()
               if "NVRM: Xid (" in ln or "Out of memory: Killed process" in ln or "oom-kill:" in ln]
    assert (row.status == "OK") == (not flagged), (row, flagged[:3])


# --- several boots (issue 8 defect 6): seed 004's crash was in an earlier boot -------------------
B2, B1, B0 = "a" * 32, "b" * 32, "c" * 32
# what `journalctl --list-boots` prints (systemd 252 layout)
LIST_BOOTS = f"""\
IDX BOOT ID                          FIRST ENTRY                 LAST ENTRY
 -2 {B2} Fri 2026-09-11 08:00:00 CEST Fri 2026-09-11 21:24:41 CEST
 -1 {B1} Fri 2026-09-11 21:30:00 CEST Sat 2026-09-12 14:25:44 CEST
  0 {B0} Sat 2026-09-12 14:31:00 CEST Sat 2026-09-12 18:00:00 CEST
"""
JOURNAL_BOOTS = [
    (B2, "2026-09-11T21:24:41.123456+02:00",
     "NVRM: Xid (PCI:0000:01:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus."),
    (B2, "2026-09-11T21:24:41.200000+02:00", "r8169 0000:05:00.0 eth0: RTL8125B, XID 641, IRQ 140"),
    (B1, "2026-09-12T08:00:00.000000+02:00",
     "NVRM: Xid (PCI:0000:01:00): 31, pid=41235, name=VLLM::EngineCor, Ch 00000008"),
    (B1, "2026-09-12T14:25:44.000000+02:00",
     "NVRM: Xid (PCI:0000:01:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus."),
    (B0, "2026-09-12T14:31:00.000000+02:00", "Linux version 6.1.0-26-amd64"),
]


def journal_json(entries) -> str:
    """`journalctl -o json --output-fields=MESSAGE,_BOOT_ID` lines for (boot id, time, message)."""
    import json
    from datetime import datetime

    return "".join(json.dumps({"__REALTIME_TIMESTAMP": str(int(datetime.fromisoformat(t).timestamp() * 1e6)),
                               "_BOOT_ID": b, "MESSAGE": m}) + "\n" for b, t, m in entries)


def journal_run(text, boots=LIST_BOOTS, calls=None):
    def run(argv):
        if calls is not None:
            calls.append(argv)
        if argv[0] == "journalctl" and "--list-boots" in argv:
            return cp(argv, 0, boots)
        if argv[0] == "journalctl":
            return cp(argv, 0, text)
        return cp(argv, 0, "[  1.0] dmesg line\n")
    return run


def test_list_boots_parse():
    assert parse_list_boots(LIST_BOOTS) == {B2: -2, B1: -1, B0: 0}


def test_journal_json_events_carry_their_boot():
    evs, lines, nboots = parse_journal_json(journal_json(JOURNAL_BOOTS), parse_list_boots(LIST_BOOTS))
    assert lines == 5 and nboots == 3
    assert [(e.code, e.boot, e.boot_id) for e in evs] == [(79, -2, B2), (31, -1, B1), (79, -1, B1)]
    assert evs[0].boot_label == "boot -2" and evs[0].line.startswith("2026-09-11T")
    # a boot the index does not know keeps its id
    evs, _, _ = parse_journal_json(journal_json(JOURNAL_BOOTS[:1]), {})
    assert evs[0].boot is None and evs[0].boot_label == "boot aaaaaaaa"


def test_doctor_reads_all_boots_and_names_each_events_boot():
    calls = []
    log = read_kernel_events(run=journal_run(journal_json(JOURNAL_BOOTS), calls=calls))
    assert calls[0][0] == "journalctl" and "-b" not in calls[0] and "_TRANSPORT=kernel" in calls[0]
    assert log.readable and log.boots_read == 3 and "all boots" in log.source
    row = check_kernel(log)
    assert row.status == "FAIL"
    assert "Xid 79 ×2" in row.saw and "in boot -2, boot -1" in row.saw and "Xid 31 ×1" in row.saw
    assert "3 boots" in row.saw
    assert [e["boot"] for e in row.data["events"]] == [-2, -1, -1]


def test_no_journal_falls_back_to_dmesg_for_this_boot_and_says_so():
    def run(argv):
        if argv[0] == "journalctl":
            return cp(argv, 0, "-- No entries --\n")
        return cp(argv, 0, JOURNAL)
    log = read_kernel_events(run=run)
    assert log.source.startswith("dmesg") and "current boot only" in log.source
    assert log.boots_read == 1 and all(e.boot == 0 for e in log.events)
    assert "this boot" in check_kernel(log).saw


# --- acknowledging past events (issue 31, item 5): September's Xid 79s must not fail the row forever -----
SEED004_SEPTEMBER = [
    (B2, "2026-09-11T21:24:41.123456+02:00",
     "NVRM: Xid (PCI:0000:01:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus."),
    (B2, "2026-09-11T21:24:41.130000+02:00",
     "NVRM: Xid (PCI:0000:01:00): 154, GPU recovery action changed from 0x0 (None) to 0x2 (Node Reboot Required)"),
    (B1, "2026-09-12T14:25:44.000000+02:00",
     "NVRM: Xid (PCI:0000:01:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus."),
    (B1, "2026-09-12T14:25:44.010000+02:00",
     "NVRM: Xid (PCI:0000:01:00): 154, GPU recovery action changed from 0x0 (None) to 0x2 (Node Reboot Required)"),
]


def test_acknowledged_events_are_shown_but_do_not_fail_the_row():
    from servedeck.doctor.kernel_ack import acknowledge, acks_file, read_acks

    log = read_kernel_events(run=journal_run(journal_json(SEED004_SEPTEMBER)))
    assert check_kernel(log, read_acks()).status == "FAIL"
    ack = acknowledge(log.events, by="alice@box", now=1_800_000_000.0)
    assert ack["what"] == "Xid 154 ×2, Xid 79 ×2" and ack["by"] == "alice@box" and ack["events"] == 4
    stored = json.loads(acks_file().read_text())
    assert stored["schema"] == 1 and stored["acks"][0]["acknowledged_at"].startswith("2027-01-15")
    row = check_kernel(log, read_acks())
    assert row.status == "OK", row
    assert "acknowledged by alice@box" in row.saw and "Xid 79 ×2" in row.saw and row.data["acknowledged"] == 4


def test_a_new_event_after_the_acknowledgement_fails_the_row_again():
    from servedeck.doctor.kernel_ack import acknowledge, read_acks

    acknowledge(read_kernel_events(run=journal_run(journal_json(SEED004_SEPTEMBER))).events, by="alice@box")
    later = SEED004_SEPTEMBER + [(B0, "2026-10-02T09:00:00.000000+02:00",
                                  "NVRM: Xid (PCI:0000:01:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus.")]
    row = check_kernel(read_kernel_events(run=journal_run(journal_json(later))), read_acks())
    assert row.status == "FAIL" and row.saw.startswith("Xid 79 ×1") and "acknowledged by alice@box" in row.saw
    assert "--ack-kernel" in row.action


def test_an_unreadable_acknowledgement_file_is_named():
    from servedeck.doctor.kernel_ack import acks_file, read_acks
    from servedeck.errors import StateError

    acks_file().write_text("{not json")
    with pytest.raises(StateError) as e:
        read_acks()
    assert "kernel-acks.json" in e.value.message and "--ack-kernel" in e.value.hint
