"""Know before you launch: doctor rows, build verification, crash forensics, kernel Xid events.

    checks.run_doctor(load_config, model) -> list[Row]     every row, OK / WARN / FAIL / SKIP
    build.verify_build(build, name, cfg) -> BuildReport    pip RECORD integrity, version, requires paths
    forensics.classify(log_tail, exit_info, kernel_events) -> dict    a cause from signatures.toml
    kernel.read_kernel_events() / kernel.events_near(when)             NVRM Xid (and OOM-kill) lines
"""
