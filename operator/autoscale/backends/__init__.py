"""Where the policy runs: one folder per backend, each with its metric source and actuator."""
