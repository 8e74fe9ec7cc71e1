"""Issue 8 defect 3: one redaction function, every place servedeck writes argv or env."""

from __future__ import annotations

import json
from pathlib import Path

from servedeck.config.load import parse
from servedeck.deck import Deck
from servedeck.deck.launch import cmd_sh
from servedeck.engines.base import LaunchSpec

HF = "hf_AbCdEfGhIjKlMnOpQrStUv"
SK = "sk-proj-AbCdEfGhIjKlMnOp1234"
GH = "ghp_AbCdEfGhIjKlMnOpQrStUvWxYz0123456789"
SLACK = "xoxb-1234567890-AbCdEfGhIj"


def spec(argv, env=None):
    return LaunchSpec(model="m", engine="vllm", argv=argv, env=env or {}, host="127.0.0.1", port=1,
                      served_name="m", health_path="/health", slot="main", stop_timeout_s=1, ready_timeout_s=1)


def redact_argv(argv):
    return spec(argv).redacted_argv()


def redact_env(env):
    return spec([], env).redacted_env()


def test_secret_named_flags_any_spelling():
    argv = ["x", "--api-key", "plain1", "--hf-token=plain2", "--my-secret", "plain3", "--db-password=p4",
            "--aws-credential", "plain5", "--ssl-keyfile", "/k.pem", "--port", "8000", "--enforce-eager"]
    out = redact_argv(argv)
    assert out == ["x", "--api-key", "<redacted>", "--hf-token=<redacted>", "--my-secret", "<redacted>",
                   "--db-password=<redacted>", "--aws-credential", "<redacted>", "--ssl-keyfile", "<redacted>",
                   "--port", "8000", "--enforce-eager"]


def test_counts_and_tokenizers_are_not_secrets():
    argv = ["x", "--max-num-batched-tokens", "8192", "--tokenizer", "org/tok", "--eos-token-id", "2",
            "--speculative-config", '{"method": "mtp", "num_speculative_tokens": 4}']
    assert redact_argv(argv) == argv
    assert redact_env({"MAX_TOKENS": "5", "TOKENIZERS_PARALLELISM": "false"}) == {"MAX_TOKENS": "5",
                                                                                 "TOKENIZERS_PARALLELISM": "false"}


def test_secret_named_bare_flag_does_not_eat_the_next_flag():
    assert redact_argv(["x", "--no-api-key", "--port", "1"]) == ["x", "--no-api-key", "--port", "1"]


def test_token_formats_anywhere_in_argv():
    argv = ["x", "--model", HF, f"--foo={SK}", "--note", f"use {GH} here",
            "--speculative-config", json.dumps({"method": "mtp", "auth": SLACK}),
            "--hf-overrides", json.dumps({"x": {"access_token": "plainvalue"}})]
    out = redact_argv(argv)
    text = " ".join(out)
    for secret in (HF, SK, GH, SLACK, "plainvalue"):
        assert secret not in text, secret
    assert out[2] == "<redacted>" and out[3] == "--foo=<redacted>" and out[5] == "use <redacted> here"
    assert json.loads(out[7]) == {"method": "mtp", "auth": "<redacted>"}
    assert json.loads(out[9]) == {"x": {"access_token": "<redacted>"}}


def test_env_names_and_token_values():
    env = {"HF_TOKEN": "a", "OPENAI_API_KEY": "b", "my_secret_thing": "c", "DB_PASSWORD": "d",
           "GOOGLE_APPLICATION_CREDENTIALS": "/creds.json", "SSH_KEY_PATH": "e", "WHATEVER": SK, "PLAIN": "ok"}
    out = redact_env(env)
    assert out == {k: "<redacted>" for k in env if k != "PLAIN"} | {"PLAIN": "ok"}


def test_redact_text_token_formats():
    from servedeck.redact import redact_text

    assert redact_text(f"Authorization: Bearer {SK} and {HF}") == "Authorization: Bearer <redacted> and <redacted>"
    assert redact_text("sk-short hf_x ok") == "sk-short hf_x ok"  # too short to be a token


CONFIG = f"""
[builds.stock]
engine = "vllm"
python = "/venvs/vllm/bin/python"

[models.q]
source = "org/model"
build = "stock"
port = 8004
context = 4096
args = {{ api-key = "plainkey123", speculative-config = {{ method = "mtp", token = "{HF}" }} }}
env = {{ MY_CREDENTIAL = "abc", NOTE = "{SK}" }}
"""


def test_cmd_sh_launch_json_and_render_json_hold_no_secret(tmp_path):
    from servedeck.deck.deck import settings_of

    cfg = parse(CONFIG, Path("/home/u/models.toml"))
    s = Deck(cfg).render("q")
    shown = cmd_sh(s, "stock", "/home/u/models.toml") + json.dumps(s.to_json()) + json.dumps(settings_of("q", cfg))
    for secret in ("plainkey123", HF, SK, '"abc"'):
        assert secret not in shown, secret
    assert ': "${MY_CREDENTIAL:?set MY_CREDENTIAL first}"' in shown
    # the real argv still carries the values the engine needs
    assert "plainkey123" in s.argv and s.env["NOTE"] == SK
