"""An httpx client for the OpenAI chat-completions wire format.

Theory of operation
-------------------
``HttpProvider.complete`` is the one place where a provider's HTTP reality becomes the
engine's vocabulary. It does three things, in order:

1. **send**: POST ``{base_url}/chat/completions`` with ``ProviderRequest.body()`` as the
   body (which carries ``"stream": true`` when the request streams): the same bytes the
   simulator records and the wire checkers judge;
2. **classify**: a status outside 2xx becomes a typed ``ProviderError``
   (``chat_wire.error_for_status``);
3. **parse**: a 2xx body (one JSON document, or a server-sent-event stream of
   ``chat.completion.chunk`` objects) becomes a ``ProviderReply``
   (``chat_wire.parse_completion``, ``chat_wire.StreamAssembler``).

This module owns the transport; ``hermes_ref.shell.chat_wire`` owns every decision
about bytes (the status map, the strict parser, the stream fold) and does no I/O. The
transport's own failures map here, each keeping the foreign exception as ``__cause__``::

    httpx.TimeoutException                    ProviderTimeout                      transient
    httpx.InvalidURL                          ProviderRejected        (will not fix itself)
    a transport failure (not a timeout)       StreamCut(deltas=what came)          transient
      after a delta arrived, or no [DONE]
      after the finish chunk
    any other transport failure               ProviderServerError(status=None)     transient
      (a body cut before its end, a stream
      without its last chunk, included:
      httpx.RemoteProtocolError)

No httpx or json exception escapes ``complete``. A request body that cannot be encoded
(NaN, an unserialisable value) is a ``ProviderRejected`` before anything is sent
(``ProviderRequest.body`` says so).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from types import TracebackType

import httpx

from hermes_ref.errors import (
    ProviderError,
    ProviderRejected,
    ProviderServerError,
    ProviderTimeout,
    StreamCut,
)
from hermes_ref.models import ProviderReply
from hermes_ref.shell.chat_wire import (
    StreamAssembler,
    decode_json_body,
    error_for_status,
    parse_completion,
)
from hermes_ref.wire import ProviderRequest


class HttpProvider:
    """Calls one OpenAI-compatible endpoint; see the module docstring for the contract."""

    def __init__(
        self,
        base_url: str,
        api_key: str | None = None,
        *,
        client: httpx.AsyncClient | None = None,
        timeout_s: float = 60.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        """``client`` lets tests pass one built with ``transport=``; it is then theirs to
        close. ``clock`` (epoch seconds) turns an HTTP-date Retry-After into a delay."""
        self.url = base_url.rstrip("/") + "/chat/completions"
        self._api_key = api_key
        self._owns_client = client is None
        self._client = client if client is not None else httpx.AsyncClient()
        self._timeout = httpx.Timeout(timeout_s)
        self._clock = clock

    async def __aenter__(self) -> HttpProvider:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Close the client if this provider created it."""
        if self._owns_client:
            await self._client.aclose()

    async def complete(self, request: ProviderRequest) -> ProviderReply:
        """One model call. Raises only ``ProviderError`` subclasses."""
        body = encode_body(request)
        try:
            if request.stream:
                return await self._complete_streamed(body)
            return await self._complete_whole(body)
        except httpx.TimeoutException as exc:
            raise ProviderTimeout(f"provider timed out: {type(exc).__name__}") from exc
        except httpx.InvalidURL as exc:
            # A broken base_url will not fix itself, so retrying would only hide it.
            raise ProviderRejected(f"invalid provider URL {self.url!r}: {exc}") from exc
        except (httpx.HTTPError, httpx.StreamError) as exc:
            raise ProviderServerError(
                f"provider unreachable: {type(exc).__name__}: {exc}", status=None
            ) from exc

    async def _complete_whole(self, body: bytes) -> ProviderReply:
        response = await self._client.post(
            self.url, content=body, headers=self._headers(stream=False), timeout=self._timeout
        )
        if not response.is_success:
            raise self._error_for(response)
        return parse_completion(decode_json_body(response.content))

    async def _complete_streamed(self, body: bytes) -> ProviderReply:
        async with self._client.stream(
            "POST", self.url, content=body, headers=self._headers(stream=True),
            timeout=self._timeout,
        ) as response:
            if not response.is_success:
                await response.aread()
                raise self._error_for(response)
            if response.headers.get("content-type", "").startswith("application/json"):
                # The server ignored "stream": true and sent one whole completion.
                return parse_completion(decode_json_body(await response.aread()))
            assembler = StreamAssembler()
            try:
                async for line in response.aiter_lines():
                    assembler.feed_line(line)
                    if assembler.done:
                        break  # anything after [DONE] is not part of this completion
            except (httpx.HTTPError, httpx.StreamError) as exc:  # cut midway: keep what came
                if not assembler.deltas or isinstance(exc, httpx.TimeoutException):
                    raise  # nothing came, or a stall: a timeout or a server error, as ever
                raise StreamCut(f"stream cut: {type(exc).__name__}: {exc}",
                                deltas=tuple(assembler.deltas)) from exc
            reply = assembler.finish()  # the fold; the reply carries its deltas (DEL-1)
            return reply.model_copy(update={"deltas": tuple(assembler.deltas),
                                            "streamed_text": reply.content or ""})

    def _headers(self, *, stream: bool) -> dict[str, str]:
        headers = {
            "content-type": "application/json",
            "accept": "text/event-stream" if stream else "application/json",
        }
        if self._api_key:
            headers["authorization"] = f"Bearer {self._api_key}"
        return headers

    def _error_for(self, response: httpx.Response) -> ProviderError:
        return error_for_status(
            response.status_code,
            response.content,
            retry_after=response.headers.get("retry-after"),
            now=self._clock(),
        )


def encode_body(request: ProviderRequest) -> bytes:
    """The request body ``complete`` sends: ``request.body()``, kept as a name of its own.

    NaN and unserialisable values are refused (``ProviderRejected``) before anything is sent.
    """
    return request.body()
