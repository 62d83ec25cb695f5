"""The daemon link: one kvtierd connection per engine process (or role), kept through
outages, with the one outage policy every engine integration follows.

- The socket: the engine's ``socket`` setting, else ``$KVTIER_SOCKET``, else
  :data:`DEFAULT_SOCKET`, the socket the shipped ``config/kvtier.toml`` serves (the same
  rule as kvtierctl). A packaged daemon serves ``/run/kvtier/kvtierd.sock``: set
  ``KVTIER_SOCKET`` or the engine's ``socket`` setting to it.
- The connection is made lazily. While the daemon is down every call gets a miss (a
  lookup finds nothing, a load loads nothing, a save stores nothing) and the engine
  recomputes; nothing raises into the engine.
- One warning when the daemon goes away, one line when it is back; reconnects are tried
  with exponential back-off (0.5 s doubling to 10 s), so a dead daemon costs no time per
  request (a stat of the socket, about a microsecond). A daemon that starts again makes a
  new socket file: the first call after that reconnects at once, whatever the back-off.
  Contracts registered before are registered again on the new connection.
- Any other error of a call (a full tier, a refused request) is logged once per operation
  and status, and that call's blocks are a miss.

:class:`DaemonLink` is thread-safe: every call on its client is made under
:attr:`DaemonLink.lock` (one connection, one request at a time).
"""
from __future__ import annotations

import logging
import os
import threading
import time
from typing import Callable, Dict, Optional, Sequence, Tuple

import kvtier

log = logging.getLogger("kvtier.engine")

# The socket config/kvtier.toml serves ([daemon] socket), relative to the daemon's folder.
DEFAULT_SOCKET = "./kvtier-data/kvtierd.sock"
# How long one call on the daemon may take before the link counts the daemon as gone.
DEFAULT_TIMEOUT_MS = 10000
# Reconnect back-off: the first retry after this many seconds, doubling up to the second.
BACKOFF_S = (0.5, 10.0)


def socket_path(setting: Optional[str] = None) -> str:
    """The socket an engine attaches to: its setting, else $KVTIER_SOCKET, else DEFAULT_SOCKET."""
    return str(setting or os.environ.get("KVTIER_SOCKET") or DEFAULT_SOCKET)


class DaemonLink:
    """A kvtierd connection that survives the daemon's outages (see the module doc).

    ``attach(contract)`` returns (client, contract id) with the contract registered, or
    (None, 0) while the daemon is down. A caller that gets a KvtierError from a call on
    the client hands it to :meth:`report`, which drops the connection when the error
    means the daemon is gone and otherwise logs it once per operation and status."""

    GONE = {8, 9}  # DISCONNECTED, TIMEOUT: the connection is dead
    _CONNECT_ERRORS = (kvtier.KvtierError, OSError)

    def __init__(self, socket: Optional[str], name: str,
                 contracts: Callable[[], Sequence[kvtier.Contract]] = lambda: (),
                 timeout_ms: int = DEFAULT_TIMEOUT_MS, backoff_s=BACKOFF_S, logger: Optional[logging.Logger] = None,
                 clock=time.monotonic, has_gpu: bool = False):
        self.socket_path, self.name, self.timeout_ms = socket_path(socket), name, timeout_ms
        self.has_gpu = has_gpu
        self._more = contracts
        self._lo, self._hi = backoff_s
        self._log = logger or log
        self._clock = clock
        self.lock = threading.RLock()     # every call on the client
        self._client: Optional[kvtier.Client] = None
        self._known: Dict[int, kvtier.Contract] = {}   # contract id -> contract, registered on connect
        self._down = False
        self._next_try = 0.0
        self._delay = self._lo
        self._seen = set()
        self._socket_then = None   # the socket file when the daemon was last found gone
        self.outages = 0

    # ---- the connection ---------------------------------------------------------------

    def client(self) -> Optional[kvtier.Client]:
        """The connected client, or None while the daemon is down (no attempt before the
        back-off has passed, unless the socket file is a new one)."""
        with self.lock:
            if self._client is not None:
                return self._client
            if self._clock() < self._next_try and self._socket_file() == self._socket_then:
                return None
            c = None
            try:
                c = kvtier.Client(self.socket_path, name=self.name, timeout_ms=self.timeout_ms, has_gpu=self.has_gpu)
                for ct in list(self._known.values()) + list(self._more()):
                    c.register_contract(ct)
            except self._CONNECT_ERRORS as e:
                if c is not None:
                    c.close()
                self._went_down(f"cannot attach to kvtierd at {self.socket_path}: {e}")
                return None
            if self._down:
                self._log.warning("kvtier: kvtierd at %s is back; caching again", self.socket_path)
            self._down = False
            self._delay = self._lo
            self._seen.clear()
            self._client = c
            return c

    def attach(self, contract: kvtier.Contract, cid: Optional[int] = None) -> Tuple[Optional[kvtier.Client], int]:
        """(client, contract id) with `contract` registered on the current connection, or
        (None, 0) while the daemon is down. A contract the daemon refuses (a block larger
        than its largest slot, a bad scale) is logged once and gives (None, 0) too. cid:
        contract.id() when the caller has it (it hashes the whole contract)."""
        cid = contract.id() if cid is None else cid
        with self.lock:
            self._known.setdefault(cid, contract)
            c = self.client()
            if c is None:
                return None, 0
            if cid not in c._block_bytes:
                try:
                    c.register_contract(contract)
                except kvtier.KvtierError as e:
                    self.report("register", e, "its blocks are not cached")
                    return None, 0
            return c, cid

    def register(self, contract: kvtier.Contract) -> Optional[int]:
        """Registers a contract on the current connection (None while the daemon is down)."""
        c, cid = self.attach(contract)
        return cid if c is not None else None

    # ---- errors -----------------------------------------------------------------------

    def report(self, op: str, err: Exception, consequence: str = "those blocks are a miss"):
        """A call failed: a gone daemon is one line per outage (and a reconnect later);
        any other error is one line per operation and status."""
        if isinstance(err, kvtier.KvtierError) and err.code not in self.GONE:
            key = (op, err.code)
            with self.lock:
                if key in self._seen:
                    return
                self._seen.add(key)
            self._log.warning("kvtier: %s failed (%s); %s", op, err, consequence)
            return
        self.failed(err)

    def warn_once(self, key, msg: str, *args):
        """Logs a message once per key until the next reconnect (a failing path is not a flood)."""
        with self.lock:
            if key in self._seen:
                return
            self._seen.add(key)
        self._log.warning(msg, *args)

    def failed(self, err: Exception):
        """Reports an error from a call on the client: the connection is dropped (and the
        outage logged once) when the error says the daemon is gone."""
        if isinstance(err, kvtier.KvtierError) and err.code not in self.GONE:
            return
        with self.lock:
            c, self._client = self._client, None
            if c is not None:
                try:
                    c.close()
                except Exception:
                    pass
            self._went_down(f"lost kvtierd at {self.socket_path}: {err}")

    def _socket_file(self):
        """(device, inode, change time) of the socket file, None where there is none: a
        daemon that starts again binds a new one (the inode number may be the old one's)."""
        try:
            st = os.stat(self.socket_path)
        except OSError:
            return None
        return st.st_dev, st.st_ino, st.st_ctime_ns

    def _went_down(self, why: str):
        # Called with the lock held.
        self._socket_then = self._socket_file()
        if not self._down:
            self.outages += 1
            self._log.warning("kvtier: %s; the engine recomputes what it would have loaded until the daemon is "
                              "back (retrying every %.1f-%.0f s)", why, self._lo, self._hi)
            self._down = True
            self._delay = self._lo
        else:
            self._delay = min(self._delay * 2, self._hi)
        self._next_try = self._clock() + self._delay

    @property
    def down(self) -> bool:
        return self._down

    def close(self):
        with self.lock:
            c, self._client = self._client, None
        if c is not None:
            c.close()
