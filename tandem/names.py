"""Names shared by both wings: labels, ports, metric names. One place so Prometheus, the router and the
operator agree."""

LABEL_SERVICE = "serving.tandem.dev/inferenceservice"
LABEL_POOL = (
    "serving.tandem.dev/pool"  # prefill | decode | router | colocated: the Deployment a pod belongs to
)
# A prefill or decode pod's current role: its pool's at first, set by the operator when it flips the pod
# (spec.roleFlip). Deployments select on the pool, never on this, so a flip leaves their ReplicaSets alone.
LABEL_ROLE = "serving.tandem.dev/role"
LABEL_COMPONENT = "app.kubernetes.io/component"

POOL_PREFILL = "prefill"
POOL_DECODE = "decode"
POOL_ROUTER = "router"
POOL_COLOCATED = "colocated"

# Trailing metadata a draining worker sets on the refusals it answers, so the router stops picking it at once.
DRAINING_METADATA_KEY = "tandem-draining"

GRPC_PORT = 50051
HEALTH_PORT = 50052  # plaintext grpc.health.v1 only, for kubelet probes when the gRPC port needs mutual TLS
METRICS_PORT = 9090
HTTP_PORT = 8000

# Router HTTP probes: liveness answers while the process serves HTTP; readiness only while workers can serve
LIVENESS_PATH = "/livez"
# The gRPC health service name a worker keeps SERVING while its process runs, draining or not (liveness);
# the empty name turns NOT_SERVING when it drains (readiness).
WORKER_LIVENESS_SERVICE = "liveness"
# The gRPC health service names a worker reports its role under: `role/<role>` is SERVING for the role it
# has now and NOT_SERVING for the one it could take (a prefill or decode worker changes role by SetRole).
WORKER_ROLE_SERVICE_PREFIX = "role/"
READINESS_PATH = "/readyz"

# Router metrics
TTFT_SECONDS = "tandem_ttft_seconds"
TPOT_SECONDS = "tandem_tpot_seconds"
ITL_SECONDS = "tandem_inter_token_latency_seconds"
E2E_SECONDS = "tandem_e2e_latency_seconds"
REQUESTS_TOTAL = "tandem_requests_total"
ROUTER_QUEUE_DEPTH = "tandem_router_queue_depth"
ROUTER_ROUTABLE_WORKERS = "tandem_router_routable_workers"  # by `role`: prefill | decode | colocated
ROUTER_DISCOVERY_STALE = "tandem_router_discovery_stale"  # worker names kept at their last good addresses
# Warm before the first request: workers whose channel from the router is connected (TCP and TLS done), by
# `role`, and prefill-decode pairs whose KV channel the prefill worker has connected.
ROUTER_CONNECTED_WORKERS = "tandem_router_connected_workers"
ROUTER_KV_PAIRS_CONNECTED = "tandem_router_kv_pairs_connected"
# Requests the router holds while a pool they need has no worker (scaled to zero, waking), by `role`, and
# how long the oldest of them has waited: the demand the autoscaler sees at zero.
ROUTER_HELD_REQUESTS = "tandem_router_held_requests"
ROUTER_HELD_OLDEST_SECONDS = "tandem_router_held_oldest_seconds"
REQUEST_ARRIVALS_TOTAL = "tandem_request_arrivals_total"  # requests reaching the router (the arrival rate)
REQUEST_PROMPT_TOKENS = "tandem_request_prompt_tokens"  # histogram of prompt lengths (tokens)
REQUEST_OUTPUT_TOKENS = "tandem_request_output_tokens"  # histogram of output lengths of completed requests
# The service's SLO as the router judges each completed request: the target (seconds) and objective (the
# fraction of requests that must meet it, spec.slo.percentile / 100) per `slo`, and requests by `met`.
SLO_TARGET_SECONDS = "tandem_slo_target_seconds"
SLO_OBJECTIVE_RATIO = "tandem_slo_objective_ratio"
SLO_REQUESTS_TOTAL = "tandem_slo_requests_total"
SLO_TTFT = "ttft"  # values of the `slo` label
SLO_TPOT = "tpot"
# The router's histogram buckets (shared so the simulator can expose what the router would). Seconds: TTFT
# spans queueing plus prefill, TPOT/ITL one decode step.
TTFT_BUCKETS = (
    0.005,
    0.01,
    0.025,
    0.05,
    0.075,
    0.1,
    0.15,
    0.2,
    0.3,
    0.5,
    0.75,
    1,
    1.5,
    2,
    3,
    5,
    10,
    20,
    30,
    60,
)
TOKEN_BUCKETS = (
    0.001,
    0.0025,
    0.005,
    0.0075,
    0.01,
    0.015,
    0.02,
    0.03,
    0.04,
    0.05,
    0.075,
    0.1,
    0.15,
    0.2,
    0.3,
    0.5,
    1,
    2.5,
)
# Tokens: prompt and output lengths, for the autoscaler's capacity model (powers of two up to 128k).
LENGTH_BUCKETS = tuple(float(2**i) for i in range(2, 18))
# Prefill metrics
PREFILL_QUEUED_TOKENS = "tandem_prefill_queued_tokens"
PREFILL_TOKENS_TOTAL = "tandem_prefill_tokens_total"
# KV pushed to decode workers, by `transport` (grpc | shm | cuda_ipc): bytes, and per prompt the time from its
# first chunk to the commit's acknowledgement (span) and from its first token to that acknowledgement (tail)
KV_TRANSFER_BYTES_TOTAL = "tandem_kv_transfer_bytes_total"
KV_TRANSFER_SECONDS = "tandem_kv_transfer_seconds"
KV_TRANSFER_TAIL_SECONDS = "tandem_kv_transfer_tail_seconds"
# Decode metrics
DECODE_RUNNING_SEQUENCES = "tandem_decode_running_sequences"
KV_BLOCKS_USED = "tandem_kv_blocks_used"
KV_BLOCKS_TOTAL = "tandem_kv_blocks_total"
DECODE_BATCH_SIZE = "tandem_decode_batch_size"
# Every worker: requests it holds (reservations, token queues, prefills, sequences); zero once idle
WORKER_HELD_REQUESTS = "tandem_worker_held_requests"
WORKER_STARTUP_SECONDS = "tandem_worker_startup_seconds"  # by phase, STARTUP_PHASES
# weights in memory; KV cache sized; every step path run once (graphs included); the decode step's buckets
# alone
STARTUP_PHASES = ("load", "kv_plan", "warmup", "decode_graphs")
# Speculative decoding (decode and colocated engines): draft tokens verified, those the model accepted, and
# the verify steps; acceptance rate = rate(accepted) / rate(proposed)
SPEC_PROPOSED_TOKENS_TOTAL = "tandem_spec_decode_proposed_tokens_total"
SPEC_ACCEPTED_TOKENS_TOTAL = "tandem_spec_decode_accepted_tokens_total"
SPEC_VERIFY_STEPS_TOTAL = "tandem_spec_decode_verify_steps_total"
# Prefix cache (prefill and decode engines): prompt tokens looked up, and those found already cached
PREFIX_CACHE_QUERIED_TOKENS_TOTAL = "tandem_prefix_cache_queried_tokens_total"
PREFIX_CACHE_HIT_TOKENS_TOTAL = "tandem_prefix_cache_hit_tokens_total"
# Autoscaler: the replica count it wants per pool (exported by the autoscaler loop when autoscaling is on)
AUTOSCALER_DESIRED_REPLICAS = "tandem_autoscaler_desired_replicas"
AUTOSCALER_DECISIONS_TOTAL = "tandem_autoscaler_decisions_total"  # by pool and reason (CamelCase code)

# vLLM's names, exported beside tandem's with vLLM's meanings, units and buckets and its `model_name` label
# (the served name), for dashboards, KEDA recipes and endpoint pickers written for vLLM. Each name comes from
# one kind of process, so a sum over pods counts once: the router serves the per-request ones, each worker
# (an engine) its own state.
VLLM_MODEL_LABEL = "model_name"
VLLM_TTFT_SECONDS = "vllm:time_to_first_token_seconds"  # router
VLLM_ITL_SECONDS = "vllm:inter_token_latency_seconds"  # router
VLLM_E2E_SECONDS = "vllm:e2e_request_latency_seconds"  # router
VLLM_PROMPT_TOKENS = "vllm:prompt_tokens"  # router; a counter, exposed as ..._total
VLLM_GENERATION_TOKENS = "vllm:generation_tokens"  # router; a counter, exposed as ..._total
VLLM_RUNNING = "vllm:num_requests_running"  # worker
VLLM_WAITING = "vllm:num_requests_waiting"  # worker
VLLM_KV_CACHE_USAGE = "vllm:kv_cache_usage_perc"  # worker; a fraction, 1 = full
VLLM_PREFIX_CACHE_QUERIES = "vllm:prefix_cache_queries"  # worker; a counter of tokens
VLLM_PREFIX_CACHE_HITS = "vllm:prefix_cache_hits"  # worker; a counter of tokens

# Metric labels
METRIC_LABELS = ("service", "pool")
# Where a request's prompt ran, a label of the router's TTFT histogram and request counter and the value of
# its response header: disaggregated | local (on the decode worker) | colocated | none (never routed).
PREFILL_ROUTE_LABEL = "prefill"
PREFILL_ROUTE_HEADER = "X-Tandem-Prefill"
# On a response whose request waited for a pool to wake from zero: the milliseconds it waited (in its TTFT).
COLD_START_HEADER = "X-Tandem-Cold-Start-Ms"
PREFILL_ROUTE_NONE = "none"
