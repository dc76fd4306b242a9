"""What every part of the project shares: errors, atomic writes, params and their schema
(with the names params refer to: codecs, ladder rungs), and the data set's schema.
Standard library, PyYAML and (for the schema) pydantic only."""
