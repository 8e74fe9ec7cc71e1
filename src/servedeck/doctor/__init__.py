"""Know before you launch: doctor rows, build verification, crash forensics, kernel Xid events.

    checks.run_doctor(load_config, model) -> list[Row]     every row, OK / WARN / FAIL / SKIP
    checks.gpu_fit(name, cfg) -> dict | None               the deck's pre-start memory check (None: no GPU)
    build.verify_build(build, name, cfg) -> BuildReport    pip RECORD integrity, version, requires paths
    forensics.classify(log_tail, exit_info, kernel_events) -> dict    a cause from signatures.toml
    kernel.read_kernel_events() / kernel.events_near(when)             NVRM Xid (and OOM-kill) lines
"""
