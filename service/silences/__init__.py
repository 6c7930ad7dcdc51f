"""Silences: maintenance windows that mute decisions and alerts for matching nodes or jobs."""
