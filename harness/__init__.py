"""What the tests, the load tests and the benchmarks start and read, written once.

- ``harness.ci``: CI detection; a missing binary fails under ``CI`` and skips locally.
- ``harness.redis``: a 3-master Redis Cluster on loopback (single servers: ``serve_app.ops.redis_server``).
- ``harness.proc``: a child process in a process group of its own, its output pumped and matched.
- ``harness.hitl_up``: a real ``hitl up`` as a child process (``READY`` line, SIGTERM, SIGKILL of the tree).
- ``harness.uvicorn``: the control plane under plain uvicorn, in a thread or in a child process.
- ``harness.tokens``: the test identities and the ``<data-dir>/api-token`` file.
- ``harness.sse``: decoding the job event stream.
- ``harness.executor``: playing the executor's part through the store (a report for the current node).
"""
