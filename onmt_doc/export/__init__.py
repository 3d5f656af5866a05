"""Moving models in and out of onmt_doc: CTranslate2 export, OpenNMT-py import."""
