"""Alertmanager input: the alert rules a cluster already has become signals for diagnosis."""
