"""Scheduler adapters: act on faultline's node decisions in Kubernetes or Slurm, then acknowledge them.

They run on the scheduler side and talk to the service over HTTP only: no import of `service` or `ml`.
"""
