"""The hitl-review locust scenarios, as a package: ``shared`` (configuration and state one locust
process shares), ``base`` (``HitlUser``, the protocol moves), ``users`` (the six user classes) and
``hooks`` (options, setup, counting, summary). ``loadtest/locustfile.py`` is the entry point."""
