"""The wire protocol: RocketMQ's remoting protocol as a sans-IO codec of frames, commands, typed
headers, bodies and messages.

``MessageIndex`` and ``index_message_exts`` (the Spark source's numpy index of a pull reply) are
imported on first use, so that a broker, a name server or a client process does not import numpy
(about 0.3 s of every process start).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from txmq.protocol._acl_sign import *  # noqa: F403
from txmq.protocol._acl_sign import __all__ as _acl_sign_all
from txmq.protocol._codes import *  # noqa: F403
from txmq.protocol._codes import __all__ as _codes_all
from txmq.protocol._consume import *  # noqa: F403
from txmq.protocol._consume import __all__ as _consume_all
from txmq.protocol._controller import *  # noqa: F403
from txmq.protocol._controller import __all__ as _controller_all
from txmq.protocol._ha import *  # noqa: F403
from txmq.protocol._ha import __all__ as _ha_all
from txmq.protocol._ha_auto import *  # noqa: F403
from txmq.protocol._ha_auto import __all__ as _ha_auto_all
from txmq.protocol._ha_status import *  # noqa: F403
from txmq.protocol._ha_status import __all__ as _ha_status_all
from txmq.protocol._headers import *  # noqa: F403
from txmq.protocol._headers import __all__ as _headers_all
from txmq.protocol._message import *  # noqa: F403
from txmq.protocol._message import __all__ as _message_all
from txmq.protocol._message_bulk import *  # noqa: F403
from txmq.protocol._message_bulk import __all__ as _message_bulk_all
from txmq.protocol._message_codec import *  # noqa: F403
from txmq.protocol._message_codec import __all__ as _message_codec_all
from txmq.protocol._message_id import *  # noqa: F403
from txmq.protocol._message_id import __all__ as _message_id_all
from txmq.protocol._msg_trace import *  # noqa: F403
from txmq.protocol._msg_trace import __all__ as _msg_trace_all
from txmq.protocol._parked import *  # noqa: F403
from txmq.protocol._parked import __all__ as _parked_all
from txmq.protocol._remoting import *  # noqa: F403
from txmq.protocol._remoting import __all__ as _remoting_all
from txmq.protocol._route import *  # noqa: F403
from txmq.protocol._route import __all__ as _route_all
from txmq.protocol._topic_admin import *  # noqa: F403
from txmq.protocol._topic_admin import __all__ as _topic_admin_all
from txmq.protocol._topics import *  # noqa: F403
from txmq.protocol._topics import __all__ as _topics_all
from txmq.protocol._tx_trace import *  # noqa: F403
from txmq.protocol._tx_trace import __all__ as _tx_trace_all
from txmq.protocol._validate import *  # noqa: F403
from txmq.protocol._validate import __all__ as _validate_all

if TYPE_CHECKING:
    from txmq.protocol._message_index import MessageIndex as MessageIndex
    from txmq.protocol._message_index import index_message_exts as index_message_exts

_MESSAGE_INDEX_ALL = ("MessageIndex", "index_message_exts")

__all__ = [
    *_acl_sign_all,
    *_codes_all,
    *_consume_all,
    *_controller_all,
    *_ha_all,
    *_ha_auto_all,
    *_ha_status_all,
    *_headers_all,
    *_message_all,
    *_message_bulk_all,
    *_message_codec_all,
    "MessageIndex",
    "index_message_exts",
    *_message_id_all,
    *_msg_trace_all,
    *_parked_all,
    *_topic_admin_all,
    *_remoting_all,
    *_topics_all,
    *_tx_trace_all,
    *_route_all,
    *_validate_all,
]


def __getattr__(name: str) -> Any:
    """The names of ``txmq.protocol._message_index``, imported (with numpy) on first access."""
    if name in _MESSAGE_INDEX_ALL:
        return getattr(importlib.import_module("txmq.protocol._message_index"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
