"""The work beside the API: the dispatcher that calls the models, the inspector, the archiver's loops
and the write-back spool."""
