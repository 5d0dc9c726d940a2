"""The image's reference on a node: `tessera.local/tessera:<tag>`.

Without `--tag`, the tag is the chart's appVersion and the first 12 hex digits of the build's key
(`0.1.0-3f2a9c1d0b7e`), so a changed tree never reuses a tag a node already holds.
"""

from __future__ import annotations

import re

from hack.image import recipe

# The OCI distribution spec's tag grammar.
_TAG = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._-]{0,127}")


class TagError(ValueError):
    pass


def default_tag(app_version: str, key: str) -> str:
    return check_tag(f"{app_version}-{key[:12]}")


def check_tag(tag: str) -> str:
    if not _TAG.fullmatch(tag):
        raise TagError(f"--tag {tag!r}: a tag is 1 to 128 letters, digits, '_', '.' or '-', not starting with "
                       "'.' or '-' (for example --tag 0.1.0-dev)")
    return tag


def reference(tag: str) -> str:
    return f"{recipe.REPOSITORY}:{tag}"
