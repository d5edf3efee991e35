"""This project's test infrastructure for third-party RocketMQ clients (not shipped in the wheel):
each module builds, once and cached, a separate virtual environment holding a client txmq did not
write, for the conformance tests (tests/conformance, tests/broker/grpc).

- :mod:`client_envs.rocketmq_cpp`: the RocketMQ C++ core (``rocketmq-client-python`` 2.0.0 and the
  ``librocketmq.so`` of ``rocketmq-python-cvs`` 2.1.0.3, remoting protocol);
- :mod:`client_envs.rocketmq_grpc`: the official RocketMQ 5 Python client (``rocketmq-python-client``
  5.1.2, gRPC) at the exact pins of ``tests/conformance/clients/rocketmq_grpc_requirements.txt``.

Tests import it by name: ``tests/conftest.py`` puts ``tests/`` on ``sys.path`` (pytest's default
``prepend`` import mode), also when the suite runs against the installed wheel (``.ci/test``). From a
shell: ``PYTHONPATH=tests python -m client_envs.rocketmq_cpp``.
"""
