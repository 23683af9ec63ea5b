"""The trace-replay simulator beside the policy: an engine profile in, each policy's replicas and SLO out."""
