"""Where a pod's model comes from: the source, the shared download cache, and whether the pods have it."""
