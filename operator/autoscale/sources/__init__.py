"""Where the autoscaler's observations come from: the Prometheus HTTP API, or a direct scrape of the pods."""
