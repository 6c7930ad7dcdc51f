"""Node agent: collects GPU counters, kernel and training logs, and stacks, and ships them to the service.

Imports neither `service` nor `ml`, and installs with the base package only.
"""
