"""How the probe bundle reaches the nodes: the bundle itself, the fan-out fleet, and the SSH and local sessions."""
