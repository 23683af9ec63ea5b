"""`tandem up`: the operator's local backend, an InferenceService run as router and worker processes here."""
