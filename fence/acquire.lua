-- Acquire a lock and hand out its fencing token, in one round trip.
-- KEYS[1] lock, KEYS[2] token counter
-- ARGV[1] holder, ARGV[2] lease (ms), ARGV[3] idle expiry of the counter (ms)
-- Returns {1, '<token>:<holder>'} (the lock's value) when acquired,
-- {2, value} when this holder id holds it already (the lease restarts, the
-- token stays: a retry after a lost reply gets its lock back), and
-- {0, pttl} when another holder has it (pttl -1: the key has no expiry).
--
-- The lock is one string '<token>:<holder>' with a PX expiry: one write to
-- create it, one read to check an owner (release, renew).
--
-- Invariant: the token strictly increases per name, even when the counter
-- key was lost (FLUSHALL, restart without persistence, eviction, deleted by
-- hand): token = max(counter + 1, server clock in microseconds). The clock
-- floor only moves forward while the server clock does.
local cur = redis.call('GET', KEYS[1])
if cur then
  -- The token is digits only: the holder is everything after the first ':'.
  local i = string.find(cur, ':', 1, true)
  if i and string.sub(cur, i + 1) == ARGV[1] then
    redis.call('PEXPIRE', KEYS[1], ARGV[2])
    return {2, cur}
  end
  return {0, redis.call('PTTL', KEYS[1])}
end
local t = redis.call('TIME')
-- Lua numbers are doubles; microseconds since 1970 (~1.8e15) and a counter
-- below 2^53 are exact, and string.format('%.0f') never switches to the
-- exponent notation tostring would use.
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local token = tonumber(redis.call('GET', KEYS[2]) or '0') + 1
if now > token then
  token = now
end
local s = string.format('%.0f', token)
redis.call('SET', KEYS[2], s, 'PX', ARGV[3])
local v = s .. ':' .. ARGV[1]
redis.call('SET', KEYS[1], v, 'PX', ARGV[2])
return {1, v}
