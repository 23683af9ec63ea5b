"""At the default log level no process of a stack writes prompt text, completion text, token ids or an
API key to its log: real requests (streamed, not, chat, token-id prompts, refused ones) through a real
router with API keys, then every process's log is searched."""

from __future__ import annotations

import httpx
import pytest

from tests.integration.stacks import running_stack, spec

pytestmark = pytest.mark.slow

KEY = "sk-tandem-test-7f3a9c"
WRONG_KEY = "sk-wrong-key-5d1e8b"
PROMPT = "Quokka marmalade xylophone, tell me a story about the zeppelin"
TOKEN_PROMPT = [
    397,
    283,
    461,
    199,
    347,
    421,
    263,
    389,
    307,
    443,
    211,
    367,
    293,
    409,
    331,
    457,
    229,
]  # in the tiny vocabulary


def test_no_prompt_completion_token_ids_or_keys_in_any_log(tiny_model_dir, tmp_path):
    keys = tmp_path / "api-keys"
    keys.write_text(f"{KEY}\n")
    obj = spec("logs", tiny_model_dir)
    obj["spec"]["security"] = {"apiKeys": {"file": str(keys)}}
    log_dir = tmp_path / "logs"
    completions: list[str] = []
    auth = {"Authorization": f"Bearer {KEY}"}
    with running_stack(obj, log_dir) as (_, url), httpx.Client(base_url=url, timeout=60) as c:
        body = {"model": "tiny", "max_tokens": 12, "temperature": 0, "ignore_eos": True}
        r = c.post("/v1/completions", json={**body, "prompt": PROMPT}, headers=auth)
        assert r.status_code == 200, r.text
        completions.append(r.json()["choices"][0]["text"])
        r = c.post(
            "/v1/completions", json={**body, "prompt": TOKEN_PROMPT, "cache_salt": "tenant-a"}, headers=auth
        )
        assert r.status_code == 200, r.text
        completions.append(r.json()["choices"][0]["text"])
        chat = {**body, "messages": [{"role": "user", "content": PROMPT}], "stream": True}
        with c.stream("POST", "/v1/chat/completions", json=chat, headers=auth) as s:
            assert s.status_code == 200
            streamed = "".join(s.iter_text())
        assert "[DONE]" in streamed
        assert c.post("/v1/completions", json={**body, "prompt": PROMPT}).status_code == 401
        bad = c.post(
            "/v1/completions",
            json={**body, "prompt": PROMPT},
            headers={"Authorization": f"Bearer {WRONG_KEY}"},
        )
        assert bad.status_code == 401 and WRONG_KEY not in bad.text
        assert (
            c.post("/v1/completions", json={**body, "prompt": [10**6, 397]}, headers=auth).status_code == 400
        )
    logs = {p.name: p.read_text(errors="replace") for p in log_dir.glob("*.log")}
    assert {"router.log", "prefill-0.log", "decode-0.log"} <= set(logs)
    secrets = [
        KEY,
        WRONG_KEY,
        "Quokka",
        "xylophone",
        "zeppelin",
        "397, 283, 461",
        "397,283,461",
        "1000000",
        "tenant-a",
    ]
    secrets += [t.strip() for t in completions if len(t.strip()) >= 12]
    leaks = {(name, s) for name, text in logs.items() for s in secrets if s in text}
    assert not leaks, leaks
    assert any(logs.values()), "the processes logged nothing at all: the search proves nothing"
