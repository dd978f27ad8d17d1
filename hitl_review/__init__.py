"""hitl-review: human-in-the-loop review for image cut-out.

The installed distribution's one import name. Its subpackages are the repository's top-level folders
(``statecore``, ``serve_app``, ``deployments``, ``ui``, ``client``, ``archive``; SPEC.md §1), linked
here so that a checkout and an installed wheel import them the same way::

    from hitl_review.client import HitlClient
"""

# This release (pyproject.toml reads it; CHANGELOG.md and the git tag v<version> move with it).
__version__ = "0.2.0"
