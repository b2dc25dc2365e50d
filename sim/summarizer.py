"""The auxiliary model of the simulated world: it answers compaction's summary requests.

Theory of operation
-------------------
Compaction (``hermes_ref.compaction``) asks for a summary with a request whose
``purpose`` is ``"compression"``. Every fake provider hands such a request to its
``Summarizer`` instead of its own script, so a story scripts the turn's model calls as
before and the summary calls need no steps of their own.

The summary is a function of the request alone: the number of messages it summarized,
how many were the user's, and the opening words of each user message, after the
previous summary when the request carried one (an update, not a fresh start). Same
request, same summary, on every run.

``delay_s`` makes every summary arrive that many seconds late, so a story can kill the
process while a summary call is in flight. ``say(text, ...)`` queues the texts of the next
summaries. ``fail(ProviderTimeout(...), ...)`` queues failures: each queued error answers
one summary request, in order; when the queue is empty the summarizer answers normally.
"""

from __future__ import annotations

from collections import deque

from hermes_ref.compaction import COMPRESSION_PURPOSE as COMPRESSION_PURPOSE  # re-exported for sim
from hermes_ref.errors import ProviderError
from hermes_ref.models import ProviderReply, Role, Usage
from hermes_ref.tokens import count_text
from hermes_ref.wire import ProviderRequest

# The markers of the request compaction sends (``hermes_ref.compaction.summary_request``).
PREVIOUS_MARK = "Previous summary:\n"
LINES_MARK = "Conversation:\n"
WORDS_PER_USER = 6


class Summarizer:
    """Deterministic summaries, and scripted failures (see the module docstring)."""

    def __init__(self) -> None:
        self.requests: list[ProviderRequest] = []
        self.delay_s = 0.0  # each summary arrives this many seconds after it was asked for
        self._failures: deque[ProviderError] = deque()
        self._texts: deque[str] = deque()

    def say(self, *texts: str) -> Summarizer:
        """The next ``len(texts)`` successful summaries are these texts, in order."""
        self._texts.extend(texts)
        return self

    def fail(self, *errors: ProviderError) -> Summarizer:
        """The next ``len(errors)`` summary requests raise these, in order."""
        self._failures.extend(errors)
        return self

    @property
    def failures_left(self) -> int:
        return len(self._failures)

    def complete(self, request: ProviderRequest) -> ProviderReply:
        self.requests.append(request)
        if self._failures:
            raise self._failures.popleft()
        text = self._texts.popleft() if self._texts else summarize(request)
        return ProviderReply(content=text, finish_reason="stop", model=request.model,
                             usage=Usage(prompt_tokens=request.prompt_tokens,
                                         completion_tokens=count_text(text)))


def summarize(request: ProviderRequest) -> str:
    """The summary of the conversation the request carries (a pure function of it)."""
    body = "\n".join(m.content or "" for m in request.messages if m.role is Role.USER)
    previous = ""
    if PREVIOUS_MARK in body:
        previous = body.split(PREVIOUS_MARK, 1)[1].split("\n\n" + LINES_MARK, 1)[0].strip()
    lines = body.split(LINES_MARK, 1)[1].splitlines() if LINES_MARK in body else []
    users = [line[len("[user] "):] for line in lines if line.startswith("[user] ")]
    asked = "; ".join(" ".join(u.split()[:WORDS_PER_USER]) for u in users)
    tools = sum(1 for line in lines if line.startswith("[tool "))
    now = (f"{len(lines)} earlier messages ({len(users)} from the user, {tools} tool results)"
           + (f"; the user asked: {asked}" if asked else ""))
    return f"{previous}\nThen: {now}" if previous else now
