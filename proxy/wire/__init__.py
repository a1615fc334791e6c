"""PostgreSQL frontend/backend protocol v3 codec: pure, with no sockets, asyncio or logging.

A server session owns one `MessageBuffer`, feeds it whatever the socket yields and takes out
whole messages::

    buffer = MessageBuffer(limits=FRONTEND_LIMITS)
    buffer.feed(data)
    while (payload := buffer.take_startup()) is not None:    # startup phase
        packet = decode_startup(payload)   # StartupMessage | SSLRequest | GSSENCRequest | ...
    while (raw := buffer.take_message()) is not None:        # after StartupMessage
        message = decode_frontend(raw)     # Query | Parse | Bind | ... | AuthResponse
    writer.write(encode_all([RowDescription(...), DataRow(...), ReadyForQuery()]))

Errors are `ProtocolViolation` (08P01) and come in two kinds:

* from `MessageBuffer.take_*`: the framing is lost; send a FATAL error and close.
* from `decode_*`: one message was malformed but its frame was intact; send an ERROR and,
  in the extended protocol, skip messages until Sync, as PostgreSQL does.

``p`` messages decode to `AuthResponse`, read with the method matching the request sent
(`as_password`, `as_sasl_initial_response`, `as_sasl_response`). Values travel through
`types.encode_value` / `types.decode_value`.
"""

from proxy.wire.auth import (
    Authentication,
    AuthenticationCleartextPassword,
    AuthenticationMD5Password,
    AuthenticationOk,
    AuthenticationSASL,
    AuthenticationSASLContinue,
    AuthenticationSASLFinal,
    PasswordMessage,
    SASLInitialResponse,
    SASLResponse,
)
from proxy.wire.backend import (
    BackendKeyData,
    BackendMessage,
    BindComplete,
    CloseComplete,
    CommandComplete,
    DataRow,
    EmptyQueryResponse,
    ErrorResponse,
    FieldDescription,
    NegotiateProtocolVersion,
    NoData,
    NoticeResponse,
    ParameterDescription,
    ParameterStatus,
    ParseComplete,
    PortalSuspended,
    ReadyForQuery,
    RowDescription,
    TransactionStatus,
    decode_backend,
)
from proxy.wire.buffer import MessageBuffer
from proxy.wire.copy import CopyData, CopyDone, CopyFail, CopyInResponse, CopyOutResponse
from proxy.wire.frontend import (
    FRONTEND_LIMITS,
    AuthResponse,
    Bind,
    Close,
    Describe,
    Execute,
    Flush,
    FrontendMessage,
    FunctionCall,
    Parse,
    Query,
    Sync,
    Target,
    Terminate,
    decode_frontend,
)
from proxy.wire.message import Message, RawMessage, encode_all
from proxy.wire.startup import (
    ENCRYPTION_REFUSED,
    CancelRequest,
    GSSENCRequest,
    SSLRequest,
    StartupMessage,
    StartupPacket,
    decode_startup,
    split_options,
)

__all__ = [
    "Authentication",
    "AuthenticationCleartextPassword",
    "AuthenticationMD5Password",
    "AuthenticationOk",
    "AuthenticationSASL",
    "AuthenticationSASLContinue",
    "AuthenticationSASLFinal",
    "AuthResponse",
    "BackendKeyData",
    "BackendMessage",
    "Bind",
    "BindComplete",
    "CancelRequest",
    "Close",
    "CloseComplete",
    "CommandComplete",
    "CopyData",
    "CopyDone",
    "CopyFail",
    "CopyInResponse",
    "CopyOutResponse",
    "DataRow",
    "Describe",
    "EmptyQueryResponse",
    "ENCRYPTION_REFUSED",
    "ErrorResponse",
    "Execute",
    "FieldDescription",
    "Flush",
    "FRONTEND_LIMITS",
    "FrontendMessage",
    "FunctionCall",
    "GSSENCRequest",
    "Message",
    "MessageBuffer",
    "NegotiateProtocolVersion",
    "NoData",
    "NoticeResponse",
    "ParameterDescription",
    "ParameterStatus",
    "Parse",
    "ParseComplete",
    "PasswordMessage",
    "PortalSuspended",
    "Query",
    "RawMessage",
    "ReadyForQuery",
    "RowDescription",
    "SASLInitialResponse",
    "SASLResponse",
    "SSLRequest",
    "StartupMessage",
    "StartupPacket",
    "Sync",
    "Target",
    "Terminate",
    "TransactionStatus",
    "decode_backend",
    "decode_frontend",
    "decode_startup",
    "encode_all",
    "split_options",
]
