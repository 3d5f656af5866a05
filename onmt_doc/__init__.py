"""onmt_doc: sentence- and document-level neural machine translation.

``from onmt_doc import Translator`` is the Python API (docs/deploy.md); it is imported on first
use, so ``import onmt_doc`` (and reading ``__version__``) stays cheap and torch-free.
"""

__version__ = "0.1.0"

__all__ = ["Translator", "__version__"]


def __getattr__(name: str):
    """Lazy public names (PEP 562): the translator pulls in torch."""
    if name == "Translator":
        from onmt_doc.translate.translator import Translator

        return Translator
    raise AttributeError(f"module 'onmt_doc' has no attribute '{name}'")
