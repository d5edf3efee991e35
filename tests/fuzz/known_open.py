"""Finding classes that are known and not fixed yet (KNOWN-OPEN). Empty: every class found while
issue 11 was built (frame decoder leaks, non-numeric values answered SYSTEM_ERROR, hostile names
accepted, poison schedule entries, recovery on unparsable records) is fixed, and a match fails.

The stateful broker test and the corpus replay report a failure that matches one of these as an
xfail with the reason, instead of failing. **Remove each entry once its fix is merged**; the
tests then fail if the class shows up again. Each entry: name → (owner part, description, regex
matched against ``"<ExceptionType>: <message>"`` plus the traceback text).
"""

from __future__ import annotations

import re
import traceback

KNOWN_OPEN: dict[str, tuple[str, str, str]] = {}


def classify(exc: BaseException) -> str | None:
    """The KNOWN_OPEN entry an exception matches (message and traceback), or None."""
    text = "".join(traceback.format_exception(exc))
    for name, (_, _, pattern) in KNOWN_OPEN.items():
        if re.search(pattern, text):
            return name
    return None
