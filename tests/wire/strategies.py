"""Hypothesis strategies for every message the codec speaks."""

from __future__ import annotations

from hypothesis import strategies as st

from proxy.wire import (
    AuthenticationCleartextPassword,
    AuthenticationMD5Password,
    AuthenticationOk,
    AuthenticationSASL,
    AuthenticationSASLContinue,
    AuthenticationSASLFinal,
    AuthResponse,
    BackendKeyData,
    BackendMessage,
    Bind,
    BindComplete,
    CancelRequest,
    Close,
    CloseComplete,
    CommandComplete,
    CopyData,
    CopyDone,
    CopyFail,
    CopyInResponse,
    CopyOutResponse,
    DataRow,
    Describe,
    EmptyQueryResponse,
    ErrorResponse,
    Execute,
    FieldDescription,
    Flush,
    FrontendMessage,
    FunctionCall,
    GSSENCRequest,
    NegotiateProtocolVersion,
    NoData,
    NoticeResponse,
    ParameterDescription,
    ParameterStatus,
    Parse,
    ParseComplete,
    PasswordMessage,
    PortalSuspended,
    Query,
    ReadyForQuery,
    RowDescription,
    SASLInitialResponse,
    SASLResponse,
    SSLRequest,
    StartupMessage,
    StartupPacket,
    Sync,
    Target,
    Terminate,
    TransactionStatus,
)

texts = st.text(st.characters(codec="utf-8", exclude_characters="\x00"), max_size=12)
names = texts.filter(bool)
blobs = st.binary(max_size=24)
values = st.none() | blobs
int16 = st.integers(-(2**15), 2**15 - 1)
int32 = st.integers(-(2**31), 2**31 - 1)
oids = st.integers(0, 2**32 - 1)
formats = st.sampled_from((0, 1))
secret_keys = st.binary(min_size=4, max_size=256)


@st.composite
def _formatted_values(draw: st.DrawFn) -> tuple[tuple[int, ...], tuple[bytes | None, ...]]:
    """Values with a format list of the allowed lengths: none, one, or one each."""
    items = tuple(draw(st.lists(values, max_size=5)))
    count = draw(st.sampled_from(sorted({0, 1, len(items)})))
    return tuple(draw(st.lists(formats, min_size=count, max_size=count))), items


@st.composite
def _binds(draw: st.DrawFn) -> Bind:
    param_formats, params = draw(_formatted_values())
    result_formats = tuple(draw(st.lists(formats, max_size=4)))
    return Bind(draw(texts), draw(texts), param_formats, params, result_formats)


@st.composite
def _function_calls(draw: st.DrawFn) -> FunctionCall:
    arg_formats, args = draw(_formatted_values())
    return FunctionCall(draw(oids), arg_formats, args, draw(formats))


targets = st.sampled_from(Target)

frontend_messages: st.SearchStrategy[FrontendMessage] = st.one_of(
    st.builds(Query, texts),
    st.builds(Parse, texts, texts, st.lists(oids, max_size=5).map(tuple)),
    _binds(),
    st.builds(Describe, targets, texts),
    st.builds(Execute, texts, int32),
    st.builds(Close, targets, texts),
    st.just(Sync()),
    st.just(Flush()),
    st.just(Terminate()),
    _function_calls(),
    st.builds(AuthResponse, blobs),
    st.builds(CopyData, blobs),
    st.just(CopyDone()),
    st.builds(CopyFail, texts),
)

password_messages = st.one_of(
    st.builds(PasswordMessage, texts),
    st.builds(SASLInitialResponse, texts, values),
    st.builds(SASLResponse, blobs),
)

startup_packets: st.SearchStrategy[StartupPacket] = st.one_of(
    st.builds(
        StartupMessage,
        st.dictionaries(names, texts, max_size=4),
        st.just(3),
        st.integers(0, 2**16 - 1),
    ),
    st.just(SSLRequest()),
    st.just(GSSENCRequest()),
    st.builds(CancelRequest, int32, secret_keys),
)

_field_descriptions = st.builds(FieldDescription, texts, oids, int16, oids, int16, int32, formats)
_report_fields = st.dictionaries(
    st.characters(codec="ascii", exclude_characters="\x00"), texts, max_size=5
)


@st.composite
def _copy_responses(draw: st.DrawFn, cls: type[CopyInResponse | CopyOutResponse]) -> object:
    overall = draw(formats)
    columns = draw(st.lists(formats if overall else st.just(0), max_size=4))
    return cls(overall, tuple(columns))


backend_messages: st.SearchStrategy[BackendMessage] = st.one_of(
    st.just(AuthenticationOk()),
    st.just(AuthenticationCleartextPassword()),
    st.builds(AuthenticationMD5Password, st.binary(min_size=4, max_size=4)),
    st.builds(AuthenticationSASL, st.lists(names, min_size=1, max_size=3).map(tuple)),
    st.builds(AuthenticationSASLContinue, blobs),
    st.builds(AuthenticationSASLFinal, blobs),
    st.builds(ParameterStatus, texts, texts),
    st.builds(BackendKeyData, int32, secret_keys),
    st.builds(ReadyForQuery, st.sampled_from(TransactionStatus)),
    st.builds(RowDescription, st.lists(_field_descriptions, max_size=4).map(tuple)),
    st.builds(DataRow, st.lists(values, max_size=5).map(tuple)),
    st.builds(CommandComplete, texts),
    st.just(EmptyQueryResponse()),
    st.builds(ErrorResponse, _report_fields),
    st.builds(NoticeResponse, _report_fields),
    st.just(ParseComplete()),
    st.just(BindComplete()),
    st.just(CloseComplete()),
    st.just(NoData()),
    st.builds(ParameterDescription, st.lists(oids, max_size=5).map(tuple)),
    st.just(PortalSuspended()),
    st.builds(NegotiateProtocolVersion, int32, st.lists(texts, max_size=3).map(tuple)),
    _copy_responses(CopyInResponse),
    _copy_responses(CopyOutResponse),
    st.builds(CopyData, blobs),
    st.just(CopyDone()),
)
