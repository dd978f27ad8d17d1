"""The Api deployment's HTTP surface: the routes, their authentication, admission and the SSE hub."""
