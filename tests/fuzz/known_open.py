"""Finding classes that are known and being fixed on other branches of issue 11 (KNOWN-OPEN).

The stateful broker test and the corpus replay report a failure that matches one of these as an
xfail with the reason, instead of failing. **Remove each entry once its fix is merged**; the
tests then fail if the class shows up again. Each entry: name → (owner part, description, regex
matched against ``"<ExceptionType>: <message>"`` plus the traceback text).
"""

from __future__ import annotations

import re
import traceback

KNOWN_OPEN: dict[str, tuple[str, str, str]] = {
    "frame-decoder-leak": (
        "1 validate", "FrameDecoder lets UnicodeDecodeError/RecursionError escape (bad UTF-8, "
        "deep nesting) instead of MalformedFrame", r"(UnicodeDecodeError|RecursionError)[\s\S]*_frame\.py"
        r"|_frame\.py[\s\S]*(UnicodeDecodeError|RecursionError)"),
    "non-numeric-system-error": (
        "1 validate", "DELAY=abc / REAL_QID=abc / non-numeric limit answered SYSTEM_ERROR",
        r"answered SYSTEM_ERROR: ValueError: invalid literal for int\(\)"),
    "hostile-name-accepted": (
        "1 validate", "hostile topic / REAL_TOPIC / system-topic send accepted, breaking restart "
        "or recovered state", r"after accepting hostile requests"),
    "schedule-poison": (
        "4 sched", "a poison SCHEDULE_TOPIC_XXXX entry raises out of the delay scheduler",
        r"_schedule\.py"),
    "recovery-bad-body": (
        "3 recovery", "transaction recovery raises ValueError on an unparsable op/half record",
        r"ValueError[\s\S]*(_service\.py|recover)"),
}


def classify(exc: BaseException) -> str | None:
    """The KNOWN_OPEN entry an exception matches (message and traceback), or None."""
    text = "".join(traceback.format_exception(exc))
    for name, (_, _, pattern) in KNOWN_OPEN.items():
        if re.search(pattern, text):
            return name
    return None
