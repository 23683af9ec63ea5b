"""The trace-replay simulator beside the policy: the engine's profile in, each policy's replicas and SLO out."""
