"""hitl-review: human-in-the-loop review for image cut-out.

The installed distribution's one import name. Its subpackages are the repository's top-level folders
(``statecore``, ``serve_app``, ``deployments``, ``ui``, ``client``, ``archive``; SPEC.md §1), linked
here so that a checkout and an installed wheel import them the same way::

    from hitl_review.client import HitlClient
"""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("hitl-review")
except PackageNotFoundError:  # a checkout that was never installed
    __version__ = "0+checkout"
