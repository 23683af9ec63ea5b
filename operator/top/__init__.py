"""`tandem top`: a live terminal view of each InferenceService (pools, replicas, TTFT/TPOT against the SLO,
attainment, the last scaling decision) from routers' /metrics, Prometheus, or the Kubernetes API."""
