"""The `hitl` command's machinery: settings, pre-start checks, ports, the embedded redis-server,
launching and stopping."""
