"""Sessions of images. An image is built once (its snapshot pinned); each of its sessions is one
conversation with that snapshot: the primary session created with the image (the one the AgentX
protocol knows), and any number more created over HTTP. A session's turns run with the image as
built, however much later it is resumed.

The engine runs a session through the image's view for it (`Image.for_session`): the image record
with `session_id` set to that session, so everything downstream (turns, history, event log, leases)
is keyed by the session without knowing about several sessions."""

from __future__ import annotations

from agentvm.domain.models import Image, Principal, Session, StoredMessage, Turn
from agentvm.engine.context import conversation_order
from agentvm.errors import Conflict, InvalidRequest, NotFound
from agentvm.hosting.runtime_ports import RuntimePorts
from agentvm.ids import now_ms, session_id
from agentvm.services.images import ImageService

MAX_TITLE_CHARS = 200


def session_not_found(sid: str) -> NotFound:
    return NotFound(f"Session not found: {sid}", field="sessionId")


class ImageSessions:
    def __init__(self, deps: RuntimePorts, images: ImageService) -> None:
        self.deps = deps
        self.images = images

    async def create(self, p: Principal, image_id: str, title: str | None = None) -> Session:
        if title is not None and (not title.strip() or len(title) > MAX_TITLE_CHARS):
            raise InvalidRequest(f"title: must be 1 to {MAX_TITLE_CHARS} characters, not blank", field="title")
        image = await self.images.require(p, image_id)
        ts = now_ms()
        session = Session(p.tenant_id, session_id(), image.image_id, image.container_id, ts, ts, title)
        if not await self.deps.store.create_session(session):  # the image was deleted meanwhile
            raise NotFound(f"Image not found: {image_id}", field="imageId")
        return session

    async def get(self, p: Principal, sid: str) -> Session:
        session = await self.deps.store.get_session(p.tenant_id, sid)
        if session is None:
            raise session_not_found(sid)
        return session

    async def with_image(self, p: Principal, sid: str) -> tuple[Session, Image]:
        session = await self.get(p, sid)
        image = await self.deps.store.get_image(p.tenant_id, session.image_id)
        if image is None:  # deleted meanwhile
            raise session_not_found(sid)
        return session, image.for_session(session.session_id)

    async def of_image(self, p: Principal, image_id: str) -> list[Session]:
        image = await self.images.require(p, image_id)
        return await self.deps.store.list_sessions(p.tenant_id, image.image_id)

    async def page(self, p: Principal, image_id: str | None, *, limit: int,
                   cursor: str | None) -> tuple[list[Session], str | None]:
        """The caller's sessions, newest first, of one image when `image_id` is given (an image of
        another tenant answers as not found)."""
        if image_id is not None:
            image_id = (await self.images.require(p, image_id)).image_id
        return await self.deps.store.list_tenant_sessions(p.tenant_id, image_id=image_id, limit=limit, cursor=cursor)

    async def view(self, p: Principal, image: Image, sid: str | None) -> Image:
        """`image` as its session `sid` runs it (None: the primary session). A session of another
        image answers as not found, like one that does not exist."""
        if sid is None or sid == image.session_id:
            return image
        session = await self.deps.store.get_session(p.tenant_id, sid)
        if session is None or session.image_id != image.image_id:
            raise session_not_found(sid)
        return image.for_session(session.session_id)

    async def delete(self, p: Principal, sid: str) -> None:
        session, image = await self.with_image(p, sid)
        primary = await self.images.require(p, session.image_id)
        if primary.session_id == sid:
            raise Conflict(f"Session {sid} is the primary session of image {session.image_id}: delete the "
                           "image to delete it", field="sessionId")
        await self.images.sessions.forget(image)
        await self.deps.store.delete_session(p.tenant_id, sid)

    async def messages(self, p: Principal, sid: str) -> list[StoredMessage]:
        await self.get(p, sid)
        return conversation_order(await self.deps.store.list_messages(p.tenant_id, sid))

    async def history(self, image: Image) -> list[StoredMessage]:
        """The conversation of the session `image` is a view for (found already)."""
        return conversation_order(await self.deps.store.list_messages(image.tenant_id, image.session_id))

    async def turns(self, p: Principal, sid: str) -> list[Turn]:
        await self.get(p, sid)
        return await self.deps.store.list_turns(p.tenant_id, sid)
