"""Reading Xid events from the kernel log: parsing (written lines), the reader's fallbacks, and the real log here."""

from __future__ import annotations

import subprocess

from servedeck.doctor.checks import check_kernel
from servedeck.doctor.kernel import KernelLog, events_near, parse_kernel_lines, read_kernel_events

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
    near = events_near(t79 + 30, before_s=60, after_s=10, run=lambda argv: cp(argv, 0, JOURNAL))
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


def test_the_real_kernel_log_here_is_read_or_skipped_with_a_reason():
    log = read_kernel_events()
    row = check_kernel(log)
    assert row.status in ("OK", "WARN", "FAIL", "SKIP")
    if not log.readable:
        assert row.status == "SKIP" and log.reason
    else:
        assert log.lines_read > 0
