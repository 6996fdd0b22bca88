-- Shared by acquire.lua, release.lua and leave.lua, which it is put in
-- front of: the token rule, the queue of waiters, and the handover.
--
-- KEYS[1] lock: '<token>:<holder>' with a PX expiry
-- KEYS[2] token counter
-- KEYS[3] queue: a list of the waiting holder ids, in arrival order
-- KEYS[4] waiters: a hash, holder id -> '<deadline>:<grant lease>', the
--         deadline in server ms (the waiter is skipped once it passed;
--         its heartbeats move it), the grant lease in ms (the expiry a
--         handover gives it until its own renewal)
-- ARGV[1] idle expiry of the counter (ms), ARGV[2] the name's channel,
-- ARGV[3] '1' to notify with SPUBLISH (a cluster's sharded pub/sub)
--
-- A holder id is in the queue iff it has a field in the waiters hash: a
-- list entry without one is dropped when it reaches the head.

local now_cache
-- now is the server clock in µs, read once per call. Lua numbers are
-- doubles: µs since 1970 (~1.8e15) and counters below 2^53 are exact, and
-- string.format('%.0f') never switches to the exponent notation tostring
-- would use.
local function now()
  if not now_cache then
    local t = redis.call('TIME')
    now_cache = tonumber(t[1]) * 1000000 + tonumber(t[2])
  end
  return now_cache
end

local function fmt(n) return string.format('%.0f', n) end

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
local function next_token()
  local t = now()
  local s = fmt(t)
  local old = redis.call('SET', KEYS[2], s, 'PX', ARGV[1], 'GET')
  if old and tonumber(old) >= t then
    s = fmt(tonumber(old) + 1)
    redis.call('SET', KEYS[2], s, 'PX', ARGV[1])
  end
  return s
end

-- holder_of is the holder part of a lock value: the token is digits only,
-- so the holder is everything after the first ':'.
local function holder_of(v)
  local i = string.find(v, ':', 1, true)
  if i then
    return string.sub(v, i + 1)
  end
  return nil
end

-- notify publishes msg on the name's channel; false when the Redis user
-- may not (the waiters then learn of it at their next heartbeat).
local function notify(msg)
  local r
  if ARGV[3] == '1' then
    r = redis.pcall('SPUBLISH', ARGV[2], msg)
  else
    r = redis.pcall('PUBLISH', ARGV[2], msg)
  end
  return not (type(r) == 'table' and r.err)
end

-- At most this many dead or departed entries are dropped from the head
-- per call, so that a call's work is bounded however many waiters died at
-- once; the next call (a heartbeat, a release) goes on from there.
local skip_max = 16

-- live_head returns the first waiter whose deadline has not passed, and
-- its grant lease, dropping the dead ones before it; nil when the queue
-- is empty. more is true when the budget ran out before a live one was
-- found: dead entries remain, and nobody can be told the lock is free of
-- waiters.
local function live_head()
  for _ = 1, skip_max do
    local id = redis.call('LINDEX', KEYS[3], 0)
    if not id then
      return nil, nil, false
    end
    local w = redis.call('HGET', KEYS[4], id)
    if w then
      local i = string.find(w, ':', 1, true)
      if tonumber(string.sub(w, 1, i - 1)) * 1000 > now() then
        return id, string.sub(w, i + 1), false
      end
      redis.call('HDEL', KEYS[4], id)
    end
    redis.call('LPOP', KEYS[3])
  end
  return nil, nil, true
end

-- grant makes the head waiter id the holder, with a token by the same
-- rule as an acquisition, and tells it: the message carries the server
-- time of the grant, from which the waiter dates its lease. It returns
-- the lock's new value and whether the message was published.
local function grant(id, lease)
  local v = next_token() .. ':' .. id
  redis.call('SET', KEYS[1], v, 'PX', lease)
  redis.call('LPOP', KEYS[3])
  redis.call('HDEL', KEYS[4], id)
  return v, notify('grant:' .. fmt(now()) .. ':' .. v)
end

-- pass_on ends a holding that is ours (value v): the lock goes to the
-- first live waiter in the same call, or is deleted when none waits.
-- Returns {1} released, {2} released but not published, {3, value}
-- handed over, {4, value} handed over but not published.
local function pass_on(v)
  local id, lease = live_head()
  if id then
    local nv, published = grant(id, lease)
    if published then
      return {3, nv}
    end
    return {4, nv}
  end
  redis.call('DEL', KEYS[1])
  -- The released value, as versions without handover publish it: their
  -- waiters wake on any message, this version's poll the queue.
  if notify(v) then
    return {1}
  end
  return {2}
end

-- keep puts holder id in the queue, or keeps it there: its deadline moves
-- to liveness ms from now. A waiter not in the queue joins at the tail
-- only when join is true (its first call); a heartbeat never puts back a
-- waiter that left or was dropped, so a heartbeat that arrives after its
-- waiter's leave.lua cannot queue it again. Returns whether id is queued.
local function keep(id, grant_lease, liveness, join)
  local v = fmt(math.floor(now() / 1000) + liveness) .. ':' .. grant_lease
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
  -- liveness/3 then moves it about every other time), and on a join, which
  -- may have made the list anew (an emptied list is deleted): the list
  -- gets the hash's expiry, so that both keys go together.
  local ttl = 2 * liveness
  local pttl = redis.call('PTTL', KEYS[4])
  if joined or pttl < 1.5 * liveness then
    ttl = math.max(ttl, pttl)
    redis.call('PEXPIRE', KEYS[4], ttl)
    redis.call('PEXPIRE', KEYS[3], ttl)
  end
  return true
end

