"""The timed all-reduce test on the controller: launch plan and deadlines, the run over a fleet, localization of a slow or hung node."""
