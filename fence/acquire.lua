-- Acquire a lock, or wait for it in its queue, in one round trip (with
-- queue.lua, which defines the keys and the shared functions, put in at
-- the "--@" lines).
-- ARGV[1] holder, ARGV[2] lease (ms), ARGV[3] the mode: 't' try (never
-- queue), 'w' wait (join the queue when not acquired), 'b' heartbeat of a
-- waiter (stay in the queue, never join it); for 'w' and 'b' followed by
-- ':<liveness>:<grant lease>' (ms): how far the waiter's deadline moves,
-- and the lease a handover gives it ('w:6000:6000').
--
-- Returns
--   value: acquired; value is the lock's '<token>:<holder>' (a bare
--     string, the common answer: a table costs the server more than the
--     rest of the reply);
--   {2, value}: this holder id has the lock already — a retry after a
--     lost reply (the lease restarts), or a waiter's heartbeat finding its
--     handover (the lease is at least the grant lease from now); the token
--     stays;
--   {0, pttl, now, queued}: not acquired; pttl is the holder's remaining
--     lease (-1: no expiry, 0: free, or the queue must be cleared first:
--     try again), now the server time in µs (an integer), queued 1 when
--     the caller is in the queue (a heartbeat of a waiter that lost its
--     place gets 0, and joins again with 'w').
--
-- No barging: a free lock goes to the first live waiter, so a caller
-- ahead of whom a live waiter queues does not get it; the script hands it
-- to that waiter instead (the last holder's lease ran out, or a version
-- without handover released it) and tells it.
--
-- The lock is one string '<token>:<holder>' with a PX expiry: one write to
-- create it, one read to check an owner (release, renew). A free lock
-- with nobody queued costs an EXISTS (of the lock and the queue at once)
-- before the token; a held one adds a GET and a PTTL, and writes only the
-- caller's place in the queue. A heartbeat, whose queue exists, starts at
-- the GET.
local me, mode = ARGV[1], string.byte(ARGV[3])
local beat = mode == 98 -- 'b'
--@tokens

if not beat and redis.call('EXISTS', KEYS[1], KEYS[3]) == 0 then
  -- Free, nobody queued.
  local v = next_token() .. ':' .. me
  redis.call('SET', KEYS[1], v, 'PX', ARGV[2])
  --elect began(v, me, ARGV[2], ARGV[4])
  return v
end
--@queue

-- wait_here keeps the caller's place (q: the queue's functions) and
-- reports whether it is queued, as 1 or 0.
local function wait_here(q)
  if mode == 116 then -- 't'
    return 0
  end
  local liveness, grant_lease = string.match(ARGV[3], ':(%d+):(%d+)$')
  if q.keep(me, tonumber(liveness), grant_lease, not beat) then
    --elect candidate(me, not beat and ARGV[4] or nil)
    return 1
  end
  return 0
end

local cur = redis.call('GET', KEYS[1])
if cur then
  local i = string.find(cur, ':', 1, true)
  if i and string.sub(cur, i + 1) == me then
    if not beat then
      redis.call('PEXPIRE', KEYS[1], ARGV[2])
    else
      -- A waiter's heartbeat finding its handover may have been sent
      -- before the handover by a waiter that died since: it extends the
      -- lock to the handover's grant lease only, never a whole lease (a
      -- dead waiter costs the queue a liveness), and never shortens a
      -- lease its holder renewed meanwhile. The client counts the grant
      -- lease from when it sent the heartbeat.
      local grant = string.match(ARGV[3], ':(%d+)$')
      if redis.call('PTTL', KEYS[1]) < tonumber(grant) then
        redis.call('PEXPIRE', KEYS[1], grant)
      end
    end
    -- Holding and queued at once (one holder id on two calls): the
    -- place would give it the lock a second time.
    if redis.call('HDEL', KEYS[4], me) == 1 then
      redis.call('LREM', KEYS[3], 1, me)
    end
    --elect if ARGV[4] then proclaim(cur, ARGV[4]) end
    return {2, cur}
  end
  local queued = wait_here(queue())
  return {0, redis.call('PTTL', KEYS[1]), (now()), queued}
end

local q = queue()
local id, lease, more = q.head()
-- A heartbeat takes the lock only for a waiter at the head of the queue:
-- one that arrives after its waiter left (its place is gone) must not.
if id == me or (id == nil and not more and not beat) then
  if id == me then
    redis.call('LPOP', KEYS[3])
    redis.call('HDEL', KEYS[4], me)
  end
  local v = next_token() .. ':' .. me
  redis.call('SET', KEYS[1], v, 'PX', ARGV[2])
  --elect began(v, me, ARGV[2], ARGV[4])
  return v
end
local pttl = 0
if id then
  q.grant_head(id, lease)
  pttl = tonumber(lease)
end
local queued = wait_here(q)
return {0, pttl, (now()), queued}
