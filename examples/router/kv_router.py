"""A KV-aware router's index, built from the vLLM-format KV event streams of N kvtier servers.

It uses only pyzmq and msgpack (Debian: python3-zmq, python3-msgpack), nothing of kvtier: what it reads
is vLLM's wire format (docs/events.md, "vLLM format"), so the same code follows vLLM engines too.

Per server it keeps block hash -> medium ("GPU", "CPU", "DISK") and the next batch seq it expects.
Batches arrive on a SUB socket as [topic, seq (8 bytes big-endian), msgpack KVEventBatch]. A seq above
the expected one is a gap: the router asks the server's replay ROUTER socket for everything from the
expected seq ([b"", seq] from a DEALER; replies [b"", seq, payload] ... then seq -1), applies that in
order, and skips what it already applied when the live copies arrive. `pause()`/`resume()` close and
reopen a server's SUB socket (a stall: whatever is published meanwhile is lost to the socket), and
`catch_up()` replays from the expected seq, which also brings in a lost tail that no later batch would
reveal (vLLM's stream has no heartbeats). vLLM batches carry no instance id: a server that restarts
numbers from 0 again, beginning with AllBlocksCleared. The router sees it as a seq it already applied
arriving with another payload, live or at the anchor of a replay (catch_up asks from the last seq it
applied and compares that batch); it then drops what it knew and replays the new instance from 0.

If the replay buffer no longer holds the expected seq (the first batch replayed is later), the events in
between are gone and the index of that server may be wrong: it is marked `stale` until the server
restarts or an AllBlocksCleared arrives (the vLLM format has no snapshot).

Scoring: for a prompt's block hashes, each server's longest prefix of hashes it holds, and how many of
those blocks are on each medium; `rank()` orders servers by a weighted prefix (GPU 1.0, CPU 0.8,
DISK 0.5 per block, configurable).

Usage (see README.md):
    router = KvRouter({"node-a": ("tcp://10.0.0.1:5557", "tcp://10.0.0.1:5558"), ...})
    router.poll(timeout_ms=100)            # call in a loop: applies whatever arrived
    router.rank([h0, h1, h2, ...])         # [(server, score, prefix_blocks, {"CPU": n, ...}), ...]
"""

from __future__ import annotations

import collections
import hashlib
import time
from typing import Dict, Iterable, List, Optional, Tuple

import msgpack
import zmq

END_SEQ = -1
DIGESTS_KEPT = 65536  # batches whose digest is kept to recognize a restart
DEFAULT_WEIGHTS = {"GPU": 1.0, "CPU": 0.8, "DISK": 0.5}


def _hashable(h):
    """Block hashes are ints or bytes (vLLM's ExternalBlockHash); lists would not be dict keys."""
    return bytes(h) if isinstance(h, (bytes, bytearray, memoryview)) else h


def _digest(payload: bytes) -> bytes:
    return hashlib.blake2b(payload, digest_size=16).digest()


def decode_events(payload: bytes) -> List[Tuple[str, dict]]:
    """A KVEventBatch (array_like or map layout, as msgspec writes them) as [(kind, fields)]."""
    batch = msgpack.unpackb(payload, raw=False)
    events = batch["events"] if isinstance(batch, dict) else batch[1]
    out = []
    for ev in events:
        if isinstance(ev, dict):  # map layout: {"type": tag, field: value, ...}
            kind, f = ev.get("type"), ev
        else:  # array layout: [tag, fields in declaration order]; trailing defaults may be left out
            kind = ev[0]
            names = {"BlockStored": ["block_hashes", "parent_block_hash", "token_ids", "block_size", "lora_id",
                                     "medium", "lora_name"],
                     "BlockRemoved": ["block_hashes", "medium"]}.get(kind, [])
            f = dict(zip(names, ev[1:]))
        out.append((kind, f))
    return out


class ServerIndex:
    """One server's blocks: hash -> Counter of media (a hash may be held once per TP shard)."""

    def __init__(self) -> None:
        self.blocks: Dict[object, collections.Counter] = {}
        self.next_seq = 0  # the seq of the next batch to apply
        # Digests of the latest batches applied, by seq: the same seq with another payload is a restart.
        self.digests: "collections.OrderedDict[int, bytes]" = collections.OrderedDict()
        self.stale = False
        self.gaps = 0
        self.replays = 0
        self.restarts = 0

    def apply(self, payload: bytes) -> None:
        for kind, f in decode_events(payload):
            if kind == "BlockStored":
                medium = f.get("medium")
                for h in f.get("block_hashes") or []:
                    self.blocks.setdefault(_hashable(h), collections.Counter())[medium] += 1
            elif kind == "BlockRemoved":
                medium = f.get("medium")
                for h in f.get("block_hashes") or []:
                    media = self.blocks.get(_hashable(h))
                    if media is None:
                        continue
                    if media[medium] > 0:
                        media[medium] -= 1
                        if media[medium] == 0:
                            del media[medium]
                    if not media:
                        del self.blocks[_hashable(h)]
            elif kind == "AllBlocksCleared":
                self.blocks.clear()
                self.stale = False
            # other kinds: skipped (a newer vLLM's events), the seq still advances

    def reset(self) -> None:
        """Forgets everything (the server restarted): its next batch is seq 0."""
        self.blocks.clear()
        self.digests.clear()
        self.next_seq = 0
        self.stale = False
        self.restarts += 1

    def medium_of(self, h) -> Optional[str]:
        """The fastest medium holding `h`, or None."""
        media = self.blocks.get(_hashable(h))
        if not media:
            return None
        for m in ("GPU", "CPU", "DISK"):
            if media.get(m):
                return m
        return next(iter(media))


class KvRouter:
    """The index of `servers` ({name: (pub_endpoint, replay_endpoint)}). Single-threaded: call poll()
    (and the other methods) from one thread."""

    def __init__(self, servers: Dict[str, Tuple[str, str]], *, topic: bytes = b"",
                 replay_timeout_s: float = 10.0, weights: Optional[Dict[str, float]] = None) -> None:
        self.ctx = zmq.Context()
        self.servers = dict(servers)
        self.topic = topic
        self.replay_timeout_s = replay_timeout_s
        self.weights = dict(weights or DEFAULT_WEIGHTS)
        self.index: Dict[str, ServerIndex] = {name: ServerIndex() for name in servers}
        self.subs: Dict[str, Optional[zmq.Socket]] = {}
        self.dealers: Dict[str, zmq.Socket] = {}
        for name in servers:
            self._open_sub(name)
            dealer = self.ctx.socket(zmq.DEALER)
            dealer.setsockopt(zmq.LINGER, 0)
            dealer.connect(servers[name][1])
            self.dealers[name] = dealer

    # ---- sockets -------------------------------------------------------------------------------------
    def _open_sub(self, name: str) -> None:
        sub = self.ctx.socket(zmq.SUB)
        sub.setsockopt(zmq.LINGER, 0)
        sub.setsockopt(zmq.SUBSCRIBE, self.topic)
        sub.connect(self.servers[name][0])
        self.subs[name] = sub

    def pause(self, name: str) -> None:
        """Stops reading `name`: its SUB socket is closed; what it publishes meanwhile is lost to it."""
        sub = self.subs.get(name)
        if sub is not None:
            sub.close(0)
            self.subs[name] = None

    def resume(self, name: str, replay: bool = True) -> int:
        """Reopens the SUB socket and, with `replay`, catches up through the replay socket at once;
        returns the batches replayed. Without it the next live batch shows the gap, which replays then."""
        if self.subs.get(name) is None:
            self._open_sub(name)
            time.sleep(0.2)  # the subscription reaches the server; what it misses, replay has
        return self.catch_up(name) if replay else 0

    def close(self) -> None:
        self.ctx.destroy(linger=0)

    # ---- the stream ----------------------------------------------------------------------------------
    def _replay(self, name: str, start: int) -> List[Tuple[int, bytes]]:
        """Every batch `name` still buffers with seq >= start, in order."""
        dealer = self.dealers[name]
        dealer.send_multipart([b"", start.to_bytes(8, "big")])
        self.index[name].replays += 1
        out = []
        deadline = time.monotonic() + self.replay_timeout_s
        while True:
            left_ms = int((deadline - time.monotonic()) * 1000)
            if left_ms <= 0 or not dealer.poll(left_ms):
                raise TimeoutError(f"{name}: no end of replay within {self.replay_timeout_s} s")
            frames = dealer.recv_multipart()
            seq = int.from_bytes(frames[1], "big", signed=True)
            if seq == END_SEQ:
                return out
            out.append((seq, frames[2]))

    def catch_up(self, name: str) -> int:
        """Replays `name` from the last batch applied (the anchor, checked to be the same batch) and
        applies what follows; returns the batches applied. A changed or missing anchor is a restart:
        the index is reset and the new instance replayed from seq 0."""
        idx = self.index[name]
        if idx.next_seq == 0:
            batches = self._replay(name, 0)
        else:
            anchor = idx.next_seq - 1
            batches = self._replay(name, anchor)
            known = idx.digests.get(anchor)
            if not batches or (batches[0][0] == anchor and known is not None and _digest(batches[0][1]) != known):
                idx.reset()  # its latest seq is below the anchor, or the anchor is another batch
                batches = self._replay(name, 0)
        applied = 0
        if batches and batches[0][0] > idx.next_seq:
            idx.stale = True  # the buffer no longer holds what was missed
            idx.next_seq = batches[0][0]
        for seq, payload in batches:
            if seq >= idx.next_seq:
                self._apply(name, seq, payload)
                applied += 1
        return applied

    def _apply(self, name: str, seq: int, payload: bytes) -> None:
        idx = self.index[name]
        idx.apply(payload)
        idx.next_seq = seq + 1
        idx.digests[seq] = _digest(payload)
        while len(idx.digests) > DIGESTS_KEPT:
            idx.digests.popitem(last=False)

    def _on_live(self, name: str, seq: int, payload: bytes) -> None:
        idx = self.index[name]
        if seq < idx.next_seq:
            known = idx.digests.get(seq)
            if known is not None and known != _digest(payload):
                idx.reset()  # a seq applied before, another batch: the server restarted
                self.catch_up(name)
            return  # else a duplicate of a batch applied (by replay)
        if seq > idx.next_seq:
            idx.gaps += 1
            self.catch_up(name)  # brings next_seq past seq, or marks the index stale
            if seq < idx.next_seq:
                return
            idx.next_seq = seq  # stale: take the live stream from here
        self._apply(name, seq, payload)

    def poll(self, timeout_ms: int = 0) -> int:
        """Applies every batch that has arrived (waiting up to timeout_ms for the first); returns how many."""
        poller = zmq.Poller()
        names = {}
        for name, sub in self.subs.items():
            if sub is not None:
                poller.register(sub, zmq.POLLIN)
                names[sub] = name
        n = 0
        wait = timeout_ms
        while True:
            ready = dict(poller.poll(wait))
            if not ready:
                return n
            for sock in ready:
                while True:
                    try:
                        frames = sock.recv_multipart(zmq.NOBLOCK)
                    except zmq.Again:
                        break
                    if len(frames) != 3:
                        continue
                    self._on_live(names[sock], int.from_bytes(frames[1], "big", signed=True), frames[2])
                    n += 1
            wait = 0

    # ---- queries -------------------------------------------------------------------------------------
    def snapshot(self, name: str) -> Dict[object, str]:
        """`name`'s blocks: hash -> fastest medium."""
        idx = self.index[name]
        return {h: idx.medium_of(h) for h in idx.blocks}

    def score(self, block_hashes: Iterable) -> Dict[str, Tuple[int, Dict[str, int]]]:
        """Per server: (longest prefix of `block_hashes` it holds, blocks of that prefix per medium)."""
        hashes = [_hashable(h) for h in block_hashes]
        out = {}
        for name, idx in self.index.items():
            media: Dict[str, int] = collections.Counter()
            n = 0
            for h in hashes:
                m = idx.medium_of(h)
                if m is None:
                    break
                media[m] += 1
                n += 1
            out[name] = (n, dict(media))
        return out

    def rank(self, block_hashes: Iterable) -> List[Tuple[str, float, int, Dict[str, int]]]:
        """Servers by weighted prefix, best first: (name, score, prefix_blocks, per-medium blocks)."""
        rows = []
        for name, (n, media) in self.score(block_hashes).items():
            s = sum(self.weights.get(m, 0.0) * c for m, c in media.items())
            rows.append((name, s, n, media))
        rows.sort(key=lambda r: (-r[1], -r[2], r[0]))
        return rows


def main() -> None:
    import argparse

    p = argparse.ArgumentParser(description="Follow the vLLM-format KV events of servers; print their indexes")
    p.add_argument("servers", nargs="+", help="NAME=PUB_ENDPOINT,REPLAY_ENDPOINT")
    p.add_argument("--seconds", type=float, default=10.0)
    a = p.parse_args()
    servers = {}
    for s in a.servers:
        name, eps = s.split("=", 1)
        pub, replay = eps.split(",", 1)
        servers[name] = (pub, replay)
    router = KvRouter(servers)
    for name in servers:
        router.catch_up(name)
    end = time.monotonic() + a.seconds
    while time.monotonic() < end:
        router.poll(200)
    for name, idx in router.index.items():
        media = collections.Counter(router.snapshot(name).values())
        print(f"{name}: {len(idx.blocks)} blocks {dict(media)} next_seq={idx.next_seq} gaps={idx.gaps} "
              f"replays={idx.replays} stale={idx.stale}")
    router.close()


if __name__ == "__main__":
    main()
