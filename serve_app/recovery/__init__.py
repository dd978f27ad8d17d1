"""Surviving a store loss: durability modes, restores from the archive's live mirror, reconcile and reset."""
