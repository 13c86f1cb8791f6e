"""The annotation rules engine (pure): the ``rules:`` list compiled and applied to messages.

Contract: ``engine`` holds the rules as values (``Rule``, its match and its targets), the
middleware that applies them to one connection (``RulesMiddleware``), and its fast annotator
(``FastAnnotator``: a v2 upsert's new ``_meta`` members without building the message). The
configuration package only builds it from the file; the core never imports the configuration.
"""
