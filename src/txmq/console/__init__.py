"""The web console: a FastAPI app (JSON API under ``/api``, server-rendered pages) over the brokers'
admin requests. ``txmq console`` serves it; :func:`create_app` builds it.
"""

from txmq.extras import require_extra as _require_extra

_require_extra("console", "txmq.console", "fastapi", "uvicorn", "jinja2", "plotly")

from txmq.console._app import create_app
from txmq.console._backend import Backend, ConsoleConfig
from txmq.console._history import History, Sample
from txmq.console._user import Credentials, acting_user, current_credentials

__all__ = ["Backend", "ConsoleConfig", "Credentials", "History", "Sample", "acting_user", "create_app",
           "current_credentials"]
