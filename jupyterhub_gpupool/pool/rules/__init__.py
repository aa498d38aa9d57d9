"""The rules ``pool.decide`` applies, one module per area; each module's ``RULES`` maps the
command types it decides to their rule (``pool.facts.Rule``)."""
