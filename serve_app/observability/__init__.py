"""Metrics, logs and the request log."""
