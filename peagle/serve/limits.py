"""What one client may send or hold, in one place: :class:`ServerLimits` (each field a ``peagle serve``
flag) and the three places that enforce them, each answering with an OpenAI error object:

* the connection (:class:`LimitedHttpTools`, uvicorn's httptools protocol): a request's headers must
  arrive within the read timeout (408) and fit ``max_header_bytes`` (431); past ``limit_concurrency``
  connections or requests in flight, uvicorn's plain-text 503 becomes an error object;
* the body (:class:`BodyLimit`, ASGI): read whole before the app sees it, at most ``max_body_bytes``
  (413 by its Content-Length, or as a chunked body's bytes arrive) and within the read timeout (408);
* the request (:func:`check_request`, before any prompt is tokenized): choices, prompt characters and
  stop strings (400).

Without them a 64 MB body was read and parsed whole, a 2M-character prompt was
tokenized on the event loop before its length was checked, and a connection that sent nothing held
its slot forever."""
from __future__ import annotations

import asyncio
import functools
import json
from asyncio import TimerHandle
from dataclasses import dataclass, field, fields
from http import HTTPStatus
from typing import Any

from uvicorn.protocols.http.flow_control import service_unavailable
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from peagle.serve.requests import ChatRequest, GenerationRequest
from peagle.serve.responses import Refusal, error, error_body

# The default prompt limit in characters per token of the context: text averages about 4, code a few
# more. Some tokens are longer (SmolLM2 has runs of up to 81 spaces or '#'), so a prompt made of them
# could fit the context and still be refused: --max-prompt-chars takes it.
CHARS_PER_TOKEN = 16
LINGER_S = 2.0   # how long a refused connection reads and drops what its client still sends, then closes


def _limit(default: int | float | None, flag: str, doc: str):
    """A limit's field: its default, its ``peagle serve`` flag and the flag's help ("{default}" in it: the default)."""
    return field(default=default, metadata={"flag": flag, "help": doc})


@dataclass(frozen=True)
class ServerLimits:
    """The limits on one client: none is unbounded, and the defaults leave room for what clients ask of this model.
    Each is a ``peagle serve`` flag (:meth:`add_arguments`, :meth:`from_args`); each refusal an OpenAI error object."""
    max_body_bytes: int = _limit(8 * 2 ** 20, "--max-request-body-bytes", "a larger body gets a 413, by its "
                                 "Content-Length or once that many bytes have come (default {default})")
    max_header_bytes: int = _limit(64 * 2 ** 10, "--max-request-header-bytes",
                                   "a request line and headers larger get a 431 (default {default})")
    read_timeout: float = _limit(30.0, "--request-read-timeout", "seconds a client has to send a request's headers, "
                                 "and then its body; a slower one gets a 408 and its connection is closed (default "
                                 "{default})")
    limit_concurrency: int = _limit(512, "--limit-concurrency", "open connections and requests in flight beyond which "
                                    "the server answers 503 (uvicorn's flag; default {default})")
    max_prompt_chars: int | None = _limit(None, "--max-prompt-chars", "a longer prompt (a chat's messages together) "
                                          f"gets a 400 before it is tokenized (default {CHARS_PER_TOKEN} x the "
                                          "maximum context length)")
    max_choices: int = _limit(32, "--max-choices-per-request", "prompts x n a request may ask for (default {default})")
    max_stop_strings: int = _limit(16, "--max-stop-strings", "stop strings a request may have (default {default})")
    max_stop_chars: int = _limit(256, "--max-stop-string-chars", "characters a stop string may have (default {default})")

    @classmethod
    def add_arguments(cls, parser) -> None:
        """Each limit's flag on ``parser`` (an argparse parser or group), its default the field's."""
        for f in fields(cls):
            kind = float if isinstance(f.default, float) else int
            flag = f.metadata["flag"]
            parser.add_argument(flag, dest=f.name, metavar=flag.lstrip("-").upper().replace("-", "_"), type=kind,
                                default=f.default,
                                help=f.metadata["help"].format(default=f"{f.default:g}" if kind is float else f.default))

    @classmethod
    def from_args(cls, args) -> ServerLimits:
        """The limits the flags of :meth:`add_arguments` set."""
        return cls(**{f.name: getattr(args, f.name) for f in fields(cls)})

    def __post_init__(self):
        for f in fields(self):
            value = getattr(self, f.name)
            if value is not None and not value > 0:
                raise ValueError(f"server limit {f.name} must be positive, got {value}")

    def most_prompt_chars(self, max_model_len: int) -> int:
        return self.max_prompt_chars or CHARS_PER_TOKEN * max_model_len

    def uvicorn_kwargs(self) -> dict[str, Any]:
        """uvicorn's share: the connection cap and the protocol that keeps the other connection limits."""
        return {"http": functools.partial(LimitedHttpTools, limits=self), "limit_concurrency": self.limit_concurrency}


def check_request(req: GenerationRequest, limits: ServerLimits, max_model_len: int) -> None:
    """Refuse, before any prompt is tokenized, more choices than a request may ask for, a prompt with
    more characters than any prompt that fits the context, and too many or too long stop strings."""
    sizes = _prompt_chars(req)
    if len(sizes) * req.n > limits.max_choices:
        raise Refusal(400, f"{len(sizes)} prompts x n={req.n} choices are more than the {limits.max_choices} "
                           "a request may ask for")
    most, chars = limits.most_prompt_chars(max_model_len), max(sizes, default=0)
    if chars > most:
        raise Refusal(400, f"a prompt has {chars} characters; this server takes at most {most} per prompt")
    stop = req.stop_strings
    if len(stop) > limits.max_stop_strings:
        raise Refusal(400, f"{len(stop)} stop strings are more than the {limits.max_stop_strings} a request may have")
    if any(len(s) > limits.max_stop_chars for s in stop):
        raise Refusal(400, f"a stop string may have at most {limits.max_stop_chars} characters")


def _prompt_chars(req: GenerationRequest) -> list[int]:
    """Each prompt's characters: a chat's roles and text parts together; token ids count 0 (they are
    checked as tokens, and cost no tokenizing)."""
    if isinstance(req, ChatRequest):
        return [sum(len(m.role) + (len(m.content) if isinstance(m.content, str) else
                                   sum(len(p.text or "") for p in m.content)) for m in req.messages)]
    return [len(p) if isinstance(p, str) else 0 for p in req.prompt_list]


def _closing(status: int, message: str, kind: str, headers: dict[str, str] | None = None):
    """The error object with ``Connection: close``: the rest of what the client sends is not read."""
    return error(status, message, kind, {"Connection": "close", **(headers or {})})


class BodyLimit:
    """Reads a request's body before the app: at most ``max_body_bytes`` (413 at once when its
    Content-Length says more, else when its bytes pass the limit; the rest is never read) and within
    ``read_timeout`` (408: a client that trickles its body holds no slot for longer). The app gets it
    as one message. Plain ASGI (Starlette's BaseHTTPMiddleware hides client disconnects)."""

    def __init__(self, app, limits: ServerLimits):
        self.app, self.limits = app, limits

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        try:
            body = await asyncio.wait_for(self._read(scope, receive), self.limits.read_timeout)
        except asyncio.TimeoutError:
            body = _closing(408, f"the request body did not arrive within {self.limits.read_timeout:g} s",
                            "RequestTimeoutError")
        if body is None:   # the client has gone
            return
        if not isinstance(body, bytes):
            return await body(scope, receive, send)
        replayed = False

        async def replay():
            nonlocal replayed
            if replayed:
                return await receive()   # a disconnect, for the streams that watch for one
            replayed = True
            return {"type": "http.request", "body": body, "more_body": False}

        await self.app(scope, replay, send)

    async def _read(self, scope, receive):
        """The body, an error response, or None if the client disconnected."""
        most = self.limits.max_body_bytes
        too_large = _closing(413, f"the request body is larger than {most} bytes", "RequestTooLargeError")
        length = dict(scope["headers"]).get(b"content-length", b"0")
        if not length.isdigit() or int(length) > most:
            return too_large
        chunks, size = [], 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return None
            chunks.append(message.get("body", b""))
            size += len(chunks[-1])
            if size > most:
                return too_large
            if not message.get("more_body", False):
                return b"".join(chunks)


class LimitedHttpTools(HttpToolsProtocol):
    """uvicorn's httptools protocol with the limits uvicorn lacks: it waits for a request's headers
    forever and takes headers of any size (a slow-loris holds a connection, and a slot of
    ``limit_concurrency``, for as long as it likes); here they must arrive within ``read_timeout``
    (else 408) and fit ``max_header_bytes`` (else 431), and the connection is closed. The 503 past
    ``limit_concurrency`` is an error object instead of uvicorn's plain text."""

    def __init__(self, *args, limits: ServerLimits, **kwargs):
        super().__init__(*args, **kwargs)
        self.limits = limits
        self._head_timer: TimerHandle | None = None   # set while a request's headers are awaited
        self._head_bytes = 0
        self._closing: TimerHandle | None = None      # set once refused: the close after a short linger

    def _await_head(self) -> None:
        self._head_bytes = 0
        self._head_timer = self.loop.call_later(self.limits.read_timeout, self._refuse, 408,
                                                f"the request headers did not arrive within "
                                                f"{self.limits.read_timeout:g} s", "RequestTimeoutError")

    def _head_done(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _refuse(self, status: int, message: str, kind: str) -> None:
        """Answer and close, lingering: the write side is shut at once and what the client still sends is
        read and dropped for a moment before the close. A socket closed with unread bytes resets the
        connection, and a reset can discard the answer before the client reads it (a slow-loris's 408)."""
        self._head_done()
        if self.transport.is_closing() or self._closing is not None:
            return
        body = json.dumps(error_body(status, message, kind)).encode()
        self.transport.write(b"HTTP/1.1 %d %s\r\ncontent-type: application/json\r\ncontent-length: %d\r\n"
                             b"connection: close\r\n\r\n%s" % (status, HTTPStatus(status).phrase.encode(),
                                                                len(body), body))
        self._linger()

    def _linger(self) -> None:
        """The close of :meth:`_refuse` and of every answer that ends its connection (``Connection: close``: a
        408 or 413 to a body still arriving): the write side shut now, the rest of the client's bytes dropped,
        the socket closed after ``LINGER_S`` or when the client closes first."""
        if self.transport.is_closing() or self._closing is not None:
            return
        self.transport.write_eof()
        self._closing = self.loop.call_later(LINGER_S, self.transport.close)

    def connection_made(self, transport) -> None:
        super().connection_made(transport)
        self._await_head()

    def connection_lost(self, exc) -> None:
        self._head_done()
        if self._closing is not None:
            self._closing.cancel()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self._closing is not None:   # refused: dropped while the connection lingers
            return
        if self._head_timer is not None:
            self._head_bytes += len(data)
        super().data_received(data)
        if self._head_timer is not None and self._head_bytes > self.limits.max_header_bytes:
            self._refuse(431, f"the request headers are larger than {self.limits.max_header_bytes} bytes",
                         "RequestHeaderFieldsTooLargeError")

    def on_headers_complete(self) -> None:
        self._head_done()
        super().on_headers_complete()

    def on_response_complete(self) -> None:
        idle = not self.pipeline   # no next request's headers have arrived yet
        super().on_response_complete()
        if idle and not self.transport.is_closing():
            self._await_head()

    def _start_asgi_task(self, cycle, app) -> None:
        if app is service_unavailable:   # uvicorn's answer past limit_concurrency
            app = _closing(503, "the server has too many connections open", "ServiceUnavailableError",
                           {"Retry-After": "1"})
        cycle.transport = _Lingering(self)   # the cycle closes a Connection: close answer's connection: lingering
        super()._start_asgi_task(cycle, app)


class _Lingering:
    """A connection's transport as a request's cycle sees it: ``close`` lingers (:meth:`LimitedHttpTools._linger`);
    the rest is the transport's own."""

    def __init__(self, protocol: LimitedHttpTools):
        self._protocol = protocol

    def close(self) -> None:
        self._protocol._linger()

    def __getattr__(self, name: str):
        return getattr(self._protocol.transport, name)
