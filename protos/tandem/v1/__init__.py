"""Generated gRPC/protobuf stubs for package tandem.v1 (regenerate with `python -m tandem.protogen`)."""
