"""The autoscaler in the operator: pods found through the API server, TandemPool replicas written, role labels
moved."""
