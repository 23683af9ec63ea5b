"""The SLO autoscaler: a pure core (`core/`), the metric sources the backends share (`sources/`), one folder
per backend (`backends/`) and the trace simulator (`sim/`)."""
