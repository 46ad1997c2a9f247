"""The run record: what the measurements write and the analysis reads.

``schema.py`` defines it (``docs/run-record.md`` is the prose version), ``writer.py`` writes it
(standard library only, as it runs inside the training process), ``reader.py`` loads it.
"""
