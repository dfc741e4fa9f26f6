"""Secrets never leave in a bundle: env allow/deny lists, URL credentials, flags, base64 forms."""

import base64

from trainwatch.probes.redact import (
    MASK, Redactor, is_secret_name, is_visible_name, redact_cmdline, redact_env, strip_url_credentials,
)


def test_allowlist_and_denylist():
    assert is_visible_name("NCCL_DEBUG") and is_visible_name("TORCH_NCCL_TRACE_BUFFER_SIZE")
    assert is_visible_name("TOKENIZERS_PARALLELISM")  # TOKEN only as a whole word
    assert is_visible_name("MASTER_ADDR") and is_visible_name("SLURM_JOB_ID")
    assert not is_visible_name("HOME") and not is_visible_name("WANDB_PROJECT")
    for name in ("HF_TOKEN", "WANDB_API_KEY", "AWS_SECRET_ACCESS_KEY", "DB_PASSWORD", "NCCL_AUTH_TOKEN",
                 "SENTRY_DSN", "MY_KEY", "GITHUB_PAT_PASS", "SESSION_ID", "MY_COOKIE", "GCP_CREDENTIALS"):
        assert is_secret_name(name), name
        assert not is_visible_name(name), name
    for name in ("TOKENIZERS_PARALLELISM", "KEYBOARD", "MONKEY", "PASSAGE_LEN"):
        assert not is_secret_name(name), name


def test_redact_env_keeps_names():
    env = {"NCCL_DEBUG": "INFO", "HF_TOKEN": "hf_abcdefgh123", "HOME": "/home/a",
           "PYTHONPATH": "http://u:pw@x/y"}
    out = redact_env(env)
    assert out["NCCL_DEBUG"] == "INFO"
    assert out["HF_TOKEN"] == MASK and out["HOME"] == MASK
    assert out["PYTHONPATH"] == f"http://{MASK}@x/y"


def test_url_credentials():
    assert strip_url_credentials("https://user:pw@host/a") == f"https://{MASK}@host/a"
    assert strip_url_credentials("see http://tok@h:1 and ftp://a:b@c") == f"see http://{MASK}@h:1 and ftp://{MASK}@c"
    assert strip_url_credentials("user@example.com no scheme") == "user@example.com no scheme"


def test_cmdline_flags():
    args = ["train.py", "--token", "abc123secret", "--api-key=zzzzzzzzz", "--password", "pw", "--lr", "0.1",
            "--hf-token=x", "--data", "s3://k:s@bucket/p"]
    out = redact_cmdline(args)
    assert out == ("train.py", "--token", MASK, f"--api-key={MASK}", "--password", MASK, "--lr", "0.1",
                   f"--hf-token={MASK}", "--data", f"s3://{MASK}@bucket/p")


def test_redactor_masks_values_and_base64_everywhere():
    env = {"WANDB_API_KEY": "wandb-canary-0123456789", "NCCL_DEBUG": "INFO", "SHORT_TOKEN": "abc",
           "HOME": "/home/alice", "PWD": "/work/proj",
           "HTTPS_PROXY": "http://user:hunter2pass@proxy:3128"}
    red = Redactor.from_envs([env], [["train.py", "--token", "cmdline-canary-xyz"]])
    b64 = base64.b64encode(b"wandb-canary-0123456789").decode()
    text = (f"key wandb-canary-0123456789 b64 {b64} flag cmdline-canary-xyz pw hunter2pass "
            f"path /home/alice/x.py cwd /work/proj/y.py INFO abc")
    out = red.text(text)
    assert "wandb-canary" not in out and b64 not in out and "cmdline-canary" not in out
    assert "hunter2pass" not in out
    assert "/home/alice/x.py" in out and "/work/proj/y.py" in out  # paths stay readable
    assert "INFO abc" in out  # short values are not masked elsewhere
    assert red.env(env)["NCCL_DEBUG"] == "INFO"


def test_disabled_redactor_passes_through():
    red = Redactor.from_envs([{"HF_TOKEN": "hf_secretsecret"}], enabled=False)
    assert red.text("hf_secretsecret") == "hf_secretsecret"
    assert red.env({"HF_TOKEN": "hf_secretsecret"}) == {"HF_TOKEN": "hf_secretsecret"}


def test_scrub_masks_secrets_in_free_text_without_knowing_them():
    from trainwatch.probes.redact import scrub

    text = ("RuntimeError: upload failed for https://bob:hunter2@hub.example/x with HF_TOKEN=hf_abcdefghijklmnopqrstu, "
            "password: s3cret-pass, --api-key=k123456789 --token tok987654321, key ghp_abcdefghijklmnopqrstuvwxyz0123")
    out = scrub(text)
    for secret in ("hunter2", "hf_abcdefghijklmnopqrstu", "s3cret-pass", "k123456789", "tok987654321",
                   "ghp_abcdefghijklmnopqrstuvwxyz0123"):
        assert secret not in out, (secret, out)
    assert out.startswith("RuntimeError: upload failed for https://<redacted>@hub.example/x with HF_TOKEN=<redacted>")
    harmless = "KeyError: 'lr' WorkNCCL(SeqNum=861, Timeout(ms)=45000) MONKEY=banana12 rank 0 and rank 1"
    assert scrub(harmless) == harmless
