"""The controller's machinery: the Kubernetes client, the watch cache, the work queue, leader election,
health."""
