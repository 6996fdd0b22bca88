-- Shared by acquire.lua, release.lua and leave.lua, which it is put into
-- (at their "--@" lines, see below): the token rule, the queue of
-- waiters, and the handover.
--
-- KEYS[1] lock: '<token>:<holder>' with a PX expiry
-- KEYS[2] token counter
-- KEYS[3] queue: a list of the waiting holder ids, in arrival order
-- KEYS[4] waiters: a hash, holder id -> '<deadline>:<grant lease>', the
--         deadline in server ms (the waiter is skipped once it passed;
--         its heartbeats move it), the grant lease in ms (the expiry a
--         handover gives it until its own renewal)
-- The name's channel is KEYS[1]..':ch': a channel is no key (SPUBLISH
-- routes it by the same hash tag, to the lock's slot), so it is derived
-- here rather than sent with every call. publish, the command that
-- notifies ('PUBLISH', or 'SPUBLISH' for a cluster's sharded pub/sub), is
-- set by the line at the top of each script (see scripts.go): a script per
-- kind instead of an argument per call.
--
-- A holder id is in the queue iff it has a field in the waiters hash: a
-- list entry without one is dropped when it reaches the head.
--
-- Lines that start with "--elect " are comments here and code in an
-- election's scripts (see elect.lua): a lock pays nothing for them.
--
-- Every call defines only now, next_token and queue; the queue's
-- functions are made by queue(), called only on the paths that find a
-- queue: each function defined costs every call that runs the
-- definition, as does each argument, key and command. Defining the three
-- costs more than an empty script's call does (callgrind, Redis 7.0), so
-- they are not defined at the top of each script but where the script's
-- "--@tokens" and "--@queue" lines say (see scripts.go): this file's part
-- above its own "--@queue" line (now, next_token), and the part below
-- it (queue). A release with nobody queued and an acquisition of a free
-- lock end before the definitions they do not use.

local fmt = string.format
-- The counter's idle expiry (ms): 30 days, a string (a number would be
-- formatted on every call). The clock floor (next_token) covers a counter
-- that idled out.
local counter_ttl = '2592000000'

local now_cache, now_text
-- now is the server clock in µs, read once per call, and the same as
-- decimal digits. Lua numbers are doubles: µs since 1970 (~1.8e15) and
-- counters below 2^53 are exact. The digits are TIME's own, joined
-- (formatting a number costs more than the rest of an acquisition's Lua):
-- seconds, and microseconds padded to six digits. A reply carries now as
-- a number: Redis turns it into an integer reply, exact below 2^53.
local function now()
  if not now_cache then
    local t = redis.call('TIME')
    now_cache = tonumber(t[1]) * 1000000 + tonumber(t[2])
    now_text = t[1] .. string.sub('00000' .. t[2], -6)
  end
  return now_cache, now_text
end

-- next_token hands out the next fencing token of the name. Every token,
-- whether an acquisition or a handover issues it, comes from here.
--
-- Invariant: the token strictly increases per name.
--   token = max(counter + 1, server clock in µs), and afterwards
--   counter = max(counter, token): the counter is at least every token
--   handed out, so the next token is greater whatever the clock does
--   (backwards after an NTP step or a failover to a server with a slower
--   clock, or two acquisitions in one µs), as long as the counter is kept.
--   When the counter is lost (FLUSHALL, restart without persistence,
--   failover to a replica that missed writes, eviction, deleted by hand,
--   30 days idle), the clock floor alone still gives a token above every
--   earlier one, because every earlier token was at most the clock of its
--   own acquisition, as long as the server clock has not run backwards
--   since; when both happen, RaiseCounter (fencectl repair) restores it.
--
-- Cost: the counter is written on every acquisition (a counter written
-- only when it is ahead of the clock would lose the first guarantee: after
-- the clock runs backwards, nothing would remember the last token handed
-- out from the clock). SET ... GET writes the clock and reads the old
-- counter in one call; only a counter ahead of the clock (raised by
-- RaiseCounter, or a clock that ran backwards) costs a second SET.
-- string.format('%.0f') formats a counter: it never switches to the
-- exponent notation tostring would use.
local function next_token()
  local t, s = now()
  local old = redis.call('SET', KEYS[2], s, 'PX', counter_ttl, 'GET')
  if old and tonumber(old) >= t then
    s = fmt('%.0f', tonumber(old) + 1)
    redis.call('SET', KEYS[2], s, 'PX', counter_ttl)
  end
  return s
end

--@queue
-- queue returns the functions of a name whose queue is not empty.
local function queue()
  local q = {}

  -- notify publishes msg on the name's channel; false when the Redis user
  -- may not, with Redis's error (the waiters then learn of it at their
  -- next heartbeat).
  local function notify(msg)
    local r = redis.pcall(publish, KEYS[1] .. ':ch', msg)
    if type(r) == 'table' and r.err then
      return false, r.err
    end
    return true
  end

  -- At most this many dead or departed entries are dropped from the head
  -- per call, so that a call's work is bounded however many waiters died
  -- at once; the next call (a heartbeat, a release) goes on from there.
  local skip_max = 16

  -- live reads the place of holder id: its grant lease when its deadline
  -- has not passed, else nil (its field, if any, is deleted).
  local function live(id)
    local w = redis.call('HGET', KEYS[4], id)
    if w then
      local i = string.find(w, ':', 1, true)
      if tonumber(string.sub(w, 1, i - 1)) * 1000 > now() then
        return string.sub(w, i + 1)
      end
      redis.call('HDEL', KEYS[4], id)
    end
    return nil
  end

  -- head returns the first waiter whose deadline has not passed, and its
  -- grant lease, dropping the dead ones before it; nil when the queue is
  -- empty. more is true when the budget ran out before a live one was
  -- found: dead entries remain, and nobody can be told the lock is free
  -- of waiters.
  function q.head()
    for _ = 1, skip_max do
      local id = redis.call('LINDEX', KEYS[3], 0)
      if not id then
        return nil, nil, false
      end
      local lease = live(id)
      if lease then
        return id, lease, false
      end
      redis.call('LPOP', KEYS[3])
    end
    return nil, nil, true
  end

  -- grant makes waiter id, popped from the head with its field deleted,
  -- the holder, with a token by the same rule as an acquisition, and
  -- tells it: the message carries the server time of the grant, from
  -- which the waiter dates its lease. It returns the lock's new value,
  -- whether the message was published and, if not, Redis's error.
  function q.grant(id, lease)
    local v = next_token() .. ':' .. id
    redis.call('SET', KEYS[1], v, 'PX', lease)
    --elect began(v, id, lease)
    local _, at = now()
    return v, notify('grant:' .. at .. ':' .. v)
  end

  -- grant_head pops head id (read by q.head) and grants it the lock.
  function q.grant_head(id, lease)
    redis.call('LPOP', KEYS[3])
    redis.call('HDEL', KEYS[4], id)
    return q.grant(id, lease)
  end

  -- pass_on ends a holding that is ours (value v): the lock goes to the
  -- first live waiter in the same call, or is deleted when none waits.
  -- first is the head, already popped by the caller (nil: pop it here).
  -- Returns what release.lua returns.
  function q.pass_on(v, first)
    --elect handing = v
    local id = first
    for _ = 1, skip_max do
      id = id or redis.call('LPOP', KEYS[3])
      if not id then
        break
      end
      local lease = live(id)
      if lease then
        redis.call('HDEL', KEYS[4], id)
        local nv, published, err = q.grant(id, lease)
        if published then
          return {3, nv}
        end
        return {4, nv, err}
      end
      id = nil
    end
    -- Nobody live within the budget: the lock is deleted, and the next
    -- call (a heartbeat, the first waiter's poll) hands it on.
    return q.free(v)
  end

  -- free deletes the lock (value v, ours) and publishes the released
  -- value (release.lua does the same without the queue's functions).
  function q.free(v)
    redis.call('DEL', KEYS[1])
    --elect resigned(v)
    local published, err = notify(v)
    if published then
      return 1
    end
    return {2, err}
  end

  -- keep puts holder id in the queue, or keeps it there: its deadline
  -- moves to liveness ms from now. A waiter not in the queue joins at the
  -- tail only when join is true (its first call); a heartbeat never puts
  -- back a waiter that left or was dropped, so a heartbeat that arrives
  -- after its waiter's leave.lua cannot queue it again. Returns whether id
  -- is queued.
  function q.keep(id, liveness, grant_lease, join)
    local v = fmt('%.0f', math.floor(now() / 1000) + liveness) .. ':' .. grant_lease
    local joined = false
    if join then
      joined = redis.call('HSET', KEYS[4], id, v) == 1
      if joined then
        redis.call('RPUSH', KEYS[3], id)
      end
    elseif redis.call('HEXISTS', KEYS[4], id) == 1 then
      redis.call('HSET', KEYS[4], id, v)
    else
      return false
    end
    -- The queue outlives the longest-lived waiter by a liveness period and
    -- then expires by itself: abandoned when every waiter died. The expiry
    -- moves when it is within 1.5 liveness periods (a heartbeat every
    -- liveness/3 then moves it about every other time), and on a join,
    -- which may have made the list anew (an emptied list is deleted): the
    -- list gets the hash's expiry, so that both keys go together.
    local ttl = 2 * liveness
    local pttl = redis.call('PTTL', KEYS[4])
    if joined or pttl < 1.5 * liveness then
      ttl = math.max(ttl, pttl)
      redis.call('PEXPIRE', KEYS[4], ttl)
      redis.call('PEXPIRE', KEYS[3], ttl)
    end
    return true
  end

  return q
end
