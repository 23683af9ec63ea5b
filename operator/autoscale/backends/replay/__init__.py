"""The policy inside Dynamo's replay loop, the referee the benches run it under: its per-tick metrics as a
source, the policy and the HPA as its planners."""
