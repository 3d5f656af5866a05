"""``onmt_doc_server``: translation over HTTP (Flask app in ``app.py``, batching worker in
``batcher.py``, command in ``onmt_doc/bin/server.py``). Needs the ``server`` extra
(``pip install -e .[server]``: flask, waitress)."""
