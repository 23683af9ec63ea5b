"""Pure readings of what the reconcile observed: pods, cold starts, preflight findings, the status it
reports."""
