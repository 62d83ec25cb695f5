"""Block I/O: the one save path and the one load path between an engine and kvtierd's
host tier, for every engine integration.

A save allocates staging slots in chunks, lets the engine write each chunk's blocks into
them (kvtier's block layout, straight into the shared host window), commits them under
their keys as a chain and releases the lease. A load acquires the leading run of cached
blocks in chunks (the daemon promotes from NVMe), lets the engine read each chunk out of
the read-only host arena and releases it; it stops at the first block the daemon does not
have. Every slot is addressed with its contract, whatever the daemon's slot classes are
(tiers.slot_classes "per-contract", the shipped config, makes one slot size per contract).

Failures follow the daemon link's outage policy (kvtier.engine.link): nothing from the
daemon raises into the engine; a call counts what it stored or loaded before the failure
and the rest is a miss. Errors of the engine's own write/read callbacks propagate (they
are the engine's bugs or refusals, e.g. kvtier.pages.PagesError).
"""
from __future__ import annotations

import ctypes
from typing import Callable, Optional, Sequence

import kvtier

from .link import DaemonLink

# Staging slots per alloc: well under the daemon's tiers.host.staging_slots_per_client.
SAVE_CHUNK = 32
# Keys per acquire: the daemon sets up an acquire in steps of 256 keys.
LOAD_CHUNK = 256
# How long an alloc waits out a host tier that is full for now (RETRY) before the save
# gives up on those blocks; a save runs beside the engine's step, so it stays short.
ALLOC_WAIT_MS = 200


def slot_rows(client: kvtier.Client, slots, contract_id: int, nbytes: int):
    """The first nbytes of each host slot of `contract_id`, as rows of one uint8 tensor over
    the shared host window: a 2-D [n, nbytes] view when the slots lie at one stride (a run
    of staging slots, blocks acquired in a row), else a list of 1-D views. Writable for
    staging slots; acquired slots are only read (the arena is mapped read-only)."""
    import torch
    offs, _ = client.host_slot_offsets(slots, contract_id)
    win = _window_tensor(client)
    if len(offs) > 1:
        step = offs[1] - offs[0]
        if step >= nbytes and all(offs[i + 1] - offs[i] == step for i in range(len(offs) - 1)):
            return torch.as_strided(win, (len(offs), nbytes), (step, 1), offs[0])
    return [win[o:o + nbytes] for o in offs]


def _window_tensor(client: kvtier.Client):
    """A uint8 tensor over the client's whole host window, made once per mapping."""
    import torch
    arr = client.host_window()
    cached = getattr(client, "_kvtier_window_tensor", None)
    if cached is not None and cached[0] == ctypes.addressof(arr) and cached[1].numel() == len(arr):
        return cached[1]
    t = torch.frombuffer(arr, dtype=torch.uint8)
    client._kvtier_window_tensor = (ctypes.addressof(arr), t)
    return t


def slot_view(client: kvtier.Client, slot, contract_id: int, nbytes: int):
    """A uint8 torch tensor over nbytes of one host slot of `contract_id` in the shared host
    window (a staging slot, writable; or an acquired slot, only to be read)."""
    import torch
    addr = client.host_slot_address(slot, contract_id)
    return torch.frombuffer((ctypes.c_uint8 * nbytes).from_address(addr), dtype=torch.uint8)


class BlockIO:
    """Chunked save and load of blocks through a DaemonLink (see the module doc)."""

    def __init__(self, link: DaemonLink, save_chunk: int = SAVE_CHUNK, load_chunk: int = LOAD_CHUNK,
                 alloc_wait_ms: int = ALLOC_WAIT_MS):
        self.link = link
        self.save_chunk, self.load_chunk, self.alloc_wait_ms = save_chunk, load_chunk, alloc_wait_ms
        self.saved_blocks = self.loaded_blocks = 0

    def _release(self, client: kvtier.Client, lease) -> None:
        try:
            client.release(lease)
        except kvtier.KvtierError as e:
            self.link.report("release", e)

    def lookup(self, contract: kvtier.Contract, keys: Sequence[kvtier.Key]) -> int:
        """How many leading blocks of `keys` kvtierd holds (0 while the daemon is down)."""
        if len(keys) == 0:
            return 0
        with self.link.lock:
            client, cid = self.link.attach(contract)
            if client is None:
                return 0
            try:
                return client.lookup(cid, keys).hit_blocks
            except kvtier.KvtierError as e:
                self.link.report("lookup", e, "the engine computes those blocks")
                return 0

    def save(self, contract: kvtier.Contract, keys: Sequence[kvtier.Key],
             write: Callable[[list, int, int], None], parent: Optional[kvtier.Key] = None,
             copied: Optional[Callable[[], None]] = None) -> int:
        """Stores len(keys) blocks, a chain: keys[i]'s parent is keys[i - 1] (`parent` for
        keys[0]). write(rows, i, m) writes blocks i .. i+m-1 into rows (slot_rows: a 2-D uint8
        tensor of m rows of the contract's block bytes, or a list of m 1-D ones; staging
        slots). copied() is called once the last
        write returned (before the last commit): the engine's pages are no longer read.
        Returns how many blocks kvtierd holds now with these bytes."""
        n = len(keys)
        stored = 0
        done = 0
        bb, cid0 = contract.block_bytes(), contract.id()  # each hashes the contract: once a call
        try:
            while done < n:
                m = min(self.save_chunk, n - done)
                with self.link.lock:
                    client, cid = self.link.attach(contract, cid0)
                    if client is None:
                        return stored
                    try:
                        lease = client.alloc(cid, m, "host", wait_ms=self.alloc_wait_ms)
                    except kvtier.KvtierError as e:
                        self.link.report("save", e, "those blocks are not cached")
                        return stored
                    try:
                        write(slot_rows(client, lease.slots, cid, bb), done, m)
                        if done + m >= n and copied is not None:
                            copied()
                            copied = None
                        p = keys[done - 1] if done else parent
                        try:
                            stored += client.commit_chain(cid, lease, lease.slots, keys[done:done + m], p)
                        except kvtier.KvtierConflict as e:
                            # Keys already cached with other bytes (another engine's): ours are
                            # not counted; the rest went through.
                            stored += e.committed
                            self.link.warn_once(("save", "conflict"), "kvtier: save: %s", e)
                        except kvtier.KvtierError as e:
                            self.link.report("save", e, "those blocks are not cached")
                            return stored
                    finally:
                        self._release(client, lease)
                done += m
            return stored
        finally:
            if copied is not None:
                copied()
            self.saved_blocks += stored

    def load(self, contract: kvtier.Contract, keys: Sequence[kvtier.Key],
             read: Callable[[list, int, int], Optional[int]]) -> int:
        """Loads the leading run of `keys` that kvtierd holds. read(rows, i, m) copies blocks
        i .. i+m-1 out of rows (slot_rows' read-only views of the host arena) into the engine's pages
        and returns how many of them it took (None: all); fewer ends the load. Returns how
        many leading blocks were loaded."""
        n = len(keys)
        done = 0
        bb, cid0 = contract.block_bytes(), contract.id()  # each hashes the contract: once a call
        try:
            while done < n:
                with self.link.lock:
                    client, cid = self.link.attach(contract, cid0)
                    if client is None:
                        return done
                    chunk = keys[done:min(n, done + self.load_chunk)]
                    try:
                        lease = client.acquire(cid, chunk, "host")
                    except kvtier.KvtierError as e:
                        self.link.report("load", e, "the engine recomputes those blocks")
                        return done
                    try:
                        got = len(lease.slots)
                        took = got
                        if got:
                            r = read(slot_rows(client, lease.slots, cid, bb), done, got)
                            took = got if r is None else max(0, min(int(r), got))
                    finally:
                        self._release(client, lease)
                done += took
                if took < len(chunk):
                    return done
            return done
        finally:
            self.loaded_blocks += done
