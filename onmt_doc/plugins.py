"""User plugins: a user's own encoder, decoder, loss, optimizer, schedule, unit or field, registered
without forking the package (fairseq's ``--user-dir``).

A plugin is a Python file or a package folder (with ``__init__.py``) that imports onmt_doc and
registers its parts the way the package's own do (``@REGISTRY.register("my_encoder", MyConfig)``,
docs/extending.md). It is imported under a private module name, once per process, from:

* the ``plugins:`` key of a config file (paths relative to the working directory), before any
  section is read, so ``type: my_encoder`` resolves; the resolved config (``config.yaml``, every
  checkpoint) records the absolute paths of every plugin the run imported;
* ``-user_dir PATH`` on any command (repeatable): translating or serving a model that uses a
  plugin part needs it, because loading a checkpoint never imports code by itself (a checkpoint
  is data; a plugin is code you choose to trust).
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import sys
from typing import Iterable

from onmt_doc.errors import UserError

# real path -> module name, in import order
_LOADED: dict[str, str] = {}


def loaded_plugins() -> list[str]:
    """The real paths of the plugins this process imported, in order."""
    return list(_LOADED)


def import_plugins(paths: Iterable[str], where: str = "plugins") -> list[str]:
    """Import each plugin (a ``.py`` file or a package folder) once; a missing file, a syntax error
    or an exception inside the plugin is a one-line ``UserError`` naming it."""
    names = []
    for path in paths:
        real = os.path.realpath(path)
        if real not in _LOADED:
            _LOADED[real] = _import(path, real, where)
        names.append(_LOADED[real])
    return names


def _import(path: str, real: str, where: str) -> str:
    folder = os.path.isdir(real)
    entry = os.path.join(real, "__init__.py") if folder else real
    if not os.path.isfile(entry) or not entry.endswith(".py"):
        what = "a package folder without __init__.py" if folder else "not found, or not a .py file"
        raise UserError(f"{where}: {path}: {what}; a plugin is a .py file or a package folder")
    stem = os.path.basename(real.rstrip(os.sep)).removesuffix(".py")
    name = f"onmt_doc_plugin_{stem}_{hashlib.sha1(real.encode()).hexdigest()[:8]}"
    spec = importlib.util.spec_from_file_location(name, entry, submodule_search_locations=[real] if folder else None)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except UserError:
        del sys.modules[name]
        raise
    except SystemExit as e:  # exit() in the plugin: the plugin's doing, not a silent end of the command
        del sys.modules[name]
        raise UserError(
            f"{where}: {path}: the plugin called exit({e.code!r:.80}) while being imported; "
            "a plugin only registers parts"
        ) from None
    except Exception as e:  # the plugin's own code: report it in one line, naming the plugin
        del sys.modules[name]
        reason = (str(e).strip().splitlines() or [""])[0][:200]
        raise UserError(f"{where}: {path}: the plugin failed to import ({type(e).__name__}: {reason})") from None
    return name
