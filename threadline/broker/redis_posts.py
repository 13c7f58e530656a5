"""A batch of the Redis broker's outbox as one script call: what it sends, and how it is packed.

A batch (the events, stream ends and signals queued while the previous one was in flight) used to be a
pipeline of one `XADD` per event, an `EXPIRE` per run, a `PUBLISH` per signal: a command packed and a reply
read back per event, and a pool checkout per batch. On the `pg` stack's long streams that was a fifth of the
worker's CPU (bench/README.md, "Fewer writes per token ... (2026-12-07)"). It is now one `EVALSHA` of
`POST_SCRIPT`, whose arguments are the batch's operations in order, and whose one reply is the ids the
waiters of the batch get. Pure: packing only, no I/O (`RedisBroker._send_batch` sends it).
"""

from __future__ import annotations

import asyncio
import hashlib
from typing import Any

from threadline.broker.base import event_bytes
from threadline.broker.budget import ByteBudget
from threadline.broker.keys import Keys
from threadline.broker.outbox import Item

#: KEYS: every key the batch touches. ARGV[1]: events kept per run (exactly, as `XADD MAXLEN =`); ARGV[2]: the
#: seconds a live run's events are kept after its last one; ARGV[3]: the seconds after a run's end. Then the
#: batch's operations in order, each a letter and its arguments:
#:   E k event data   XADD to the run's events KEYS[k] (their expiry renewed once per batch, unless ended in it)
#:   X k j            the run's end: XADD to its end stream KEYS[j]; both expire ARGV[3] seconds later
#:   T k n            XTRIM KEYS[k] to its n newest events (the byte budgets, `broker/budget.py`)
#:   P channel text   PUBLISH (a signal)
#:   W k n most secs  the batch's n wake-up tokens pushed on the list KEYS[k], kept to its `most` newest, the
#:                    list expiring `secs` seconds after (`RedisBroker.wait_for_work` takes them)
#: Returns the ids of the E and X operations, in order. An error stops the script where it is (what came
#: before it stays), as a failed pipeline did: the outbox counts the batch as not sent.
POST_SCRIPT = """
local ids, expiring, i, n = {}, {}, 4, #ARGV
while i <= n do
  local op = ARGV[i]
  if op == 'E' then
    local key = KEYS[tonumber(ARGV[i + 1])]
    ids[#ids + 1] = redis.call('XADD', key, 'MAXLEN', ARGV[1], '*', 'e', ARGV[i + 2], 'd', ARGV[i + 3])
    if not expiring[key] then
      redis.call('EXPIRE', key, ARGV[2])
      expiring[key] = true
    end
    i = i + 4
  elseif op == 'X' then
    local key, ended = KEYS[tonumber(ARGV[i + 1])], KEYS[tonumber(ARGV[i + 2])]
    ids[#ids + 1] = redis.call('XADD', ended, 'MAXLEN', '1', '*', 'end', '1')
    redis.call('EXPIRE', ended, ARGV[3])
    redis.call('EXPIRE', key, ARGV[3])
    expiring[key] = true
    i = i + 3
  elseif op == 'T' then
    redis.call('XTRIM', KEYS[tonumber(ARGV[i + 1])], 'MAXLEN', ARGV[i + 2])
    i = i + 3
  elseif op == 'P' then
    redis.call('PUBLISH', ARGV[i + 1], ARGV[i + 2])
    i = i + 3
  elseif op == 'W' then
    local key = KEYS[tonumber(ARGV[i + 1])]
    for _ = 1, tonumber(ARGV[i + 2]) do
      redis.call('RPUSH', key, '1')
    end
    redis.call('LTRIM', key, 0, tonumber(ARGV[i + 3]) - 1)
    redis.call('EXPIRE', key, ARGV[i + 4])
    i = i + 5
  else
    return redis.error_reply('unknown operation ' .. tostring(op))
  end
end
return ids
"""
POST_SHA = hashlib.sha1(POST_SCRIPT.encode()).hexdigest()


class Packed:
    """One batch as `EVALSHA POST_SHA` arguments (`args`, after the script), and who waits for which id."""

    __slots__ = ("args", "waiters")

    def __init__(self, args: list[Any], waiters: list[tuple[int, asyncio.Future[Any]]]) -> None:
        self.args = args
        #: (index of the id in the script's reply, the future of `publish` or `end_stream` that waits for it)
        self.waiters = waiters


def pack_batch(batch: list[Item], keys: Keys, budget: ByteBudget, sender: str, *, live_seconds: int,
               retain_seconds: int, wake_tokens_max: int = 1000, wake_tokens_seconds: int = 60) -> Packed:
    """The batch's operations in its order, each event and end told to the byte budget as it is packed, then
    the trims the budget asks for, then the batch's wake-up tokens in one push. `sender` prefixes each
    signal's payload (this process's id: its own listener skips it)."""
    key_index: dict[str, int] = {}
    key_list: list[str] = []

    def index(key: str) -> int:
        found = key_index.get(key)
        if found is None:
            key_list.append(key)
            found = key_index[key] = len(key_list)
        return found

    ops: list[Any] = []
    waiters: list[tuple[int, asyncio.Future[Any]]] = []
    ids = tokens = 0
    for kind, name, value in batch:
        if kind == "event":
            event, data, stored = value
            budget.added(name, event_bytes(event, data))
            if stored is not None:
                waiters.append((ids, stored))
            ops += ("E", index(keys.events(name)), event, data)
            ids += 1
        elif kind == "end":
            budget.ended(name)
            waiters.append((ids, value))
            ops += ("X", index(keys.events(name)), index(keys.end(name)))
            ids += 1
        elif kind == "token":
            tokens += 1
        else:  # a signal
            ops += ("P", name, f"{sender} {value}")
    for run_id, keep in budget.trims().items():
        ops += ("T", index(keys.events(run_id)), keep)
    if tokens:
        ops += ("W", index(keys.wake_tokens), tokens, wake_tokens_max, wake_tokens_seconds)
    head = [POST_SHA, len(key_list), *key_list, budget.buffer_events, live_seconds, retain_seconds]
    return Packed(head + ops, waiters)
