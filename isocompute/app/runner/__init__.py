"""Running a routed request: waves of samples on model pools, stopping rules, votes, the answer."""
