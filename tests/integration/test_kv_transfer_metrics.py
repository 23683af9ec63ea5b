"""The KV transport a prefill and decode pair uses is visible: over a real local stack (router, prefill and
decode processes on loopback) the prefill worker's counter grows by exactly the bytes of the KV it pushed,
labelled with the transport the pair used (shared memory on one host, the gRPC stream when forced), its
transfer histograms count each prompt, and each worker says the transport once in its log."""

from __future__ import annotations

import httpx
import pytest

from tandem import names
from tandem.v1 import common_pb2
from tandem.worker.kv_transport.pairing_log import transport_label
from tests.integration.stacks import running_stack, spec, worker_info

PROMPTS = [" ".join(f"word{i}" for i in range(k, k + 40)) for k in (0, 500, 1000)]  # distinct: no prefix hits


def _samples(plan, name: str) -> dict[str, float]:
    """`name`'s samples at a worker's metrics port, by their label text."""
    host = plan.address.rsplit(":", 1)[0]
    text = httpx.get(f"http://{host}:{plan.metrics_port}/metrics", timeout=5, trust_env=False).text
    return {
        line.rsplit(" ", 1)[0][len(name) :]: float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith(name + "{")
    }


def _kv_bytes(info: common_pb2.WorkerInfo, prompt_tokens: int) -> int:
    """Keys and values of every block the prompt fills (the last one partly), in every layer."""
    blocks = -(-prompt_tokens // info.block_size)
    itemsize = {"float32": 4, "bfloat16": 2, "float16": 2}[info.dtype]
    return 2 * info.num_layers * blocks * info.block_size * info.num_kv_heads * info.head_dim * itemsize


@pytest.mark.parametrize(
    "setting, expected", [("auto", common_pb2.KV_TRANSPORT_SHM), ("grpc", common_pb2.KV_TRANSPORT_GRPC)]
)
def test_kv_bytes_and_times_are_counted_under_the_transport_used(tiny_model_dir, tmp_path, setting, expected):
    obj = spec(f"kv-{setting}", tiny_model_dir)
    obj["spec"]["kvTransfer"] = {"transport": setting}
    label = transport_label(expected)
    with running_stack(obj, tmp_path) as (stack, url):
        (prefill,) = [p for p in stack.plans if p.role == "prefill"]
        worker = worker_info(prefill)
        before = _samples(prefill, names.KV_TRANSFER_BYTES_TOTAL)
        assert not before, before  # nothing pushed yet: no series for any transport
        expected_bytes = 0
        for prompt in PROMPTS:
            r = httpx.post(
                f"{url}/v1/completions",
                json={
                    "model": "tiny",
                    "prompt": prompt,
                    "max_tokens": 4,
                    "temperature": 0,
                    "ignore_eos": True,
                },
                timeout=60,
            )
            assert r.status_code == 200, r.text
            assert r.headers[names.PREFILL_ROUTE_HEADER] == "disaggregated"
            expected_bytes += _kv_bytes(worker, r.json()["usage"]["prompt_tokens"])
        series = f'{{pool="prefill",service="kv-{setting}",transport="{label}"}}'
        assert _samples(prefill, names.KV_TRANSFER_BYTES_TOTAL) == {series: expected_bytes}
        for histogram in (names.KV_TRANSFER_SECONDS, names.KV_TRANSFER_TAIL_SECONDS):
            assert _samples(prefill, histogram + "_count") == {series: len(PROMPTS)}
            assert _samples(prefill, histogram + "_sum")[series] > 0
        assert (
            _samples(prefill, names.KV_TRANSFER_SECONDS + "_sum")[series]
            >= _samples(prefill, names.KV_TRANSFER_TAIL_SECONDS + "_sum")[series]
        )  # the tail is the end of the span
    logs = {p.stem: p.read_text(errors="replace") for p in tmp_path.glob("*.log")}
    said = [line for line in logs["prefill-0"].splitlines() if "KV to decode worker" in line]
    went = [line for line in said if " goes over " in line]
    assert len(went) == 1 and went[0].endswith(f"goes over {label}"), said  # once, at the first transfer
    assert all(line.endswith(f" over {label}") for line in said), said  # the router's pairing handshake too
    said = [line for line in logs["decode-0"].splitlines() if "KV from prefill workers" in line]
    assert len(said) == 1 and said[0].endswith(f"comes over {label}"), said
