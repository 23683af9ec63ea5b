"""Kubernetes operator wing: spec rendering, kopf handlers, autoscaler, local backend."""
