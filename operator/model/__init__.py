"""Where a pod's model comes from: the source, and the download cache the pods of a Hugging Face source
share."""
