"""Session records: the versioned JSON Lines format, redaction, transcripts, replay.

Contract: pure. This package builds and reads record lines (``format``), renders them as a
transcript (``transcript``) and plans a replay (``replay``), with the
redaction of secrets (``redact``, its ``patterns``), the recording settings (``settings``),
visible escapes of control characters (``escape``) and compact chunk references for
``show --state`` (``chunkrefs``); it never opens a file, reads a
clock or logs. Writing a record is ``acp_proxy.shell.record.recorder``'s job.
"""
