"""`Drain`: a stopping process (a turn host on SIGTERM: ECS scale-in, a deploy, a Fargate Spot
interruption's two-minute warning) as the session runs it hosts see it.

* `drain()`: finish the turn that is running, start no other; a session run hands its session back
  (`handed_back`) instead of taking the lease again, so its queued turns run elsewhere (`chat_turn`).
* `abort()`: the drain ran out of time: interrupt the turns still running. Each ends as an
  interrupted turn (what it streamed is stored, `conversation_end` and `turn_response` are sent, its
  usage is billed and its budget hold settled) and its run releases the lease: before the process is
  killed, not after the lease expires.
"""

from __future__ import annotations

import asyncio

#: The error code and text of a turn interrupted because its host stopped.
HOST_STOPPED = "host_stopped"
HOST_STOPPED_TEXT = ("The turn host stopped before this turn finished (its capacity was reclaimed); "
                     "send the message again to continue.")


class Drain:
    def __init__(self) -> None:
        self.draining = False
        self._aborted = asyncio.Event()
        self.handed_back: set[tuple[str, str]] = set()

    def drain(self) -> None:
        self.draining = True

    def abort(self) -> None:
        self.draining = True
        self._aborted.set()

    @property
    def aborting(self) -> bool:
        return self._aborted.is_set()

    async def aborted(self) -> None:
        await self._aborted.wait()

    def hand_back(self, tenant_id: str, session_id: str) -> None:
        self.handed_back.add((tenant_id, session_id))

    def take_handed_back(self, tenant_id: str, session_id: str) -> bool:
        """Whether a run of this session handed it back (and forget it)."""
        key = (tenant_id, session_id)
        if key in self.handed_back:
            self.handed_back.discard(key)
            return True
        return False
