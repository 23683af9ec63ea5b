"""Pure rendering of an InferenceService's children: the manifests, each concern of a pod, and their drift."""
