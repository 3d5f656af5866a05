"""onmt_doc: sentence- and document-level neural machine translation."""

__version__ = "0.1.0"
