"""Planned maintenance windows of nodes: announced by a person or read from the cloud's scheduled events."""
