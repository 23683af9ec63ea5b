"""The autoscaler's pure core: the policy's rules, the capacity model, flips, wake, the shape decision and one
tick."""
