"""``txmq.extras``: a missing optional dependency raises MissingExtra naming its install command."""

from __future__ import annotations

import pytest

from txmq.errors import ConfigError, MissingExtra
from txmq.extras import require_extra, requires_extra


def test_require_extra_names_the_first_missing_module_and_the_command() -> None:
    require_extra("broker", "txmq.broker", "msgspec", "json")
    with pytest.raises(MissingExtra) as info:
        require_extra("spark", "txmq.spark", "msgspec", "txmq_no_such_module", "json")
    exc = info.value
    assert isinstance(exc, ModuleNotFoundError) and isinstance(exc, ConfigError)
    assert (exc.name, exc.extra, exc.feature) == ("txmq_no_such_module", "spark", "txmq.spark")
    assert str(exc) == ("txmq.spark needs txmq_no_such_module, which is not installed: "
                        "pip install 'txmq[spark]'")
    assert exc.code == "MISSING_EXTRA"


def test_requires_extra_converts_a_third_party_import_and_keeps_txmq_s_own() -> None:
    with (pytest.raises(MissingExtra, match=r"pip install 'txmq\[nats\]'") as info,
          requires_extra("nats", "the NATS transport")):
        import txmq_no_such_module.sub  # type: ignore[import-not-found]  # noqa: F401
    assert info.value.name == "txmq_no_such_module"
    with pytest.raises(ModuleNotFoundError) as own, requires_extra("nats", "the NATS transport"):
        import txmq.no_such_module  # type: ignore[import-not-found]  # noqa: F401
    assert not isinstance(own.value, MissingExtra)
    with requires_extra("nats", "the NATS transport"):
        import json  # noqa: F401
