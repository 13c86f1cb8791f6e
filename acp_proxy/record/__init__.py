"""Session records: the versioned JSON Lines format, redaction, transcripts, replay.

Contract: pure. This package builds and reads record lines (``format``), renders them as a
transcript (``transcript``) and plans a replay (``replay``); it never opens a file, reads a
clock or logs. Writing a record is ``acp_proxy.shell.recorder``'s job.
"""
