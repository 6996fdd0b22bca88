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
-- RaiseCounter, or a clock that ran backwards) costs a second SET. A held
-- lock costs a GET and a PTTL and writes nothing.
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
local s = string.format('%.0f', now)
local old = redis.call('SET', KEYS[2], s, 'PX', ARGV[3], 'GET')
if old and tonumber(old) >= now then
  -- The counter is ahead of the clock: one above it, and keep it.
  s = string.format('%.0f', tonumber(old) + 1)
  redis.call('SET', KEYS[2], s, 'PX', ARGV[3])
end
local v = s .. ':' .. ARGV[1]
redis.call('SET', KEYS[1], v, 'PX', ARGV[2])
return {1, v}
