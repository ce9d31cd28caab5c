"""Kubernetes: kubectl exec into a privileged agent DaemonSet for the node checks; cordon/taint for node actions."""
