"""Cut-out quality (SPEC.md §13): mask metrics against ground truth (``metrics``), the versioned
gate that judges a mask without one (``gate``), and the refinement strategies for what fails
(``refine``)."""
