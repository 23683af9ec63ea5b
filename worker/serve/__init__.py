"""The gRPC worker servers (prefill, decode, colocated), their wire conversions, metrics and `tandem worker`."""
