-- Acquire a lock, or wait for it in its queue, in one round trip (after
-- queue.lua, which defines the keys and the shared functions).
-- ARGV[4] holder, ARGV[5] lease (ms), ARGV[6] mode: 't' try (never
-- queue), 'w' wait (join the queue when not acquired), 'b' heartbeat of a
-- waiter (stay in the queue, never join it); ARGV[7] liveness (ms): how
-- far a waiter's deadline moves; ARGV[8] its grant lease (ms).
--
-- Returns
--   {1, value, now}: acquired; value is the lock's '<token>:<holder>';
--   {2, value, now}: this holder id has the lock already — a retry after
--     a lost reply, or a waiter's heartbeat finding its handover; the
--     lease restarts, the token stays;
--   {0, pttl, now, queued}: not acquired; pttl is the holder's remaining
--     lease (-1: no expiry, 0: free, or the queue must be cleared first:
--     try again), queued 1 when the caller is in the queue (a heartbeat of
--     a waiter that lost its place gets 0, and joins again with 'w').
-- now is the server time in µs.
--
-- No barging: a free lock goes to the first live waiter, so a caller
-- ahead of whom a live waiter queues does not get it; the script hands it
-- to that waiter instead (the last holder's lease ran out, or a version
-- without handover released it) and tells it.
--
-- The lock is one string '<token>:<holder>' with a PX expiry: one write to
-- create it, one read to check an owner (release, renew). A held lock
-- costs a GET, a TIME and a PTTL, and writes only the caller's place in
-- the queue.
local me, mode = ARGV[4], ARGV[6]
local function wait_here()
  if mode ~= 't' and keep(me, ARGV[8], tonumber(ARGV[7]), mode == 'w') then
    return 1
  end
  return 0
end

local cur = redis.call('GET', KEYS[1])
if cur then
  if holder_of(cur) == me then
    redis.call('PEXPIRE', KEYS[1], ARGV[5])
    -- Holding and queued at once (one holder id on two calls): the
    -- place would give it the lock a second time.
    if redis.call('HDEL', KEYS[4], me) == 1 then
      redis.call('LREM', KEYS[3], 1, me)
    end
    return {2, cur, fmt(now())}
  end
  local q = wait_here()
  return {0, redis.call('PTTL', KEYS[1]), fmt(now()), q}
end

local id, lease, more = live_head()
-- A heartbeat takes the lock only for a waiter at the head of the queue:
-- one that arrives after its waiter left (its place is gone) must not.
if id == me or (id == nil and not more and mode ~= 'b') then
  if id == me then
    redis.call('LPOP', KEYS[3])
    redis.call('HDEL', KEYS[4], me)
  end
  local v = next_token() .. ':' .. me
  redis.call('SET', KEYS[1], v, 'PX', ARGV[5])
  return {1, v, fmt(now())}
end
local pttl = 0
if id then
  grant(id, lease)
  pttl = tonumber(lease)
end
local q = wait_here()
return {0, pttl, fmt(now()), q}
