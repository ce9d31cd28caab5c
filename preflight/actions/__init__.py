"""What preflight does to nodes after a run's verdict: drain, resume, cordon policy and its gates."""
