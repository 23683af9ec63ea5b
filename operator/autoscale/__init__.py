"""The SLO autoscaler: a pure policy over per-pool observations, metric sources, actuators and a trace simulator."""
