"""Stand-ins for what faultline talks to in tests: a Kubernetes API server, scontrol."""
