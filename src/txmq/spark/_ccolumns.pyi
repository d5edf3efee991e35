"""Types of the C extension built from ``_columns.c`` (its comments give the layout and checks)."""

_Var = tuple[bytes | None, int, bytes, bytes]
_Props = tuple[bytes, bytes, bytes, bytes, bytes]

def decode_reply(
    data: bytes | bytearray | memoryview, /
) -> tuple[int, _Var, _Var, _Var, _Var, bytes, bytes, _Var, bytes, bytes, _Props,
           set[tuple[str, int]], bool] | None: ...
